#!/bin/bash
# A/B of a kernel change in one device call (one H200): the tree is built once per variant, A with
# the defines $AB_FLAGS_A and B with $AB_FLAGS_B, for CUDA and C++ sources alike (default: A =
# -DDCP_AB_OLD, B = none, so a change kept behind `#ifdef DCP_AB_OLD` for the measurement compares
# against the code it replaces). AB_VARIANTS="A B C" adds a variant C built with $AB_FLAGS_C (two
# changes against one base in one call). Every variant but A is checked (kernel tests against
# fp64, the whole-plan check on one GPU), then all are timed alternately in the same sustained
# state: bench_cuda_attention (S = 32768, routes $AB_ROUTES) A B A B, and one-GPU whole plans (ldc
# 65536, the four masks, B = $AB_BLOCK) in the variants' order, then reversed (AB_PLANS=0: none;
# AB_LISTS=0: no kernel lists; AB_MASKS: other masks).
# AB_STOP_ON_FAIL=1: a variant whose kernel tests or whole-plan check fail ends the call there
# (the logs in ab.tgz), before any timing.
# AB_ENV_<V>="VAR=value ...": variant V's environment for its checks and timings (a runtime option
# against the default: AB_FLAGS_A= AB_ENV_B="DCP_ATTN_WIDE_BACKWARD=0"; variants of the same flags
# share one build).
# AB_NOCHECK="C" skips the checks of the variants named (a probe that computes wrong results on
# purpose to bound what a change could buy is only timed; a variant built with a flag that turns
# off what the tree's own tests check, such as A's -DDCP_AB_OLD, fails them by design).
# AB_DET=1 adds the deterministic backward: its whole-plan check (gradients bitwise equal over three
# steps) for every variant but A, and the same whole plans with it, in both orders (detplan_*.json);
# AB_DET=2 adds the same for the one-pass deterministic backward (DCP_ATTN_DETERMINISTIC_ONE_PASS=1:
# det1plan_*.json) beside the two-pass one; AB_DET=3 the one-pass and the ordered methods
# (DCP_ATTN_DETERMINISTIC_ORDERED=1: ordplan_*.json), no two-pass; AB_DET=4 the ordered method alone;
# AB_DET=5 the one-pass method alone.
# AB_ENERGY=N: every whole plan also runs N more steps of each pass with the GPU's energy counter
# read around them (dcp bench --energy-iters): ab_table.py prints their TFLOP per kJ.
# cuDNN's SDPA follows on the same shapes (AB_SDPA=0: not run); the SM clock and power are sampled
# throughout.
# Reading it: each list's forward is timed right after the previous list's backward, at the clock
# that backward's power draw left, so two variants whose backwards differ can read 2-10 % apart on
# the same forward code (short lists most); compare forwards between variants with the same backward.
# Usage (repository root): bench/run_ab_device.sh DEPS_DIR
# Duration on one H100 (session 60): two variants, two masks, about 3 minutes; four variants (three
# checked), two masks, about 8 minutes, near the device tool's 10-minute limit per command.
# Results: $OUT/ab.tgz (every JSON, log and the clock samples) and the tables on stdout;
# `python3 bench/ab_table.py ab.tgz` prints each variant over A per list and per whole plan.
set -u
cd "$(dirname "$0")/.." || exit 1
deps=$(realpath "$1")
out=${OUT:-/tmp/ab_out}
x=$out/ab
mkdir -p "$x"
export NCCL_NVLS_ENABLE=0
NV=$(python3 -c 'import nvidia,os;print(os.path.dirname(nvidia.__path__[0]))')/nvidia
export NCCL_ROOT=$NV/nccl LD_LIBRARY_PATH=$NV/nccl/lib:${LD_LIBRARY_PATH:-}
say() { echo "== $(date +%T) $*"; }
variants=${AB_VARIANTS:-A B}
# The deterministic methods of AB_DET and their switches.
case ${AB_DET:-0} in 1) det_methods="two_pass" ;; 2) det_methods="two_pass one_pass" ;; 3) det_methods="one_pass ordered" ;; 4) det_methods="ordered" ;; 5) det_methods="one_pass" ;; *) det_methods="" ;; esac
det_env() {
  case $1 in
    default) echo "DCP_ATTN_DETERMINISTIC=0" ;;
    two_pass) echo "DCP_ATTN_DETERMINISTIC=1 DCP_ATTN_DETERMINISTIC_ONE_PASS=0" ;;
    one_pass) echo "DCP_ATTN_DETERMINISTIC=1 DCP_ATTN_DETERMINISTIC_ONE_PASS=1" ;;
    ordered) echo "DCP_ATTN_DETERMINISTIC=1 DCP_ATTN_DETERMINISTIC_ORDERED=1" ;;
  esac
}
# A variant's environment for everything it runs (AB_ENV_B="DCP_ATTN_WIDE_BACKWARD=0": a
# runtime option against the default, both variants built from the same flags).
env_of() { local v="AB_ENV_$1"; echo "${!v-}"; }
flags_of() {
  case $1 in
    A) echo "${AB_FLAGS_A--DDCP_AB_OLD}" ;;
    B) echo "${AB_FLAGS_B-}" ;;
    *) local v="AB_FLAGS_$1"; [ -n "${!v+x}" ] || { echo "run_ab_device: AB_FLAGS_$1 is not set" >&2; exit 1; }; echo "${!v}" ;;
  esac
}
# Variants built from the same flags share one build (a runtime option against the default,
# AB_ENV_<V>, needs one): the first of them owns it, the others link to it.
owner_of() {
  local f u
  f=$(flags_of $1) || exit 1
  for u in $variants; do [ "$(flags_of $u)" = "$f" ] && { echo $u; return; }; done
}
owners=""
declare -A checked  # owner -> 1 when a variant of its build is checked (not A): the test binaries too
for v in $variants; do
  o=$(owner_of $v) || exit 1
  [ $v = A ] || checked[$o]=1
  if [ $o != $v ]; then rm -rf /tmp/ab$v; ln -sfn /tmp/ab$o /tmp/ab$v; continue; fi
  owners="$owners $v"
  f=$(flags_of $v) || exit 1
  say "configure $v ($f)"
  cmake -S . -B /tmp/ab$v -G Ninja -DCMAKE_BUILD_TYPE=Release -DDCP_DEVICE_DEPS_DIR="$deps" -DDCP_ENABLE_BENCH=ON \
    -DNCCL_ROOT="$NCCL_ROOT" -DCMAKE_CUDA_FLAGS="$f" -DCMAKE_CXX_FLAGS="$f" >"$x/cmake_$v.log" 2>&1 || { tail -20 "$x/cmake_$v.log"; exit 1; }
done
nv=$(echo $owners | wc -w)
jobs=$(( $(nproc) / nv ))
for v in $owners; do
  targets="dcp_cli bench_cuda_attention"
  [ -n "${checked[$v]:-}" ] && targets="$targets dcp_exec_cuda_check dcp_test_cuda"
  (ninja -C /tmp/ab$v -j $jobs $targets >"$x/build_$v.log" 2>&1 || echo "build $v failed") &
done
wait
for v in $owners; do grep -h -A8 "error" "$x/build_$v.log" | head -20; done
for v in $variants; do
  [ $v = A ] && continue
  case " ${AB_NOCHECK:-} " in *" $v "*) continue ;; esac  # a timing-only probe (wrong results by design)
  say "kernel tests ($v)"
  env $(env_of $v) timeout 200 /tmp/ab$v/tests/cuda/dcp_test_cuda >"$x/kernel_tests_$v.log" 2>&1
  rc_tests=$?
  echo "kernel tests $v: rc=$rc_tests"
  grep -E "^\[  (FAILED|PASSED) |Failure" "$x/kernel_tests_$v.log" | head
  say "whole-plan check, one GPU ($v)"
  env $(env_of $v) timeout 200 /tmp/ab$v/tests/cuda/dcp_exec_cuda_check >"$x/exec_check_$v.log" 2>&1
  rc_check=$?
  echo "exec check $v: rc=$rc_check"
  tail -2 "$x/exec_check_$v.log"
  if [ "${AB_STOP_ON_FAIL:-0}" = 1 ] && [ $rc_tests != 0 -o $rc_check != 0 ]; then
    grep -B2 -A12 "Failure\|FAILED\|mismatch" "$x/kernel_tests_$v.log" | head -60
    tar -czf "$out/ab.tgz" -C "$out" ab && rm -rf "$x"
    say "stopped: a check of $v failed (AB_STOP_ON_FAIL=1)"
    exit 1
  fi
  for method in $det_methods; do
    say "whole-plan check, one GPU, deterministic backward ($v, $method)"
    env $(env_of $v) $(det_env $method) timeout 240 /tmp/ab$v/tests/cuda/dcp_exec_cuda_check >"$x/exec_check_det_${method}_$v.log" 2>&1
    echo "deterministic exec check $v ($method): rc=$? $(grep -c 'bitwise equal over 3 steps ok' "$x/exec_check_det_${method}_$v.log") configs bitwise equal"
  done
done
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 200 >"$x/clocks.csv" 2>&1 &
smi=$!
for r in $([ "${AB_LISTS:-1}" = 0 ] || echo 1 2); do
  for v in $variants; do
    say "kernels $v, run $r"
    env $(env_of $v) DCP_BENCH_SEQ=32768 DCP_BENCH_ROUTES=${AB_ROUTES:-wgmma-cells,wgmma-runs} timeout 120 \
      /tmp/ab$v/bench/bench_cuda_attention "$x/kernels_${v}_$r" 2>&1 | tail -16
  done
done
reversed=$(echo $variants | tr ' ' '\n' | tac | tr '\n' ' ')
[ "${AB_PLANS:-1}" = 0 ] && reversed="" variants_plans="" || variants_plans=$variants
for method in default $det_methods; do
  case $method in default) prefix=plan ;; two_pass) prefix=detplan ;; one_pass) prefix=det1plan ;; ordered) prefix=ordplan ;; esac
  n=0
  for order in ${variants_plans:+"$variants_plans"} ${reversed:+"$reversed"}; do
    n=$((n + 1))
    tag=$(echo $order | tr -d ' ')$n  # the order, numbered: one variant's two orders stay apart
    for m in ${AB_MASKS:-causal lambda causal_blockwise shared_question}; do
      for v in $order; do
        say "$prefix $v $m"
        env $(env_of $v) $(det_env $method) timeout 120 /tmp/ab$v/dcp bench --profile ldc --seed 1 --tokens 65536 --mask $m \
          --q-heads 32 --kv-heads 8 --head-dim 128 --block ${AB_BLOCK:-1024} --stages 2 --layers 2 --iters 5 --warmup 2 \
          --method dcp --cluster auto --nodes 1 ${AB_ENERGY:+--energy-iters $AB_ENERGY} \
          --json "$x/${prefix}_${v}_${m}_${tag}.json" 2>&1 | tail -1
      done
    done
  done
done
if [ "${AB_SDPA:-1}" != 0 ]; then
  say "cuDNN SDPA"
  timeout 120 python3 bench/sdpa_reference.py "$x/sdpa_reference.json" 2>&1 | grep cudnn
fi
kill $smi
tar -czf "$out/ab.tgz" -C "$out" ab && rm -rf "$x"
say done
