"""Position-wise feed-forward network: the encoder-decoder's block, FFN(x) = max(0, x W1 + b1)
W2 + b2 with dropout after the ReLU (nmt/models/scratch/feed_forward.py), used as it is."""

from nmt.models.scratch.feed_forward import FeedForward

__all__ = ["FeedForward"]
