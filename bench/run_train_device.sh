#!/bin/bash
# End-to-end training on the GPU machine (examples/train.py): the one-H200 measurements and the
# two-GPU runs. One device call runs a list of phases within PHASE_BUDGET_S seconds (default 540:
# a call may run 600); runs that no longer fit are left for the next call, which takes the
# previous call's results (RESUME) and runs only what is missing.
#
# Usage, from the repository root, dcp installed into python3 with its CUDA kernels (pip install
# --no-build-isolation .; or DCP_WHEEL=dcp-*.whl, a wheel of bench/run_package_device.sh, is
# installed first):
#   bash bench/run_train_device.sh single                          # nvidia-h200: one call, ~6-9 min
#   bash bench/run_train_device.sh pair                            # nvidia-h200-x2: ~28 min in all;
#   RESUME=train_pair.tar.gz bash bench/run_train_device.sh pair   # repeat with the last call's tar
#                                                                  # until it says "nothing left"
# Phases (model presets in examples/train_model.py; every run trains from the same weights on the
# same steps; times are medians over the measured steps):
#   single     anchor (542M), 64K tokens/step, FlexAttention vs dcp on every mask (24 steps,
#              medians over steps 8-23, then 1 profiled step); small model, 64K, 300 steps, flex
#              vs dcp, and dcp with its deterministic backward, causal; first-step gradients of
#              each against flex32 (FlexAttention in fp32); anchor 128K causal with activation
#              checkpointing, flex vs dcp, if the time left allows (LONG_128K_S)
#   anchor     the anchor 64K group of single alone (flex vs dcp on every mask)
#   det        anchor 64K, dcp with the default backward, then with its deterministic backward in
#              one pass and in two passes, every mask (the deterministic option's cost in training)
#   loss       the small model's group of single alone (300 steps at lr LOSS_LR, 3e-4)
#   single128  anchor 128K with checkpointing, flex vs dcp, every mask (16 steps, medians 6-15)
#   pair       = pair64 pairloss pairtorch pair128 pairflex, in that order (most wanted first):
#   pair64     anchor 64K: dcp on 1 GPU; dcp and every static layout on 2 GPUs; every mask
#   pairloss   small model, 300 steps, causal: dcp on 2 GPUs vs 1 GPU (loss, first-step gradients)
#   pairtorch  anchor 64K: PyTorch native CP on 2 GPUs, every mask
#   pair128    anchor 128K with checkpointing: dcp on 1 GPU; dcp, every static layout and native
#              CP on 2 GPUs; every mask
#   pairflex   anchor 64K: FlexAttention on 1 GPU (native CP's one-GPU counterpart), every mask
# Environment: MASKS (default "causal lambda shared_question"), MODES (the 2-GPU layouts of
#   pair64 and pair128), RESUME (tar files or directories of earlier results: their successful
#   runs are not repeated), PHASE_BUDGET_S, LONG_128K_S (time single needs left to try 128K,
#   default 160), TRAIN_EXTRA (flags added to every run, e.g. "--block-size 2048"), SEARCH_BLOCKS (dcp's
#   block-size candidates of the anchor runs, default 1024,2048,4096), OUT;
#   DRY_CPU=1 rehearses the phases on CPU ranks with the tiny model.
# Results in $OUT: train_<phases>.tar.gz (each run's NAME.json and NAME.steps.jsonl, grads_*.json,
#   report/summary.md with every target checked, report/loss.svg, report/tokens.svg; resumed
#   runs included) and train.log (every run's output). bench/plot_train.py report FILE reads them.
set -u
cd "$(dirname "$0")/.." || exit 1
phases=${*:-single}
tag=$(echo "$phases" | tr ' ' '-')
out=${OUT:-/tmp/train_out}
runs=${TRAIN_RUNS:-/tmp/train_runs}
mkdir -p "$out" "$runs"
log=$out/train.log
deadline=$((SECONDS + ${PHASE_BUDGET_S:-540}))
masks=${MASKS:-causal lambda shared_question}
static="zigzag ring ulysses a2a_p2p packing"
incomplete=0
# NVLink multicast stays off on these machines; a few host threads per rank are plenty (the
# planner has its own threads).
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
NV=$(python3 -c 'import nvidia,os;print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)/nvidia
[ -d "$NV/nccl/lib" ] && export LD_LIBRARY_PATH=$NV/nccl/lib:${LD_LIBRARY_PATH:-}

say() { echo "== $(date +%T) +${SECONDS}s $*" | tee -a "$log"; }

# The measurement windows: every 64K run shares one, every 128K run another, so that runs of
# different phases (and machines) compare step for step.
# --run-timeout bounds what a hung run costs (a few times a run's expected time, compile included).
# dcp picks each step's block size by simulating its plan at each candidate (--search-blocks).
SEARCH="--search-blocks ${SEARCH_BLOCKS:-1024,2048,4096}"
W64="--preset anchor --tokens 65536 --steps 24 --measure-from 8 --profile-steps 1 --run-timeout 240 $SEARCH"
W128="--preset anchor --tokens 131072 --checkpoint --steps 16 --measure-from 6 --profile-steps 1 --run-timeout 300 $SEARCH"
# The loss runs train at lr 3e-4 (LOSS_LR): at the small preset's 1e-3 two dcp trainings that differ
# only in the order of dQ's sums drift 0.07 apart in logged interval means (docs/training.md).
LOSS="--preset small --tokens 65536 --steps 300 --lr ${LOSS_LR:-3e-4} --warmup 50 --profile-steps 0 --log-every 50 --run-timeout 240"
if [ -n "${DRY_CPU:-}" ]; then
  # A rehearsal of this script's logic on CPU ranks with the tiny model (names keep their
  # tokens: 2K and 4K stand in for 64K and 128K, 1K for the loss runs).
  tiny="--device cpu --preset tiny --max-doc 700 --window 64 --sink 4"
  W64="$tiny --tokens 2048 --steps 4 --measure-from 1 --profile-steps 1 $SEARCH"
  W128="$tiny --tokens 4096 --checkpoint --steps 3 --measure-from 1 --profile-steps 1"
  LOSS="$tiny --tokens 1024 --steps 20 --warmup 5 --profile-steps 0 --log-every 10"
fi

pack() {
  python3 bench/plot_train.py report "$runs" --out "$runs/report" >/dev/null 2>>"$log" || say "report: failed (see log)"
  tar -czf "$out/train_$tag.tar.gz" -C "$runs" --exclude='*.pt' --exclude='*.tmp' . 2>>"$log"
  [ -f "$runs/report/summary.md" ] && sed -n '/^### /,$p' "$runs/report/summary.md"
  if [ "$incomplete" -eq 0 ]; then
    say "nothing left: every run of '$phases' has a result"
  else
    say "runs left: call again with RESUME=<this call's train_$tag.tar.gz>"
  fi
}
trap pack EXIT

for src in ${RESUME:-}; do  # earlier calls' results; only successful runs are kept
  if [ -d "$src" ]; then cp "$src"/*.json "$src"/*.jsonl "$runs"/ 2>/dev/null; else tar -xzf "$src" -C "$runs" 2>>"$log"; fi
done
if [ -n "${RESUME:-}" ]; then
  python3 - "$runs" <<'KEEP_OK' | tee -a "$log"
import glob, json, os, sys
kept = 0
for path in glob.glob(os.path.join(sys.argv[1], "*.json")):
    try:
        with open(path) as f:
            r = json.load(f)
    except ValueError:
        continue
    if r.get("schema") != "dcp-train/1":
        continue
    if r.get("status") == "ok":
        kept += 1
    else:
        os.remove(path)
print(f"resumed {kept} finished runs")
KEEP_OK
fi

if [ -n "${DCP_WHEEL:-}" ]; then  # a wheel built by an earlier call (bench/run_package_device.sh build)
  say "installing $DCP_WHEEL"
  python3 -m pip install -q --no-deps --force-reinstall "$DCP_WHEEL" >>"$log" 2>&1 || say "pip install $DCP_WHEEL failed"
fi
if [ -z "${DRY_CPU:-}" ]; then
  if ! python3 -c 'import torch, dcp, dcp.torch; assert torch.cuda.is_available() and dcp.cuda_available()' 2>>"$log"; then
    say "python3 has no CUDA build of dcp: pip install --no-build-isolation . first"
    exit 1
  fi
  say "phases: $phases; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $(nvidia-smi -L | wc -l) GPU(s)"
fi

# run_group LABEL NPROC LIMIT_S ARGS...: one launch of train.py for the runs of --runs in ARGS,
# all within LIMIT_S (and the call's budget). While runs are left to do (train.py --pending: no
# result, or one left 'started' by a launch that died or timed out) and time lasts, it launches
# again: finished and failed runs are skipped, the one cut short is recorded as failed.
run_group() {
  local label=$1 nproc=$2 attempt rc t from
  local until=$((SECONDS + $3 < deadline ? SECONDS + $3 : deadline))
  shift 3
  local pending
  for attempt in 1 2 3 4 5 6 7 8; do
    # train.py --pending names the runs without a result; if it cannot run (no torch, bad flags),
    # nothing can, and the group is not done.
    if ! pending=$(WORLD_SIZE=$nproc python3 examples/train.py --pending --out "$runs" "$@" 2>>"$log"); then
      say "$label: not run: train.py --pending failed (see train.log)"
      incomplete=1
      return 1
    fi
    if [ -z "$pending" ]; then
      [ "$attempt" -eq 1 ] && say "$label: done before"
      return 0
    fi
    t=$((until - SECONDS))
    if [ "$t" -lt 45 ] || [ "$attempt" -eq 8 ]; then
      say "$label: not run (or not finished): out of time or attempts"
      incomplete=1
      return 1
    fi
    say "$label (attempt $attempt, at most ${t}s)"
    from=$(wc -l <"$log")
    if [ "$nproc" -eq 1 ]; then
      CUDA_VISIBLE_DEVICES=${ONE_GPU:-0} timeout -k 20 "$t" python3 examples/train.py --out "$runs" --skip-existing "$@" \
        ${TRAIN_EXTRA:-} >>"$log" 2>&1
    else
      timeout -k 20 "$t" python3 -m torch.distributed.run --standalone --nproc-per-node "$nproc" examples/train.py \
        --out "$runs" --skip-existing "$@" ${TRAIN_EXTRA:-} >>"$log" 2>&1
    fi
    rc=$?
    tail -n +"$((from + 1))" "$log" | grep -E "tokens/s, step|FAILED|skipped|giving up|Error|error:" | grep -v "^\s*File" |
      head -n 40
    [ "$rc" -ne 0 ] && say "$label: exit status $rc"
  done
}

# runs_of "MODES" -> "mode:mask,..." over $masks, mask-major (each mask's modes side by side).
runs_of() {
  local r="" m mode
  for m in $masks; do for mode in $1; do r="$r,$mode:$m"; done; done
  echo "${r#,}"
}

loss_name() {  # MODE RANKS: the name train.py gives the loss runs
  if [ -n "${DRY_CPU:-}" ]; then echo "tiny_$1_causal_1k_$2cpu"; else echo "small_$1_causal_64k_$2gpu"; fi
}

compare_grads() {  # A B: first-step gradients of two runs that used --dump-grads
  [ -f "$runs/grads_${1}_vs_$2.json" ] && return 0
  if [ -f "$runs/grads_$1.pt" ] && [ -f "$runs/grads_$2.pt" ]; then
    python3 bench/plot_train.py grads "$runs/grads_$1.pt" "$runs/grads_$2.pt" --tol 0.02 \
      --json "$runs/grads_${1}_vs_$2.json" 2>&1 | tee -a "$log"
  else
    say "gradients of $1 / $2: missing (both runs must be made in one call)"
  fi
}

# The small model's 300 steps: flex against dcp, and the yardsticks: dcp with its deterministic
# backward (only the order of dQ's sums differs: how far two trainings apart by rounding alone
# drift), and the first step's gradients against attention in fp32 (flex32; too slow for 300).
loss_group() {
  run_group "1 GPU, small 64K, 300 steps, flex vs dcp" 1 200 $LOSS --runs flex:causal,dcp:causal \
    --dump-grads "$runs/grads_{name}.pt"
  run_group "1 GPU, small 64K, 300 steps, dcp deterministic" 1 150 $LOSS --runs dcp:causal --deterministic
  run_group "1 GPU, small 64K, first step, flex32" 1 120 $LOSS --steps 1 --runs flex32:causal \
    --dump-grads "$runs/grads_{name}.pt"
  compare_grads "$(loss_name flex 1)" "$(loss_name dcp 1)"
  compare_grads "$(loss_name flex32 1)" "$(loss_name dcp 1)"
  compare_grads "$(loss_name flex32 1)" "$(loss_name flex 1)"
}

expand() {  # phase names -> the phases they stand for
  local p
  for p in "$@"; do
    case $p in
      pair) echo pair64 pairloss pairtorch pair128 pairflex ;;
      *) echo "$p" ;;
    esac
  done
}

for phase in $(expand $phases); do
  case $phase in
    single)
      run_group "1 GPU, anchor 64K, flex vs dcp" 1 330 $W64 --runs "$(runs_of "flex dcp")"
      loss_group
      if [ $((deadline - SECONDS)) -ge "${LONG_128K_S:-160}" ]; then
        run_group "1 GPU, anchor 128K causal, dcp vs flex" 1 240 $W128 --runs dcp:causal,flex:causal
      else
        say "1 GPU, anchor 128K: not run, out of time (phase single128)"
      fi
      ;;
    anchor)
      run_group "1 GPU, anchor 64K, flex vs dcp" 1 330 $W64 --runs "$(runs_of "flex dcp")"
      ;;
    det)
      run_group "1 GPU, anchor 64K, dcp" 1 150 $W64 --runs "$(runs_of dcp)"
      run_group "1 GPU, anchor 64K, dcp deterministic in one pass" 1 150 $W64 --runs "$(runs_of dcp)" --deterministic one-pass
      run_group "1 GPU, anchor 64K, dcp deterministic in two passes" 1 150 $W64 --runs "$(runs_of dcp)" --deterministic two-pass
      ;;
    loss)
      loss_group
      ;;
    single128)
      run_group "1 GPU, anchor 128K, dcp vs flex" 1 540 $W128 --runs "$(runs_of "dcp flex")"
      ;;
    pair64)
      run_group "1 GPU, anchor 64K, dcp" 1 150 $W64 --runs "$(runs_of dcp)"
      run_group "2 GPUs, anchor 64K, dcp and static layouts" 2 500 $W64 --runs "$(runs_of "${MODES:-dcp $static}")"
      ;;
    pairloss)
      run_group "2 GPUs, small 64K, 300 steps, dcp" 2 120 $LOSS --runs dcp:causal --dump-grads "$runs/grads_{name}.pt"
      run_group "1 GPU, small 64K, 300 steps, dcp" 1 100 $LOSS --runs dcp:causal --dump-grads "$runs/grads_{name}.pt"
      compare_grads "$(loss_name dcp 2)" "$(loss_name dcp 1)"
      ;;
    pairtorch)
      run_group "2 GPUs, anchor 64K, native CP" 2 300 $W64 --runs "$(runs_of torch)"
      ;;
    pair128)
      run_group "1 GPU, anchor 128K, dcp" 1 200 $W128 --runs "$(runs_of dcp)"
      run_group "2 GPUs, anchor 128K, dcp, static layouts, native CP" 2 900 $W128 \
        --runs "$(runs_of "${MODES:-dcp $static} torch")"
      ;;
    pairflex)
      run_group "1 GPU, anchor 64K, flex" 1 240 $W64 --runs "$(runs_of flex)"
      ;;
    *)
      say "unknown phase '$phase' (single anchor det loss single128 pair pair64 pairloss pairtorch pair128 pairflex)"
      ;;
  esac
done
say "done"
