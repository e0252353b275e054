"""Model FLOPs utilisation (MFU): the FLOPs of the timed training steps, and the peaks they are
a share of: on CUDA the GPU's dense bf16 peak from its data sheet; on the CPU the machine's
own, measured by a short calibration (the fastest of a few large matrix products, in fp32 and
in bf16).
"""

from __future__ import annotations

import time

import torch

from nmt.core.codecs import PAD_ID
from nmt.models import ModelConfig
from nmt.stages.bench.timing import sync

# Dense bf16 tensor-core peaks of GPUs (FLOP/s, data sheets), for MFU on CUDA.
BF16_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12}
# The CPU's calibration: the fastest of the products of two square matrices of this size
# (2 x 2048^3 = 17 GFLOP each: 55-70 ms in fp32 and 9-17 ms in bf16 on 2 cores with AMX)
# repeated for CALIBRATION_SECONDS (5 at least; smaller where a precision is too slow for
# them: calibration_size). On this repository's 2-core VM the best
# of one calibration varied between processes: 179-322 GFLOP/s fp32, 844-2,150 bf16.
CALIBRATION_SIZE, CALIBRATION_SECONDS = 2048, 0.5
MIN_CALIBRATION_SIZE = 256  # where a slow precision's products start (calibration_size)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def peak_flops(device: torch.device) -> dict:
    """The peaks MFU is taken of, in FLOP/s by precision: a GPU's dense bf16 peak from its data
    sheet (none for a GPU the table lacks); on the CPU each precision's measured matmul_peak."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = next((v for k, v in BF16_PEAK.items() if k in name), None)
        return {"bf16": peak} if peak else {}
    return {precision: matmul_peak(dtype, device) for precision, dtype in DTYPES.items()}


@torch.inference_mode()
def matmul_peak(dtype: torch.dtype, device: torch.device, size: int = CALIBRATION_SIZE,
                seconds: float = CALIBRATION_SECONDS) -> float:
    """FLOP/s of the fastest product of two n x n matrices in dtype, of those `seconds` allow
    (5 at least), on this process's threads: what the machine's matrix units give. n is
    calibration_size's: `size`, or less where products of it would not fit `seconds`."""
    n = calibration_size(dtype, device, size, seconds)
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    times: list[float] = []
    while len(times) < 5 or sum(times) < seconds:
        times.append(product_seconds(a, b, device))
    return 2 * n**3 / min(times)


def calibration_size(dtype: torch.dtype, device: torch.device, size: int = CALIBRATION_SIZE,
                     seconds: float = CALIBRATION_SECONDS) -> int:
    """The side of matmul_peak's matrices: doubled from MIN_CALIBRATION_SIZE up to `size` while
    one product of the next size (8 times the work) fits `seconds`. bf16 on a CPU without bf16
    instructions (an AVX2 AMD EPYC) took 0.8 s at 512 and so about a minute a product at
    2048, where AMX takes 9-17 ms: six such products a peak, two peaks a bench, 10 minutes."""
    n = MIN_CALIBRATION_SIZE
    while n < size:
        a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
        if product_seconds(a, b, device) * 8 > seconds:  # its first: an upper bound
            break
        n *= 2
    return min(n, size)


def product_seconds(a: torch.Tensor, b: torch.Tensor, device: torch.device) -> float:
    """Seconds of one product a @ b, the device synchronized before and after."""
    sync(device)
    start = time.perf_counter()
    a @ b
    sync(device)
    return time.perf_counter() - start


def train_flops(cfg: ModelConfig, tgt_vocab_size: int, batches) -> float:
    """Model FLOPs of one pass of an encoder-decoder over batches (forward and backward): 6 x
    the weights each real token passes through, + attention's products. A source token passes
    through the encoder and each decoder layer's cross-attention keys and values; a target
    token through the decoder's other projections, its FFNs and the generator."""
    d, ff = cfg.d_model, cfg.dim_feedforward
    per_source = (cfg.num_encoder_layers * (4 * d * d + 2 * d * ff)  # attention + FFN
                  + cfg.num_decoder_layers * 2 * d * d)  # cross-attention keys and values
    per_target = (cfg.num_decoder_layers * (6 * d * d + 2 * d * ff)  # self: 4, cross: 2 d*d
                  + tgt_vocab_size * d)  # the generator
    total = 0.0
    for src, tgt in batches:
        s, t = (src != PAD_ID).sum().item(), (tgt[:, 1:] != PAD_ID).sum().item()
        S, T = src.shape[1], tgt.shape[1] - 1
        # QK^T and AV: 2 matmuls x 2 FLOPs x 3 (forward + backward) = 12 per (query, key, dim).
        attn = 12 * d * (cfg.num_encoder_layers * s * S + cfg.num_decoder_layers * t * (T + S))
        total += 6 * (per_source * s + per_target * t) + attn
    return total
