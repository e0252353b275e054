"""Runs: one (recipe, model, seed) each, and the files of its folder, named in one place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nmt.core.errors import NmtError


def _in_folder(name: str) -> property:
    """A RunFiles property: the file `name` in the run's folder."""
    return property(lambda files: files.folder / name, doc=f"<run folder>/{name}")


@dataclass(frozen=True)
class RunFiles:
    """What a run folder holds; the one place its file names are spelled."""

    folder: Path

    # nmt train writes these four, only when training completes (train.json last).
    best = _in_folder("best.pt")  # the best validation loss's weights (or their average)
    last = _in_folder("last.pt")  # the last epoch's weights
    history = _in_folder("history.csv")  # one row an epoch
    summary = _in_folder("train.json")  # what the report reads about the training
    # An unfinished training's state (no stage's output; removed when training completes).
    resume = _in_folder("resume.pt")
    # nmt evaluate writes these.
    metrics = _in_folder("metrics.json")  # the numbers people compare
    evaluation = _in_folder("evaluation.json")  # what produced them
    translations = _in_folder("translations")  # <testset>.{greedy,beam}.txt, .loss.tsv
    attention = _in_folder("attention.json")  # one sentence's cross-attention
    # nmt bench --decoding writes this: ours against CTranslate2 on the run's weights.
    decoding = _in_folder("decoding.json")

    @property
    def trained(self) -> tuple[Path, ...]:
        """The training stage's outputs."""
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

    def dvc_stage(self, stage: str) -> str:
        """The DVC stage that runs `stage` for this run: evaluate@published-scratch-0."""
        return dvc_stage(stage, self.recipe, self.model, self.seed)

    @classmethod
    def parse(cls, name: str) -> Run:
        """The inverse of .name: 'tuned-scratch-s1' -> Run('tuned', 'scratch', 1)."""
        parts = name.rsplit("-", 2)
        if len(parts) != 3 or not parts[2].startswith("s") or not parts[2][1:].isdigit():
            raise NmtError(f"run {name!r} is not <recipe>-<model>-s<seed> "
                           "(fix: for example published-scratch-s0)")
        return cls(parts[0], parts[1], int(parts[2][1:]))


def dvc_stage(stage: str, *per) -> str:
    """The name dvc.yaml's matrix gives a stage's job for the values of its `per` dimensions
    (vocab@published, train@published-scratch-0), which the content records name."""
    return f"{stage}@{'-'.join(map(str, per))}"


def runs(params: dict) -> list[Run]:
    """Every run the pipeline makes: pipeline.recipes x pipeline.models x pipeline.seeds."""
    p = params["pipeline"]
    return [Run(r, m, s) for r in p["recipes"] for m in p["models"] for s in p["seeds"]]
