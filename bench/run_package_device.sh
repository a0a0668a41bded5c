#!/bin/bash
# One device call on the GPU machine (one H200) for the PyTorch package: build it with pip (the
# command line and the GPU checks from the same CMake build, so nvcc runs once), check the kernels
# and whole plans against fp64, run the package's tests on the GPU, then time the operator against
# `dcp bench` of the same plan, its host cost per call, and planning hidden by lookahead.
# Usage (repository root): bench/run_package_device.sh DEPS_DIR [phases...]
#   phases: build checks pytest op bench det kernels plans pair (default: all but det, kernels, plans and pair); results and
#   logs in $OUT (or /tmp/dcp_out)
#   (det: the kernel table with the deterministic backward beside the default, its whole-plan
#   checks (whole key blocks, units of 256 rows, ordered), and `dcp bench` of one-GPU plans without
#   it, with its one-pass method and with the ordered one, in det.tar; the kernel table's routes
#   and lengths: $DET_ROUTES (none: no table), $DET_SEQ; $DET_BLOCK, the plans' block size, 2048;
#   $DET_CHECKS and $DET_RUNS keep some of the checks (whole units ordered) and of the runs
#   (default det ordered));
#   kernels: bench_cuda_attention, routes $KERNEL_ROUTES (default wgmma-cells,wgmma-persistent,wgmma-runs: the backend's kernels without and with the persistent forward, and over runs of tiles sharing q rows as the backend issues a list whose outputs accumulate in place), then cuDNN's SDPA on the same shapes and the SM clock and power during both (all in kernels.tar);
#   plans: `dcp bench` of the one-GPU plans (the calibration's points) per block size and run;
#   pair: two GPUs (the two-GPU issue's operator runs): the package's two-GPU tests, the operator
#   on ldc 131072 against `dcp bench` of the same plan on 2 ranks, planning hidden with lookahead 2,
#   and a captured step's replay against eager, all in pair.tar)
#   DEPS_DIR: scripts/device-deps.sh's folder (headers of nlohmann/json, CLI11, fmt; GoogleTest)
#   BUILD_BENCH=1: build bench_cuda_attention (in $b/bench) without the kernels or det phase
#   PREBUILT=DIR: no build here; the phases that run binaries only (checks, kernels, plans, det,
#   bench) take them from DIR, packed on the CPU machine by scripts/device-prebuilt.sh (carried
#   with the call): about three minutes of device time less than the build phase
set -u
cd "$(dirname "$0")/.." || exit 1
deps=$(realpath "$1"); shift
phases=${*:-"build checks pytest op bench"}
out=${OUT:-/tmp/dcp_out}
mkdir -p "$out"
log=$out/package_device.log
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
NV=$(python3 -c 'import nvidia,os;print(os.path.dirname(nvidia.__path__[0]))')/nvidia
export NCCL_ROOT=$NV/nccl LD_LIBRARY_PATH=$NV/nccl/lib:${LD_LIBRARY_PATH:-}
b=/tmp/dcp_pybuild
say() { echo "== $(date +%T) $*" | tee -a "$log"; }
has() { [[ " $phases " == *" $1 "* ]]; }
# The SM clock, power and temperature every $2 ms into file $1, in the background (kill $!).
sample_clocks() { nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms "$2" >"$1" 2>&1 & }
if [ -n "${PREBUILT:-}" ]; then
  has build && { echo "run_package_device: PREBUILT is set: leave out the build phase" >&2; exit 1; }
  # Each binary is called where the phases look for it through a wrapper that puts DIR's
  # libraries first for that process alone (torch in the same phases keeps its own CUDA runtime).
  pre=$(realpath "$PREBUILT")
  mkdir -p $b/tests/cuda $b/bench
  for f in dcp tests/cuda/dcp_test_cuda tests/cuda/dcp_exec_cuda_check bench/bench_cuda_attention; do
    [ -x "$pre/${f##*/}" ] || { echo "run_package_device: $pre/${f##*/} missing (scripts/device-prebuilt.sh)" >&2; exit 1; }
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' "$pre" "$pre/${f##*/}" >$b/$f
    chmod +x $b/$f
  done
  missing=$(for f in "$pre"/dcp*; do LD_LIBRARY_PATH=$pre:$LD_LIBRARY_PATH ldd "$f"; done | grep "not found" | sort -u)
  say "prebuilt binaries from $PREBUILT${missing:+; missing libraries: $missing}"
fi
if has build; then
  say "build: pip install --no-build-isolation . (with the dcp command and GPU checks)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$log" 2>&1
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)' | tee -a "$log"
  # The wheel comes back in $OUT: a later call installs it (pip install --no-deps) without building.
  rm -rf /tmp/wheels
  bench_flag=""; { has kernels || { has det && [ "${DET_ROUTES:-}" != none ]; } || [ -n "${BUILD_BENCH:-}" ]; } &&
    bench_flag="-C cmake.define.DCP_ENABLE_BENCH=ON"  # bench_cuda_attention
  CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps -v -w /tmp/wheels . \
    -C build-dir=$b -C cmake.define.DCP_DEVICE_DEPS_DIR="$deps" -C cmake.define.NCCL_ROOT="$NCCL_ROOT" \
    -C cmake.define.DCP_ENABLE_TOOLS=ON -C cmake.define.DCP_ENABLE_TESTS=ON $bench_flag >"$out/build.log" 2>&1 \
    || { grep -E "error|Error" "$out/build.log" | head -40 | tee -a "$log"; tail -20 "$out/build.log"; exit 1; }
  python3 -m pip install --no-deps --force-reinstall /tmp/wheels/dcp-*.whl >>"$log" 2>&1
  cp /tmp/wheels/dcp-*.whl "$out/"
  ls -la /tmp/wheels | tee -a "$log"
  grep -E "NCCL:|\[x\]|\[ \]" "$out/build.log" | head -12 | tee -a "$log"
  python3 -c 'import dcp, dcp.torch; print("dcp", dcp.__version__, "cuda", dcp.cuda_available(), "nccl", dcp.nccl_available())' | tee -a "$log"
fi
if has checks; then
  say "kernel tests (every route against fp64)"
  timeout 240 $b/tests/cuda/dcp_test_cuda >"$out/kernel_tests.log" 2>&1
  echo "kernel tests: rc=$?" | tee -a "$log"
  grep -E "^\[  (FAILED|PASSED) |Failure" "$out/kernel_tests.log" | head -20 | tee -a "$log"
  say "whole-plan check, 1 GPU (CUDA backend vs CPU backend, every placement)"
  timeout 240 $b/tests/cuda/dcp_exec_cuda_check >"$out/exec_check.log" 2>&1
  echo "exec check: rc=$?" | tee -a "$log"
  tail -5 "$out/exec_check.log" | tee -a "$log"
  say "dcp run --backend cuda on one GPU (no mpirun)"
  timeout 120 $b/dcp run --backend cuda --tokens 2048 --block 256 --mask mixed --q-heads 8 --kv-heads 2 --head-dim 128 \
    --dtype bf16 2>&1 | tail -4 | tee -a "$log"
fi
if has pytest; then
  # test_train.py and test_hf_train.py train on CPU ranks only (minutes here, with torch.compile);
  # CI runs them. A test that stalls gets every thread's stack in the log after 120 s.
  say "package tests on the GPU (every test but the CPU-rank training of test_train.py and test_hf_train.py)"
  (cd /tmp && timeout 480 python3 -m pytest -q -x -o faulthandler_timeout=120 --ignore "$OLDPWD/tests/python/test_train.py" \
    --ignore "$OLDPWD/tests/python/test_hf_train.py" "$OLDPWD/tests/python" >"$out/pytest.log" 2>&1)
  echo "pytest: rc=$?" | tee -a "$log"
  tail -5 "$out/pytest.log" | tee -a "$log"
  say "an HF Llama 4 (chunked and global layers) trained 5 steps with dcp on the GPU (examples/hf_train.py)"
  timeout 180 python3 examples/hf_train.py --arch llama4 --steps 5 --tokens 16384 2>&1 | grep -E "^step|Error" \
    | tee -a "$log"
fi
if has op; then
  say "operator: ldc 131072 causal, 32/8 heads x 128, B 2048, 4 layers (op, host, lookahead)"
  timeout 300 python3 bench/op_bench.py --tokens 131072 --block 2048 --stages 2 --layers 4 --iters 5 \
    --phases "${OP_PHASES:-op,host,lookahead}" --json "$out/op_bench.json" 2>&1 | tee -a "$log"
fi
if has bench; then
  say "dcp bench, the same plan"
  timeout 200 $b/dcp bench --profile ldc --seed 1 --tokens 131072 --mask causal --q-heads 32 --kv-heads 8 \
    --head-dim 128 --block 2048 --stages 2 --layers 4 --iters 5 --warmup 2 --method dcp --cluster auto --nodes 1 \
    --json "$out/dcp_bench.json" 2>&1 | tail -12 | tee -a "$log"
fi
if has pair; then
  say "two GPUs: package tests (the operator against fp64, CUDA graphs with NCCL rounds, per-rank data)"
  (cd /tmp && timeout 300 python3 -m pytest -q -o faulthandler_timeout=120 -k "two_gpus or on_ranks" \
    "$OLDPWD/tests/python/test_gpu.py" "$OLDPWD/tests/python/test_per_rank_data.py" >"$out/pytest_pair.log" 2>&1)
  echo "pytest (2 GPUs): rc=$?" | tee -a "$log"
  tail -3 "$out/pytest_pair.log" | tee -a "$log"
  say "two GPUs: operator, ldc 131072 causal, 32/8 heads x 128, B 2048, 4 layers (op, lookahead, graph)"
  timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/op_bench.py --tokens 131072 \
    --block 2048 --stages 2 --layers 4 --iters 5 --phases op,lookahead,graph --json "$out/op_bench_pair.json" 2>&1 \
    | grep -v Warning | tail -4 | tee -a "$log"
  say "two GPUs: dcp bench, the same plan"
  timeout 200 mpirun --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -np 2 $b/dcp bench --profile ldc --seed 1 \
    --tokens 131072 --mask causal --q-heads 32 --kv-heads 8 --head-dim 128 --block 2048 --stages 2 --layers 4 \
    --iters 5 --warmup 2 --method dcp --cluster auto --nodes 1 --devices-per-node 2 \
    --json "$out/dcp_bench_pair.json" 2>&1 | tail -12 | tee -a "$log"
  (cd "$out" && tar -cf pair.tar pytest_pair.log op_bench_pair.json dcp_bench_pair.json 2>/dev/null && \
    rm -f pytest_pair.log op_bench_pair.json dcp_bench_pair.json)
fi
if has det; then  # the deterministic backward: kernel table beside the default, whole plans, repeatability
  if [ "${DET_ROUTES:-wgmma-cells,wgmma-det}" != none ]; then
    say "kernel bench: the default backward and the deterministic one"
    DCP_BENCH_ROUTES=${DET_ROUTES:-wgmma-cells,wgmma-det} DCP_BENCH_SEQ=${DET_SEQ:-32768} timeout 200 \
      $b/bench/bench_cuda_attention "$out/bench_cuda_attention" 2>&1 | tail -32 | tee -a "$log"
  fi
  say "whole-plan checks, 1 GPU, deterministic backward (gradients bitwise equal over 3 steps): ${DET_CHECKS:=whole units ordered}"
  # name:DCP_ATTN_DETERMINISTIC_UNIT_ROWS:DCP_ATTN_DETERMINISTIC_ORDERED
  for check in whole:0:0 units:256:0 ordered:0:1; do
    IFS=: read -r name rows ordered <<<"$check"
    [[ " $DET_CHECKS " == *" $name "* ]] || continue
    DCP_ATTN_DETERMINISTIC=1 DCP_ATTN_DETERMINISTIC_UNIT_ROWS=$rows DCP_ATTN_DETERMINISTIC_ORDERED=$ordered timeout 240 \
      $b/tests/cuda/dcp_exec_cuda_check >"$out/exec_check_det_$name.log" 2>&1
    echo "exec check (deterministic, $name): rc=$? $(grep -c 'bitwise equal over 3 steps ok' "$out/exec_check_det_$name.log") configs bitwise equal" | tee -a "$log"
  done
  for m in causal lambda causal_blockwise shared_question; do
    # name:DCP_ATTN_DETERMINISTIC:DCP_ATTN_DETERMINISTIC_ORDERED (one GPU: the one-pass method over
    # the key blocks' units, or ordered over the default work); $DET_RUNS keeps some
    for run in default:0:0 det:1:0 ordered:1:1; do
      [[ " ${DET_RUNS:-default det ordered} " == *" ${run%%:*} "* ]] || continue
      IFS=: read -r name det ordered <<<"$run"
      say "dcp bench ldc 65536 $m, $name"
      DCP_ATTN_DETERMINISTIC=$det DCP_ATTN_DETERMINISTIC_ORDERED=$ordered timeout 120 $b/dcp bench --profile ldc --seed 1 \
        --tokens 65536 --mask $m --q-heads 32 --kv-heads 8 --head-dim 128 --block ${DET_BLOCK:-2048} --stages 2 --layers 2 --iters 5 \
        --warmup 2 --method dcp --cluster auto --nodes 1 --json "$out/dcp_bench_${name}_$m.json" 2>&1 | tail -3 | tee -a "$log"
    done
  done
  # One file for them all (the device tool brings back at most 8 files per call).
  (cd "$out" && shopt -s nullglob && files=(exec_check_det*.log dcp_bench_*.json) &&
    { [ ${#files[@]} -eq 0 ] || { tar -cf det.tar "${files[@]}" && rm -f "${files[@]}"; }; })
fi
if has kernels; then
  # The H200 runs these kernels at its power limit (about 690 W), where the SM clock settles
  # between 1.6 and 1.8 GHz; a short isolated run sees up to 1.98 GHz and reads up to 12 % faster.
  # So cuDNN is timed right after ours in the same sustained state, and the clocks are logged.
  sample_clocks "$out/clocks.csv" 200
  smi=$!
  say "kernel bench, routes ${KERNEL_ROUTES:-wgmma-cells,wgmma-persistent,wgmma-runs}"
  DCP_BENCH_ROUTES=${KERNEL_ROUTES:-wgmma-cells,wgmma-persistent,wgmma-runs} timeout 240 $b/bench/bench_cuda_attention "$out/bench_cuda_attention" \
    2>&1 | tee -a "$log"
  if [ "${KERNEL_SDPA:-1}" != 0 ]; then  # KERNEL_SDPA=0: ours alone (a calibration refit needs no cuDNN)
    say "cuDNN / FlashAttention-2 SDPA on the same shapes (bench/sdpa_reference.py)"
    timeout 180 python3 bench/sdpa_reference.py "$out/sdpa_reference.json" 2>&1 | tee -a "$log"
  fi
  kill $smi
  # One file for the four (the device tool brings back a few files per call).
  (cd "$out" && files=() && for f in bench_cuda_attention.json bench_cuda_attention.md sdpa_reference.json clocks.csv; do
    [ -e "$f" ] && files+=("$f"); done; tar -cf kernels.tar "${files[@]}" && rm -f "${files[@]}")
fi
if has plans; then  # one-GPU whole plans, ldc 65536 seed 1, the four masks
  # PLAN_BLOCKS: block sizes (default 2048). PLAN_RUNS: name:flags:environment triples, e.g.
  # "merged:--no-outputs-in-place" or "nocells::DCP_ATTN_PARTIAL_CELLS=0" (default: "default::");
  # plans.tar holds bench_1gpu_ldc65536_<mask>_b<B>[_<name>].json, a runs.json call's entries,
  # and the SM clock and power sampled through them (clocks.csv): a plan's passes are short, so
  # they may run above the clock the kernel lists settle at.
  rm -rf /tmp/plans_json && mkdir -p /tmp/plans_json
  sample_clocks /tmp/plans_json/clocks.csv 100
  smi=$!
  for B in ${PLAN_BLOCKS:-2048}; do
    for m in causal lambda causal_blockwise shared_question; do
      for run in ${PLAN_RUNS:-default::}; do
        IFS=: read -r name flag envs <<<"$run"
        # As bench/calibration_points.py reads them: the run "default" without a suffix.
        file=bench_1gpu_ldc65536_${m}_b$B; [ "$name" = default ] || file=${file}_$name
        say "dcp bench ldc 65536 $m, B $B, $name"
        env ${envs//,/ } timeout 120 $b/dcp bench --profile ldc --seed 1 --tokens 65536 --mask $m --q-heads 32 \
          --kv-heads 8 --head-dim 128 --block $B --stages 2 --layers 2 --iters 5 --warmup 2 --method dcp \
          --cluster auto --nodes 1 $flag --json "/tmp/plans_json/$file.json" 2>&1 | tail -3 | tee -a "$log"
      done
    done
  done
  kill $smi
  tar -cf "$out/plans.tar" -C /tmp/plans_json .
fi
say done
