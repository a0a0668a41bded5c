#!/bin/bash
# One device call: build the CUDA kernels, GPU checks and benchmark with plain nvcc (the GPU
# machine lacks the CMake dependencies), run the checks, the benchmark and the SDPA reference.
# Results go to $OUT (or /tmp/dcp_out). Usage: bench/run_cuda_device.sh [checks|bench|kernels|all]
# (kernels: checks and benchmark without the PyTorch SDPA reference)
set -u
cd "$(dirname "$0")/.." || exit 1
what=${1:-all}
out=${OUT:-/tmp/dcp_out}
mkdir -p "$out" /tmp/dcp_obj
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$out/gpu.txt"
# sm_90a: the wgmma kernels (attention_*_sm90*.cu) use arch-specific instructions.
nvcc_flags="-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -Xptxas -warn-spills"
srcs="src/exec/cuda/attention_forward.cu src/exec/cuda/attention_forward_sm90.cu src/exec/cuda/attention_forward_sm90_ws.cu src/exec/cuda/attention_backward.cu src/exec/cuda/attention_backward_sm90.cu src/exec/cuda/attention_backward_sm90_ws.cu src/exec/cuda/attention_merge.cu
      src/exec/cuda/attention_work.cpp src/exec/cuda/tensor_map.cpp src/core/error.cpp src/validate/reference.cpp tests/cuda/attention_cuda_check.cpp
      tests/cuda/attention_forward_check.cpp tests/cuda/attention_backward_check.cpp tests/cuda/standalone_main.cpp bench/bench_cuda_attention.cu"
for f in $srcs; do nvcc $nvcc_flags -c "$f" -o "/tmp/dcp_obj/$(basename "$f").o" & done
wait
o=/tmp/dcp_obj
lib="$o/attention_forward.cu.o $o/attention_forward_sm90.cu.o $o/attention_forward_sm90_ws.cu.o $o/attention_backward.cu.o $o/attention_backward_sm90.cu.o $o/attention_backward_sm90_ws.cu.o $o/attention_merge.cu.o $o/attention_work.cpp.o $o/tensor_map.cpp.o $o/error.cpp.o"
nvcc -o /tmp/dcp_check $lib $o/reference.cpp.o $o/attention_cuda_check.cpp.o $o/attention_forward_check.cpp.o $o/attention_backward_check.cpp.o $o/standalone_main.cpp.o || exit 1
nvcc -o /tmp/dcp_bench $lib $o/bench_cuda_attention.cu.o || exit 1
rc=0
if [ "$what" != bench ]; then
  /tmp/dcp_check 2>&1 | tee "$out/checks.log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then
    timeout 120 compute-sanitizer --tool memcheck /tmp/dcp_check 1 2>&1 | tail -n 40 | tee "$out/sanitizer.log"
  fi
fi
if [ "$what" != checks ]; then
  /tmp/dcp_bench "$out/bench_cuda_attention" 2>&1 | tee "$out/bench.log"
  [ "$what" = kernels ] || PYTHONUNBUFFERED=1 timeout 150 python3 bench/sdpa_reference.py "$out/sdpa_reference.json" 2>&1 | tee "$out/sdpa.log"
fi
exit "$rc"
