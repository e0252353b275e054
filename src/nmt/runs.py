"""Runs: one (recipe, model, seed) each, and the files of its folder, named in one place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nmt.errors import NmtError

# The models a run can train, torch-free for the CLI and the schema (nmt.models.MODELS builds
# each; a test checks the two lists agree).
MODEL_NAMES = ("baseline", "scratch", "decoder_only")


@dataclass(frozen=True)
class RunFiles:
    """What a run folder holds: train writes the first four, evaluate the rest."""

    folder: Path

    @property
    def best(self) -> Path:
        """The weights of the best validation loss (or their average): what evaluate reads."""
        return self.folder / "best.pt"

    @property
    def last(self) -> Path:
        return self.folder / "last.pt"

    @property
    def history(self) -> Path:
        """history.csv: one row an epoch."""
        return self.folder / "history.csv"

    @property
    def summary(self) -> Path:
        """train.json: what the report reads about the training (written last)."""
        return self.folder / "train.json"

    @property
    def resume(self) -> Path:
        """resume.pt: an unfinished training's state (no stage's output)."""
        return self.folder / "resume.pt"

    @property
    def metrics(self) -> Path:
        return self.folder / "metrics.json"

    @property
    def evaluation(self) -> Path:
        return self.folder / "evaluation.json"

    @property
    def translations(self) -> Path:
        return self.folder / "translations"

    @property
    def attention(self) -> Path:
        return self.folder / "attention.json"

    @property
    def trained(self) -> tuple[Path, ...]:
        """The training stage's outputs, all written only when training completes."""
        return (self.best, self.last, self.history, self.summary)


@dataclass(frozen=True)
class Run:
    """One training run: a (recipe, model, seed); the one place that names its folder."""

    recipe: str
    model: str
    seed: int = 0

    @property
    def name(self) -> str:
        return f"{self.recipe}-{self.model}-s{self.seed}"

    def dir(self, results: str | Path = "results") -> Path:
        """results/<recipe>-<model>-s<seed>/: checkpoints, history, metrics, translations."""
        return Path(results) / self.name

    def files(self, results: str | Path = "results") -> RunFiles:
        return RunFiles(self.dir(results))

    @classmethod
    def parse(cls, name: str) -> Run:
        """The inverse of .name: 'tuned-scratch-s1' -> Run('tuned', 'scratch', 1)."""
        parts = name.rsplit("-", 2)
        if len(parts) != 3 or not parts[2].startswith("s") or not parts[2][1:].isdigit():
            raise NmtError(f"run {name!r} is not <recipe>-<model>-s<seed> "
                           "(fix: for example published-scratch-s0)")
        return cls(parts[0], parts[1], int(parts[2][1:]))


def runs(params: dict) -> list[Run]:
    """Every run the pipeline makes: pipeline.recipes x pipeline.models x pipeline.seeds."""
    p = params["pipeline"]
    return [Run(r, m, s) for r in p["recipes"] for m in p["models"] for s in p["seeds"]]
