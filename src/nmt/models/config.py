"""The architecture settings every model is built from (params.yaml's `model:` section)."""

from __future__ import annotations

from dataclasses import dataclass, fields

POSITIONS = ("sinusoidal", "rotary")


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the Transformer; the defaults are the published base model (6+6 layers, 512).

    The pipeline checks params.yaml's values against its schema before building one; this
    class checks what a schema cannot (d_model divisible by nhead, even heads for rotary) and,
    for notebooks, the one choice that would otherwise be silently ignored (positions).
    """

    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    d_model: int = 512
    nhead: int = 8
    dim_feedforward: int = 2048
    dropout: float = 0.1
    tie_embeddings: bool = False  # share source, target and generator weights (one vocabulary)
    # encoder-decoder models: LayerNorm before each sublayer (pre-norm, as nn.Transformer's
    # norm_first) instead of after the residual sum; decoder_only is always pre-norm
    norm_first: bool = False
    max_len: int = 256  # positions the sinusoid table covers
    # decoder_only: layers of its one stack (0: as many as match the encoder-decoder's size)
    decoder_only_layers: int = 0
    attention: str = "prefix"  # decoder_only over the source: prefix (bidirectional) | causal
    # scratch: sinusoids added to the embeddings (as nn.Transformer's tutorial) | rotary (queries
    # and keys rotated in self-attention; no twin in PyTorch, so verify checks its properties)
    positions: str = "sinusoidal"

    def __post_init__(self):
        if self.d_model % self.nhead:
            raise ValueError(f"d_model {self.d_model} is not divisible by nhead {self.nhead} "
                             "(fix: make d_model a multiple of nhead)")
        if self.positions not in POSITIONS:
            raise ValueError(f"unknown positions {self.positions!r} (fix: one of "
                             f"{', '.join(POSITIONS)})")
        if self.positions == "rotary" and (self.d_model // self.nhead) % 2:
            raise ValueError(f"rotary positions rotate pairs of features, and a head has "
                             f"{self.d_model // self.nhead} (fix: an even d_model / nhead)")

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        """From a mapping such as params['model']; unknown keys are an error, not ignored."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ValueError(f"unknown model settings {unknown} (fix: use only "
                             f"{', '.join(known)})")
        return cls(**d)
