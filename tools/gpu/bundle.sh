#!/usr/bin/env bash
# Prepare a run of the pipeline on a GPU machine that has PyTorch but no network and none of
# DVC, Snakemake, jsonschema or spaCy: build the data stages here (download ... vocab, the
# only ones that need the network or spaCy) and verify (a minute or two of CPU here that the
# GPU machine's minutes need not pay), and download, as wheels for the machine's Python, what
# `nmt`, Snakemake and DVC need there beyond its image (image-packages.txt).
#
#   make gpu-bundle          # = bash tools/gpu/bundle.sh; then carry data/, params/,
#   bash tools/gpu/run.sh    # results/verify/ and .whl/ over, and run this there
#
# Environment: PY (the machine's Python, default 3.12), PLATFORMS (its manylinux tags), STEPS
# (default "data wheels": which of the two parts to run).
#
# Its bundles carried the GPU runs of docs/gpu.md (95 wheels, 42 MB). tests/test_tools.py runs
# its data part (STEPS=data) at tiny size in a copy of the repository; the wheels' part needs
# the network, and is left to `make gpu-bundle`.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-3.12}
BIN=${BIN:-.venv/bin}
export PATH="$(cd "$BIN" && pwd):$PATH"  # the stages' `nmt` (make gpu-bundle sets it too)
WHEELS=.whl
STEPS=${STEPS-data wheels}
platforms=(${PLATFORMS:-manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64
            manylinux2014_x86_64 manylinux1_x86_64 any})

if [[ " $STEPS " == *" data "* ]]; then
    echo "== data: dvc repro verify (download, tokenize, config, vocab and verify of every recipe)"
    "$BIN/dvc" repro verify
fi

if [[ " $STEPS " == *" wheels "* ]]; then
    echo "== wheels for Python $PY: snakemake, dvc, jsonschema and what they need"
    all=$(mktemp -d)
    trap 'rm -rf "$all"' EXIT
    pins() { grep -iE "^($(IFS='|'; echo "$*"))==" constraints.txt requirements.txt | cut -d: -f2 | sort -u; }
    # These two are published as source only: build their (pure-Python) wheels here first.
    "$BIN/python" -m pip wheel -q --no-deps -w "$all" $(pins antlr4-python3-runtime connection_pool)
    "$BIN/python" -m pip download -q --only-binary=:all: --find-links "$all" -d "$all" \
        --python-version "$PY" --implementation cp ${platforms[@]/#/--platform } \
        -c constraints.txt $(pins snakemake dvc ruamel.yaml.clib jsonschema)
    rm -rf "$WHEELS" && mkdir -p "$WHEELS"
    normal() { tr 'A-Z_.' 'a-z--'; }
    image=$(grep -v '^#' tools/gpu/image-packages.txt | normal)
    for wheel in "$all"/*.whl; do
        name=$(basename "$wheel" | cut -d- -f1 | normal)
        grep -qx "$name" <<<"$image" || cp "$wheel" "$WHEELS/"
    done
    echo "== wheels: $(ls "$WHEELS" | wc -l) ($(du -sh "$WHEELS" | cut -f1))"
fi
echo "== ready: data/ $(du -sh data | cut -f1), results/verify/ $(du -sh results/verify | cut -f1)"
