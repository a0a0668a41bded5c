#!/usr/bin/env bash
# Runs the CPU benchmarks and records their results in bench/results/ (GPU benchmarks run on
# the GPU machine: bench/run_cuda_device.sh). Usage: scripts/bench.sh [build-dir] [--quick]
set -euo pipefail
build=${1:-build}
quick=${2:-}
out=bench/results
mkdir -p "$out"
b="$build/bench"
run() { echo; echo "== $*"; "$@"; }

run "$b/bench_block_table" --json "$out/block_table.json"
run "$b/bench_metrics"
run "$b/bench_plan" 5 | tee "$out/plan_build.txt"
if [ "$quick" = "--quick" ]; then
  run "$b/bench_placement" --quick --json "$out/placement_quick.json"
  run "$b/bench_sim_paper" 1 data/calibration/a100.json "$out/sim_paper_a100_quick.json"
else
  run "$b/bench_placement" --json "$out/placement.json"
  run "$b/bench_sim_paper" 2 data/calibration/a100.json "$out/sim_paper_a100.json" | tee "$out/sim_paper_a100.txt"
fi
run "$b/bench_cpu_attention" --reps 5
