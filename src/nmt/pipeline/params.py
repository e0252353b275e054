"""params.yaml: read it (nmt.pipeline.params_file), check it against
workflow/schemas/params.schema.yaml (the one source of every key's type and limits; the model
names come from nmt.models.registry, which the schema's model_name takes its enum from), then
check the rules across keys a schema cannot express.

Every problem becomes one NmtError line naming the key and the fix. The checks refuse, never
change a value, so they are the command line's, no stage's code (nmt.pipeline.code).
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml

from nmt.core.errors import NmtError
from nmt.models.registry import MODELS, entry, exportable, names
from nmt.pipeline.corpora.kinds import kind_of
from nmt.pipeline.corpus import CORPUS_SECTIONS
from nmt.pipeline.params_file import read_params, read_yaml
from nmt.pipeline.recipes import resolve

SCHEMA_PATH = Path("workflow/schemas/params.schema.yaml")
# What the schema asks of a name that becomes part of a path (a recipe: params/<recipe>.yaml,
# results/<recipe>-<model>-s<seed>/); no `/`, no `..`.
NAME_PATTERN = "^[a-z][a-z0-9_]*$"


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
    if err.validator == "pattern" and err.validator_value == NAME_PATTERN:
        return (f"{where}: {err.instance!r} is not a name: the pipeline makes file and folder "
                f"names of it (fix: lower-case letters, digits and _, starting with a letter: "
                f"{NAME_PATTERN})")
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


def read_schema(schema_path: Path) -> dict:
    """The schema, its model_name holding the registry's models (the one list of them)."""
    schema = read_yaml(Path(schema_path).read_text(), str(schema_path))
    schema["$defs"]["model_name"]["enum"] = list(names())
    return schema


def check_schema(params: dict, schema_path: Path) -> None:
    schema = read_schema(schema_path)
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
        for base, what, kind in (("ablation_of", "removes", "an ablation"),
                                 ("step_of", "adds", "a search step")):
            if recipe.get(base, name) not in params["recipes"] or (
                    base in recipe) != (what in recipe):
                raise NmtError(
                    f"params.yaml: recipes.{name}: {kind} needs both {base} (an existing "
                    f"recipe) and {what} (fix: set both, or neither)")
        if "ablation_of" in recipe and "step_of" in recipe:
            raise NmtError(f"params.yaml: recipes.{name}: a recipe builds on one other "
                           "(fix: keep ablation_of or step_of, not both)")
    check_one_corpus(params)
    check_export_list(params["pipeline"])
    if params["bench"]["recipe"] not in params["pipeline"]["recipes"]:
        raise NmtError(
            f"params.yaml: bench.recipe {params['bench']['recipe']!r} is not in pipeline.recipes "
            "(fix: name one of the recipes the pipeline runs)"
        )
    for name in params["recipes"]:
        check_recipe(params, name)
    check_positions(params)


def check_one_corpus(params: dict) -> None:
    """The data stages run once a pipeline: its recipes must agree on data and tokenize."""
    first, *others = params["pipeline"]["recipes"]
    corpus = {k: resolve(params, first)[k] for k in CORPUS_SECTIONS}
    for name in others:
        differ = [k for k in CORPUS_SECTIONS if resolve(params, name)[k] != corpus[k]]
        if differ:
            raise NmtError(
                f"params.yaml: pipeline.recipes: {first} and {name} read different {differ[0]} "
                "sections, but one pipeline tokenizes one corpus (fix: run them in separate "
                "pipelines, e.g. `dvc exp run -S 'pipeline.recipes=[" + name + "]' -S "
                f"'bench.recipe={name}'`)")


def check_positions(params: dict) -> None:
    """Positions other than sinusoids exist in some models only (the registry's `positions`;
    rotary: scratch): a pipeline that trains a recipe with them trains no other model (the
    others would refuse to build) and exports nothing (the conversion to CTranslate2 knows
    sinusoids only)."""
    for name in params["pipeline"]["recipes"]:
        positions = resolve(params, name)["model"]["positions"]
        having = [m for m, e in MODELS.items() if positions in e.positions]
        others = [m for m in params["pipeline"]["models"] if m not in having]
        if others:
            raise NmtError(f"params.yaml: pipeline.recipes: {name} has model.positions "
                           f"{positions}, which only {' and '.join(having)} "
                           f"{'has' if len(having) == 1 else 'have'}, and pipeline.models also "
                           f"trains {', '.join(others)} (fix: pipeline.models: "
                           f"[{', '.join(having)}], or positions: sinusoidal)")
        if positions != "sinusoidal" and params["pipeline"]["export"]:
            raise NmtError(f"params.yaml: pipeline.export: {name} has model.positions "
                           f"{positions}, which the CTranslate2 conversion does not map (fix: "
                           "pipeline.export: [], or positions: sinusoidal)")


def check_export_list(pipeline: dict) -> None:
    """pipeline.export names models the pipeline trains and CTranslate2 can run."""
    for name in pipeline["export"]:
        if not entry(name).exports:
            raise NmtError(f"params.yaml: pipeline.export: {name} cannot be exported: "
                           "CTranslate2 has no attention that is bidirectional over the source "
                           "and causal over the target in one stack (fix: export "
                           f"{' or '.join(exportable())} only)")
        if name not in pipeline["models"]:
            raise NmtError(f"params.yaml: pipeline.export names {name}, which pipeline.models "
                           f"does not train (fix: add {name} to pipeline.models, or remove it "
                           "from pipeline.export)")


def check_recipe(params: dict, name: str) -> None:
    """One resolved recipe's rules; errors name where to fix them: the recipe's override of a
    section, else the top-level section."""
    r, overridden = resolve(params, name), params["recipes"][name]
    model, train = r["model"], r["train"]

    def at(section: str) -> str:
        return f"recipes.{name}" if section in overridden else section

    if model["d_model"] % model["nhead"]:
        raise NmtError(f"params.yaml: {at('model')}: d_model {model['d_model']} is not divisible "
                       f"by nhead {model['nhead']} (fix: make d_model a multiple of nhead)")
    if model["positions"] == "rotary" and (model["d_model"] // model["nhead"]) % 2:
        raise NmtError(f"params.yaml: {at('model')}: rotary positions rotate pairs of features, "
                       f"and a head has {model['d_model'] // model['nhead']} (fix: an even "
                       "d_model / nhead)")
    if model["tie_embeddings"] and r["vocab"]["kind"] != "bpe":
        raise NmtError(f"params.yaml: {at('model')}: tie_embeddings needs one shared vocabulary "
                       "(fix: set vocab.kind: bpe or tie_embeddings: false)")
    kind_of(r["data"]).check(r["data"], f"recipes.{name}.data" if "data" in overridden else "data")
    if not r["tokenize"]["words"] and r["vocab"]["kind"] == "word":
        raise NmtError(f"params.yaml: {at('vocab')}: vocab.kind word needs spaCy's word tokens, "
                       f"but {at('tokenize')}: tokenize.words is false (fix: set "
                       "tokenize.words: true, or vocab.kind: bpe)")
    missing = [x for x in r["evaluate"]["testsets"] if x not in r["data"]["testsets"]]
    if missing:
        raise NmtError(f"params.yaml: {at('evaluate')}: evaluate.testsets names "
                       f"{', '.join(missing)}, which data.testsets does not fetch (fix: add it "
                       "to data.testsets)")
    if not train["max_updates"] and train["average_last"] > train["epochs"]:  # else epochs unused
        raise NmtError(f"params.yaml: {at('train')}: train.average_last {train['average_last']} "
                       f"exceeds train.epochs {train['epochs']} (fix: lower average_last)")


def validate(params: dict, schema_path: Path) -> dict:
    check_schema(params, schema_path)
    check_semantics(params)
    return params


# params.yaml is about 20 KB; a file 50 times that is no settings file. Refused before it is
# parsed: a 46 MB one (a 2.7 M-item list under an unused recipe) ran `nmt config` past 180 s
# and 1.24 GB with no line.
MAX_PARAMS_BYTES = 1 << 20


def load_params(path: str | Path = "params.yaml") -> dict:
    """Read and validate params.yaml; every error is one NmtError line."""
    path = Path(path)
    if path.is_file() and (size := path.stat().st_size) > MAX_PARAMS_BYTES:
        raise NmtError(f"{path}: {size / 1e6:.1f} MB, and a params file is tens of KB (at most "
                       f"{MAX_PARAMS_BYTES >> 20} MB here) (fix: remove the values no recipe "
                       "needs, or keep data in files a stage reads)")
    return validate(read_params(path), find_schema(path))
