#!/usr/bin/env bash
# The whole comparison on a GPU machine that has PyTorch but no network, from what
# tools/gpu/bundle.sh prepared here (carry data/, params/ and .whl/ with the working tree):
#
#   OUT=folder bash tools/gpu/run.sh [MINUTES] [more snakemake arguments]
#
# Snakemake runs the trainings at once under workflow/profiles/gpu. After MINUTES (default 9)
# it is interrupted: each training stops after its current step and keeps its resume state, so
# the same command again (on the same machine) goes on where it stopped. Every call packs the
# small results (no checkpoints) into $OUT/results.tgz and its output into $OUT/log; when the
# whole pipeline is done, `dvc commit` records it in dvc.lock (in the pack too).
#
# Until CUDA graph updates (train.cuda_graphs) have run on a GPU once, check them first, on the
# same machine (about a minute; this script then finds the wheels installed):
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
#       --target /tmp/nmt-site .whl/*.whl
#   PYTHONPATH=/tmp/nmt-site OUT=folder python3 tools/gpu/check_graphs.py
set -euo pipefail
cd "$(dirname "$0")/../.."
minutes=${1:-9}
shift || true
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
export PYTHONUNBUFFERED=1

site=/tmp/nmt-site bin=/tmp/nmt-bin
if [ ! -d "$site" ]; then  # the carried wheels, once a machine
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$site" .whl/*.whl
fi
export PYTHONPATH="$site:$PWD/src" PATH="$bin:$PATH"
mkdir -p "$bin"
for tool in nmt snakemake dvc; do  # the commands the stages and this script call
    printf '#!/bin/sh\nexec python3 -m %s "$@"\n' "$tool" >"$bin/$tool"
    chmod +x "$bin/$tool"
done
[ -d .git ] || git init -q  # DVC wants a git repository; the tree arrives without one
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

# The data stages ran where spaCy and the network are: mark their carried outputs up to date
# (file times do not survive the trip), so Snakemake starts at verify.
vocabs=(data/vocab/*/)
snakemake --workflow-profile workflow/profiles/gpu --touch "${vocabs[@]%/}"

# Two passes within MINUTES: everything but bench (and the report, which reads bench.json)
# first, then the rest. bench holds the whole GPU to be timed alone; in one pass it was ready
# first and kept six trainings waiting 75 s on the first GPU run.
deadline=$(( $(date +%s) + $(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 }') ))
within_minutes() {
    local left=$(( deadline - $(date +%s) ))
    (( left > 0 )) || return 124
    timeout -s INT -k 60 "$left" snakemake --workflow-profile workflow/profiles/gpu "$@"
}
status=0
within_minutes --omit-from bench "$@" || status=$?
if [ "$status" != 124 ]; then  # time left: bench, the report, and a retry of what failed
    status=0
    within_minutes "$@" || status=$?
fi
if [ "$status" = 0 ]; then
    dvc commit -f -q && echo "dvc.lock: every stage recorded"
else
    echo "snakemake stopped (exit $status); run this again to go on"
fi
tar czf "$OUT/results.tgz" --exclude='*.pt' results reports dvc.lock logs 2>/dev/null || true
ls -la "$OUT"
exit "$status"
