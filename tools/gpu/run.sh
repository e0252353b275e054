#!/usr/bin/env bash
# The whole comparison on a GPU machine that has PyTorch but no network, from what
# tools/gpu/bundle.sh prepared here (carry data/, results/verify/, params/ and .whl/ with the
# working tree):
#
#   OUT=folder bash tools/gpu/run.sh [MINUTES] [EXTRA RUNS ...]
#
# Within MINUTES (default 9), in this order:
#   1. tools/gpu/preflight.py, parts A and B: which attention kernels the models take, each
#      checked against a float64 reference (dropout included); its verdict, preflight.json.
#      Where a kernel fails, every stage leaves it out (NMT_ATTENTION_KERNELS, the route the
#      preflight prints), and the route is checked (preflight-routed.json). Part C, scratch's
#      expected gradient against the baseline's from the same weights, runs beside the
#      trainings of step 5 (preflight-gradients.json).
#   2. tools/gpu/check_graphs.py: CUDA graph updates against eager ones (dropout off), dropout
#      on in replayed graphs, and the milliseconds an update of each ($OUT/check_graphs.json).
#      If the graphs fail it, training runs eagerly (train.cuda_graphs: false here).
#   3. CUDA MPS (tools/gpu/mps.sh): the Multi-Process Service started where it can (its binary,
#      root, MPS not 0) and probed, so that the trainings' processes share the GPU as its
#      clients; otherwise one line says why and they share it as before. $OUT/mps.txt says
#      which. Optionally first, and again once MPS is on, tools/gpu/concurrency.py: the
#      aggregate speed of 1, 3, 6 and 9 trainings at once against one alone, without MPS
#      (concurrency-nomps.json) and with it (concurrency-mps.json).
#   4. tools/gpu/plan.py: which runs fit in the minutes left at that speed, run at once as the
#      concurrency measurement of this MPS setting says (none measured: their seconds add
#      up), the published baseline and scratch first, then EXTRA RUNS in the order given
#      (e.g. published-baseline-s1 published-scratch-s1), then the rest of params.yaml's
#      pipeline; it prints the plan.
#   5. Snakemake (workflow/profiles/gpu) trains and evaluates the planned runs at once, then
#      the bench and the report if every run of the pipeline is in the plan. At the deadline it
#      is interrupted: each training stops after its current step and keeps its resume state,
#      so the same command again (on the same machine) goes on where it stopped; runs the
#      first call finished stay up to date (the carried inputs are touched once a machine) and
#      the plan counts them done.
# Every call packs the small results (no checkpoints) into $OUT/results.tgz and its output
# into $OUT/log; when the whole pipeline is done, `dvc commit` records it in dvc.lock.
# CHECKS (default "preflight graphs") names the checks to run: "preflight" (1), "graphs" (2),
# "concurrency" (3's measurements: not by default; estimated at a minute or two each, without
# and with MPS, at the published size, at most 4 minutes each). A second call on the same
# machine needs none (plan.py reuses the first call's check_graphs.json and the
# concurrency-*.json of its MPS setting, kept in $CHECK_DIR, default .kit/checks). MPS=0
# leaves MPS off (to compare); CONCURRENCY_OPTIONS, concurrency.py's options (e.g. "--counts
# 1,3 --updates 100"). UPDATE_MS gives plan.py the milliseconds an update measured
# earlier on this kind of GPU, where step 2 is left out on a fresh machine. KIT (default
# .kit in the checkout, which git ignores: the kit writes nothing outside the checkout and
# OUT) is where the wheels are installed (nmt-site, once: a folder already there is kept),
# the commands' wrappers written (nmt-bin), and MPS's pipe and log folders made (mps).
# Minutes that are no positive number, an OUT this user cannot write, or a tree without what
# bundle.sh prepared: one line, exit 2, before any work. Killed, however: no process left.
#
# Its runs are the GPU runs of docs/gpu.md (reports/gpu-first-run, gpu-second-run and
# h200-published). tests/test_tools.py runs it at tiny size on the CPU, after bundle.sh's data
# part, in a copy of the repository (CHECKS="": the preflight, the graph check and the
# concurrency measurement have their own tests; KIT holds an empty nmt-site: the test's Python
# has the packages; no MPS daemon on the CPU: the "MPS: off" line).
set -euo pipefail
cd "$(dirname "$0")/../.."
minutes=${1:-9}
shift || true
extra=("$@")
OUT=${OUT:-gpu-out}
CHECKS=${CHECKS-preflight graphs}
KIT=${KIT:-$PWD/.kit}  # in the checkout (git ignores it): nothing written outside it
CHECK_DIR=${CHECK_DIR:-$KIT/checks}
export MPS_ROOT=${MPS_ROOT:-$KIT/mps}
# What the kit needs, each a line before any work (exit 2): minutes, a writable OUT, and what
# bundle.sh prepared (Snakemake's own error for a missing data/ names no fix).
refuse() { echo "run.sh: $1" >&2; exit 2; }
[[ $minutes =~ ^[0-9]+([.][0-9]+)?$ ]] && awk -v m="$minutes" 'BEGIN { exit !(m > 0) }' \
    || refuse "MINUTES is '$minutes': give a positive number of minutes (e.g. 9)"
mkdir -p "$OUT" 2>/dev/null && [ -w "$OUT" ] && [ -d "$OUT" ] \
    || refuse "OUT '$OUT' is not a folder this user can write (fix: OUT=<a writable folder>)"
wheels=$([ -d "$KIT/nmt-site" ] || echo .whl)  # needed until a call installed them
for carried in data/tokenized data/vocab results/verify params $wheels; do
    [ -e "$carried" ] || refuse "the kit has no $carried (fix: make gpu-bundle where spaCy and \
the network are, then carry data/, results/verify/, params/ and .whl/ with the tree)"
done
deadline=$(( $(date +%s) + $(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 }') ))
minutes_left() { awk -v s=$(( deadline - $(date +%s) )) 'BEGIN { printf "%.2f", s / 60 }'; }
exec > >(tee -a "$OUT/log") 2>&1
export PYTHONUNBUFFERED=1

# A killed kit leaves no process behind, however it was killed (SIGKILL included): a watcher
# notes the kit's descendants every 2 s and, once the kit is gone, stops those still running
# (the checks, Snakemake and its trainings, which keep their resume state on SIGTERM) and
# what they started since. A list taken while the kit died may be cut short (its children are
# no longer the kit's once it is gone): it is added to the last, not put in its place.
descendants() {  # $1's descendants but the watcher ($2) and its own
    local child
    for child in $(pgrep -P "$1"); do
        [ "$child" = "$2" ] || { echo "$child"; descendants "$child" "$2"; }
    done
}
kit_pid=$$
(
    watcher=$BASHPID known=""
    while kill -0 "$kit_pid" 2>/dev/null; do
        seen=$(descendants "$kit_pid" "$watcher")
        if kill -0 "$kit_pid" 2>/dev/null; then known=$seen; else known="$known $seen"; fi
        sleep 2
    done
    for pid in $known; do known="$known $(descendants "$pid" "$watcher")"; done
    for pid in $known; do kill -TERM "$pid" 2>/dev/null || true; done
) </dev/null >/dev/null 2>&1 &

site=$KIT/nmt-site bin=$KIT/nmt-bin
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

# The data stages and verify ran where spaCy and the network are: mark their carried outputs
# up to date (file times do not survive the trip), so Snakemake starts at the trainings. Once
# for what was carried: touched again on a second call to this machine, they are newer than
# the runs the first call finished, and Snakemake trains those again (it did, in the first
# study session: reports/h200-study/). Other carried files (a new bundle) are touched again.
carried=$(find data/tokenized data/vocab results/verify params -type f \
          ! -name .snakemake_timestamp -exec sha256sum {} + | sort -k 2)  # (--touch writes those)
if [ "$(cat "$KIT/carried.sha256" 2>/dev/null)" != "$carried" ]; then
    [ -f "$KIT/carried.sha256" ] && diff <(echo "$carried") "$KIT/carried.sha256" | sed -n \
        's/^< [0-9a-f]*  /carried anew since the last call: /p' || true
    vocabs=(data/vocab/*/)
    snakemake --workflow-profile workflow/profiles/gpu --touch "${vocabs[@]%/}" \
        results/verify/*.json
    echo "$carried" >"$KIT/carried.sha256"
else
    echo "the carried data and verify records are this machine's first call's: not touched again"
fi

mkdir -p "$CHECK_DIR"
preflight() {  # tools/gpu/preflight.py, its JSON in $CHECK_DIR/$1 and $OUT
    local json=$1
    shift
    local status=0  # (set -e ends a background subshell at a bare failing command)
    timeout -k 10 150 python3 tools/gpu/preflight.py --json "$CHECK_DIR/$json" "$@" || status=$?
    cp "$CHECK_DIR/$json" "$OUT/" 2>/dev/null || true
    return $status
}
if [[ " $CHECKS " == *" preflight "* ]]; then
    echo "== 1. preflight: the attention kernels ($(minutes_left) min left)"
    if ! preflight preflight.json --parts AB; then
        route=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1])).get(
            'attention_kernels', ''))" "$CHECK_DIR/preflight.json" 2>/dev/null || true)
        if [ -n "$route" ]; then  # every stage leaves out the kernel found wrong
            export NMT_ATTENTION_KERNELS=$route
            echo "NMT_ATTENTION_KERNELS=$route: checking the route"
            preflight preflight-routed.json --parts AB || echo "the route fails too: see above"
        fi
    fi
fi
if [[ " $CHECKS " == *" graphs "* ]]; then
    echo "== 2. CUDA graphs against eager updates ($(minutes_left) min left)"
    graphs=0
    OUT="$CHECK_DIR" timeout -k 10 150 python3 tools/gpu/check_graphs.py --updates 100 \
        || graphs=$?
    cp "$CHECK_DIR/check_graphs.json" "$OUT/" 2>/dev/null || true
    if [ "$graphs" != 0 ]; then
        echo "CUDA graphs failed their check (exit $graphs): training eagerly (train.cuda_graphs: false)"
        python3 - <<'PY'
from pathlib import Path
import re
path = Path("params.yaml")
path.write_text(re.sub(r"(?m)^(  cuda_graphs:) auto", r"\1 false", path.read_text(), count=1))
PY
    fi
fi

concurrency() {  # tools/gpu/concurrency.py under this shell's MPS setting, its JSON to $1
    local json=$1 options
    read -ra options <<<"${CONCURRENCY_OPTIONS:-}"
    timeout -k 10 240 python3 tools/gpu/concurrency.py "${options[@]}" --json "$CHECK_DIR/$json" \
        || echo "concurrency.py failed or ran out of time (exit $?): no factors from it"
    cp "$CHECK_DIR/$json" "$OUT/" 2>/dev/null || true
}
echo "== 3. MPS and the trainings at once ($(minutes_left) min left)"
if [[ " $CHECKS " == *" concurrency "* ]]; then  # before the daemon: no process is its client
    concurrency concurrency-nomps.json
fi
source tools/gpu/mps.sh
start_mps "$OUT"
if [ "$MPS_ON" = 1 ] && [[ " $CHECKS " == *" concurrency "* ]]; then
    concurrency concurrency-mps.json
fi
factors=$CHECK_DIR/concurrency-$([ "$MPS_ON" = 1 ] && echo mps || echo nomps).json
concurrency_option=()  # the measurement under the MPS setting the trainings run under
[ -f "$factors" ] && concurrency_option=(--concurrency "$factors")

echo "== 4. plan ($(minutes_left) min left)"
python3 tools/gpu/plan.py --minutes "$(minutes_left)" --check "$CHECK_DIR/check_graphs.json" \
    --ms "${UPDATE_MS:-0}" "${concurrency_option[@]}" --extra "${extra[@]}" \
    --targets "$OUT/targets.txt" --stages "$OUT/stages.txt" --narrowed params.planned.yaml
mapfile -t targets <"$OUT/targets.txt"

echo "== 5. train and evaluate ($(minutes_left) min left)"
within_minutes() {
    local left=$(( deadline - $(date +%s) ))
    (( left > 0 )) || return 124
    timeout -s INT -k 60 "$left" snakemake --workflow-profile workflow/profiles/gpu "$@"
}
# Two passes: the runs first, then bench (it holds the whole GPU to be timed alone; in one
# pass it was ready first and kept six trainings waiting 75 s) and the report.
# The gradients of scratch against the baseline's (the preflight's part C, about a minute, its
# GPU work small beside the trainings') alongside the first pass.
gradients=
if [[ " $CHECKS " == *" preflight "* ]]; then
    preflight preflight-gradients.json --parts AC --models baseline,scratch \
        >"$OUT/preflight-gradients.log" 2>&1 &
    gradients=$!
fi
status=0
within_minutes "${targets[@]}" --omit-from bench || status=$?  # (it takes several words)
if [ "$status" != 124 ]; then  # time left: bench, the report, and a retry of what failed
    status=0
    within_minutes "${targets[@]}" || status=$?
fi
if [ "$status" = 0 ] && grep -qx reports/report.md "$OUT/targets.txt"; then
    dvc commit -f -q && echo "dvc.lock: every stage recorded"
elif [ "$status" = 0 ]; then
    echo "the planned runs are done; the rest of the pipeline did not fit (see the plan)"
    mapfile -t stages <"$OUT/stages.txt"
    dvc commit -f -q "${stages[@]}" bench && echo "dvc.lock: the planned runs and bench recorded"
    if [ -f params.planned.yaml ]; then  # the report of the recipes trained whole
        nmt --params params.planned.yaml report --tokenized data/tokenized --vocab data/vocab \
            --results results --out reports 2> logs/report.log || echo "report failed: logs/report.log"
    fi
else
    echo "snakemake stopped (exit $status); run this again to go on"
fi
if [ -n "$gradients" ]; then  # its own timeout bounds it; a bare `wait` would also wait
    wait "$gradients" || true  # for the log's tee, which never ends (the first H200 run hung)
    tail -n 1 "$OUT/preflight-gradients.log"
fi
tar czf "$OUT/results.tgz" --exclude='*.pt' results reports dvc.lock logs params.yaml \
    params.planned.yaml 2>/dev/null || true
ls -la "$OUT"
exit "$status"
