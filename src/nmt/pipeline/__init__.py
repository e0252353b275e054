"""The pipeline around the stages: the declaration of every stage (workflow/stages.yaml) read
and checked and the renderers of dvc.yaml and Snakemake's rules (the package declaration, a
module each), the import parser that derives the code a computation runs from the source (code:
a stage's, a corpus kind's),
params.yaml and its schema (params), recipes, the corpus a pipeline reads (corpus) and its
kinds, one module a kind (corpora), the checks before long work starts (preflight), the guard
that lets one orchestrator run at a time (orchestrators) and the record of what a stage reads
(tracking).

May import: nmt.core (and nmt.models through it). Never nmt.training, a stage, nmt.commands or
nmt.cli (tests/test_layout.py holds the direction).
"""
