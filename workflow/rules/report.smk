# The report: tables, figures and sample translations of every (recipe, model) run.


rule report:
    output:
        report="reports/report.md",
        table="reports/results.csv",
        metrics="reports/metrics.json",
        figures=directory("reports/figures"),
    input:
        metrics=expand("results/{recipe}-{model}/metrics.json", recipe=RECIPES, model=MODELS),
        history=expand("results/{recipe}-{model}/history.csv", recipe=RECIPES, model=MODELS),
        verified=expand("results/verify/{recipe}.json", recipe=RECIPES),
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
