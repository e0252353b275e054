"""Multi-head self-attention over the packed sequence, with a key/value cache.

The same block as the encoder-decoder's (nmt/models/scratch/attention.py: one packed Q/K/V
projection, a fused path and an explicit math path that returns weights); here one stack
attends over source and target at once, and decoding appends each new position's keys and
values. The model builds the boolean masks (prefix or causal; True where a query may attend a
key) and hands the stack their additive bias (nmt.models.masks), broadcast to
(B, H, T_query, T_key).
"""

import torch

from nmt.models.scratch.attention import MultiHeadAttention


class SelfAttention(MultiHeadAttention):
    """Self-attention of new positions over earlier (cached) and new ones."""

    def forward(self, x, mask, past_kv=None, need_weights: bool = False):
        """x (B, T, D) new positions; past_kv: keys, values (B, H, t, Dh) of earlier ones.
        Returns (B, T, D), the keys and values of past and new positions, the weights."""
        q, k, v = self.project_self(x)  # (B, H, T, Dh) each
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
        y, weights = self.attend(q, k, v, mask, need_weights)
        return y, (k, v), weights
