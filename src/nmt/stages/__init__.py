"""The pipeline's stages, one module (verify: one package) a stage, each `stage(settings,
paths)` with a small Paths dataclass of the files it reads and writes; `nmt <stage>` (nmt.cli)
calls it, and workflow/stages.yaml declares it for DVC and Snakemake.

sources, download, tokenize, config, vocab, verify, train, evaluate, export, bench, report.

May import: nmt.pipeline, nmt.core, nmt.models. Never another stage: what two stages share
belongs in nmt.core (tests/test_layout.py holds the direction).
"""
