"""The pipeline's stages, one module (verify: one package) a stage, each `stage(settings,
paths)` with a small Paths dataclass of the files it reads and writes; workflow/stages.yaml
declares it for DVC and Snakemake.

Each module also says its own command line, which nmt.cli builds `nmt <stage>` from (every
module here is a stage; none is imported until its subcommand is named):
  HELP                      the subcommand's help;
  arguments(parser)         adds its options (the shared groups: nmt.pipeline.commandline);
  command(args, params)     runs the stage; returns the exit status (None: 0);
and where it needs them: MEMORY_FIX (what to make smaller when it runs out of memory),
interrupted_note(args), SETS_OWN_THREADS.

May import: nmt.pipeline, nmt.training, nmt.core, nmt.models. Never another stage: what two
stages share belongs in nmt.core, or in nmt.training where it is training's (the update bench
times; the precision evaluate decodes in) (tests/test_layout.py holds the direction).
"""
