"""Self-describing checkpoints: the weights plus everything needed to rebuild the model."""

from __future__ import annotations

import io
from dataclasses import asdict
from pathlib import Path

import torch

from nmt.config import ModelConfig, NmtError
from nmt.files import atomic_path


def save(path: Path, model: torch.nn.Module, *, name: str, recipe: str, cfg, src_vocab_size: int,
         tgt_vocab_size: int, params: dict, **extra) -> None:
    """Write atomically; plain types and tensors only, so it loads with weights_only=True."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    write_torch(path, {"model": name, "recipe": recipe, "model_config": asdict(cfg),
                       "src_vocab_size": src_vocab_size, "tgt_vocab_size": tgt_vocab_size,
                       "params": params, "state_dict": state, **extra})


def write_torch(path: Path, obj) -> None:
    """torch.save to memory, then write the bytes atomically: equal objects give equal files
    (saved straight to a file, the archive records the temporary file's random name)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    with atomic_path(path) as tmp:
        tmp.write_bytes(buf.getvalue())


def load(path: Path, device: torch.device | str = "cpu"):
    """(model in eval mode on device, checkpoint dict) from a file written by `save`."""
    from nmt.models import build_model

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


def check_vocab(ckpt: dict, src_codec, tgt_codec, vocab_dir: Path) -> None:
    """The vocabulary on disk must be the one the checkpoint was trained with."""
    sizes = (len(src_codec), len(tgt_codec))
    if sizes != (ckpt["src_vocab_size"], ckpt["tgt_vocab_size"]):
        raise NmtError(f"{vocab_dir} has {sizes[0]}/{sizes[1]} source/target tokens, the "
                       f"checkpoint {ckpt['src_vocab_size']}/{ckpt['tgt_vocab_size']} "
                       "(fix: re-run `nmt train` after changing the vocabulary)")
