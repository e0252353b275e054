"""What can be checked before any job starts, so that neither orchestrator deletes a trained
model (or any output) for a job that was bound to fail.

Both tools delete a stage's outputs before they run it. So these run first: DVC's config
stage (the first stage `dvc repro` runs after any params edit) calls `check_settings`, and
`check_known_to_dvc` when DVC runs it;
Snakemake calls `check_settings`, `check_inputs` and `check_clock` when it parses the workflow and
`check_devices` in its onstart (on the machine that runs the jobs; a cluster's login node
has no GPU). Every problem is one NmtError line naming the fix.
"""

from __future__ import annotations

import os
import re
import time
from datetime import datetime
from pathlib import Path

from nmt.core.errors import NmtError
from nmt.core.files import not_a_folder
from nmt.core.records import check_folder
from nmt.core.runs import runs
from nmt.pipeline.corpora.kinds import kind_of
from nmt.pipeline.corpus import corpus_recipe, corpus_settings
from nmt.pipeline.orchestrators import made_by_snakemake
from nmt.pipeline.params_file import read_yaml
from nmt.pipeline.recipes import resolve

# Where stages write (logs: Snakemake's); each, or its nearest existing parent, must be writable.
OUTPUT_FOLDERS = ("data", "params", "results", "exports", "reports", "logs")
# What Snakemake compares time stamps of: the stages' inputs and outputs, their code.
TIMED = ("params.yaml", "workflow", "src", "data", "params", "results", "exports", "reports")
# How far ahead of the clock a time stamp may be (a file system's own rounding) before it counts.
CLOCK_SLACK_S = 2.0


def check_settings(params: dict, root: Path = Path("."), *, writes: bool = True) -> None:
    """What needs no GPU to check: the corpus's files are there, as its kind checks them
    (nmt.pipeline.corpora: multi30k, each has its pin; files, each exists), no output is a
    link out of the checkout (check_links), and, for a run that writes (not a dry run),
    every output is writable."""
    data = corpus_settings(params)["data"]
    at = (f"recipes.{corpus_recipe(params)}.data"
          if "data" in params["recipes"][corpus_recipe(params)] else "data")
    kind_of(data).preflight(data, at, root)
    check_links(root)
    for folder in OUTPUT_FOLDERS:
        if (root / folder).exists() and not (root / folder).is_dir():
            raise NmtError(not_a_folder(root / folder))
        if writes and (path := unwritable(root / folder)):
            raise NmtError(f"{path}: not writable, and the pipeline writes there (fix: "
                           f"chmod u+w {path}, or run in a copy you may write)")


def check_outputs_writable(stage: str, args, root: Path = Path(".")) -> None:
    """Before `nmt <stage>` does any work: the folder each of its outputs goes into (the
    nearest that exists) is a folder this user may write, so that a read-only checkout, or
    another user's, is one line before the work rather than a traceback after it. Its outputs:
    --out where the command line gives one, else those workflow/stages.yaml declares, with
    {recipe}, {model} and {seed} from the command line."""
    declared = declared_outputs(root).get(stage)
    if getattr(args, "out", None):
        outputs = [root / args.out]
    elif declared:
        outputs = [root / re.sub(r"\{(recipe|model|seed)\}",
                                 lambda m: str(getattr(args, m.group(1))), path)
                   for path in declared]
    else:  # not run in a checkout, or a stage not declared yet: nothing to check
        return
    for output in outputs:
        folder = writable_needed(output.parent)[0]  # it, or its nearest existing parent
        if not folder.is_dir():
            raise NmtError(not_a_folder(folder))
        if not os.access(folder, os.W_OK | os.X_OK):
            raise NmtError(f"{shown(folder)}: not writable, and nmt {stage} writes there (fix: "
                           f"chmod u+w {shown(folder)}, or run in a copy you may write)")


def declared_outputs(root: Path = Path(".")) -> dict[str, list[str]]:
    """Stage -> its outputs as workflow/stages.yaml declares them (outs, metrics, plots),
    with {recipe}, {model}, {seed} in them; nothing outside a checkout."""
    declaration = Path(root) / "workflow" / "stages.yaml"
    if not declaration.is_file():
        return {}
    stages = read_yaml(declaration.read_text(), str(declaration)).get("stages", {})
    return {name: [*entry.get("outs", []), *entry.get("metrics", []), *entry.get("plots", [])]
            for name, entry in stages.items() if entry}


def check_links(root: Path = Path(".")) -> None:
    """No output a stage replaces whole is a link to a folder outside the checkout (data/raw
    -> /elsewhere). DVC deletes an output before its stage runs and, meeting such a link,
    makes the folder it points at writable to everyone (its rmtree error handler chmods
    through the link); the stage would then put a folder of its own in the link's place.
    Refused before either tool deletes anything: Snakemake calls this when it reads the
    workflow, DVC in the sources stage, an ancestor of every stage that writes a folder."""
    checkout = Path(root).resolve()
    for patterns in declared_outputs(root).values():
        for pattern in patterns:
            for path in Path(root).glob(re.sub(r"\{\w+\}", "*", pattern)):
                if path.is_symlink() and path.is_dir() and not path.name.startswith(".") \
                        and not path.resolve().is_relative_to(checkout):
                    raise NmtError(
                        f"{path} is a link to {os.readlink(path)}, outside the checkout, and "
                        "the pipeline replaces it whole (DVC would first make that folder "
                        f"writable to everyone) (fix: rm {path}, which removes the link "
                        "alone, and run again: the pipeline writes it in the checkout)")


def check_dry_run(root: Path = Path(".")) -> None:
    """What a dry run (snakemake -n) needs to write: not the pipeline's folders (check_settings
    leaves them to the run), but Snakemake's own state, .snakemake/, where Snakemake 9 saves
    its I/O cache even in a dry run (a read-only checkout: OSError [Errno 30] on
    .snakemake/iocache/latest.pkl, a traceback)."""
    if path := unwritable(Path(root) / ".snakemake"):
        raise NmtError(f"{path}: not writable, and Snakemake writes its state there even in a "
                       "dry run (fix: run it in a copy you may write, e.g. cp -a "
                       f"{Path(root).resolve()} /tmp/copy)")


def may_write(path: Path) -> bool:
    """Whether this user may write `path` (or make it, where it is not there yet)."""
    return os.access(path if path.exists() else writable_needed(path)[0], os.W_OK)


def unwritable(folder: Path) -> Path | None:
    """The first of the folders a stage writes into for `folder` (writable_needed) that this
    user may not write into, as shown in a message; None where all may be written."""
    return next((shown(path) for path in writable_needed(folder)
                 if not os.access(path, os.W_OK | os.X_OK)), None)


def shown(path: Path) -> Path:
    """A path for a message: the working folder's own name, never a bare "."."""
    return Path.cwd() if path == Path(".") else path


def writable_needed(folder: Path) -> list[Path]:
    """Folders a stage writes into: folder and every folder under it, or, if it does not
    exist yet, its nearest existing parent (where it will be made)."""
    if not folder.exists():
        parent = folder.parent
        while not parent.exists():
            parent = parent.parent
        return [parent]
    return [folder] + [Path(d) / sub for d, subs, _ in os.walk(folder) for sub in subs]


def check_devices(params: dict) -> None:
    """Each recipe the pipeline trains finds the GPUs it asks for: train.device cuda[:N], or
    train.devices N on CUDA (auto with a GPU present). auto without a GPU trains on the CPU."""
    for name in params["pipeline"]["recipes"]:
        train = resolve(params, name)["train"]
        device, devices = train["device"], train["devices"]
        if not device.startswith("cuda") and devices == 1:
            continue  # no torch import for the common case
        import torch

        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        at = f"recipes.{name}" if "train" in params["recipes"][name] else "train"
        index = int(device.partition(":")[2] or 0)
        if device.startswith("cuda") and index >= visible:
            raise NmtError(f"params.yaml: {at}: train.device {device!r} asked for, but "
                           f"{visible or 'no'} CUDA GPU{'s are' if visible != 1 else ' is'} "
                           "visible (fix: train.device: auto, which uses the CPU without one)")
        if (device.startswith("cuda") or (device == "auto" and visible)) and devices > visible:
            raise NmtError(f"params.yaml: {at}: train.devices is {devices}, but {visible} GPUs "
                           f"are visible (fix: train.devices: {visible} or fewer)")


def check_inputs(root: Path = Path(".")) -> None:
    """Files inside the folders the stages declare (data/raw, data/tokenized, data/vocab/*,
    results/*/translations) that differ from the SHA256SUMS their stage wrote there
    (nmt.core.records). A folder's time stamp does not change when a file inside it does, so
    Snakemake would go on with a damaged file; DVC hashes the workspace, but trusts its cache."""
    for folder in [root / "data" / "raw", root / "data" / "tokenized",
                   *sorted((root / "data" / "vocab").glob("*/")),
                   *sorted((root / "results").glob("*/translations/"))]:
        check_folder(folder)


def check_clock(root: Path = Path(".")) -> None:
    """No input or output time stamp in the future. Snakemake ends each job by checking that
    its outputs are newer than its inputs: an input stamped in the future (a copy from a
    machine whose clock runs ahead, an archive) fails the job after it deleted and rewrote
    its outputs, and the failed job's outputs are deleted too (data/vocab/<recipe> for a
    future data/tokenized; a trained model for a future vocabulary)."""
    now = time.time()
    ahead = sorted(path for top in TIMED for path in _walk(Path(root) / top)
                   if path.lstat().st_mtime > now + CLOCK_SLACK_S)
    if ahead:
        tops = " ".join(t for t in TIMED if os.path.lexists(Path(root) / t))
        stamp = datetime.fromtimestamp(ahead[0].lstat().st_mtime).isoformat(" ", "seconds")
        more = f" and {len(ahead) - 1} more" if len(ahead) > 1 else ""
        raise NmtError(
            f"{ahead[0]}{more}: modified in the future ({stamp}; the clock says "
            f"{datetime.fromtimestamp(now).isoformat(' ', 'seconds')}), so Snakemake would "
            "fail the job that reads it after deleting that job's outputs (fix: `find "
            f"{tops} -newermt @{int(now)} -exec touch -c -h -d @{int(now)} {{}} +`, "
            "which gives them all one time of now, or set the clock)")


def _walk(path: Path):
    """path and everything under it (links not followed); nothing when it is not there."""
    if not os.path.lexists(path):
        return
    yield path
    if path.is_dir() and not path.is_symlink():
        for folder, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in dirs + files:
                yield Path(folder) / name


def check_known_to_dvc(params: dict, root: Path = Path(".")) -> None:
    """Under `dvc repro`: refuse, before any training is deleted, when trained runs of the
    pipeline are missing from dvc.lock (Snakemake made them), which DVC would train again."""
    unknown = made_by_snakemake(runs(params), root)
    if unknown:
        shown = ", ".join(run.name for run in unknown[:3]) + (" ..." if len(unknown) > 3 else "")
        raise NmtError(f"{len(unknown)} trained run(s) ({shown}) are not in dvc.lock: "
                       "Snakemake made them, and dvc repro would train them again (fix: "
                       "nmt adopt, which records a finished Snakemake run in dvc.lock; or "
                       "remove their folders under results/ to have DVC train them)")
