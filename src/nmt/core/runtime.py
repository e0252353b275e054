"""What training, evaluation and the benchmark share: device choice, a bound on CUDA memory,
seeding, bf16 autocast, and what a run reports about its machine (the loss: nmt.core.loss)."""

from __future__ import annotations

import functools
import logging
import os
import platform
import random
import resource
from pathlib import Path

import torch

from nmt.core.errors import NmtError
from nmt.core.process import GPU_MEMORY_ENV

log = logging.getLogger("nmt.runtime")

# The attention kernels (F.scaled_dot_product_attention's backends) this process may use, comma
# separated; unset: any. tools/gpu/preflight.py checks each kernel at the models' own calls and
# prints the setting that leaves out one it found wrong; tools/gpu/run.sh then exports it for
# every stage. Like the memory bound it is the machine's, not a param (right kernels give the
# same results); train.json records it.
ATTENTION_KERNELS_ENV = "NMT_ATTENTION_KERNELS"
KERNEL_SWITCHES = {"flash": torch.backends.cuda.enable_flash_sdp,
                   "efficient": torch.backends.cuda.enable_mem_efficient_sdp,
                   "cudnn": torch.backends.cuda.enable_cudnn_sdp,
                   "math": torch.backends.cuda.enable_math_sdp}
ATTENTION_KERNELS = tuple(KERNEL_SWITCHES)


def pick_device(name: str = "auto") -> torch.device:
    """`auto`: CUDA when present, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise NmtError(f"device {name!r} asked for, but no CUDA GPU is visible (fix: device: auto)")
    return torch.device(name)


def gpu_memory_bound() -> int:
    """NMT_GPU_MEM_MB as a number of megabytes; 0 when unset (no bound)."""
    value = os.environ.get(GPU_MEMORY_ENV, "").strip() or "0"
    if not value.isdigit():
        raise NmtError(f"{GPU_MEMORY_ENV}={value!r} is not a whole number of megabytes (fix: "
                       f"e.g. {GPU_MEMORY_ENV}=9000, or 0 for no bound)")
    return int(value)


def bound_gpu_memory(device: torch.device) -> None:
    """Cap this process's CUDA memory on `device` at NMT_GPU_MEM_MB megabytes, so that several
    jobs sharing one GPU cannot starve one another: one that needs more fails with CUDA out of
    memory instead of taking the others' share. A cap changes no result, so it is no param
    (changing it re-runs nothing). Unset or 0: no cap; on the CPU nothing to cap (one line)."""
    megabytes = gpu_memory_bound()
    if not megabytes:
        return
    if device.type != "cuda":
        log.info("%s=%d: no CUDA memory to bound on %s", GPU_MEMORY_ENV, megabytes, device)
        return
    # torch.cuda wants an index here ('cuda' alone: ValueError on torch 2.11)
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = min(1.0, megabytes * 1e6 / total)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    log.info("CUDA memory bounded at %d MB, %.1f%% of %s's %d MB", megabytes, 100 * fraction,
             device, total // 10**6)


def limit_attention_kernels(setting: str = "route") -> str:
    """Allow only the attention kernels NMT_ATTENTION_KERNELS names (torch.backends.cuda's
    switches, which F.scaled_dot_product_attention reads on every call); returns the setting
    in force ("any" when unset). `setting` is train.attention_kernels: `route` (the default)
    reads the environment so; `any` allows every kernel, cuDNN's included, whatever the
    environment says (the A/B runs against the route, recipe published_cudnn)."""
    if setting == "any":
        for switch in KERNEL_SWITCHES.values():
            switch(True)
        log.info("attention kernels: any (train.attention_kernels: any; %s not read)",
                 ATTENTION_KERNELS_ENV)
        return "any"
    if setting != "route":
        raise NmtError(f"train.attention_kernels: {setting!r} is neither route nor any (fix: "
                       "route, the kernels NMT_ATTENTION_KERNELS allows, or any)")
    value = os.environ.get(ATTENTION_KERNELS_ENV, "").strip()
    if not value:
        return "any"
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in ATTENTION_KERNELS]
    if unknown or "math" not in names:
        raise NmtError(f"{ATTENTION_KERNELS_ENV}={value!r}: names {', '.join(ATTENTION_KERNELS)} "
                       "only, and math among them, which every call can take (fix: e.g. "
                       f"{ATTENTION_KERNELS_ENV}=efficient,math, or unset it)")
    for name, switch in KERNEL_SWITCHES.items():
        switch(name in names)
    log.info("attention kernels: %s only (%s)", ", ".join(names), ATTENTION_KERNELS_ENV)
    return ",".join(names)


def seed_everything(seed: int) -> None:
    """Seed every generator a run draws from: torch (CPU and CUDA) and Python's."""
    random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def resolve_compile(compile_setting: bool | str, device: torch.device) -> bool:
    """train.compile on a device: `auto` compiles nowhere, because on every device measured
    compiling cost more time than it saved in a run of this project's sizes. On the CPU it made
    the step 0.84-0.99x as fast (issue 33). On an H200 (torch 2.11, reports/gpu-second-run)
    the published-size step's first compile took 2.5 minutes and new batch shapes recompiled
    at 1.2-1.6 minutes each (7 updates in 7.7 minutes); the tuned recipe compiled 4 times in
    4.4 minutes, then ran 3.5 s an epoch against about 5 eager; the decoder-only model's
    compile failed in sympy and fell back. true and false as given."""
    del device  # the same choice on every device measured so far
    if compile_setting == "auto":
        return False
    return bool(compile_setting)


def autocast(device: torch.device, precision: str = "fp32", cache_casts: bool = True):
    """bf16 autocast when the precision resolves to bf16 (matmuls and attention in bf16,
    reductions and the loss in float32); a no-op for fp32. `cache_casts` False: no cache of
    the weights' bf16 copies, which a CUDA graph capture requires (nmt.training.graphs)."""
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"autocast takes a resolved precision, fp32 or bf16, not {precision!r}")
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16,
                          cache_enabled=cache_casts, enabled=precision == "bf16")


def device_name(device: torch.device) -> str:
    """The GPU's name (`NVIDIA H100 80GB HBM3`), or the CPU's with its core count."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = cpuinfo_field("model name") or platform.machine()  # platform.processor(): often ''
    return f"{name} (CPU, {torch.get_num_threads()} threads)"


# CPU flags of instructions that compute in bfloat16 natively (Linux's names in /proc/cpuinfo)
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_features(cpuinfo: str | None = None) -> dict:
    """The CPU's kind of vector instructions as torch's kernels use them (AVX512, AVX2, ...;
    torch.backends.cpu.get_cpu_capability) and its native bfloat16 instructions, if any: a
    training's last digits move with the instruction set, so a result carries it. cpuinfo:
    /proc/cpuinfo's text (read here where it is None; other systems list no flags)."""
    flags = set((cpuinfo_field("flags", cpuinfo) or "").split())
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_bf16": [flag for flag in BF16_FLAGS if flag in flags]}


def cpuinfo_field(key: str, cpuinfo: str | None = None) -> str | None:
    """The first `key : value` of /proc/cpuinfo (or of the text cpuinfo), or None."""
    text = proc_cpuinfo() if cpuinfo is None else cpuinfo
    return next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.split(":", 1)[0].strip() == key), None)


@functools.cache
def proc_cpuinfo() -> str:
    """/proc/cpuinfo's text, read once a process (Linux; '' elsewhere)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def peak_memory(device: torch.device) -> dict:
    """The run's peak memory in MB and what was measured: on CUDA the tensors' peak
    (torch.cuda.max_memory_allocated, the number that must fit the GPU); on the CPU the
    process's peak resident set (getrusage's ru_maxrss, KiB on Linux), Python and torch
    included, since the CPU allocator keeps no such count."""
    device = torch.device(device)
    if device.type == "cuda":
        return {"peak_memory_mb": round(torch.cuda.max_memory_allocated(device) / 2**20, 1),
                "peak_memory_of": "cuda max_memory_allocated"}
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_memory_mb": round(rss_kib / 1024, 1), "peak_memory_of": "process peak RSS"}
