"""The registry: every model the pipeline can train, one entry each, readable without torch.

An entry says what the rest of the pipeline asks of a model without building it: its class,
whether it is an encoder-decoder, whether it takes the reference's weights (bench times it on
them; others on their own), whether its class takes the <bos> id, whether nmt export can
convert it to CTranslate2, the closed-form parameter count verify holds it to, and the names of
the check sets nmt verify runs for it (modules of nmt.stages.verify, looked up there: this
package imports nothing of the pipeline). Classes and functions are named as "module:attribute"
strings and imported only when asked for, so the command line, params validation and the schema
test read this module in milliseconds.

The entries are modules of nmt.models.entries, one a model (its ENTRY), found when this
module is imported: a new model is its module(s) of nmt.models and one entry module
(docs/adding-a-model.md).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass

# The model every other is compared against: torch.nn.Transformer (bench's ratios, the twin).
REFERENCE = "baseline"
# The check sets nmt verify knows by name (nmt.stages.verify.suite): scratch against the
# reference on shared weights, and the property checks every model of the interface passes.
TWIN_CHECKS, PROPERTY_CHECKS = "equivalence", "properties"


def load(path: str):
    """The object a "module:attribute" string names, imported now."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class ModelEntry:
    """One model of the pipeline: what is known of it without building it."""

    name: str  # params.yaml's pipeline.models, run folder names (^[a-z][a-z0-9_]*$)
    order: int  # where it stands in tables and calibrations (the reference, 0, first)
    model: str  # "module:Class": Class(cfg, src_vocab_size, tgt_vocab_size, pad_id=...)
    encoder_decoder: bool  # an encoder over the source and a decoder over the target
    reads_bos: bool  # its class also takes bos_id (the decoder-only model's source/target break)
    exports: bool  # nmt export converts it to CTranslate2 (pipeline.export may name it)
    param_count: str  # "module:function": (cfg, src_vocab_size, tgt_vocab_size) -> parameters
    # nmt verify's check sets for it, modules of nmt.stages.verify: strings or the constants
    # below, as nmt.pipeline.code reads them from the entry's text (its verify job's code)
    checks: tuple[str, ...]
    positions: tuple[str, ...] = ("sinusoidal",)  # the model.positions it can be built with
    # "module:function" turning its state dict into the scratch model's names (export, bench);
    # None where the state dict already has them, or the model has no such layout
    to_scratch: str | None = None
    # It takes the reference's weights (the reference's state dict under the scratch model's
    # names): bench times it on them, the same function, beside the reference. Not what
    # encoder_decoder says: an encoder-decoder of another family (a GRU) has none to take,
    # and bench times it on its own seeded weights.
    takes_reference_weights: bool = False

    def model_class(self) -> type:
        return load(self.model)

    def parameters(self, cfg, src_vocab_size: int, tgt_vocab_size: int) -> int:
        """Its parameter count at cfg's size, shared weights once, from the closed form."""
        return load(self.param_count)(cfg, src_vocab_size, tgt_vocab_size)

    def scratch_state_dict(self, state_dict: dict) -> dict:
        """state_dict (of this model) under the scratch model's names."""
        return load(self.to_scratch)(state_dict) if self.to_scratch else state_dict


def discovered() -> dict[str, ModelEntry]:
    """Every module of nmt.models.entries holds one model's ENTRY, named as the module: the
    models in their `order`. Registering a model adds a module there and edits no file that
    another model's runs depend on (nmt.pipeline.code gives each run its own
    model's code)."""
    package = importlib.import_module("nmt.models.entries")
    found = []
    for module in pkgutil.iter_modules(package.__path__):
        model = importlib.import_module(f"nmt.models.entries.{module.name}").ENTRY
        if model.name != module.name:
            raise ValueError(f"nmt/models/entries/{module.name}.py registers {model.name!r}; "
                             f"a model's entry module is named as the model")
        found.append(model)
    return {model.name: model for model in sorted(found, key=lambda model: model.order)}


MODELS = discovered()


def names() -> tuple[str, ...]:
    """Every model, in the registry's order (the order tables and calibrations list them in)."""
    return tuple(MODELS)


def in_order(models) -> tuple[str, ...]:
    """The names of `models` (pipeline.models, say) in the registry's order, the reference
    first: the order bench times them in, each against the first."""
    models = list(models)
    unknown = [name for name in models if name not in MODELS]
    if unknown:
        raise ValueError(f"unknown model {unknown[0]!r}; choose one of {', '.join(MODELS)}")
    return tuple(name for name in MODELS if name in models)


def exportable() -> tuple[str, ...]:
    """The models nmt export converts to CTranslate2 (pipeline.export)."""
    return tuple(name for name, entry in MODELS.items() if entry.exports)


def entry(name: str) -> ModelEntry:
    """The entry of `name`; a ValueError naming the models where there is none."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return MODELS[name]
