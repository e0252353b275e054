"""Layer normalization written out (Ba et al. 2016), with nn.LayerNorm's exact definition."""

import torch
import torch.nn as nn


class LayerNorm(nn.Module):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the last dimension.

    var is the biased variance (divided by D, not D - 1) and eps sits inside the square root,
    as in nn.LayerNorm. The common variant weight * (x - mean) / (x.std() + eps) + bias uses
    the unbiased std and eps outside the root: a different function (see the tests).
    """

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)  # (B, T, 1)
        var = (x - mean).pow(2).mean(dim=-1, keepdim=True)  # biased: / D
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias
