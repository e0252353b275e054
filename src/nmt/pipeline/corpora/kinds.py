"""The table of corpus kinds: data.corpus's name -> the module that does what that kind does
(the interface: nmt.pipeline.corpora). The schema's enum of data.corpus names the same kinds
(a test holds the two equal); nothing outside this table asks which kind a corpus is.
"""

from __future__ import annotations

from types import ModuleType

from nmt.core.errors import NmtError
from nmt.pipeline.corpora import files, huggingface, multi30k

KINDS: dict[str, ModuleType] = {
    "multi30k": multi30k,
    "files": files,
    "huggingface": huggingface,
}


def kind_of(data: dict) -> ModuleType:
    """The module of the corpus kind data.corpus names."""
    if data["corpus"] not in KINDS:
        raise NmtError(f"params.yaml: data.corpus: {data['corpus']!r} is no corpus kind (fix: "
                       f"one of {', '.join(KINDS)})")
    return KINDS[data["corpus"]]
