"""The corpus kinds of data.corpus, one module a kind; `kinds.KINDS` maps each name to its
module (every module here but kinds and raw, found by name), and the pipeline asks the kind of
a corpus (`kinds.kind_of(data)`), never its name.

What a kind's module gives: SETTINGS, the keys of data that hold its own settings (data.files),
which sources declares as "data.{kind}" in workflow/stages.yaml and records, with the sha256 of
the kind's code, in params/sources.sha256 (download and the report depend on that record, not
on the kind's settings or modules: nmt.stages.sources); and these, each taking the corpus
settings (the resolved data section):
  check(data, at)              what the kind needs of params, no file opened (nmt.pipeline.params;
                               `at` is where to fix it: data, or recipes.<name>.data);
  preflight(data, at, root)    what can be checked on disk before any job starts
                               (nmt.pipeline.preflight);
  describe(data, root)         the lines of params/sources.sha256 after its header: the sha256 of
                               every file the corpus is made of (nmt.stages.sources);
  vet(data, root)              what download would refuse, read without writing: sources runs
                               it when those lines changed, so that a download bound to fail
                               stops before either orchestrator deletes data/raw;
  download(data, origin, out)  every file of data/raw (nmt.pipeline.corpus.raw_names) into out
                               (nmt.stages.download; `origin`: raw.Origin);
  title(data)                  what the report's heading calls the corpus (nmt.stages.report).
Whatever the kind, download writes the same data/raw/<split>.<lang>.gz; raw holds the writing
and the checks of the text that the kinds share.

A new kind is a module here and its settings in the schema (workflow/schemas/params.schema.yaml:
the enum of data.corpus, its section under data) and in params.yaml (a default); it re-runs no
data stage and no training of a pipeline that reads another kind. docs/parameters-and-corpora.md
says more.

Part of nmt.pipeline: may import nmt.core and nmt.pipeline.corpus, nothing above.
"""
