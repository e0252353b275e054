"""params.yaml: load, validate against the JSON schema, resolve recipes, name run folders."""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMA_PATH = Path("workflow/schemas/params.schema.yaml")
RECIPE_SECTIONS = ("vocab", "model", "train", "evaluate")
MODEL_NAMES = ("baseline", "scratch", "decoder_only")  # nmt.models.MODELS builds each


class NmtError(ValueError):
    """A problem the user can fix; the CLI prints it as one line and exits non-zero."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture settings: params.yaml's `model:` section, checked once, here."""

    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    d_model: int = 512
    nhead: int = 8
    dim_feedforward: int = 2048
    dropout: float = 0.1
    tie_embeddings: bool = False  # share source, target and generator weights (one vocabulary)
    max_len: int = 256  # positions the sinusoid table covers
    # decoder_only: layers of its one stack (0: as many as match the encoder-decoder's size)
    decoder_only_layers: int = 0
    attention: str = "prefix"  # decoder_only over the source: prefix (bidirectional) | causal

    def __post_init__(self):
        for name in ("num_encoder_layers", "num_decoder_layers", "d_model", "nhead",
                     "dim_feedforward", "max_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise NmtError(f"model.{name} must be a positive integer, got {value!r} "
                               "(fix: set a whole number >= 1)")
        if self.d_model % self.nhead:
            raise NmtError(f"d_model {self.d_model} is not divisible by nhead {self.nhead} "
                           "(fix: make d_model a multiple of nhead)")
        if not 0.0 <= self.dropout < 1.0:
            raise NmtError(f"model.dropout must be in [0, 1), got {self.dropout!r} "
                           "(fix: 0.1 is the usual value)")
        if not isinstance(self.tie_embeddings, bool):
            raise NmtError(f"model.tie_embeddings must be true or false, "
                           f"got {self.tie_embeddings!r} (fix: true or false)")
        if isinstance(self.decoder_only_layers, bool) or not isinstance(
                self.decoder_only_layers, int) or self.decoder_only_layers < 0:
            raise NmtError(f"model.decoder_only_layers must be 0 (derived) or more, got "
                           f"{self.decoder_only_layers!r} (fix: 0)")
        if self.attention not in ("prefix", "causal"):
            raise NmtError(f"model.attention {self.attention!r} is not allowed "
                           "(fix: prefix or causal)")

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        """From a mapping such as params['model']; unknown keys are an error, not ignored."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise NmtError(f"unknown model settings {unknown} (fix: use only {', '.join(known)})")
        return cls(**d)


def find_schema(params_path: Path) -> Path:
    """The schema sits at workflow/schemas/ beside params.yaml (the repo root)."""
    schema = Path(params_path).resolve().parent / SCHEMA_PATH
    if not schema.is_file():
        raise NmtError(f"schema not found at {schema} (fix: run from the repository root)")
    return schema


def _key(path) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def _yaml_number(value, integer: bool) -> str | None:
    """`value`, a string that float() reads, written so that YAML reads that number; else None."""
    if not isinstance(value, str):
        return None
    try:
        x = float(value)
    except ValueError:
        return None
    if integer:
        text = str(int(x)) if x.is_integer() else ""  # inf and nan are not integers
    else:
        # YAML 1.1 (PyYAML) reads exponent form as a float only with a dot and a signed exponent.
        mantissa, e, exponent = value.strip().lower().partition("e")
        text = (f"{mantissa if '.' in mantissa else mantissa + '.0'}e"
                f"{exponent if exponent[:1] in ('+', '-') else '+' + exponent}"
                if e else value.strip())
    return text if text and yaml.safe_load(text) == x else None  # nan never round-trips


def schema_error_line(err: jsonschema.ValidationError) -> str:
    """Turn a jsonschema error into one line that names the key and the fix."""
    where = _key(err.absolute_path)
    if err.validator == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        unknown = sorted(set(err.instance) - set(allowed))
        hint = f"allowed keys: {', '.join(allowed)}" if allowed else "see params.yaml"
        return f"{where}: unknown key {', '.join(map(repr, unknown))} (fix: remove it; {hint})"
    if err.validator == "required":
        return f"{where}: {err.message} (fix: add it, as in the repository's params.yaml)"
    if err.validator == "enum":
        choices = ", ".join(map(repr, err.validator_value))
        return f"{where}: {err.instance!r} is not allowed (fix: use one of {choices})"
    wanted = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
    number = (_yaml_number(err.instance, integer="number" not in wanted)
              if err.validator == "type" and {"number", "integer"} & set(wanted) else None)
    if number is not None and "e" not in err.instance.lower():
        return f"{where}: {err.instance!r} is a string (fix: write {number} without quotes)"
    if number is not None:  # the YAML 1.1 gotcha: lr: 1e-4 is the string '1e-4'
        why = ("YAML reads exponent form as a number only with a dot and a signed exponent, "
               "like 1.0e-4" if "." in number else "this key takes a whole number")
        return f"{where}: {err.instance!r} is a string to YAML (fix: write {number}: {why})"
    return f"{where}: {err.message} (fix: see workflow/schemas/params.schema.yaml)"


def check_schema(params: dict, schema_path: Path) -> None:
    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(params), key=lambda e: list(e.absolute_path))
    if errors:
        err = jsonschema.exceptions.best_match(errors)
        # allOf wraps section errors; best_match descends into them, keep the deepest one.
        while err.context:
            err = jsonschema.exceptions.best_match(err.context)
        raise NmtError(f"params.yaml: {schema_error_line(err)}")


def check_semantics(params: dict) -> None:
    """Rules across keys that a JSON schema cannot express; checked for every recipe."""
    if params["data"]["source_lang"] == params["data"]["target_lang"]:
        raise NmtError("params.yaml: data.source_lang equals data.target_lang (fix: de and en)")
    for name in params["pipeline"]["recipes"]:
        if name not in params["recipes"]:
            known = ", ".join(params["recipes"]) or "none"
            raise NmtError(
                f"params.yaml: pipeline.recipes names {name!r}, which recipes: does not define "
                f"(fix: add recipes.{name} or use one of: {known})"
            )
    for name, recipe in params["recipes"].items():
        if recipe.get("ablation_of", name) not in params["recipes"] or (
                "ablation_of" in recipe) != ("removes" in recipe):
            raise NmtError(
                f"params.yaml: recipes.{name}: an ablation needs both ablation_of (an existing "
                "recipe) and removes (fix: set both, or neither)"
            )
    if params["bench"]["recipe"] not in params["pipeline"]["recipes"]:
        raise NmtError(
            f"params.yaml: bench.recipe {params['bench']['recipe']!r} is not in pipeline.recipes "
            "(fix: name one of the recipes the pipeline runs)"
        )
    for name, recipe in params["recipes"].items():
        r = resolve(params, name)
        m, t = r["model"], r["train"]
        # Where to fix it: the recipe's override of a section, else the top-level section.
        at_model = f"recipes.{name}" if "model" in recipe else "model"
        at_train = f"recipes.{name}" if "train" in recipe else "train"

        try:
            ModelConfig.from_dict(m)
        except NmtError as e:
            raise NmtError(f"params.yaml: {at_model}: {e}") from None
        if m["tie_embeddings"] and r["vocab"]["kind"] != "bpe":
            raise NmtError(
                f"params.yaml: {at_model}: tie_embeddings needs one shared vocabulary "
                "(fix: set vocab.kind: bpe or tie_embeddings: false)"
            )
        missing = [x for x in r["evaluate"]["testsets"] if x not in params["data"]["testsets"]]
        if missing:
            at = f"recipes.{name}" if "evaluate" in recipe else "evaluate"
            raise NmtError(f"params.yaml: {at}: evaluate.testsets names {', '.join(missing)}, "
                           "which data.testsets does not fetch (fix: add it to data.testsets)")
        if t["average_last"] > t["epochs"]:
            raise NmtError(
                f"params.yaml: {at_train}: train.average_last {t['average_last']} exceeds "
                f"train.epochs {t['epochs']} (fix: lower average_last)"
            )


def validate(params: dict, schema_path: Path) -> dict:
    check_schema(params, schema_path)
    check_semantics(params)
    return params


def load_params(path: str | Path = "params.yaml") -> dict:
    """Read and validate params.yaml; every error is one NmtError line."""
    path = Path(path)
    if not path.is_file():
        raise NmtError(f"{path}: not found (fix: run from the repository root or pass --params)")
    try:
        params = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise NmtError(f"{path}: not valid YAML{at} (fix: correct the syntax)") from None
    if not isinstance(params, dict):
        raise NmtError(f"{path}: expected a mapping of sections (fix: see the repository's copy)")
    return validate(params, find_schema(path))


def _merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in override.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def resolve(params: dict, recipe: str) -> dict[str, Any]:
    """The sections of one recipe: the top level with recipes.<recipe> merged over it."""
    if isinstance(params, Tracked):  # resolving reads nothing; the recipe's keys are tracked
        return Tracked(resolve(params.plain(), recipe), params.reads, ns="recipe")
    if recipe not in params["recipes"]:
        known = ", ".join(params["recipes"])
        raise NmtError(f"unknown recipe {recipe!r} (fix: use one of: {known})")
    resolved = {k: copy.deepcopy(v) for k, v in params.items()
                if k not in ("recipes", "pipeline", "bench")}
    return _merge(resolved, overrides(params, recipe))


def overrides(params: dict, recipe: str, seen: tuple = ()) -> dict:
    """What a recipe changes: its ablation_of recipe's overrides, then its own sections."""
    if recipe in seen:
        raise NmtError(f"params.yaml: recipes.{recipe}: ablation_of goes round in a circle "
                       f"({' -> '.join(seen + (recipe,))}) (fix: point it at a full recipe)")
    r = params["recipes"][recipe]
    base = overrides(params, r["ablation_of"], seen + (recipe,)) if "ablation_of" in r else {}
    return _merge(base, {k: v for k, v in r.items() if k in RECIPE_SECTIONS})


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


class Tracked(dict):
    """A params mapping that records the path of every value read from it (a test proves
    each stage declares what it reads). Sub-sections come back tracked too; `ns` names the
    file the keys belong to: params.yaml (`params`) or a resolved recipe (`recipe`)."""

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


# yaml.safe_dump of a tracked section writes (and so reads) every key under it.
# (As a plain dict, so sort_keys sorts it like any other mapping.)
yaml.SafeDumper.add_representer(
    Tracked, lambda dumper, data: dumper.represent_dict(dict(data.items())))
