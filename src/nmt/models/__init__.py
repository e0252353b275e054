"""The two models behind one interface: build_model("baseline" | "scratch", cfg, ...).

Both take src (B, S) and tgt_in (B, T) token ids and derive their masks from pad_id:
forward -> logits (B, T, V); encode(src) -> memory (B, S, D); decode(tgt_in, memory, src);
init_cache(memory, src) and decode_step(cache, tokens (B,)) -> logits (B, V) for search,
with cache.reorder(index) for beam search; attention_maps(src, tgt_in) -> per-head weights
of every layer.
"""

from dataclasses import asdict, dataclass, fields

import torch.nn as nn

from nmt.models.baseline import BaselineTransformer
from nmt.models.scratch import ScratchTransformer

MODEL_NAMES = ("baseline", "scratch")


@dataclass
class ModelConfig:
    """Architecture settings: params.yaml's `model:` section."""

    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    d_model: int = 512
    nhead: int = 8
    dim_feedforward: int = 2048
    dropout: float = 0.1
    tie_embeddings: bool = False  # share source, target and generator weights (one vocabulary)
    max_len: int = 256  # positions the sinusoid table covers

    def __post_init__(self):
        for name in ("num_encoder_layers", "num_decoder_layers", "d_model", "nhead",
                     "dim_feedforward", "max_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model.{name} must be a positive integer, got {value!r}")
        if self.d_model % self.nhead:
            fit = max(h for h in range(1, self.nhead) if self.d_model % h == 0)
            raise ValueError(f"model.d_model={self.d_model} is not divisible by "
                             f"model.nhead={self.nhead}; set nhead to a divisor of d_model "
                             f"(e.g. {fit}) or d_model to a multiple of nhead")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout!r}")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"model.tie_embeddings must be true or false, "
                             f"got {self.tie_embeddings!r}")

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """From a mapping such as params['model']; unknown keys are an error, not ignored."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ValueError(f"unknown model settings {unknown}; known: {', '.join(known)}")
        return cls(**d)


def build_model(name: str, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                pad_id: int = 1) -> nn.Module:
    """A freshly initialised "baseline" or "scratch" model."""
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    cls = BaselineTransformer if name == "baseline" else ScratchTransformer
    return cls(src_vocab_size, tgt_vocab_size, pad_id=pad_id, **asdict(cfg))


__all__ = ["MODEL_NAMES", "BaselineTransformer", "ModelConfig", "ScratchTransformer",
           "build_model"]
