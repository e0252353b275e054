"""Position-wise feed-forward network (paper section 3.3)."""

import torch
import torch.nn as nn

from nmt.models.scratch.dropout import Dropout


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, eq. (2), with dropout after the ReLU."""

    def __init__(self, d_model: int, dim_feedforward: int, dropout: float):
        super().__init__()
        self.w1 = nn.Linear(d_model, dim_feedforward)
        self.w2 = nn.Linear(dim_feedforward, d_model)
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.dropout(self.w1(x).relu()))  # (B, T, D)
