"""params.yaml read into the values every stage computes from: YAML, and nothing params.yaml
never holds (an anchor, a key written twice), refused before any value is built.

This is the part of `nmt`'s reading of params.yaml that can change a stage's outputs, and so is
every stage's code (nmt.pipeline.code.SHARED); what checks the values and refuses
them (nmt.pipeline.params: the schema, the rules across keys) is the command line's, and DVC's
config stage runs it first.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from nmt.core.errors import NmtError

# libyaml's parser where PyYAML was built with it (the wheels are): the same YAML 1.1 and the
# same values, about 8x faster than the pure-Python one, and every `nmt` command reads
# params.yaml and its schema (tens of ms each).
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(text: str, where: str = "params.yaml"):
    """A YAML file's values, once its event stream holds nothing params.yaml never does
    (check_plain): every reader of params.yaml and its schema comes here."""
    check_plain(text, where)
    return yaml.load(text, Loader=YAML_LOADER)


def check_plain(text: str, where: str) -> None:
    """Refuse, from the parser's events and before any value is built, what a YAML parser
    lets through but params.yaml never holds: an anchor or alias (a few lines of them expand
    to gigabytes, the "billion laughs", and Snakemake's `configfile:` builds them after us)
    and a key written twice in one mapping (PyYAML and Snakemake keep the last silently, DVC
    refuses it). A syntax error is left to the loader's YAMLError."""
    open_nodes: list[OpenNode] = []  # the mappings and sequences the stream is inside
    for event in yaml.parse(text, Loader=YAML_LOADER):
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            mark = "*" if isinstance(event, yaml.AliasEvent) else "&"
            raise NmtError(f"{where}: line {line}: a YAML anchor or alias ({mark}{event.anchor}); "
                           "params.yaml uses none, and an alias can expand to gigabytes (fix: "
                           "write the values out)")
        if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            open_nodes.pop()
        elif isinstance(event, (yaml.ScalarEvent, yaml.CollectionStartEvent)):
            path = open_nodes[-1].place(event, line, where) if open_nodes else ""
            if isinstance(event, yaml.CollectionStartEvent):
                open_nodes.append(OpenNode(path, isinstance(event, yaml.MappingStartEvent)))


class OpenNode:
    """A mapping or sequence check_plain is inside: where it sits (train, data.testsets) and,
    for a mapping, the keys seen so far with their lines."""

    def __init__(self, path: str, mapping: bool):
        self.path, self.mapping = path, mapping
        self.keys: dict[str, int] = {}  # mapping: key -> its line
        self.value_of: str | None = None  # mapping: the path of the key whose value is next
        self.items = 0  # sequence: items so far

    def place(self, event, line: int, where: str) -> str:
        """The path of the node `event` starts (a key, a key's value, an item); a key is
        refused if this mapping has it already."""
        if not self.mapping:
            self.items += 1
            return f"{self.path}[{self.items - 1}]"
        if self.value_of is not None:  # the value of the key before it
            path, self.value_of = self.value_of, None
            return path
        key = event.value if isinstance(event, yaml.ScalarEvent) else "?"  # "?": a complex key
        path = f"{self.path}.{key}" if self.path else key
        if key in self.keys and key != "?":
            raise NmtError(f"{where}: {path} is written twice, at lines {self.keys[key]} and "
                           f"{line} (fix: keep one)")
        self.keys[key], self.value_of = line, path
        return path


def read_params(path: Path) -> dict:
    """params.yaml as a mapping, not yet validated; a YAML syntax error names the file's line
    (Snakemake reads it too, and would name its own Snakefile's `configfile:` line)."""
    if not path.is_file():
        raise NmtError(f"{path}: not found (fix: run from the repository root or pass --params)")
    try:
        params = read_yaml(path.read_text(), str(path))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise NmtError(f"{path}: not valid YAML{at} (fix: correct the syntax)") from None
    if not isinstance(params, dict):
        raise NmtError(f"{path}: expected a mapping of sections (fix: see the repository's copy)")
    return params
