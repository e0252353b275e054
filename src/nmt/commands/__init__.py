"""`nmt` commands that are not stages of the pipeline: translate (sentences through a trained
run or its CTranslate2 export), decoding_bench (`nmt bench --decoding`: one run's decoding,
ours against CTranslate2's), data_bench (`nmt bench --data`: the data stages at a million
pairs), estimate (`nmt estimate`: a recipe's training minutes on this CPU) and stages
(`nmt stages`: dvc.yaml and Snakemake's rules rendered from the declaration). Each says its
command as a stage module does: HELP, `arguments(parser)`, `command(args, params)`; the two
benches beside `nmt bench` only `command`, as their options are the bench stage's
(nmt.cli.INSTEAD).

data_bench times the download, tokenize and vocab stages' own functions, so it sits above the
stages, as nmt.cli does: a stage may not import another, a command may.

May import: nmt.stages, nmt.pipeline, nmt.training, nmt.core, nmt.models (tests/test_layout.py).
"""
