"""What a command read: every params key, and the `nmt` modules it loaded.

A debug feature, and what the stage-contract tests stand on: with NMT_TRACK_READS=FILE, `nmt`
(nmt.cli.reads_recorded) wraps params.yaml in `Tracked`, and when the command ends appends
{stage, params, recipe_params, modules} to FILE as one JSON line (`recorded`). The tests
compare each line with what workflow/stages.yaml declares and what its code derives to; by
hand, it shows what a stage really reads (docs/testing.md). Unset, nothing here is imported.
"""

from __future__ import annotations

import contextlib
import copy
import json
import sys
from pathlib import Path

import yaml

from nmt.pipeline.recipes import resolve


class Tracked(dict):
    """A params mapping that records the path of every value read from it. Sub-sections come
    back tracked too; `ns` names the file the keys belong to: params.yaml (`params`) or a
    resolved recipe (`recipe`)."""

    def __init__(self, data: dict, reads: set, ns: str = "params", prefix: str = ""):
        super().__init__(data)
        self.reads, self.ns, self.prefix = reads, ns, prefix

    def _wrap(self, key, value):
        path = f"{self.prefix}{key}"
        if isinstance(value, dict):
            return Tracked(value, self.reads, self.ns, path + ".")
        self.reads.add((self.ns, path))
        return value

    def __getitem__(self, key):
        return self._wrap(key, super().__getitem__(key))

    def get(self, key, default=None):
        return self[key] if key in self else default

    def __iter__(self):  # iteration goes through here: {**t}, dict(t) and json see reads
        return iter(list(super().keys()))

    def items(self):
        return [(k, self[k]) for k in super().keys()]

    def values(self):
        return [self[k] for k in super().keys()]

    def plain(self) -> dict:
        """The data without recording reads."""
        return copy.deepcopy(dict(super().items()))


@resolve.register
def _(params: Tracked, recipe: str) -> Tracked:
    """nmt.pipeline.recipes.resolve of a tracked view: resolving reads nothing; the recipe's
    keys, read later, are recorded as keys of params/<recipe>.yaml."""
    return Tracked(resolve(params.plain(), recipe), params.reads, ns="recipe")


def start_tracking(params: dict, reads: set) -> Tracked:
    """params as a Tracked view recording into `reads`; yaml.safe_dump of a tracked section
    then writes (and so reads) every key under it, sorted like any other mapping."""
    yaml.SafeDumper.add_representer(
        Tracked, lambda dumper, data: dumper.represent_dict(dict(data.items())))
    return Tracked(params, reads)


@contextlib.contextmanager
def recorded(path: Path, command: str, model: str | None = None):
    """Around one `nmt` command (of `model`'s run, where it has one): yields what wraps its
    params.yaml (start_tracking); at its end, failed or not, appends what it read to `path`
    as one JSON line."""
    reads = set()
    try:
        yield lambda params: start_tracking(params, reads)
    finally:
        modules = sorted(m for m in sys.modules if (m == "nmt" or m.startswith("nmt."))
                         and m != __name__)  # the recording itself is no stage's code
        line = {"stage": command, "model": model, "modules": modules,
                "params": sorted(k for ns, k in reads if ns == "params"),
                "recipe_params": sorted(k for ns, k in reads if ns == "recipe")}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")
