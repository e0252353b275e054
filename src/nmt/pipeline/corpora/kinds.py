"""The corpus kinds: data.corpus's name -> the module that does what that kind does (the
interface: nmt.pipeline.corpora). Every module of nmt.pipeline.corpora but HELPERS is a kind,
named as its module, found when this module is imported: registering a kind adds a module and
edits no file a stage runs. The schema's enum of data.corpus names the same kinds (a test
holds the two equal); nothing outside this module asks which kind a corpus is.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from nmt.core.errors import NmtError

PACKAGE = "nmt.pipeline.corpora"
HELPERS = ("kinds", "raw")  # its modules that are no kind: this table, the shared writing
# What the pipeline asks of a kind (nmt.pipeline.corpora says what each does).
INTERFACE = ("SETTINGS", "check", "preflight", "describe", "vet", "download", "title")


def discovered() -> dict[str, ModuleType]:
    """Every kind module of PACKAGE, by name; one that lacks part of INTERFACE is refused."""
    package = importlib.import_module(PACKAGE)
    found = {}
    for name in sorted(m.name for m in pkgutil.iter_modules(package.__path__)):
        if name in HELPERS:
            continue
        module = importlib.import_module(f"{PACKAGE}.{name}")
        missing = [a for a in INTERFACE if not hasattr(module, a)]
        if missing:
            raise ValueError(f"nmt/pipeline/corpora/{name}.py is no corpus kind: it lacks "
                             f"{', '.join(missing)} (fix: write them, nmt/pipeline/corpora/"
                             f"__init__.py says what each does; or add {name!r} to HELPERS)")
        found[name] = module
    return found


KINDS: dict[str, ModuleType] = discovered()


def kind_of(data: dict) -> ModuleType:
    """The module of the corpus kind data.corpus names."""
    if data["corpus"] not in KINDS:
        raise NmtError(f"params.yaml: data.corpus: {data['corpus']!r} is no corpus kind (fix: "
                       f"one of {', '.join(KINDS)})")
    return KINDS[data["corpus"]]


def settings_of(data: dict) -> dict:
    """The values of the kind's own settings (its SETTINGS: data.files -> data['files'])."""
    return {key: data[key.removeprefix("data.")] for key in kind_of(data).SETTINGS}
