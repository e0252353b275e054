"""`nmt stages`: dvc.yaml and Snakemake's rules, rendered from workflow/stages.yaml
(nmt.pipeline.declaration): printed, written, or checked current; with them docs/pipeline.md's
table of what each module's edit re-runs, and the links of workflow/code/ (each model's code,
which dvc.yaml's per-model stages depend on)."""

from __future__ import annotations

import argparse
from pathlib import Path

from nmt.core.errors import NmtError
from nmt.pipeline.declaration import rendered
from nmt.pipeline.declaration.dvc import MODEL_LINKS, model_links

HELP = ("Render dvc.yaml and Snakemake's rules (workflow/rules/stages.smk) from "
        "workflow/stages.yaml, the one declaration of every stage: print them, --write them, "
        "or --check that they are current.")


def arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--declaration", type=Path, default=Path("workflow/stages.yaml"))
    s.add_argument("--write", action="store_true")
    s.add_argument("--check", action="store_true")


def command(args, params: dict) -> None:
    files = rendered(args.declaration)  # dvc.yaml, workflow/rules/stages.smk, docs/pipeline.md
    links = model_links(args.declaration)
    if args.check:
        stale = [str(p) for p, text in files.items()
                 if not p.is_file() or p.read_text() != text]
        stale += [str(MODEL_LINKS)] if stale_links(links) else []
        if stale:
            named = " and ".join([", ".join(stale[:-1]), stale[-1]] if len(stale) > 1 else stale)
            raise NmtError(f"{named} differ{'s' if len(stale) == 1 else ''} "
                           f"from {args.declaration} (fix: nmt stages --write)")
    elif args.write:
        for path, text in files.items():
            path.write_text(text)
        write_links(links)
    else:
        for path, text in files.items():
            print(f"# ==> {path} <==\n{text}", end="")


def stale_links(links: dict[Path, str]) -> list[Path]:
    """The links of workflow/code/ that are missing, point elsewhere, or are no longer made
    (a file there that is no link counts: a checkout without symlinks, whose DVC would hash
    the links' text)."""
    there = {p for p in MODEL_LINKS.rglob("*") if p.is_symlink() or p.is_file()}
    wrong = [link for link, target in links.items()
             if not link.is_symlink() or str(link.readlink()) != target]
    return sorted(set(wrong) | (there - set(links)))


def write_links(links: dict[Path, str]) -> None:
    """workflow/code/ as `links` says: stale links removed, missing ones made."""
    for path in stale_links(links):
        if path.is_symlink() or path.is_file():
            path.unlink()
    for folder in sorted(MODEL_LINKS.glob("*"), reverse=True):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    for link, target in links.items():
        if not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(target)
