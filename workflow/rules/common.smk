# How a declared output becomes a Snakemake output: folders are directory(), and outputs the
# declaration gives a report category are marked for `snakemake --report`.
from nmt.stages import is_dir


def output(path, stage):
    out = directory(path) if is_dir(path) else path
    category = stage.report.get(path)
    if category is None:
        return out
    if is_dir(path):
        return report(out, patterns=["{name}.png"], category=category)
    return report(out, category=category)
