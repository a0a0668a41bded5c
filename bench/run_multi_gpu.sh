#!/bin/bash
# The 4- and 8-GPU study (one device call per kind: nvidia-h200-x4, nvidia-h200-x8), prepared for
# when those machines are lent. One rank per GPU; DCP and every static baseline through the same
# executor (dcp bench: time = max over ranks, mask-area TFLOP/s per GPU, bytes moved, the
# simulator's prediction beside the measurement).
#   batches : ldc and longalign, 8K tokens per GPU and 131072 tokens in total
#   shapes  : 64 q / 8 kv heads (MagiAttention's benchmark shape) and 32 / 8; head dim 128
#   masks   : causal, lambda, causal_blockwise, shared_question
#   layouts : the GPUs as one node, and as 2 (4 GPUs) or 2 and 4 (8 GPUs) "nodes" of the cluster
#             model, to exercise hierarchical placement on real links
# Usage (on the device machine, repository root): bench/run_multi_gpu.sh DEPS_DIR
#   SHAPES="64x8" or "32x8" (query x KV heads; default both) splits the study over two device calls (a call may run
#   10 minutes; the whole study is about 64-96 runs of ~10 s). The build and the whole-plan checks
#   (which choose the kernel routes, bench/run_exec_device.sh) run first.
# Results: $OUT/multi_gpu.log, $OUT/json.tar (one JSON per run), $OUT/trace/ (one timeline);
# tables: bench/exec_tables.py $OUT/json.tar, bench/sim_vs_measured.py.
set -u
cd "$(dirname "$0")/.." || exit 1
deps=$(realpath "$1")
out=${OUT:-/tmp/dcp_out}
mkdir -p "$out" /tmp/dcp_json
CHECK_TIMEOUT=${CHECK_TIMEOUT:-60} bash bench/run_exec_device.sh "$deps" build checks >/dev/null 2>&1 || { echo "build failed"; exit 1; }
grep -E "^== |die test" "$out/device.log"
# The kernel routes the whole-plan checks chose.
[ -f "$out/routes.env" ] && source "$out/routes.env"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
NV=$(python3 -c 'import nvidia,os;print(os.path.dirname(nvidia.__path__[0]))')/nvidia
export LD_LIBRARY_PATH=$NV/nccl/lib:${LD_LIBRARY_PATH:-}
gpus=$(nvidia-smi -L | wc -l)
log=$out/multi_gpu.log
run() {  # name nodes args...
  local name=$1 nodes=$2; shift 2
  echo "== $(date +%T) $name" | tee -a "$log"
  timeout ${BENCH_TIMEOUT:-150} mpirun --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x DCP_ATTN_FORWARD \
    -x DCP_ATTN_BACKWARD -x DCP_ATTN_BACKWARD_DQ -np "$gpus" \
    /tmp/dcp_build/dcp bench --cluster auto --nodes "$nodes" --devices-per-node $((gpus / nodes)) \
    --json "/tmp/dcp_json/$name.json" "$@" 2>&1 | tee -a "$log"
  tar -cf "$out/json.tar" -C /tmp/dcp_json .
}
node_layouts="1 2"
[ "$gpus" -ge 8 ] && node_layouts="1 2 4"
export DCP_ATTN_FORWARD=${DCP_ATTN_FORWARD:-} DCP_ATTN_BACKWARD=${DCP_ATTN_BACKWARD:-} \
       DCP_ATTN_BACKWARD_DQ=${DCP_ATTN_BACKWARD_DQ:-}
mkdir -p "$out/trace"
run "${gpus}gpu_trace_ldc131072_causal" 1 --profile ldc --tokens 131072 --mask causal --layers 1 --iters 1 \
  --method dcp --method zigzag --trace "$out/trace/${gpus}gpu_ldc131072_causal"
for shape in ${SHAPES:-64x8 32x8}; do
  set -- ${shape/x/ }
  for profile in ldc longalign; do
    for tokens in $((8192 * gpus)) 131072; do
      for mask in causal lambda causal_blockwise shared_question; do
        for nodes in $node_layouts; do
          run "${gpus}gpu_${profile}${tokens}_${mask}_q$1kv$2_nodes$nodes" "$nodes" --profile "$profile" \
            --tokens "$tokens" --mask "$mask" --q-heads "$1" --kv-heads "$2" --head-dim 128 --layers 1 --iters 2
        done
      done
    done
  done
done
echo "== done" | tee -a "$log"
