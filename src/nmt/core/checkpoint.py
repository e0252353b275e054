"""Self-describing checkpoints: the weights plus everything needed to rebuild the model.

A file that is damaged, foreign, of another run or of another vocabulary is refused with one
NmtError line, never a traceback from the unpickler. `load_trained` opens a trained run as
evaluate, export, translate and the decoding bench use it: its model, the vocabulary it was
trained with (checked against the checkpoint) and the checkpoint's record.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from nmt.core.codecs import load_codecs
from nmt.core.errors import NmtError
from nmt.core.files import atomic_path, failed_crc
from nmt.core.runs import Run
from nmt.models import MODELS, ModelConfig, build_model

# What `save` writes besides the extras, and the type each must have.
FIELDS = {"model": str, "recipe": str, "model_config": dict, "src_vocab_size": int,
          "tgt_vocab_size": int, "params": dict, "state_dict": dict}
RETRAIN = "re-run nmt train for that run, or point --checkpoint at a best.pt"


def save(path: Path, model: torch.nn.Module, *, name: str, recipe: str, cfg, src_vocab_size: int,
         tgt_vocab_size: int, params: dict, **extra) -> None:
    """Write atomically; plain types and tensors only, so it loads with weights_only=True."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    write_torch(path, {"model": name, "recipe": recipe, "model_config": asdict(cfg),
                       "src_vocab_size": src_vocab_size, "tgt_vocab_size": tgt_vocab_size,
                       "params": json.loads(json.dumps(params)),  # plain: weights_only loads it
                       "state_dict": state, **extra})


def write_torch(path: Path, obj) -> None:
    """torch.save to memory, then write the bytes atomically: equal objects give equal files
    (saved straight to a file, the archive records the temporary file's random name)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    with atomic_path(path) as tmp:
        tmp.write_bytes(buf.getvalue())


def foreign(path: Path, why: str) -> NmtError:
    return NmtError(f"{path} is not a checkpoint written by nmt train ({why}) (fix: {RETRAIN})")


def _why_unreadable(path: Path, head: bytes, e: Exception) -> str:
    """A short reason torch.load failed; never its advice to load with weights_only=False."""
    if head != b"PK\x03\x04":
        return "not a PyTorch zip archive"
    if not zipfile.is_zipfile(path):
        return "a truncated or damaged zip archive"
    if isinstance(e, pickle.UnpicklingError):
        return "it holds Python objects, not only tensors and plain data"
    first = str(e).strip().split("\n")[0].split(". ")[0][:120]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def read(path: Path) -> dict:
    """The checkpoint dict, its fields checked; a damaged or foreign file is an NmtError."""
    path = Path(path)
    if not path.is_file():
        raise NmtError(f"{path} not found (fix: train that run first: nmt train ...)")
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise NmtError(f"{path} cannot be read ({e.strerror}) (fix: check that file)") from None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # arbitrary bytes make torch.load raise almost anything
        raise foreign(path, _why_unreadable(path, head, e)) from None
    check_crc(path)
    if not isinstance(ckpt, dict):
        raise foreign(path, f"it holds a {type(ckpt).__name__}, not a dict")
    missing = [k for k in FIELDS if k not in ckpt]
    if missing:
        raise foreign(path, f"no {', '.join(missing)}")
    wrong = [k for k, kind in FIELDS.items() if not isinstance(ckpt[k], kind)]
    if wrong:
        raise foreign(path, f"{', '.join(wrong)} of the wrong type")
    return ckpt


def check_crc(path: Path) -> None:
    """Every member's bytes match the CRC-32 the archive recorded (files.failed_crc): a
    weight with a changed byte would load as a slightly different model."""
    bad = failed_crc(path)
    if bad is None:
        return
    try:
        stage = f"`dvc repro -f -s {Run.parse(Path(path).parent.name).dvc_stage('train')}`"
    except NmtError:  # not in a run's folder
        stage = "re-run the training that wrote it"
    raise NmtError(f"{path} is damaged: its member {bad} fails the CRC-32 check the archive "
                   f"recorded (fix: {stage}, or delete it and run snakemake again)")


def describe(model: str, recipe: str, seed) -> str:
    return f"a {model} model of recipe {recipe}" + ("" if seed is None else f", seed {seed}")


def check_run(path: Path, ckpt: dict, expect: Run) -> None:
    """The checkpoint must be of the run that asks for it (seed only where it is recorded)."""
    seed = ckpt.get("seed")
    if (ckpt["model"], ckpt["recipe"]) == (expect.model, expect.recipe) and seed in (
            None, expect.seed):
        return
    held = describe(ckpt["model"], ckpt["recipe"], seed)
    wanted = describe(expect.model, expect.recipe, None if seed is None else expect.seed)
    raise NmtError(f"{path} holds {held}, expected {wanted} (fix: re-run `nmt train --recipe "
                   f"{expect.recipe} --model {expect.model} --seed {expect.seed}`, or put that "
                   "run's own best.pt there)")


# train: keys that say where a run trained, how its arithmetic ran and how often it kept its
# state, not what it learnt (precision, like compile and CUDA graphs, moves rounding only;
# evaluate may score a model in another precision to measure exactly that).
PLACEMENT = ("device", "precision", "compile", "cuda_graphs", "save_every_minutes")
# train: keys added after runs were trained, with what those runs did: they read the value here.
TRAIN_BEFORE_KEYS = {"attention_kernels": "route"}  # NMT_ATTENTION_KERNELS, as route reads it


def setting_differences(ckpt: dict, settings: dict) -> list[str]:
    """`section.key (trained A, now B)` for each setting that differs between the checkpoint and
    a resolved recipe: the model it builds (model_config), and the train section it records
    (other epochs, lr or batching give other weights: a wrong result for that run as much as
    another size). A section the checkpoint does not record is not compared."""
    now = {"model": asdict(ModelConfig.from_dict(settings["model"]))}
    trained = {"model": ckpt["model_config"]}
    if isinstance(ckpt["params"].get("train"), dict):
        now["train"] = {k: v for k, v in settings["train"].items() if k not in PLACEMENT}
        trained["train"] = {k: v for k, v in (TRAIN_BEFORE_KEYS | ckpt["params"]["train"]).items()
                            if k not in PLACEMENT}
    out = []
    for section, values in now.items():
        for key in sorted(values.keys() | trained[section].keys()):
            a, b = trained[section].get(key), values.get(key)
            if json.dumps(a) != json.dumps(b):  # a tuple and the list it was saved as agree
                out.append(f"{section}.{key} (trained {a}, now {b})")
    return out


def check_trained_with(path: Path, ckpt: dict, settings: dict, run: Run) -> None:
    """The checkpoint must have been trained with the settings its run's recipe resolves to."""
    changed = setting_differences(ckpt, settings)
    if changed:
        raise NmtError(f"{path} was trained with other settings than recipe {run.recipe} has "
                       f"now: {', '.join(changed)} (fix: re-run `nmt train --recipe {run.recipe} "
                       f"--model {run.model} --seed {run.seed}`, or restore those settings in "
                       "params.yaml)")


def build(path: Path, ckpt: dict) -> torch.nn.Module:
    """The model the checkpoint describes, its weights loaded; checked key by key and shape."""
    if ckpt["model"] not in MODELS:
        raise foreign(path, f"unknown model {ckpt['model']!r}")
    try:
        cfg = ModelConfig.from_dict(ckpt["model_config"])
        model = build_model(ckpt["model"], cfg, ckpt["src_vocab_size"], ckpt["tgt_vocab_size"])
    except (NmtError, TypeError, ValueError) as e:
        raise foreign(path, f"its model_config does not build: {str(e).split(' (fix:')[0]}"
                      ) from None
    want, have = model.state_dict(), ckpt["state_dict"]
    missing, unexpected = sorted(want.keys() - have.keys()), sorted(have.keys() - want.keys())
    if missing or unexpected:
        names = (missing or unexpected)[:2]
        raise foreign(path, f"{len(missing)} weights missing and {len(unexpected)} unexpected "
                            f"for a {ckpt['model']} model, e.g. {', '.join(names)}")
    for k, v in want.items():
        if not isinstance(have[k], torch.Tensor) or have[k].shape != v.shape:
            got = (tuple(have[k].shape) if isinstance(have[k], torch.Tensor)
                   else f"a {type(have[k]).__name__}")
            raise foreign(path, f"weight {k} is {got}, the model_config needs {tuple(v.shape)}")
    try:
        model.load_state_dict(have)
    except (RuntimeError, TypeError) as e:
        first = str(e).strip().split("\n")[0]
        raise foreign(path, f"its weights do not load: {first}") from None
    return model


def load(path: Path, device: torch.device | str = "cpu", expect: Run | None = None,
         settings: dict | None = None):
    """(model in eval mode on device, checkpoint dict) from a file written by `save`.

    With `expect`, the checkpoint must be of that run's model and recipe (and seed, where the
    checkpoint records one); with `settings` too (the run's resolved recipe), trained with them.
    """
    path = Path(path)
    ckpt = read(path)
    if expect is not None:
        check_run(path, ckpt, expect)
        if settings is not None:
            check_trained_with(path, ckpt, settings, expect)
    return build(path, ckpt).to(device).eval(), ckpt


VOCAB_FILES = {"word": ("src.json", "tgt.json"), "bpe": ("spm.model",)}


def vocab_fingerprint(vocab_dir: Path) -> str:
    """sha256 over a vocabulary folder's files (meta.json and what its kind reads), by name."""
    vocab_dir = Path(vocab_dir)
    fix = f"(fix: run `nmt vocab` to rebuild {vocab_dir})"
    try:
        kind = json.loads((vocab_dir / "meta.json").read_bytes())["kind"]
        names = ("meta.json", *VOCAB_FILES[kind])
    except (OSError, ValueError, KeyError, TypeError):
        raise NmtError(f"{vocab_dir}/meta.json is missing or damaged {fix}") from None
    digest = hashlib.sha256()
    for name in names:
        if not (vocab_dir / name).is_file():
            raise NmtError(f"{vocab_dir}/{name} is missing {fix}")
        data = (vocab_dir / name).read_bytes()
        digest.update(f"{name}\0{len(data)}\0".encode())  # framed: no two folders collide
        digest.update(data)
    return digest.hexdigest()


def check_vocab(ckpt: dict, src_codec, tgt_codec, vocab_dir: Path) -> None:
    """The vocabulary on disk must be the one the checkpoint was trained with.

    Sizes always; the exact files when the checkpoint records their fingerprint (vocab_sha256).
    """
    sizes = (len(src_codec), len(tgt_codec))
    if sizes != (ckpt["src_vocab_size"], ckpt["tgt_vocab_size"]):
        raise NmtError(f"{vocab_dir} has {sizes[0]}/{sizes[1]} source/target tokens, the "
                       f"checkpoint {ckpt['src_vocab_size']}/{ckpt['tgt_vocab_size']} "
                       "(fix: re-run `nmt train` after changing the vocabulary)")
    recorded = ckpt.get("vocab_sha256")
    if recorded is not None and recorded != vocab_fingerprint(vocab_dir):
        raise NmtError(f"{vocab_dir} has the checkpoint's sizes but not its tokens (its files "
                       "changed since training) (fix: re-run `nmt train` after changing the "
                       "vocabulary, or point --vocab at the one it was trained with)")


@dataclass(frozen=True)
class TrainedRun:
    """A trained run, opened for use: its model and the vocabulary it was trained with."""

    model: torch.nn.Module  # in eval mode, on the device asked for
    checkpoint: dict  # what the file records: model, recipe, model_config, params, seed, ...
    src_codec: object  # source text <-> ids (nmt.core.codecs)
    tgt_codec: object  # target ids <-> text

    @property
    def codecs(self) -> tuple:
        return self.src_codec, self.tgt_codec

    @property
    def config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.checkpoint["model_config"])

    @property
    def max_len(self) -> int:
        """The model's positions: inputs are cut to it, outputs to one fewer."""
        return self.checkpoint["model_config"]["max_len"]


def load_trained(path: Path, vocab: Path | Callable[[str], Path],
                 device: torch.device | str = "cpu", expect: Run | None = None,
                 settings: dict | None = None) -> TrainedRun:
    """The run whose checkpoint is at `path` (`load`, with `expect` and `settings` as it takes
    them), and its codecs from `vocab`: the vocabulary folder, or a function from the
    checkpoint's recipe to it (where only the file says whose run it is). The vocabulary must
    be the one the checkpoint was trained with (check_vocab)."""
    model, ckpt = load(path, device, expect=expect, settings=settings)
    vocab_dir = Path(vocab(ckpt["recipe"]) if callable(vocab) else vocab)
    src_codec, tgt_codec = load_codecs(vocab_dir)
    check_vocab(ckpt, src_codec, tgt_codec, vocab_dir)
    return TrainedRun(model, ckpt, src_codec, tgt_codec)
