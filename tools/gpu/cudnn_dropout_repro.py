"""Does cuDNN's scaled_dot_product_attention use its forward's dropout mask in backward?
Run: `python cudnn_dropout_repro.py [cudnn | math]`. With value = identity (keys = head dim),
the forward's output is the attention matrix after dropout and its 1/(1-p) scale, so the mask
the kernel drew is read from outside it (a dropped weight is an exact zero). Float64 math with
that mask gives the reference output and q, k, v gradients. Two calls at one shape test "right
on first use at a shape, wrong after". Exit 1 on a FAIL; 0 when all pass, or with one SKIP line
without CUDA or cuDNN attention. `math`: the same checks of the math backend (on the CPU without
CUDA), a control of the method. Imports torch only.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

B, H, S, P = 4, 8, 64, 0.1  # batch, heads, queries = keys = head dim, dropout probability


def reference(q, k, v, keep, scale):
    """Attention in float64 with a given keep mask: softmax, times keep / (1 - p), times v."""
    q, k, v = (x.detach().double().requires_grad_() for x in (q, k, v))
    weights = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
    return (weights * keep / (1 - P)) @ v, (q, k, v)


def check(call: int, backend, device: str, dtype) -> bool:
    """One call of the backend against the reference; True when a check failed."""
    q, k = (torch.randn(B, H, S, S, device=device, dtype=dtype, requires_grad=True) for _ in "qk")
    v = torch.eye(S, device=device, dtype=dtype).expand(B, H, S, S).clone().requires_grad_()
    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=P)
    upstream = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), upstream)
    keep = (out.detach() != 0).double()  # softmax weights are > 0: a zero was dropped
    ref, leaves = reference(q, k, v, keep, S ** -0.5)
    ref_grads = torch.autograd.grad(ref, leaves, upstream.double())
    rate = keep.mean().item()
    failed = abs(rate - (1 - P)) > 0.005  # 131,072 weights: sigma 0.0008 around 1 - p
    print(f"call {call} keep rate: {'FAIL' if failed else 'PASS'} {rate:.4f} (1 - p = {1 - P})")
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref, *ref_grads),
                               strict=True):
        error, bound = (got.double() - want).abs().max().item(), 0.02 * want.abs().max().item()
        failed |= not error <= bound  # the bound: half-precision rounding, 2% of the largest
        print(f"call {call} {name}: {'PASS' if error <= bound else 'FAIL'} max abs error "
              f"{error:.3g} (bound {bound:.3g})")
    return failed


def main() -> int:
    name = (sys.argv[1:] or ["cudnn"])[0]
    if name not in ("cudnn", "math"):
        print(f"usage: {sys.argv[0]} [cudnn | math], not {name!r}")
        return 2
    cuda = torch.cuda.is_available()
    backend = getattr(SDPBackend, "CUDNN_ATTENTION" if name == "cudnn" else "MATH", None)
    skip = ("no CUDA device, so no cuDNN attention" if name == "cudnn" and not cuda else
            "this torch has no cuDNN attention backend" if backend is None else None)
    if skip:
        print(f"SKIP: {skip} (torch {torch.__version__})")
        return 0
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
          f"{torch.backends.cudnn.version() if cuda else None}, GPU "
          f"{torch.cuda.get_device_name() if cuda else None}; backend {name}, p = {P}")
    device, dtype = ("cuda", torch.float16) if cuda else ("cpu", torch.float32)
    torch.manual_seed(0)
    try:
        failed = [check(call, backend, device, dtype) for call in (1, 2)]  # the same shape
    except RuntimeError as err:
        if "no available kernel" not in str(err).lower():
            raise
        print(f"SKIP: {name} attention refuses these inputs here: {str(err).splitlines()[0]}")
        return 0
    first, second = ("FAIL" if f else "PASS" for f in failed)
    print(f"{'FAIL' if any(failed) else 'PASS'}: {name}, call 1 {first}, call 2 {second}")
    return 1 if any(failed) else 0


if __name__ == "__main__":
    sys.exit(main())
