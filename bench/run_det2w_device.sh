#!/bin/bash
# The deterministic backward with two writers per key chunk (CudaKernelOptions::
# deterministic_two_writers) against its one-pass method and the default, on one GPU, in two
# device calls on one warm machine (about 7 and 5 minutes):
#   bash bench/run_det2w_device.sh DEPS_DIR checks   # package build; kernel tests (every
#        deterministic method against fp64, four runs bitwise), the whole-plan check bitwise with
#        two writers; `dcp bench` ldc 65536 causal and lambda at B 2048 and 4096: default, one
#        pass, two writers (det_2048.tar, det_4096.tar)
#   bash bench/run_det2w_device.sh DEPS_DIR train    # anchor 64K causal training: default, one
#        pass, two writers (bench/run_train_device.sh det2w)
#   bash bench/run_det2w_device.sh DEPS_DIR plans    # the `dcp bench` part of checks alone (after
#        a build on the same machine)
# DEPS_DIR: scripts/device-deps.sh's folder. Results and logs in $OUT (or /tmp/dcp_out).
set -u
cd "$(dirname "$0")/.." || exit 1
deps=$1
phase=${2:-checks}
out=${OUT:-/tmp/dcp_out}
mkdir -p "$out"
b=/tmp/dcp_pybuild
log=$out/det2w.log
say() { echo "== $(date +%T) $*" | tee -a "$log"; }
if [ "$phase" = checks ] || [ "$phase" = plans ]; then
  if [ "$phase" = checks ]; then
    bash bench/run_package_device.sh "$deps" build || exit 1
    say "kernel tests: the deterministic backward and the targeted backward scenarios against fp64"
    timeout 240 $b/tests/cuda/dcp_test_cuda --gtest_filter='*Deterministic*:*Backward*' >"$out/kernel_tests.log" 2>&1
    echo "kernel tests: rc=$?" | tee -a "$log"
    grep -E "^\[  (FAILED|PASSED) |Failure|^two writers" "$out/kernel_tests.log" | head -40 | tee -a "$log"
  fi
  for block in 2048 4096; do
    checks=two; { [ "$block" = 4096 ] || [ "$phase" = plans ]; } && checks=""
    OUT=$out/b$block DET_ROUTES=none DET_CHECKS="$checks" DET_RUNS="default det two" DET_MASKS="causal lambda" DET_BLOCK=$block \
      bash bench/run_package_device.sh "$deps" det
    mv "$out/b$block/det.tar" "$out/det_$block.tar" 2>/dev/null
    cat "$out/b$block/package_device.log" >>"$log"
    rm -rf "$out/b$block"
  done
  python3 - "$out" <<'PY' | tee -a "$log"
import json, sys, tarfile
out = sys.argv[1]
for block in (2048, 4096):
    try:
        tar = tarfile.open(f"{out}/det_{block}.tar")
    except OSError:
        continue
    runs = {}
    for m in tar.getmembers():
        if m.name.startswith("dcp_bench_") and m.name.endswith(".json"):
            runs[m.name[len("dcp_bench_"):-5]] = json.load(tar.extractfile(m))
    for mask in ("causal", "lambda"):
        def bwd(name):
            r = runs.get(f"{name}_{mask}")
            rows = [x for x in (r or {}).get("rows", []) if x.get("method") == "dcp"]
            return rows[0]["bwd_ms"] if rows else None
        d, one, two = bwd("default"), bwd("det"), bwd("two")
        if d and one and two:
            print(f"B {block} {mask}: backward ms default {d:.2f}, one pass {one:.2f} ({d / one:.3f}x), two writers {two:.2f} ({d / two:.3f}x; over one pass {one / two:.3f})")
        else:
            print(f"B {block} {mask}: backward ms default {d}, one pass {one}, two writers {two}")
PY
else
  MASKS=causal PHASE_BUDGET_S=${PHASE_BUDGET_S:-540} OUT=$out bash bench/run_train_device.sh det2w
fi
