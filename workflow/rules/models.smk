# Model stages: verify (per recipe) -> train -> evaluate (per recipe and model).


rule verify:
    output:
        "results/verify/{recipe}.json",
    input:
        tokenized="data/tokenized",
        vocab="data/vocab/{recipe}",
        code=[f"{CODE}/verify.py", f"{CODE}/data.py", f"{CODE}/models"],
    params:
        model=lambda w: section("model", w.recipe),
    conda:
        "../envs/nmt.yaml"
    log:
        "logs/verify/{recipe}.log",
    shell:
        "nmt verify --recipe {wildcards.recipe} --out {output} 2> {log}"


rule train:
    output:
        best="results/{recipe}-{model}-s{seed}/best.pt",
        last="results/{recipe}-{model}-s{seed}/last.pt",
        summary="results/{recipe}-{model}-s{seed}/train.json",
        history="results/{recipe}-{model}-s{seed}/history.csv",
    input:
        verified="results/verify/{recipe}.json",  # no training until the models are proven equal
        tokenized="data/tokenized",
        vocab="data/vocab/{recipe}",
        code=[f"{CODE}/train.py", f"{CODE}/data.py", f"{CODE}/models"],
    params:
        model=lambda w: section("model", w.recipe),
        train=lambda w: section("train", w.recipe),
    resources:
        gpu=1,  # the default profile caps gpu=1: two trainings never share one GPU
    conda:
        "../envs/nmt.yaml"
    log:
        "logs/train/{recipe}-{model}-s{seed}.log",
    shell:
        "nmt train --recipe {wildcards.recipe} --model {wildcards.model} --seed {wildcards.seed} 2> {log}"


rule evaluate:
    output:
        metrics="results/{recipe}-{model}-s{seed}/metrics.json",
        translations=directory("results/{recipe}-{model}-s{seed}/translations"),
        attention="results/{recipe}-{model}-s{seed}/attention.json",
    input:
        checkpoint="results/{recipe}-{model}-s{seed}/best.pt",
        tokenized="data/tokenized",
        vocab="data/vocab/{recipe}",
        code=[f"{CODE}/evaluate.py", f"{CODE}/search.py", f"{CODE}/models"],
    params:
        evaluate=lambda w: section("evaluate", w.recipe),
    resources:
        gpu=1,
    conda:
        "../envs/nmt.yaml"
    log:
        "logs/evaluate/{recipe}-{model}-s{seed}.log",
    shell:
        "nmt evaluate --recipe {wildcards.recipe} --model {wildcards.model} --seed {wildcards.seed} 2> {log}"
