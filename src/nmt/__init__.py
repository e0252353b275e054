"""A Transformer written from scratch, compared with torch.nn.Transformer on Multi30k de->en."""

__version__ = "0.1.0"
