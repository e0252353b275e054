# The speed benchmark and the report: tables, figures and sample translations of every run.


rule bench:
    output:
        "results/bench.json",
    input:
        tokenized="data/tokenized",
        vocab=f"data/vocab/{config['bench']['recipe']}",
        code=[f"{CODE}/bench.py", f"{CODE}/search.py", f"{CODE}/train.py", f"{CODE}/models"],
    params:
        recipe=config["bench"]["recipe"],
        bench=section("bench"),
        model=section("model", config["bench"]["recipe"]),
        train=section("train", config["bench"]["recipe"]),
        evaluate=section("evaluate", config["bench"]["recipe"]),
    resources:
        gpu=1,
    conda:
        "../envs/nmt.yaml"
    log:
        "logs/bench.log",
    shell:
        "nmt bench --recipe {params.recipe} --json {output} 2> {log}"


rule report:
    output:
        report="reports/report.md",
        table="reports/results.csv",
        metrics="reports/metrics.json",
        figures=directory("reports/figures"),
    input:
        metrics=expand("results/{recipe}-{model}-s{seed}/metrics.json", recipe=RECIPES, model=MODELS, seed=SEEDS),
        history=expand("results/{recipe}-{model}-s{seed}/history.csv", recipe=RECIPES, model=MODELS, seed=SEEDS),
        verified=expand("results/verify/{recipe}.json", recipe=RECIPES),
        bench="results/bench.json",
        code=f"{CODE}/report.py",
    params:
        pipeline=section("pipeline"),
        report=section("report"),
    conda:
        "../envs/nmt.yaml"
    log:
        "logs/report.log",
    shell:
        "nmt report --results results --out reports 2> {log}"
