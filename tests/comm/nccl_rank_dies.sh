#!/usr/bin/env bash
# NCCL failure test: when one rank of a two-GPU job dies in the middle of its transfers, the
# surviving rank must notice on its own (its NCCL wait times out), abort the NCCL communicator
# and exit non-zero within the timeout, instead of waiting forever inside NCCL.
#
#   nccl_rank_dies.sh DCP_BINARY [TIMEOUT_S]
#
# The job runs `dcp bench --backend cuda` under mpirun with recovery on, so that mpirun does not
# kill the survivor itself when the other rank is killed: what ends the survivor is dcp's own
# timeout and ncclCommAbort. Exits 77 (ctest: skipped) without two GPUs, mpirun or a CUDA build.
set -uo pipefail
dcp=${1:?usage: nccl_rank_dies.sh DCP_BINARY [TIMEOUT_S]}
timeout_s=${2:-20}

skip() { echo "SKIPPED: $*"; exit 77; }
command -v mpirun >/dev/null 2>&1 || skip "no mpirun"
command -v nvidia-smi >/dev/null 2>&1 || skip "no nvidia-smi (no GPU)"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$gpus" -ge 2 ] || skip "needs 2 GPUs, found $gpus"
"$dcp" run --backend cuda --ranks 1 --tokens 256 --block 64 >/dev/null 2>&1 || skip "this dcp cannot run --backend cuda"

export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
mpirun -np 2 --enable-recovery --mca orte_abort_on_non_zero_status 0 -x NCCL_NVLS_ENABLE \
  "$dcp" bench --backend cuda --nodes 1 --profile ldc --tokens 65536 --method dcp --warmup 1 --iters 1000000 \
  --timeout "$timeout_s" >"$log" 2>&1 &
job=$!

# Wait until both ranks are in their timed steps (rank 0 reports nothing before the end, so
# wait for the processes and a fixed start-up allowance), then kill rank 1 outright.
victim=""
for _ in $(seq 1 120); do
  for pid in $(pgrep -f "$dcp bench" || true); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then victim=$pid; fi
  done
  [ -n "$victim" ] && break
  sleep 1
done
[ -n "$victim" ] || { cat "$log"; echo "FAIL: rank 1 never started"; kill "$job" 2>/dev/null; exit 1; }
sleep 20
kill -9 "$victim"
killed_at=$(date +%s)

# The survivor must be gone within its timeout plus a margin for aborting NCCL and exiting.
limit=$((timeout_s + 60))
while kill -0 "$job" 2>/dev/null; do
  if [ $(( $(date +%s) - killed_at )) -gt "$limit" ]; then
    cat "$log"
    echo "FAIL: the surviving rank still runs ${limit} s after its peer died"
    pkill -9 -f "$dcp bench"
    exit 1
  fi
  sleep 1
done
wait "$job"
rc=$?
elapsed=$(( $(date +%s) - killed_at ))
cat "$log"
[ "$rc" -ne 0 ] || { echo "FAIL: the job exited 0 although a rank died"; exit 1; }
grep -qiE 'timeout|aborted' "$log" || { echo "FAIL: no timeout or NCCL abort reported by the survivor"; exit 1; }
echo "PASS: survivor exited $rc, ${elapsed} s after its peer died (timeout ${timeout_s} s)"
