"""Corpus kind huggingface: data.huggingface {path, name, splits}, each split read with
datasets.load_dataset(path, name, split=...), its two languages from a `translation` column
({de: ..., en: ...}, as WMT-style datasets hold them) or from one column a language. The path
is a Hub id or a local dataset folder (parquet, json, arrow); a Hub dataset works offline from
the local Hugging Face cache (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from nmt.core.errors import NmtError
from nmt.core.files import sha256
from nmt.pipeline.corpora.raw import Origin, write_split
from nmt.pipeline.corpus import splits

# Its settings: the keys of data it reads, download and sources alike (workflow/stages.yaml
# declares them for both as "data.{kind}").
SETTINGS = ("data.huggingface",)


def check(data: dict, at: str) -> None:
    """A path, and a datasets split for every split (train, val, each test set)."""
    hf = data.get("huggingface") or {}
    if not hf.get("path") or "splits" not in hf:
        raise NmtError(f"params.yaml: {at}: corpus huggingface needs {at}.huggingface "
                       "(fix: add {path: <hub id or folder>, name: <config>, splits: "
                       "{train: ..., val: ..., <test set>: ...}})")
    for split in splits(data):
        if split not in (hf["splits"] or {}):
            what = "test set" if split in data["testsets"] else "split"
            raise NmtError(f"params.yaml: {at}.huggingface.splits: the {what} {split} "
                           f"has no datasets split (fix: add {split}: <split, e.g. test>)")


def preflight(data: dict, at: str, root: Path) -> None:
    """Nothing before any job: whether the dataset loads is download's to say."""


def describe(data: dict, root: Path) -> list[str]:
    """The sha256 of each file of a local dataset folder (a Hub dataset is known by its
    settings, which the record holds before these lines)."""
    folder = Path(root) / data["huggingface"]["path"]
    if not folder.is_dir():
        return []
    files = [f.relative_to(folder) for f in sorted(folder.rglob("*")) if f.is_file()]
    return [f"{sha256(folder / f)}  {f}" for f in files
            if not any(part.startswith(".") for part in f.parts)]


def title(data: dict) -> str:
    return f"{data['huggingface'].get('path')}"


def download(data: dict, origin: Origin, out: Path) -> None:
    """Each split's two languages into out, both sides checked."""
    hf, langs = data["huggingface"], (data["source_lang"], data["target_lang"])
    for split in splits(data):
        dataset = load_split(hf, split)
        columns = set(dataset.column_names)
        if "translation" in columns:
            def side(lang, dataset=dataset):
                for batch in dataset.select_columns("translation").iter(batch_size=10_000):
                    for pair in batch["translation"]:
                        yield pair[lang]
            first = dataset[0]["translation"] if len(dataset) else {}
            missing = [lang for lang in langs if len(dataset) and lang not in first]
        elif set(langs) <= columns:
            def side(lang, dataset=dataset):
                for batch in dataset.select_columns(lang).iter(batch_size=10_000):
                    yield from batch[lang]
            missing = []
        else:
            missing = [lang for lang in langs if lang not in columns]
        if missing:
            raise NmtError(f"params.yaml: data.huggingface.splits.{split}: {hf['path']} has "
                           f"no {'/'.join(missing)} text (columns: {', '.join(sorted(columns))})"
                           " (fix: a dataset with a translation column {"
                           f"{langs[0]}: ..., {langs[1]}: ...}} or columns {langs[0]}, "
                           f"{langs[1]}; or set data.source_lang/target_lang)")
        write_split(out, split, {lang: side(lang) for lang in langs},
                    f"data.huggingface.splits.{split}")


def vet(data: dict, root: Path) -> None:
    """Whether the dataset resolves (a wrong path or Hub id) and, where its files name their
    splits, whether each split asked for is one: datasets.load_dataset_builder, which reads
    no rows. Sources runs it when data.huggingface or a file of a local dataset changed,
    before either orchestrator deletes data/raw for a download bound to fail."""
    hf = data["huggingface"]
    datasets = imported()
    with load_errors(hf, split=None):
        builder = datasets.load_dataset_builder(hf["path"], hf.get("name"))
    known = {str(split) for split in getattr(builder.config, "data_files", None) or {}}
    for split in splits(data) if known else ():
        spec = hf["splits"][split]  # "train", "train[:1000]", "train+validation"
        for name in (part.split("[")[0].strip() for part in spec.split("+")):
            if name not in known:
                raise NmtError(f"params.yaml: data.huggingface.splits.{split}: {spec!r}: "
                               f"{hf['path']} has no split {name!r} (its splits: "
                               f"{', '.join(sorted(known))}) (fix: name a split the dataset "
                               "has)")


def load_split(hf: dict, split: str):
    """One split of the dataset; a wrong path or split is one line."""
    datasets = imported()
    with load_errors(hf, split):
        return datasets.load_dataset(hf["path"], hf.get("name"), split=hf["splits"][split])


def imported():
    """The datasets package, quiet; one line where it is not installed."""
    try:
        import datasets
    except ImportError:
        raise NmtError("data.corpus huggingface needs the datasets package (fix: pip install "
                       "datasets, as requirements.txt pins it)") from None
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    return datasets


@contextmanager
def load_errors(hf: dict, split: str | None):
    """What datasets raises for a wrong path or split, as one line naming the params key."""
    import datasets
    try:
        yield
    except ValueError as e:  # an unknown split or a bad slice; an unknown config name
        if split is None:
            raise NmtError(f"params.yaml: data.huggingface: {hf['path']!r}: {e} (fix: name "
                           "a config the dataset has)") from None
        raise NmtError(f"params.yaml: data.huggingface.splits.{split}: "
                       f"{hf['splits'][split]!r}: {e} (fix: name a split the dataset "
                       "has)") from None
    except (FileNotFoundError, ConnectionError, OSError,
            datasets.exceptions.DatasetNotFoundError) as e:
        raise NmtError(f"params.yaml: data.huggingface.path: cannot load {hf['path']!r}"
                       f"{' (' + hf['name'] + ')' if hf.get('name') else ''}: "
                       f"{str(e).splitlines()[0] if str(e) else type(e).__name__} (fix: a Hub "
                       "id reachable or in the local cache, or a local dataset folder)") from None
