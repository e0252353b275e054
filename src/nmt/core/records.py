"""Content records: every stage folder carries a SHA256SUMS of what its stage wrote, checked
wherever a stage reads from it, so that a damaged copy is refused instead of used.

DVC trusts its cache: a cache object whose bytes changed is restored by `dvc checkout` as it
is, and `dvc status` sees nothing (it compares the recorded hashes, not the bytes). Snakemake
sees time stamps only. So the stages that write data/raw, data/tokenized, data/vocab/<recipe>,
results/<run>/translations and exports/<run> end by recording the sha256 of each file
(`write_record`), headed by the DVC stage that writes them, and the readers check a file
against its folder's record before they use it (`verified`, `check_folder`). The record is
`sha256sum -c`'s format (it skips the `#` line), so a user can check a folder by hand.

A folder without a record (made by hand, as the tests do, or by an older version) is read
as it is: the record guards the pipeline's own outputs, it does not forbid other inputs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from nmt.core.dvc_cache import evict_damaged
from nmt.core.errors import NmtError
from nmt.core.files import sha256, write_text

RECORD = "SHA256SUMS"
# What the orchestrators put in a folder output besides the stage's files: Snakemake's mark of
# when it made the folder. Neither recorded nor an unlisted file.
TOOL_FILES = (".snakemake_timestamp",)
STAGE = "# written by DVC stage "  # the record's first line, then the stage's name
# A line of `sha256sum`'s output: the digest, a space, ` ` (text) or `*` (binary), the name.
SUM_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")


def write_record(folder: Path, stage: str) -> None:
    """folder/SHA256SUMS: the sha256 of every file under folder (sub-folders too), sorted;
    `stage` is the DVC stage that writes them (tokenize, vocab@published, ...). Its damaged
    DVC cache objects go (nmt.core.dvc_cache)."""
    folder = Path(folder)
    write_text(folder / RECORD, "".join([f"{STAGE}{stage}\n"] + [
        f"{sha256(folder / name)}  {name}\n" for name in covered_files(folder)]))
    evict_damaged(stage)  # so that DVC re-adds the intact copies: the re-run repairs its cache


def covered_files(folder: Path) -> list[str]:
    """The files under folder (sub-folders too) that its record covers, sorted: all but the
    record itself and what the orchestrators put there (TOOL_FILES)."""
    return sorted(p.relative_to(folder).as_posix() for p in Path(folder).rglob("*")
                  if p.is_file() and p.name not in (RECORD, *TOOL_FILES))


def read_sums(path: Path) -> dict[str, str]:
    """file name -> sha256, from a `sha256sum` style file ({} when it is missing); `#` lines
    are comments. A line that is no `<sha256>  <name>`, or bytes that are no UTF-8, is one
    NmtError for the record (it is damaged), not a file taken for missing or unlisted."""
    if not Path(path).is_file():
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise unreadable(Path(path), f"byte {e.start} is not UTF-8") from None
    sums = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        if not (match := SUM_LINE.match(line)):
            raise unreadable(Path(path), f"line {number} is not `<sha256>  <file name>`")
        sums[match.group(2)] = match.group(1)
    return sums


def unreadable(record: Path, why: str) -> NmtError:
    """The one line for a record that cannot be read as one, with the fix: its stage re-run
    (the record names it), else the file restored."""
    stage = recorded_stage(record)
    fix = (f"`dvc repro -f -s {stage}`, or `rm -r {record.parent}` and run snakemake again"
           if stage else f"restore it (`git checkout -- {record}` where git tracks it)")
    return NmtError(f"{record}: {why}, so the record is damaged (fix: {fix})")


def recorded_stage(record: Path) -> str | None:
    """The DVC stage a record names on its first line (None: a record without one)."""
    with open(record, encoding="utf-8", errors="replace") as f:
        first = f.readline()
    if not first.startswith(STAGE):
        return None
    return first[len(STAGE):].strip() or None


def damaged(path: Path, why: str, record: Path) -> NmtError:
    """The one line for a file that is not what its stage wrote, with both fixes: DVC re-runs
    the stage (-f: its run-cache and its cache may hold the damaged copy, which the re-run
    removes, write_record), and Snakemake, which checks the records when it parses the
    workflow, re-makes a folder that is gone."""
    stage = recorded_stage(record)
    rerun = (f"`dvc repro -f -s {stage}`, which replaces DVC's damaged copy too" if stage
             else "re-run the stage that wrote it")
    return NmtError(f"{path}: {why} {record}: the file is damaged or not the stage's (fix: "
                    f"{rerun}, or `rm -r {record.parent}` and run snakemake again)")


# (path, size, mtime, inode) -> sha256: a file read twice by one process is hashed once.
_hashed: dict[tuple, str] = {}


def _digest(path: Path) -> str:
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _hashed:
        _hashed[key] = sha256(path)
    return _hashed[key]


def verified(path: Path) -> Path:
    """path, once its sha256 matches its folder's record; one NmtError line if not. A file
    in a folder without a record is not checked."""
    path = Path(path)
    record = path.parent / RECORD
    if not record.is_file() or path.name == RECORD or not path.is_file():
        return path  # no record, or nothing to check: the reader's own error says what
    check_entry(path, read_sums(record).get(path.name), record)
    return path


def check_folder(folder: Path) -> None:
    """Every file folder's record lists is there and has its sha256 (folders without a record
    are not checked): a whole export, or what Snakemake finds when it starts."""
    record = Path(folder) / RECORD
    for name, digest in read_sums(record).items():
        check_entry(Path(folder) / name, digest, record)


def check_entry(path: Path, digest: str | None, record: Path) -> None:
    """path is there and has the sha256 `record` lists for it (None: it lists none)."""
    if digest is None:
        raise damaged(path, "it is not listed in", record)
    if not path.is_file():
        raise damaged(path, "it is missing, but listed in", record)
    if _digest(path) != digest:
        raise damaged(path, "its sha256 differs from the one recorded in", record)
