#!/bin/bash
# One device call (GPU machine, 2 x H200): build dcp + the GPU executor checks with CMake (the
# header-only dependencies carried in $DEPS), run the checks on 1 and 2 GPUs and the failure
# test, then `dcp bench` runs. Results go to $OUT (or /tmp/dcp_out).
# Usage: bench/run_exec_device.sh DEPS_DIR [phases...]; phases: build kernels ncu checks det detbench single pair nodes trace scaling
# (det: the whole-plan checks on one GPU with the deterministic backward, gradients bitwise equal
# over three steps; detbench: the deterministic backward's speed against the default, 32K kernel
# lists and one-GPU whole plans at B 1024 and 2048)
# Environment: PAIR_PROFILES / PAIR_TOKENS / PAIR_MASKS (pair), SCALING_ITERS (scaling), BENCH_EXTRA (added to every bench,
# e.g. "--search --calibration data/calibration/h200_measured.json"), BENCH_TIMEOUT, JSON_DIR (where
# the bench JSON files go before they are tarred into $OUT/json.tar), NO_REFERENCE (single: skip
# the PyTorch varlen reference). Phase trace: timelines of ldc 131072 causal into $OUT/trace.
# (kernels: the kernel tests of every route against fp64, then bench_cuda_attention; the checks
# phase picks the routes later phases use: the first whose whole-plan check passes)
set -u
cd "$(dirname "$0")/.." || exit 1
deps=$(realpath "$1"); shift
phases=${*:-"build checks single pair"}
out=${OUT:-/tmp/dcp_out}
json_dir=${JSON_DIR:-/tmp/dcp_json}
mkdir -p "$out" "$json_dir"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
export DCP_ATTN_FORWARD=${DCP_ATTN_FORWARD:-}  # empty: the kernels choose (wgmma on sm_90)
export DCP_ATTN_BACKWARD=${DCP_ATTN_BACKWARD:-}  # empty: the kernels choose (wgmma on sm_90)
export DCP_ATTN_BACKWARD_DQ=${DCP_ATTN_BACKWARD_DQ:-}  # empty: bulk reductions of dQ (atomic: wgmma-basic only)
NV=$(python3 -c 'import nvidia,os;print(os.path.dirname(nvidia.__path__[0]))')/nvidia
export NCCL_ROOT=$NV/nccl LD_LIBRARY_PATH=$NV/nccl/lib:${LD_LIBRARY_PATH:-}
export DCP_ATTN_DETERMINISTIC=${DCP_ATTN_DETERMINISTIC:-} DCP_ATTN_DETERMINISTIC_UNIT_ROWS=${DCP_ATTN_DETERMINISTIC_UNIT_ROWS:-}
MPIRUN="mpirun --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x DCP_ATTN_FORWARD -x DCP_ATTN_BACKWARD -x DCP_ATTN_BACKWARD_DQ -x DCP_ATTN_DETERMINISTIC -x DCP_ATTN_DETERMINISTIC_UNIT_ROWS"
log=$out/device.log
say() { echo "== $(date +%T) $*" | tee -a "$log"; }
has() { [[ " $phases " == *" $1 "* ]]; }
b=/tmp/dcp_build
if has build; then
  say build
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv >>"$log" 2>&1
  cmake -S . -B $b -G Ninja -DCMAKE_BUILD_TYPE=Release -DDCP_DEVICE_DEPS_DIR="$deps" -DDCP_ENABLE_BENCH=ON \
    -DNCCL_ROOT="$NCCL_ROOT" >>"$log" 2>&1 || { tail -30 "$log"; exit 1; }
  ninja -C $b -j 32 dcp_cli dcp_exec_cuda_check dcp_test_cuda bench_cuda_attention >>"$log" 2>&1 || { grep -B2 -A10 "error" "$log" | head -60; exit 1; }
  grep -i "nccl:" "$log"
fi
if has kernels; then
  say "kernel tests"
  # Every route is checked here (the binary fails if any does); which routes the executor uses
  # is decided by the whole-plan checks below.
  CUDA_VISIBLE_DEVICES=0 timeout ${KTEST_TIMEOUT:-200} $b/tests/cuda/dcp_test_cuda >"$out/kernel_tests.log" 2>&1
  echo "kernel tests: rc=$?" | tee -a "$log"
  grep -E "^\[  (FAILED|PASSED) |Failure|mismatch" "$out/kernel_tests.log" | head -n 60 | tee -a "$log"
  say "kernel bench"
  CUDA_VISIBLE_DEVICES=0 timeout ${KBENCH_TIMEOUT:-200} $b/bench/bench_cuda_attention "$out/bench_cuda_attention" 2>&1 | tee -a "$log"
fi
if has ncu; then  # Nsight Compute on the default (wgmma) kernels: one 32K launch of each (NCU_LIST, NCU_BLOCK,
  # NCU_ROUTE: the lists (space-separated), block size and route profiled; default the causal sequence
  # at B 4096, route wgmma; wgmma-det profiles the deterministic backward's two passes, kernels
  # backward_sm90_ws (dK / dV) and backward_dq_sm90). NCU_NAME: a regex over the demangled names
  # instead, for one instance of a template, NCU_KERNELS then naming the output (the one-pass
  # deterministic backward: NCU_ROUTE=wgmma-persistent,wgmma-det NCU_KERNELS=one_pass
  # NCU_NAME="ws_kernel<.int.128, .bool.1, .bool.1, .bool.1>").
  # Full section set plus per-instruction (SASS) stall sampling, as text: the report itself needs ncu to read.
  nd=/tmp/ncu_out; mkdir -p $nd  # tarred into $OUT/ncu.tar (few files may come back)
  for list in ${NCU_LIST:-sequence}; do
    for kern in ${NCU_KERNELS:-forward_sm90_ws backward_sm90_ws}; do
      name=${kern}_${list}_b${NCU_BLOCK:-4096}${NCU_ROUTE:+_$NCU_ROUTE}
      say "ncu: attention_${kern}_kernel, $list list, B ${NCU_BLOCK:-4096}"
      CUDA_VISIBLE_DEVICES=0 DCP_BENCH_SEQ=32768 DCP_BENCH_BLOCK=${NCU_BLOCK:-4096} DCP_BENCH_LIST=$list \
        DCP_BENCH_ROUTES=${NCU_ROUTE:-wgmma} \
        timeout ${NCU_TIMEOUT:-180} ncu --clock-control none ${NCU_NAME:+--kernel-name-base demangled} \
        --kernel-name regex:"${NCU_NAME:-attention_${kern}_kernel}" \
        --launch-skip 1 --launch-count 1 --set full --import-source no -f -o /tmp/ncu_$name \
        $b/bench/bench_cuda_attention >"$nd/ncu_run_$name.txt" 2>&1
      ncu --import /tmp/ncu_$name.ncu-rep --page details >"$nd/ncu_$name.txt" 2>&1
      ncu --import /tmp/ncu_$name.ncu-rep --page source --print-source sass --csv >/tmp/ncu_src_$name.csv 2>&1
      gzip -c /tmp/ncu_src_$name.csv >"$nd/ncu_src_$name.csv.gz"
      grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Shared Memory" \
        "$nd/ncu_$name.txt" | head -20 | tee -a "$log"
    done
  done
  tar -cf "$out/ncu.tar" -C $nd .
fi
if has det; then
  say "check 1 GPU, deterministic backward"
  CUDA_VISIBLE_DEVICES=0 DCP_ATTN_DETERMINISTIC=1 timeout ${CHECK_TIMEOUT:-150} $MPIRUN -np 1 $b/tests/cuda/dcp_exec_cuda_check 2>&1 | tee -a "$log"
  echo "deterministic check: rc=${PIPESTATUS[0]}" | tee -a "$log"
fi
if has detbench; then
  say "deterministic backward: lists (bwd TFLOP/s: default, deterministic)"
  CUDA_VISIBLE_DEVICES=0 DCP_BENCH_SEQ=32768 DCP_BENCH_ROUTES=wgmma-cells,wgmma-det timeout 200 \
    $b/bench/bench_cuda_attention "$out/det_lists" 2>&1 | tee -a "$log"
  say "deterministic backward: whole plans, ldc 65536 (fwd bwd TFLOP/s)"
  detplan() { CUDA_VISIBLE_DEVICES=0 timeout 60 $b/dcp bench --profile ldc --seed 1 --tokens 65536 --mask $1 --q-heads 32 \
                --kv-heads 8 --head-dim 128 --block $2 --stages 2 --layers 2 --iters 3 --warmup 1 --method dcp \
                --cluster auto --nodes 1 2>&1 | grep -E '^dcp +[0-9]' | awk '{print $4, $5}'; }
  for blk in 1024 2048; do
    for m in causal lambda causal_blockwise shared_question; do
      echo "B $blk $m | default $(DCP_ATTN_DETERMINISTIC=0 detplan $m $blk)" \
        "| deterministic $(DCP_ATTN_DETERMINISTIC=1 detplan $m $blk)" \
        "| default again $(DCP_ATTN_DETERMINISTIC=0 detplan $m $blk)" | tee -a "$log"
    done
  done
fi
if has checks; then
  # Whole plans on 1 GPU against the CPU backend; on a failure fall back route by route (newest
  # kernels first) so that the benchmarks below only time kernels that computed right.
  check1() { say "check 1 GPU (fwd ${DCP_ATTN_FORWARD:-auto}, bwd ${DCP_ATTN_BACKWARD:-auto}/${DCP_ATTN_BACKWARD_DQ:-bulk})"
             CUDA_VISIBLE_DEVICES=0 timeout ${CHECK_TIMEOUT:-150} $MPIRUN -np 1 $b/tests/cuda/dcp_exec_cuda_check 2>&1 | tee -a "$log"
             return "${PIPESTATUS[0]}"; }
  # FORWARD BACKWARD BACKWARD_DQ ("-": empty = the kernels' default route); a failing route falls
  # back to the older kernels: wgmma-basic, then mma.
  for routes in "- - -" "- wgmma-basic -" "wgmma-basic - -" "wgmma-basic wgmma-basic -" \
                "wgmma-basic wgmma-basic atomic" "- mma -" "wgmma-basic mma -" "mma mma -"; do
    read -r f bw dq <<<"$routes"
    export DCP_ATTN_FORWARD=${f#-} DCP_ATTN_BACKWARD=${bw#-} DCP_ATTN_BACKWARD_DQ=${dq#-}
    check1 && break
  done
  say "routes used from here on: fwd ${DCP_ATTN_FORWARD:-auto}, bwd ${DCP_ATTN_BACKWARD:-auto}/${DCP_ATTN_BACKWARD_DQ:-bulk}"
  # For other scripts of the same call (bench/run_multi_gpu.sh sources it).
  declare -p DCP_ATTN_FORWARD DCP_ATTN_BACKWARD DCP_ATTN_BACKWARD_DQ \
    | sed 's/^declare -x /export /' >"$out/routes.env"
  say "check 2 GPUs"
  timeout 150 $MPIRUN -np 2 $b/tests/cuda/dcp_exec_cuda_check 2>&1 | tee -a "$log"
  say "peer dies (expect non-zero within the 5 s comm timeout)"
  start=$(date +%s)
  timeout 90 $MPIRUN -np 2 $b/tests/cuda/dcp_exec_cuda_check die >>"$log" 2>&1
  echo "die test: rc=$? after $(( $(date +%s) - start )) s" | tee -a "$log"
fi
bench() {  # name np args...
  local name=$1 np=$2; shift 2
  say "bench $name"
  local vis=""; [ "$np" = 1 ] && vis="CUDA_VISIBLE_DEVICES=0"
  env $vis timeout ${BENCH_TIMEOUT:-120} $MPIRUN -np "$np" $b/dcp bench --cluster auto --nodes ${NODES:-1} \
    --json "$json_dir/bench_$name.json" ${BENCH_EXTRA:-} "$@" 2>&1 | tee -a "$log"
  tar -cf "$out/json.tar" -C "$json_dir" .
}
if has single; then
  for m in causal lambda causal_blockwise shared_question; do
    bench "1gpu_ldc65536_$m" 1 --profile ldc --tokens 65536 --mask $m --method dcp --layers 2 --iters 3
    if [ -z "${NO_REFERENCE:-}" ] && { [ $m = causal ] || [ $m = lambda ]; }; then
      $b/dcp plan --profile ldc --tokens 65536 --mask $m --cluster h200-nvl --nodes 1 --devices-per-node 1 \
        --method dcp --write-batch /tmp/batch_$m.json >/dev/null 2>&1
      timeout 90 python3 bench/varlen_reference.py /tmp/batch_$m.json $json_dir/varlen_ldc65536_$m.json 2>&1 | tail -2 | tee -a "$log"
    fi
  done
fi
if has pair; then
  for p in ${PAIR_PROFILES:-ldc longalign}; do
    for t in ${PAIR_TOKENS:-65536}; do
      for m in ${PAIR_MASKS:-causal lambda}; do
        bench "2gpu_${p}${t}_$m" 2 --profile $p --tokens $t --mask $m --layers 1 --iters 2
      done
    done
  done
fi
if has nodes; then  # the 2 GPUs as 2 "nodes": hierarchical placement, the preset's inter-node links
  for m in causal lambda shared_question; do
    NODES=2 bench "2gpu_2nodes_ldc65536_$m" 2 --profile ldc --tokens 65536 --mask $m --layers 1 --iters 2
  done
fi
if has trace; then  # measured per-instruction timelines next to the simulator's (dcp and zigzag)
  mkdir -p "$out/trace"
  bench "trace_ldc131072_causal" 2 --profile ldc --tokens 131072 --mask causal --layers 1 --iters 1 \
    --method dcp --method zigzag --trace "$out/trace/ldc131072_causal"
fi
if has scaling; then
  for m in causal lambda; do
    bench "1gpu_ldc131072_$m" 1 --profile ldc --tokens 131072 --mask $m --method dcp --layers 1 --iters ${SCALING_ITERS:-2}
    bench "2gpu_ldc131072_${m}_dcp" 2 --profile ldc --tokens 131072 --mask $m --method dcp --layers 1 --iters ${SCALING_ITERS:-2}
  done
fi
say done
tar -cf "$out/json.tar" -C "$json_dir" .
