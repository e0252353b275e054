"""Self-describing checkpoints: the weights plus everything needed to rebuild the model."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from nmt.config import NmtError
from nmt.files import atomic_path


def pick_device(name: str = "auto") -> torch.device:
    """`auto`: CUDA when present, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise NmtError(f"device {name!r} asked for, but no CUDA GPU is visible (fix: device: auto)")
    return torch.device(name)


def save(path: Path, model: torch.nn.Module, *, name: str, recipe: str, cfg, src_vocab_size: int,
         tgt_vocab_size: int, params: dict, **extra) -> None:
    """Write atomically; plain types and tensors only, so it loads with weights_only=True."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    with atomic_path(path) as tmp:
        torch.save({"model": name, "recipe": recipe, "model_config": asdict(cfg),
                    "src_vocab_size": src_vocab_size, "tgt_vocab_size": tgt_vocab_size,
                    "params": params, "state_dict": state, **extra}, tmp)


def load(path: Path, device: torch.device | str = "cpu"):
    """(model in eval mode on device, checkpoint dict) from a file written by `save`."""
    from nmt.models import ModelConfig, build_model

    path = Path(path)
    if not path.is_file():
        raise NmtError(f"{path} not found (fix: train that run first: nmt train ...)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        model = build_model(ckpt["model"], ModelConfig(**ckpt["model_config"]),
                            ckpt["src_vocab_size"], ckpt["tgt_vocab_size"])
        model.load_state_dict(ckpt["state_dict"])
    except (RuntimeError, KeyError, EOFError, ValueError) as e:
        raise NmtError(f"{path} is not a usable checkpoint ({e}) (fix: re-run nmt train)") from None
    return model.to(device).eval(), ckpt
