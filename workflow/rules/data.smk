# Data stages: download -> tokenize -> vocab (one vocabulary per recipe).


rule download:
    output:
        directory("data/raw"),
    input:
        f"{CODE}/download.py",
    params:
        base_url=config["data"]["base_url"],
    conda:
        "../envs/nmt.yaml"
    log:
        "logs/download.log",
    shell:
        "nmt download --out {output} 2> {log}"


rule tokenize:
    output:
        directory("data/tokenized"),
    input:
        raw="data/raw",
        code=f"{CODE}/tokenize.py",
    params:
        data=section("data"),
        tokenize=section("tokenize"),
    conda:
        "../envs/nmt.yaml"
    log:
        "logs/tokenize.log",
    shell:
        "nmt tokenize --raw {input.raw} --out {output} 2> {log}"


rule vocab:
    output:
        directory("data/vocab/{recipe}"),
    input:
        tokenized="data/tokenized",
        code=f"{CODE}/vocab.py",
    params:
        vocab=lambda w: vocab_section(w.recipe),
    conda:
        "../envs/nmt.yaml"
    log:
        "logs/vocab/{recipe}.log",
    shell:
        "nmt vocab --recipe {wildcards.recipe} --tokenized {input.tokenized} --out {output} "
        "2> {log}"
