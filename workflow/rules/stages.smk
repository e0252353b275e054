# GENERATED from workflow/stages.yaml by `nmt stages --write`: edit that file, not this one.
# Snakemake's rules, one a stage: the commands dvc.yaml runs, on the same files.
# workflow/Snakefile names RECIPES, MODELS, SEEDS (pipeline.*) and BENCH (bench.recipe) before
# it includes this file; declared(), from_recipe(), listed() and lookup() are in
# rules/common.smk. `rule all`, last, asks for the outputs of the stages declared `target`.
# params.values holds the values of the keys the stage declares (params.yaml, its recipe's):
# Snakemake re-runs a job when its params change, so an edit re-runs exactly what reads it.

# The modules every stage computes from (params.yaml read into values:
# nmt.pipeline.code.SHARED); each rule adds those its stage's
# computation imports. The command line around it (nmt.cli, the checks) is none.
SHARED_CODE = [
    "src/nmt/__init__.py",
    "src/nmt/pipeline/__init__.py",
    "src/nmt/pipeline/params_file.py",
]

# Each model's modules (its registry entry and what that names): a job of one
# model (train, evaluate, export) runs its own model's only; verify-<model>: and
# its check sets (verify's jobs).
MODEL_CODE = {
    "baseline": [
        "src/nmt/models/__init__.py",
        "src/nmt/models/baseline.py",
        "src/nmt/models/beams.py",
        "src/nmt/models/config.py",
        "src/nmt/models/decoder_only/__init__.py",
        "src/nmt/models/decoder_only/size.py",
        "src/nmt/models/entries/__init__.py",
        "src/nmt/models/entries/baseline.py",
        "src/nmt/models/mapping.py",
        "src/nmt/models/masks.py",
        "src/nmt/models/registry.py",
    ],
    "decoder_only": [
        "src/nmt/models/__init__.py",
        "src/nmt/models/beams.py",
        "src/nmt/models/config.py",
        "src/nmt/models/decoder_only/__init__.py",
        "src/nmt/models/decoder_only/attention.py",
        "src/nmt/models/decoder_only/block.py",
        "src/nmt/models/decoder_only/embedding.py",
        "src/nmt/models/decoder_only/feed_forward.py",
        "src/nmt/models/decoder_only/layer_norm.py",
        "src/nmt/models/decoder_only/model.py",
        "src/nmt/models/decoder_only/size.py",
        "src/nmt/models/entries/__init__.py",
        "src/nmt/models/entries/decoder_only.py",
        "src/nmt/models/masks.py",
        "src/nmt/models/registry.py",
        "src/nmt/models/scratch/__init__.py",
        "src/nmt/models/scratch/attention.py",
        "src/nmt/models/scratch/dropout.py",
        "src/nmt/models/scratch/embedding.py",
        "src/nmt/models/scratch/feed_forward.py",
        "src/nmt/models/scratch/rotary.py",
    ],
    "scratch": [
        "src/nmt/models/__init__.py",
        "src/nmt/models/config.py",
        "src/nmt/models/decoder_only/__init__.py",
        "src/nmt/models/decoder_only/size.py",
        "src/nmt/models/entries/__init__.py",
        "src/nmt/models/entries/scratch.py",
        "src/nmt/models/masks.py",
        "src/nmt/models/registry.py",
        "src/nmt/models/scratch/__init__.py",
        "src/nmt/models/scratch/attention.py",
        "src/nmt/models/scratch/decoder.py",
        "src/nmt/models/scratch/dropout.py",
        "src/nmt/models/scratch/embedding.py",
        "src/nmt/models/scratch/encoder.py",
        "src/nmt/models/scratch/feed_forward.py",
        "src/nmt/models/scratch/rotary.py",
        "src/nmt/models/scratch/transformer.py",
    ],
    "verify-baseline": [
        "src/nmt/models/__init__.py",
        "src/nmt/models/baseline.py",
        "src/nmt/models/beams.py",
        "src/nmt/models/config.py",
        "src/nmt/models/decoder_only/__init__.py",
        "src/nmt/models/decoder_only/size.py",
        "src/nmt/models/entries/__init__.py",
        "src/nmt/models/entries/baseline.py",
        "src/nmt/models/mapping.py",
        "src/nmt/models/masks.py",
        "src/nmt/models/registry.py",
    ],
    "verify-decoder_only": [
        "src/nmt/core/__init__.py",
        "src/nmt/core/codecs.py",
        "src/nmt/core/data.py",
        "src/nmt/core/dvc_cache.py",
        "src/nmt/core/files.py",
        "src/nmt/core/records.py",
        "src/nmt/core/text.py",
        "src/nmt/models/__init__.py",
        "src/nmt/models/beams.py",
        "src/nmt/models/config.py",
        "src/nmt/models/decoder_only/__init__.py",
        "src/nmt/models/decoder_only/attention.py",
        "src/nmt/models/decoder_only/block.py",
        "src/nmt/models/decoder_only/embedding.py",
        "src/nmt/models/decoder_only/feed_forward.py",
        "src/nmt/models/decoder_only/layer_norm.py",
        "src/nmt/models/decoder_only/model.py",
        "src/nmt/models/decoder_only/size.py",
        "src/nmt/models/entries/__init__.py",
        "src/nmt/models/entries/decoder_only.py",
        "src/nmt/models/masks.py",
        "src/nmt/models/registry.py",
        "src/nmt/models/scratch/__init__.py",
        "src/nmt/models/scratch/attention.py",
        "src/nmt/models/scratch/dropout.py",
        "src/nmt/models/scratch/embedding.py",
        "src/nmt/models/scratch/feed_forward.py",
        "src/nmt/models/scratch/rotary.py",
        "src/nmt/stages/__init__.py",
        "src/nmt/stages/verify/__init__.py",
        "src/nmt/stages/verify/checklist.py",
        "src/nmt/stages/verify/decoder_only.py",
        "src/nmt/stages/verify/measure.py",
        "src/nmt/stages/verify/properties.py",
        "src/nmt/stages/verify/suite.py",
    ],
    "verify-scratch": [
        "src/nmt/core/__init__.py",
        "src/nmt/core/codecs.py",
        "src/nmt/core/data.py",
        "src/nmt/core/dvc_cache.py",
        "src/nmt/core/files.py",
        "src/nmt/core/records.py",
        "src/nmt/core/text.py",
        "src/nmt/models/__init__.py",
        "src/nmt/models/baseline.py",
        "src/nmt/models/beams.py",
        "src/nmt/models/config.py",
        "src/nmt/models/decoder_only/__init__.py",
        "src/nmt/models/decoder_only/size.py",
        "src/nmt/models/entries/__init__.py",
        "src/nmt/models/entries/baseline.py",
        "src/nmt/models/entries/scratch.py",
        "src/nmt/models/mapping.py",
        "src/nmt/models/masks.py",
        "src/nmt/models/registry.py",
        "src/nmt/models/scratch/__init__.py",
        "src/nmt/models/scratch/attention.py",
        "src/nmt/models/scratch/decoder.py",
        "src/nmt/models/scratch/dropout.py",
        "src/nmt/models/scratch/embedding.py",
        "src/nmt/models/scratch/encoder.py",
        "src/nmt/models/scratch/feed_forward.py",
        "src/nmt/models/scratch/rotary.py",
        "src/nmt/models/scratch/transformer.py",
        "src/nmt/stages/__init__.py",
        "src/nmt/stages/verify/__init__.py",
        "src/nmt/stages/verify/checklist.py",
        "src/nmt/stages/verify/equivalence.py",
        "src/nmt/stages/verify/measure.py",
        "src/nmt/stages/verify/properties.py",
        "src/nmt/stages/verify/suite.py",
    ],
}


rule names:
    input:
        code=[
            *SHARED_CODE,
            "src/nmt/stages/names.py",
            "src/nmt/core/__init__.py",
            "src/nmt/core/files.py",
            "src/nmt/stages/__init__.py",
        ],
    output:
        "params/names.yaml",
    params:
        values=declared(params=["pipeline", "bench.recipe"]),
    log:
        "logs/names.log",
    conda:
        "../envs/nmt.yaml"
    shell:
        "nmt names --out params/names.yaml 2> {log}"


rule config:
    input:
        "workflow/multi30k.sha256",
        "params/names.yaml",
        code=[
            *SHARED_CODE,
            "src/nmt/stages/config.py",
            "src/nmt/core/__init__.py",
            "src/nmt/core/files.py",
            "src/nmt/pipeline/recipes.py",
            "src/nmt/stages/__init__.py",
        ],
    output:
        "params/{recipe}.yaml",
    params:
        values=declared(params=["data", "tokenize", "vocab", "model", "train", "evaluate", "bench",
                                "report", "pipeline", "recipes"]),
    log:
        "logs/config-{recipe}.log",
    conda:
        "../envs/nmt.yaml"
    shell:
        "nmt config --recipe {wildcards.recipe} --out params/{wildcards.recipe}.yaml 2> {log}"


rule sources:
    output:
        "params/sources.sha256",
    log:
        "logs/sources.log",
    conda:
        "../envs/nmt.yaml"
    shell:
        "nmt sources --out params/sources.sha256 2> {log}"


rule download:
    input:
        "params/sources.sha256",
        code=[
            *SHARED_CODE,
            "src/nmt/stages/download.py",
            "src/nmt/core/__init__.py",
            "src/nmt/core/dvc_cache.py",
            "src/nmt/core/files.py",
            "src/nmt/core/records.py",
            "src/nmt/pipeline/corpora/__init__.py",
            "src/nmt/pipeline/corpora/kinds.py",
            "src/nmt/pipeline/corpora/raw.py",
            "src/nmt/pipeline/corpus.py",
            "src/nmt/pipeline/recipes.py",
            "src/nmt/stages/__init__.py",
        ],
    output:
        directory("data/raw"),
    params:
        values=declared(corpus_params=["data.corpus", "data.source_lang", "data.target_lang",
                                       "data.testsets"]),
    log:
        "logs/download.log",
    conda:
        "../envs/nmt.yaml"
    shell:
        "nmt download --out data/raw 2> {log}"


rule tokenize:
    input:
        "data/raw",
        code=[
            *SHARED_CODE,
            "src/nmt/stages/tokenize.py",
            "src/nmt/core/__init__.py",
            "src/nmt/core/dvc_cache.py",
            "src/nmt/core/files.py",
            "src/nmt/core/records.py",
            "src/nmt/core/text.py",
            "src/nmt/stages/__init__.py",
        ],
    output:
        directory("data/tokenized"),
    params:
        values=declared(corpus_params=["data.source_lang", "data.target_lang", "data.testsets",
                                       "data.max_train_pairs", "data.max_test_pairs",
                                       "tokenize.batch_size", "tokenize.words"]),
    threads: 4
    log:
        "logs/tokenize.log",
    conda:
        "../envs/nmt.yaml"
    shell:
        "nmt tokenize --raw data/raw --out data/tokenized --threads {threads} 2> {log}"


rule vocab:
    input:
        "data/tokenized",
        code=[
            *SHARED_CODE,
            "src/nmt/stages/vocab.py",
            "src/nmt/core/__init__.py",
            "src/nmt/core/codecs.py",
            "src/nmt/core/dvc_cache.py",
            "src/nmt/core/files.py",
            "src/nmt/core/records.py",
            "src/nmt/core/text.py",
            "src/nmt/stages/__init__.py",
        ],
    output:
        directory("data/vocab/{recipe}"),
    params:
        values=declared(recipe_params=["data.source_lang", "data.target_lang", "vocab.kind",
                                       "vocab.min_freq", "vocab.bpe_size", "vocab.bpe_sample"]),
    log:
        "logs/vocab-{recipe}.log",
    conda:
        "../envs/nmt.yaml"
    shell:
        "nmt vocab --recipe {wildcards.recipe} --tokenized data/tokenized"
        " --out data/vocab/{wildcards.recipe} 2> {log}"


rule verify:
    input:
        "data/tokenized",
        "data/vocab/{recipe}",
        code=lambda wildcards: [
            *SHARED_CODE,
            "src/nmt/stages/verify/__init__.py",
            "src/nmt/core/__init__.py",
            "src/nmt/core/codecs.py",
            "src/nmt/core/data.py",
            "src/nmt/core/dvc_cache.py",
            "src/nmt/core/files.py",
            "src/nmt/core/records.py",
            "src/nmt/core/text.py",
            "src/nmt/models/__init__.py",
            "src/nmt/models/config.py",
            "src/nmt/models/registry.py",
            "src/nmt/stages/__init__.py",
            "src/nmt/stages/verify/checklist.py",
            "src/nmt/stages/verify/measure.py",
            "src/nmt/stages/verify/suite.py",
            *MODEL_CODE[f"verify-{wildcards.model}"],
        ],
    output:
        "results/verify/{recipe}-{model}.json",
    params:
        values=declared(recipe_params=["model"]),
    threads: 8
    log:
        "logs/verify-{recipe}-{model}.log",
    conda:
        "../envs/nmt.yaml"
    shell:
        "nmt verify --recipe {wildcards.recipe} --model {wildcards.model}"
        " --tokenized data/tokenized --vocab data/vocab/{wildcards.recipe}"
        " --out results/verify/{wildcards.recipe}-{wildcards.model}.json --threads {threads}"
        " 2> {log}"


rule train:
    input:
        "results/verify/{recipe}-{model}.json",
        "data/tokenized",
        "data/vocab/{recipe}",
        code=lambda wildcards: [
            *SHARED_CODE,
            "src/nmt/stages/train.py",
            "src/nmt/core/__init__.py",
            "src/nmt/core/checkpoint.py",
            "src/nmt/core/codecs.py",
            "src/nmt/core/data.py",
            "src/nmt/core/decoding.py",
            "src/nmt/core/dvc_cache.py",
            "src/nmt/core/files.py",
            "src/nmt/core/loss.py",
            "src/nmt/core/process.py",
            "src/nmt/core/records.py",
            "src/nmt/core/runs.py",
            "src/nmt/core/runtime.py",
            "src/nmt/core/text.py",
            "src/nmt/models/__init__.py",
            "src/nmt/models/config.py",
            "src/nmt/models/registry.py",
            "src/nmt/stages/__init__.py",
            "src/nmt/training/__init__.py",
            "src/nmt/training/config.py",
            "src/nmt/training/distributed.py",
            "src/nmt/training/faults.py",
            "src/nmt/training/folder.py",
            "src/nmt/training/graphs.py",
            "src/nmt/training/launch.py",
            "src/nmt/training/loop.py",
            "src/nmt/training/meter.py",
            "src/nmt/training/outputs.py",
            "src/nmt/training/precision.py",
            "src/nmt/training/precision_cache.py",
            "src/nmt/training/precision_record.py",
            "src/nmt/training/precision_timing.py",
            "src/nmt/training/resume.py",
            "src/nmt/training/state.py",
            "src/nmt/training/state_writer.py",
            "src/nmt/training/step.py",
            *MODEL_CODE[wildcards.model],
        ],
    output:
        "results/{recipe}-{model}-s{seed}/best.pt",
        "results/{recipe}-{model}-s{seed}/last.pt",
        "results/{recipe}-{model}-s{seed}/train.json",
        "results/{recipe}-{model}-s{seed}/history.csv",
    params:
        values=declared(recipe_params=["data.source_lang", "data.target_lang",
                                       "data.max_train_pairs", "model", "train"]),
    threads: 8
    resources:
        gpu=from_recipe("train.devices"),
        gpu_mem_mb=0,
    log:
        "logs/train-{recipe}-{model}-{seed}.log",
    conda:
        "../envs/nmt.yaml"
    shell:
        "nmt train --recipe {wildcards.recipe} --model {wildcards.model} --seed {wildcards.seed}"
        " --tokenized data/tokenized --vocab data/vocab/{wildcards.recipe} --results results"
        " --threads {threads} --gpu-mem-mb {resources.gpu_mem_mb} 2> {log}"


rule evaluate:
    input:
        "results/{recipe}-{model}-s{seed}/best.pt",
        "data/tokenized",
        "data/vocab/{recipe}",
        code=lambda wildcards: [
            *SHARED_CODE,
            "src/nmt/stages/evaluate.py",
            "src/nmt/core/__init__.py",
            "src/nmt/core/checkpoint.py",
            "src/nmt/core/codecs.py",
            "src/nmt/core/data.py",
            "src/nmt/core/decoding.py",
            "src/nmt/core/dvc_cache.py",
            "src/nmt/core/files.py",
            "src/nmt/core/loss.py",
            "src/nmt/core/process.py",
            "src/nmt/core/records.py",
            "src/nmt/core/runs.py",
            "src/nmt/core/runtime.py",
            "src/nmt/core/text.py",
            "src/nmt/core/unknowns.py",
            "src/nmt/models/__init__.py",
            "src/nmt/models/config.py",
            "src/nmt/models/registry.py",
            "src/nmt/stages/__init__.py",
            "src/nmt/training/__init__.py",
            "src/nmt/training/config.py",
            "src/nmt/training/distributed.py",
            "src/nmt/training/graphs.py",
            "src/nmt/training/launch.py",
            "src/nmt/training/precision.py",
            "src/nmt/training/precision_cache.py",
            "src/nmt/training/precision_record.py",
            "src/nmt/training/precision_timing.py",
            "src/nmt/training/step.py",
            *MODEL_CODE[wildcards.model],
        ],
    output:
        directory("results/{recipe}-{model}-s{seed}/translations"),
        "results/{recipe}-{model}-s{seed}/attention.json",
        "results/{recipe}-{model}-s{seed}/evaluation.json",
        "results/{recipe}-{model}-s{seed}/metrics.json",
    params:
        values=declared(recipe_params=["data.target_lang", "evaluate", "model", "train"]),
    threads: 8
    resources:
        gpu=1,
        gpu_mem_mb=0,
    log:
        "logs/evaluate-{recipe}-{model}-{seed}.log",
    conda:
        "../envs/nmt.yaml"
    shell:
        "nmt evaluate --recipe {wildcards.recipe} --model {wildcards.model}"
        " --seed {wildcards.seed} --tokenized data/tokenized --vocab data/vocab/{wildcards.recipe}"
        " --results results --threads {threads} --gpu-mem-mb {resources.gpu_mem_mb} 2> {log}"


rule export:
    input:
        "results/{recipe}-{model}-s{seed}/best.pt",
        "data/tokenized",
        "data/vocab/{recipe}",
        code=lambda wildcards: [
            *SHARED_CODE,
            "src/nmt/stages/export.py",
            "src/nmt/core/__init__.py",
            "src/nmt/core/checkpoint.py",
            "src/nmt/core/codecs.py",
            "src/nmt/core/data.py",
            "src/nmt/core/decoding.py",
            "src/nmt/core/dvc_cache.py",
            "src/nmt/core/engine.py",
            "src/nmt/core/files.py",
            "src/nmt/core/records.py",
            "src/nmt/core/runs.py",
            "src/nmt/core/text.py",
            "src/nmt/models/__init__.py",
            "src/nmt/models/config.py",
            "src/nmt/models/registry.py",
            "src/nmt/models/scratch/__init__.py",
            "src/nmt/models/scratch/dropout.py",
            "src/nmt/models/scratch/embedding.py",
            "src/nmt/stages/__init__.py",
            *MODEL_CODE[wildcards.model],
        ],
    output:
        directory("exports/{recipe}-{model}-s{seed}"),
    wildcard_constraints:
        model=listed("pipeline.export"),
    params:
        values=declared(recipe_params=["data.source_lang", "data.target_lang",
                                       "evaluate.batch_size", "evaluate.beam_size",
                                       "evaluate.length_penalty", "evaluate.max_len_a",
                                       "evaluate.max_len_b", "model", "train"]),
    threads: 8
    log:
        "logs/export-{recipe}-{model}-{seed}.log",
    conda:
        "../envs/nmt.yaml"
    shell:
        "nmt export --recipe {wildcards.recipe} --model {wildcards.model} --seed {wildcards.seed}"
        " --tokenized data/tokenized --vocab data/vocab/{wildcards.recipe} --results results"
        " --out exports/{wildcards.recipe}-{wildcards.model}-s{wildcards.seed} --threads {threads}"
        " 2> {log}"


rule bench:
    input:
        "data/tokenized",
        expand("data/vocab/{bench}", bench=BENCH),
        code=[
            *SHARED_CODE,
            "src/nmt/stages/bench/__init__.py",
            "src/nmt/core/__init__.py",
            "src/nmt/core/codecs.py",
            "src/nmt/core/data.py",
            "src/nmt/core/decoding.py",
            "src/nmt/core/dvc_cache.py",
            "src/nmt/core/files.py",
            "src/nmt/core/loss.py",
            "src/nmt/core/process.py",
            "src/nmt/core/records.py",
            "src/nmt/core/runtime.py",
            "src/nmt/core/text.py",
            "src/nmt/models/__init__.py",
            "src/nmt/models/baseline.py",
            "src/nmt/models/beams.py",
            "src/nmt/models/config.py",
            "src/nmt/models/decoder_only/__init__.py",
            "src/nmt/models/decoder_only/attention.py",
            "src/nmt/models/decoder_only/block.py",
            "src/nmt/models/decoder_only/embedding.py",
            "src/nmt/models/decoder_only/feed_forward.py",
            "src/nmt/models/decoder_only/layer_norm.py",
            "src/nmt/models/decoder_only/model.py",
            "src/nmt/models/decoder_only/size.py",
            "src/nmt/models/entries/__init__.py",
            "src/nmt/models/entries/baseline.py",
            "src/nmt/models/entries/decoder_only.py",
            "src/nmt/models/entries/scratch.py",
            "src/nmt/models/mapping.py",
            "src/nmt/models/masks.py",
            "src/nmt/models/registry.py",
            "src/nmt/models/scratch/__init__.py",
            "src/nmt/models/scratch/attention.py",
            "src/nmt/models/scratch/decoder.py",
            "src/nmt/models/scratch/dropout.py",
            "src/nmt/models/scratch/embedding.py",
            "src/nmt/models/scratch/encoder.py",
            "src/nmt/models/scratch/feed_forward.py",
            "src/nmt/models/scratch/rotary.py",
            "src/nmt/models/scratch/transformer.py",
            "src/nmt/stages/__init__.py",
            "src/nmt/stages/bench/flops.py",
            "src/nmt/stages/bench/table.py",
            "src/nmt/stages/bench/timing.py",
            "src/nmt/training/__init__.py",
            "src/nmt/training/config.py",
            "src/nmt/training/distributed.py",
            "src/nmt/training/graphs.py",
            "src/nmt/training/launch.py",
            "src/nmt/training/precision.py",
            "src/nmt/training/precision_cache.py",
            "src/nmt/training/precision_record.py",
            "src/nmt/training/precision_timing.py",
            "src/nmt/training/step.py",
        ],
    output:
        "results/bench.json",
    params:
        values=declared(params=["bench", "pipeline.models"],
                        bench_params=["model", "train", "evaluate"]),
        bench=BENCH,
    threads: 8
    resources:
        gpu=1,
        gpu_mem_mb=0,
    log:
        "logs/bench.log",
    conda:
        "../envs/nmt.yaml"
    shell:
        "nmt bench --recipe {params.bench} --tokenized data/tokenized"
        " --vocab data/vocab/{params.bench} --json results/bench.json --threads {threads}"
        " --gpu-mem-mb {resources.gpu_mem_mb} 2> {log}"


rule report:
    input:
        expand("results/verify/{recipe}-{model}.json", recipe=RECIPES, model=MODELS),
        expand("results/{recipe}-{model}-s{seed}/best.pt",
               recipe=RECIPES, model=MODELS, seed=SEEDS),
        expand("results/{recipe}-{model}-s{seed}/last.pt",
               recipe=RECIPES, model=MODELS, seed=SEEDS),
        expand("results/{recipe}-{model}-s{seed}/train.json",
               recipe=RECIPES, model=MODELS, seed=SEEDS),
        expand("results/{recipe}-{model}-s{seed}/history.csv",
               recipe=RECIPES, model=MODELS, seed=SEEDS),
        expand("results/{recipe}-{model}-s{seed}/translations",
               recipe=RECIPES, model=MODELS, seed=SEEDS),
        expand("results/{recipe}-{model}-s{seed}/attention.json",
               recipe=RECIPES, model=MODELS, seed=SEEDS),
        expand("results/{recipe}-{model}-s{seed}/evaluation.json",
               recipe=RECIPES, model=MODELS, seed=SEEDS),
        expand("results/{recipe}-{model}-s{seed}/metrics.json",
               recipe=RECIPES, model=MODELS, seed=SEEDS),
        "results/bench.json",
        "data/tokenized",
        expand("data/vocab/{recipe}", recipe=RECIPES),
        "reports/h200-published/results_summary.csv",
        "reports/h200-published/statistics.json",
        "params/sources.sha256",
        code=[
            *SHARED_CODE,
            "src/nmt/stages/report/__init__.py",
            "src/nmt/core/__init__.py",
            "src/nmt/core/dvc_cache.py",
            "src/nmt/core/files.py",
            "src/nmt/core/records.py",
            "src/nmt/core/runs.py",
            "src/nmt/core/stats.py",
            "src/nmt/core/text.py",
            "src/nmt/pipeline/corpora/__init__.py",
            "src/nmt/pipeline/corpora/kinds.py",
            "src/nmt/pipeline/corpus.py",
            "src/nmt/pipeline/recipes.py",
            "src/nmt/stages/__init__.py",
            "src/nmt/stages/report/answer.py",
            "src/nmt/stages/report/evidence.py",
            "src/nmt/stages/report/figures.py",
            "src/nmt/stages/report/inputs.py",
            "src/nmt/stages/report/load.py",
            "src/nmt/stages/report/markdown.py",
            "src/nmt/stages/report/reference.py",
            "src/nmt/stages/report/search.py",
            "src/nmt/stages/report/size.py",
            "src/nmt/stages/report/speed.py",
            "src/nmt/stages/report/tables.py",
        ],
    output:
        "reports/report.md",
        report("reports/results.csv", category="Results"),
        report("reports/results_summary.csv", category="Results"),
        "reports/statistics.json",
        "reports/curves.csv",
        report(directory("reports/figures"), patterns=["{name}.png"], category="Figures"),
        "reports/metrics.json",
    params:
        values=declared(params=["data", "vocab", "model", "train", "evaluate", "report",
                                "pipeline.recipes", "pipeline.models", "pipeline.seeds",
                                "recipes"]),
    log:
        "logs/report.log",
    conda:
        "../envs/nmt.yaml"
    shell:
        "nmt report --tokenized data/tokenized --vocab data/vocab --results results --out reports"
        " --full-size reports/h200-published 2> {log}"


# What `snakemake` makes when no target is named: the outputs of the stages declared
# `target` (a list with no items, such as pipeline.export: [], expands to none).
rule all:
    input:
        expand(rules.export.output,
               recipe=RECIPES, model=lookup(config, "pipeline.export"), seed=SEEDS),
        rules.report.output,
