# The workflow lives in workflow/; this file lets `snakemake` run from the repo root.
include: "workflow/Snakefile"


# Snakemake ignores default targets set in included files, so name it here.
rule default:
    default_target: True
    input:
        rules.all.input,
