# CUDA's Multi-Process Service (MPS) for the trainings that share one GPU; tools/gpu/run.sh
# sources this file and calls start_mps before the trainings.
#
# Without MPS each training process has its own CUDA context and the GPU takes them in turns:
# four published trainings at once took ~20 s an epoch each, one alone ~5 s (no gain), each
# update ~1,500 small kernels at 2.4 % MFU. Under MPS the processes are clients of one server
# whose kernels can run on the GPU at the same time.
#
# start_mps OUT: where it can (nvidia-cuda-mps-control on PATH, root, MPS not 0), starts the
# control daemon with its pipe and log folders under $MPS_ROOT (run.sh: .kit/mps in the checkout),
# exported so that every process started after it is a client, sets an EXIT trap that stops
# it, and runs a tiny CUDA op in torch under `timeout` as a probe. Otherwise, or when the
# daemon or the probe fails: exactly one line saying why, the daemon stopped, the variables
# unset, and the run goes on as without MPS. Either way it prints one "MPS: on|off" line,
# writes OUT/mps.txt ("on", or "off: why") and sets MPS_ON to 1 or 0. MPS=0 turns it off (to
# measure without it: tools/gpu/concurrency.py). The daemon's and the probe's output go to
# OUT/mps.log. tests/test_tools.py runs run.sh on the CPU (no daemon: the "off" line) and
# start_mps with a stand-in daemon whose probe fails there.

MPS_ROOT=${MPS_ROOT:-$PWD/.kit/mps}
# The probe: what a training's first CUDA work does, through the MPS server when there is one
MPS_PROBE="import torch; x = torch.ones(8, device='cuda'); print('probe:', float((x + x).sum()))"

stop_mps() {  # the daemon stopped (if this shell started one); the variables unset
    if [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then
        echo quit | timeout 20 nvidia-cuda-mps-control >/dev/null 2>&1 || true
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

start_mps() {
    local out=$1 why="" status=0
    MPS_ON=0
    if [ "${MPS:-1}" = 0 ]; then
        why="MPS=0 turns it off"
    elif ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
        why="no nvidia-cuda-mps-control on this machine"
    elif [ "$(id -u)" != 0 ]; then
        why="not root (uid $(id -u)): the control daemon serves the whole machine"
    else
        export CUDA_MPS_PIPE_DIRECTORY=$MPS_ROOT/pipe CUDA_MPS_LOG_DIRECTORY=$MPS_ROOT/log
        mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
        if ! nvidia-cuda-mps-control -d >"$out/mps.log" 2>&1; then
            why="nvidia-cuda-mps-control -d failed (see $out/mps.log)"
            unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY  # no daemon to stop
        else
            trap stop_mps EXIT  # the daemon ends with the script, however it ends
            timeout -k 5 60 python3 -c "$MPS_PROBE" >>"$out/mps.log" 2>&1 || status=$?
            if [ "$status" != 0 ]; then
                why="the torch probe under MPS failed (exit $status; see $out/mps.log and"
                why="$why $CUDA_MPS_LOG_DIRECTORY/control.log)"
                stop_mps
                trap - EXIT
            fi
        fi
    fi
    if [ -n "$why" ]; then
        echo "MPS: off, $why; the processes share the GPU as separate contexts"
        echo "off: $why" >"$out/mps.txt"
        return 0
    fi
    MPS_ON=1
    echo "MPS: on (daemon's pipe $CUDA_MPS_PIPE_DIRECTORY, probe passed); every process started" \
        "from here on is its client"
    echo on >"$out/mps.txt"
}
