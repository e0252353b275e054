"""`nmt stages`: dvc.yaml and Snakemake's rules, rendered from workflow/stages.yaml
(nmt.pipeline.declaration): printed, written, or checked current."""

from __future__ import annotations

import argparse
from pathlib import Path

from nmt.core.errors import NmtError
from nmt.pipeline.declaration import rendered

HELP = ("Render dvc.yaml and Snakemake's rules (workflow/rules/stages.smk) from "
        "workflow/stages.yaml, the one declaration of every stage: print them, --write them, "
        "or --check that they are current.")


def arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--declaration", type=Path, default=Path("workflow/stages.yaml"))
    s.add_argument("--write", action="store_true")
    s.add_argument("--check", action="store_true")


def command(args, params: dict) -> None:
    files = rendered(args.declaration)  # dvc.yaml, workflow/rules/stages.smk
    if args.check:
        stale = [str(p) for p, text in files.items()
                 if not p.is_file() or p.read_text() != text]
        if stale:
            raise NmtError(f"{' and '.join(stale)} differ{'s' if len(stale) == 1 else ''} "
                           f"from {args.declaration} (fix: nmt stages --write)")
    elif args.write:
        for path, text in files.items():
            path.write_text(text)
    else:
        for path, text in files.items():
            print(f"# ==> {path} <==\n{text}", end="")
