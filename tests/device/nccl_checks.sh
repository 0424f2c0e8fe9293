#!/usr/bin/env bash
# The NCCL checks, for a machine with a GPU (CI has none, so the suite never runs them):
#   1. nccl_probe.py: a raw NCCL communicator aborted after a peer died, and the next one formed;
#   2. `slurm-elastic demo --json`: 4 local nodes on NCCL, one killed mid-run, one added, the final model
#      compared with an uninterrupted run's;
#   3. `slurm-elastic bench mttr --json`: recovery time against a checkpoint restart, on NCCL.
# Every rank shares the one GPU: each process names its own NCCL host (NCCL_HOSTID, set per process by a
# sitecustomize), so NCCL connects the ranks over sockets on loopback instead of refusing a duplicate GPU.
# Wheels for what the machine lacks (pydantic, structlog) may sit in .whl/. Results go to $OUT (or
# /tmp/nccl-checks); the exit status is the number of checks that failed.
set -u
out=${OUT:-/tmp/nccl-checks}
mkdir -p "$out"
py=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/se-site .whl/*.whl || exit 100
fi
hostid=$(mktemp -d)
# (and every process prints its threads' stacks on SIGUSR1: how a hang shows where it is)
printf 'import faulthandler, os, signal\nos.environ["NCCL_HOSTID"] = "se-host-%%d" %% os.getpid()\nfaulthandler.register(signal.SIGUSR1, all_threads=True)\n' >"$hostid/sitecustomize.py"
export PYTHONPATH="$hostid:$PWD:/tmp/se-site" PYTHONUNBUFFERED=1
export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_DEBUG=${NCCL_DEBUG:-WARN}

failed=0
check() {  # check NAME SECONDS COMMAND...: its output in $out/NAME.log, its status and time on one line
    local name=$1 seconds=$2 begun=$SECONDS rc
    shift 2
    timeout -k 10 "$seconds" "$@" >"$out/$name.log" 2>&1 &
    local pid=$! dump
    # Shortly before the limit, the training processes still running print their stacks (into their logs).
    (sleep $((seconds - 15)) && pkill -USR1 -f 'examples/train_char_lm.py') &
    dump=$!
    wait "$pid"
    rc=$?
    kill "$dump" 2>/dev/null
    echo "$name: rc=$rc in $((SECONDS - begun)) s" | tee -a "$out/summary.txt"
    [ "$rc" = 0 ] || failed=$((failed + 1))
}

{ nvidia-smi -L; $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name())'; } >"$out/summary.txt" 2>&1
check probe 150 $py tests/device/nccl_probe.py --world 3
check demo 240 $py -m slurm_elastic demo --json --keep "$out/demo"
check mttr 180 $py -m slurm_elastic bench mttr --json
tar -czf "$out/demo-logs.tgz" -C "$out" demo 2>/dev/null && rm -rf "$out/demo"
rm -rf "$hostid"
exit "$failed"
