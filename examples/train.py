#!/usr/bin/env python3
"""End-to-end training of a Llama-style decoder on packed variable-length documents, with DCP,
static context parallelism, FlexAttention or PyTorch's native context parallelism as attention.

    python3 examples/train.py --preset anchor --attn flex --mask causal        # one GPU, reference
    python3 examples/train.py --preset anchor --cp dcp --mask lambda           # one GPU, dcp
    torchrun --standalone --nproc-per-node 2 examples/train.py --cp zigzag     # two GPUs
    torchrun --standalone --nproc-per-node 2 examples/train.py --device cpu --preset tiny --tokens 4096

Every mode trains the same model from the same initial weights on the same bytes in the same
order (train_data.py); only attention and the placement of tokens on ranks differ. The model's
parameters are replicated on every rank and each rank computes the loss of the tokens it holds,
divided by the whole step's target count, so summing gradients over ranks gives the gradient of
the global mean loss: one all-reduce of a flat gradient buffer after backward.

Each run writes OUT/NAME.json (configuration, environment, tokens/s, step time, attention share,
peak memory, planner wait, per-rank imbalance, losses; on NVIDIA GPUs the energy per step and the
SM clock, train_power.py) and OUT/NAME.steps.jsonl (one line per
step, written as it goes). docs/training.md explains the figures. --runs trains several
configurations one after the other in one process (one launch, one NCCL setup, shared compile
caches); with --skip-existing, finished runs are not repeated and a run that left only its
'started' record behind (killed or crashed) is recorded as failed and skipped.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback
from contextlib import nullcontext
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_data  # noqa: E402
from train_attention import (DcpBackend, FlexBackend, NATIVE_CP_LIMITS, TorchCPBackend,  # noqa: E402
                             native_cp_missing)
from train_model import PRESETS, Decoder, describe  # noqa: E402
from train_power import GpuMeter, run_figures, window_figures  # noqa: E402

import dcp  # noqa: E402
import dcp.launch  # noqa: E402
import dcp.torch as dcp_torch  # noqa: E402

CP_METHODS = ("dcp", "zigzag", "a2a_p2p", "ulysses", "ring", "packing")
MODES = CP_METHODS + ("torch", "flex", "flex32")
ATTENTION_RANGE = "train.attention"
# Exit status when a failed run stopped the launch before its other runs (relaunch to go on);
# 1 means every run was attempted and some failed.
EXIT_STOPPED_EARLY = 3


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Modes: " + ", ".join(MODES) + ". 'flex' is the one-process FlexAttention "
                                "reference; 'flex32' the same computing attention in fp32 (exact attention up to fp32 "
                                "rounding: the yardstick of the loss comparisons); 'torch' is PyTorch's native context "
                                "parallelism (FlexAttention path).")
    g = p.add_argument_group("what to train")
    g.add_argument("--preset", choices=sorted(PRESETS), default="anchor", help="model size (default: anchor, 542M)")
    g.add_argument("--cp", choices=CP_METHODS + ("torch",), default="dcp",
                   help="placement of tokens on ranks: dcp, a static layout, or torch (native CP)")
    g.add_argument("--attn", choices=("dcp", "flex", "flex32"), default="dcp",
                   help="attention kernels: dcp's, or FlexAttention (one process; with --cp torch, native CP); "
                   "flex32: FlexAttention on q, k, v cast to fp32, its output cast back (one process)")
    g.add_argument("--mask", type=mask_arg, default="causal",
                   help="mask of every document: causal, lambda, shared_question or chunked; or a layer pattern, kinds "
                   "joined by '+' and repeated by '*N', cycled over the layers (lambda*3+causal: three "
                   "sliding-window layers, then a global one)")
    g.add_argument("--tokens", type=int, default=65536, help="tokens per step over all ranks (no padding)")
    g.add_argument("--max-doc", type=int, default=65536, help="documents longer than this are cut")
    g.add_argument("--sink", type=int, default=64, help="lambda mask: attention-sink tokens")
    g.add_argument("--window", type=int, default=4096, help="lambda mask: sliding window")
    g.add_argument("--chunk", type=int, default=8192, help="chunked mask (Llama 4's local layers): chunk size")
    g.add_argument("--question", type=float, default=0.2, help="shared question: share of a document that is question")
    g.add_argument("--answers", type=int, default=4, help="shared question: answers per document")
    g.add_argument("--data", default=None, help="directory of .py files (default: this Python's standard library)")
    g.add_argument("--seed", type=int, default=0, help="data order and initial weights")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, default=30, help="steps to train (profiled steps come after them)")
    g.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the preset's)")
    g.add_argument("--warmup", type=int, default=20, help="linear warm-up steps, then cosine decay to 10%%")
    g.add_argument("--decay-steps", type=int, default=None, help="length of the schedule (default: --steps)")
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--clip", type=float, default=1.0, help="gradient-norm clip (0: none)")
    g.add_argument("--checkpoint", action="store_true", help="activation checkpointing of every layer")
    g.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile everything around attention (default: on GPUs; attention is never "
                        "compiled into the model's graphs, so every mode runs the same compiled model)")
    g.add_argument("--dtype", choices=("bf16", "fp32"), default=None,
                   help="compute dtype (default: bf16 autocast on GPUs, fp32 on CPUs); weights stay fp32")
    g.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if available")
    g = p.add_argument_group("dcp planner")
    g.add_argument("--block-size", type=int, default=1024,
                   help="DCP token block size B (without --search-blocks)")
    g.add_argument("--search-blocks", default=None,
                   help="comma-separated block sizes: dcp's planner simulates each step's plan at each and "
                        "keeps the fastest predicted (e.g. 1024,2048,4096; the static layouts keep --block-size)")
    g.add_argument("--stages", type=int, default=2, help="communication stages of a plan")
    g.add_argument("--deterministic", nargs="?", const="one-pass", default=None,
                   choices=("one-pass", "two-pass", "ordered"),
                   help="dcp's bitwise reproducible backward (CUDA: Hopper; slower, see docs/training.md): "
                        "one-pass (the default: on one GPU, dQ summed as integer counts of per-row units; "
                        "several GPUs take two passes), two-pass (everywhere: dQ in a pass of its own, "
                        "fp32 sums in a fixed order; on one GPU the faster one for masks of many small "
                        "blocks such as causal_blockwise) or ordered (one-pass over the default backward's work, "
                        "each item's dK / dV added in its turn; no faster than one-pass on an H100)")
    g.add_argument("--outputs-in-place", action=argparse.BooleanOptionalAction, default=None,
                   help="owned outputs accumulate in their local fp32 tensors, no final merge "
                        "(default: the library's PlanOptions default)")
    g.add_argument("--plan-threads", type=int, default=None, help="planning threads (default: 4 on GPUs, 1 on CPUs)")
    g.add_argument("--lookahead", type=int, default=2, help="steps planned ahead")
    g.add_argument("--per-rank-data", action="store_true",
                   help="each rank reads only its share of a step's documents, as a data loader per rank "
                        "would; the planner gathers their lengths and masks, and dispatch moves the tokens "
                        "(same plans and loss as without)")
    g.add_argument("--cluster", default="auto",
                   help="dcp cluster preset or JSON file (auto: the preset measured on this GPU, h200-nvl without one)")
    g = p.add_argument_group("measurement and output")
    g.add_argument("--measure-from", type=int, default=10, help="first step of the timing medians")
    g.add_argument("--profile-steps", type=int, default=2,
                   help="steps after --steps run under torch.profiler for the attention share (0: none)")
    g.add_argument("--trace", default=None,
                   help="write the profiled steps as a Chrome / Perfetto trace to this file ({name}: the run "
                   "name, {rank}: the rank), e.g. to see where the GPU waits for the host")
    g.add_argument("--out", default="train_runs", help="directory for NAME.json and NAME.steps.jsonl")
    g.add_argument("--name", default=None, help="run name (default: PRESET_MODE_MASK_TOKENSk[_ckpt]_RANKS)")
    g.add_argument("--runs", default=None,
                   help="several runs in one process: comma-separated MODE:MASK[:TOKENS], e.g. "
                   "'dcp:causal,flex:causal'; the flags above give everything else")
    g.add_argument("--skip-existing", action="store_true", help="with --runs: skip runs that have a result")
    g.add_argument("--pending", action="store_true",
                   help="print the names of the runs still to do (no result in --out, or one left 'started' by "
                   "a process that died) and exit; no training; the world size comes from WORLD_SIZE")
    g.add_argument("--dump-grads", default=None,
                   help="save the first step's loss and gradients (after the sum over ranks) to this file; "
                   "'{name}' in it becomes the run name")
    g.add_argument("--log-every", type=int, default=10, help="print a line every N steps")
    g.add_argument("--run-timeout", type=float, default=0,
                   help="seconds one run may take; past them the process exits with status 3, leaving the run "
                   "'started' (a hang costs this much, not the caller's whole time limit; 0: no limit)")
    args = p.parse_args(argv)
    if args.attn == "flex" and args.cp not in ("dcp", "torch"):
        p.error("--attn flex runs on one process (the reference) or under --cp torch")
    if args.attn == "flex32" and args.cp != "dcp":
        p.error("--attn flex32 runs on one process only")
    if args.measure_from >= args.steps:
        args.measure_from = max(0, args.steps // 2)
    return args


# ---- processes and devices ---------------------------------------------------------------------
def setup_distributed(device_kind: Optional[str]):
    """(rank, world, device): from the launcher's environment (torchrun, srun, mpirun), or one
    process without one."""
    launch = dcp.launch.init_process_group(device=device_kind)
    return launch.rank, launch.world_size, launch.device


def environment(device: torch.device) -> Dict[str, object]:
    """What a result needs to be compared with another: machine, versions, commit."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip() != ""
    except (OSError, subprocess.SubprocessError):
        sha, dirty = "unknown", False
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": socket.gethostname(), "python": platform.python_version(), "torch": torch.__version__,
           "dcp": dcp.__version__, "commit": sha + ("+dirty" if dirty else ""), "cpu_count": os.cpu_count(),
           "omp_threads": torch.get_num_threads(),
           "env": {k: os.environ[k] for k in ("NCCL_NVLS_ENABLE", "DCP_ATTN_FORWARD", "DCP_ATTN_BACKWARD",
                                              "DCP_ATTN_BACKWARD_DQ", "OMP_NUM_THREADS") if k in os.environ}}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
        try:
            version = torch.cuda.nccl.version()
            env["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except (RuntimeError, AttributeError):
            pass
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=20).stdout.split("\n")[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return env


# ---- gradients ---------------------------------------------------------------------------------------
class FlatGrads:
    """Every parameter's .grad is a view into one fp32 buffer: backward accumulates into it in
    place, the sum over ranks is one all-reduce and zeroing is one fill. Summing (not averaging)
    is right because each rank's loss is already divided by the whole step's target count."""

    def __init__(self, params: List[torch.nn.Parameter]):
        numel = sum(p.numel() for p in params)
        self.buffer = torch.zeros(numel, dtype=torch.float32, device=params[0].device)
        at = 0
        for p in params:
            p.grad = self.buffer[at:at + p.numel()].view_as(p)
            at += p.numel()

    def all_reduce(self, world: int) -> None:
        if world > 1:
            dist.all_reduce(self.buffer)

    def zero(self) -> None:
        self.buffer.zero_()


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float, device: torch.device):
    """AdamW with decay on matrices only; the fused kernel on GPUs."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
    fused = {"fused": True} if device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, **fused)


def lr_factor(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


# ---- attention share from torch.profiler ---------------------------------------------------------
def _kernels(event):
    """(name, duration_us) of every GPU kernel launched under `event` and its children."""
    out = [(k.name, k.duration) for k in getattr(event, "kernels", [])]
    for child in event.cpu_children:
        out.extend(_kernels(child))
    return out


def attention_profile(prof, backward_nodes, num_steps: int, cuda: bool) -> Dict[str, object]:
    """Per-step attention time from a profile: forward = the ATTENTION_RANGE ranges around each
    attention call (recomputations under checkpointing included), backward = the autograd nodes
    of the attention outputs. On GPUs, the durations of the kernels launched under them (those of
    NCCL apart: transfers overlap compute); on CPUs, their host time."""
    from torch.autograd import DeviceType

    names = {f"autograd::engine::evaluate_function: {n}": "bwd" for n in backward_nodes}
    names[ATTENTION_RANGE] = "fwd"
    totals = {"fwd": 0.0, "bwd": 0.0, "comm": 0.0}
    all_kernels: Dict[str, float] = {}
    for e in prof.events():
        if e.device_type != DeviceType.CPU:
            continue
        if cuda:
            for k in getattr(e, "kernels", []):
                all_kernels[k.name] = all_kernels.get(k.name, 0.0) + k.duration
        part = names.get(e.name)
        if part is None:
            continue
        parent, nested = e.cpu_parent, False
        while parent is not None:
            if parent.name in names:
                nested = True
                break
            parent = parent.cpu_parent
        if nested:
            continue
        # torch.compile's backward nodes are all named CompiledFunctionBackward, attention's
        # (compiled FlexAttention) and the compiled model parts' alike: inside those, only the
        # FlexAttention kernels count as attention.
        compiled = part == "bwd" and "CompiledFunctionBackward" in e.name
        if cuda:
            for name, us in _kernels(e):
                if compiled and "flex_attention" not in name:
                    continue
                totals["comm" if name.lower().startswith("nccl") else part] += us
        else:
            totals[part] += e.cpu_time_total
    per_step = {f"{k}_ms": round(v / 1e3 / num_steps, 3) for k, v in totals.items()}
    top = sorted(all_kernels.items(), key=lambda kv: -kv[1])[:15]
    per_step["top_kernels_ms"] = [[n[:120], round(us / 1e3 / num_steps, 3)] for n, us in top]
    per_step["gpu_kernel_ms"] = round(sum(all_kernels.values()) / 1e3 / num_steps, 3)
    return per_step


# ---- one run --------------------------------------------------------------------------------------------
def mode_of(args) -> str:
    if args.cp == "torch":
        return "torch"
    return args.attn if args.attn in ("flex", "flex32") else args.cp


def mask_arg(value: str) -> str:
    try:
        train_data.layer_pattern(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))
    return value


def run_name(args, mode: str, world: int, device: torch.device) -> str:
    ranks = f"{world}{'gpu' if device.type == 'cuda' else 'cpu'}"
    ckpt = "_ckpt" if args.checkpoint else ""
    det = ""
    if args.deterministic and mode not in ("flex", "flex32", "torch"):
        det = {"one-pass": "_det1", "two-pass": "_det", "ordered": "_detord"}[args.deterministic]
    mask = args.mask.replace("*", "x")  # a layer pattern's repeat, as file names take it
    return args.name or f"{args.preset}_{mode}_{mask}_{args.tokens // 1024}k{ckpt}{det}_{ranks}"


def make_backend(args, mode: str, cfg, world: int, device: torch.device, dtype_name: str):
    if mode in ("flex", "flex32"):
        if world != 1:
            raise ValueError("the FlexAttention reference runs on one process (use --cp torch for native CP)")
        return FlexBackend(args.mask, args.sink, args.window, device, fp32=mode == "flex32")
    if mode == "torch":
        return TorchCPBackend(args.mask, args.sink, args.window, device, world)
    threads = args.plan_threads or (4 if device.type == "cuda" else 1)
    pattern = train_data.layer_pattern(args.mask)
    if len(set(pattern[i % len(pattern)] for i in range(cfg.layers))) < len(set(pattern)):
        raise ValueError(f"mask '{args.mask}': the model's {cfg.layers} layers leave a kind of the pattern unused")
    return DcpBackend(mode, (cfg.q_heads, cfg.kv_heads, cfg.head_dim), dtype_name, device, args.block_size,
                      args.stages, threads, args.lookahead, args.cluster, args.outputs_in_place,
                      [int(b) for b in args.search_blocks.split(",")] if args.search_blocks else None,
                      [pattern[i % len(pattern)] for i in range(cfg.layers)], args.per_rank_data)


def max_over_mean(values: List[float]) -> float:
    return max(values) / max(1e-9, statistics.mean(values))


def gather(obj, world: int):
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def train_run(args, mode: str, rank: int, world: int, device: torch.device, env: Dict[str, object],
              corpus: train_data.Corpus) -> Dict[str, object]:
    cfg = PRESETS[args.preset]
    cuda = device.type == "cuda"
    dtype_name = args.dtype or ("bf16" if cuda else "fp32")
    compute_dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    name = run_name(args, mode, world, device)
    say = print if rank == 0 else (lambda *a, **k: None)
    out_json = os.path.join(args.out, name + ".json")
    steps_path = os.path.join(args.out, name + ".steps.jsonl")
    config = dict(vars(args), mode=mode, dtype=dtype_name, world_size=world, runs=None, name=name)
    result: Dict[str, object] = {"schema": "dcp-train/1", "name": name, "status": "started", "config": config,
                                 "environment": env, "model": describe(cfg), "corpus": corpus.describe()}

    def write(obj, path):
        if rank == 0:
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(obj, f, indent=1)
            os.replace(tmp, path)

    write(result, out_json)
    if mode == "torch":
        say(NATIVE_CP_LIMITS)
    if cuda and dtype_name != "bf16" and mode not in ("flex", "flex32", "torch"):
        raise ValueError("dcp attention on GPUs runs bf16: use --dtype bf16")

    # The model: the same weights in every mode and on every rank (drawn from the seed, then
    # rank 0's copy broadcast, so that no device-specific generator can make ranks differ).
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = Decoder(cfg)
    model.init_weights(args.seed + 1)
    compiled = cuda if args.compile is None else args.compile
    config["compile"] = compiled
    if compiled:
        model.compile_parts()
    if world > 1:
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
    params = list(model.parameters())
    grads = FlatGrads(params)
    optimizer = make_optimizer(model, args.lr or cfg.lr, args.weight_decay, device)
    total_steps = args.steps + args.profile_steps
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, args.warmup, args.decay_steps or args.steps))
    backend = make_backend(args, mode, cfg, world, device, dtype_name)

    data = train_data.steps(corpus, args.tokens, args.max_doc, args.seed, args.mask, args.sink, args.window,
                            args.question, args.answers, args.chunk)
    first_steps: List[train_data.Step] = []

    def data_steps():
        for i, s in enumerate(data):
            if i >= total_steps:
                return
            if i < 3:
                first_steps.append(s)
            yield s

    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if compute_dtype == torch.bfloat16
                else nullcontext())
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    log = open(steps_path, "w") if rank == 0 else None
    records: List[Dict[str, float]] = []
    since_log: List[float] = []  # losses since the last printed line: their mean is printed too
    prof = None
    say(f"[{name}] {world} rank(s) on {device.type}, {cfg.num_params() / 1e6:.0f}M params, {args.tokens} tokens/step, "
        f"mask {args.mask}, {args.steps} steps (+{args.profile_steps} profiled)")
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    sync()
    it = backend.iterate(data_steps())
    prepare_next = getattr(backend, "prepare_next", lambda: None)
    meter = GpuMeter.open(device) if cuda else None
    window: Dict[str, float] = {}  # energy counter and time at the measured steps' start and end
    gpu = None
    try:
        for step in range(total_steps):
            if step == args.steps and args.profile_steps > 0:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if cuda:
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                prof = torch.profiler.profile(activities=activities)
                prof.__enter__()
            if step == args.measure_from and cuda:
                torch.cuda.reset_peak_memory_stats(device)
            if step == args.measure_from and meter:
                window.update(e0=meter.energy_mj(), t0=time.perf_counter())
            t0 = time.perf_counter()
            local = next(it)
            t_ready = time.perf_counter()

            def attend(q, k, v, layer, fn=local.attend):
                with torch.profiler.record_function(ATTENTION_RANGE):
                    return fn(q, k, v, layer)

            with autocast:
                logits = model(local.ids, local.positions, attend, compute_dtype, args.checkpoint)
                loss = torch.nn.functional.cross_entropy(logits.float(), local.labels, reduction="sum",
                                                         ignore_index=train_data.IGNORE_INDEX) / local.num_targets
            loss.backward()
            del logits
            prepare_next()  # the next step's host work, under this step's GPU work
            sync()
            t_backward = time.perf_counter()
            grads.all_reduce(world)
            if step == 0 and args.dump_grads:
                loss_sum = loss.detach().clone()
                if world > 1:
                    dist.all_reduce(loss_sum)
                if rank == 0:
                    grads_cpu = {n: p.grad.detach().float().cpu().clone() for n, p in model.named_parameters()}
                    torch.save({"loss": float(loss_sum), "name": name, "grads": grads_cpu},
                               args.dump_grads.format(name=name))
            lr = optimizer.param_groups[0]["lr"]
            norm = (torch.nn.utils.clip_grad_norm_(params, args.clip) if args.clip > 0
                    else torch.zeros((), device=device))
            optimizer.step()
            schedule.step()
            grads.zero()
            loss_sum = loss.detach()
            if world > 1:
                dist.all_reduce(loss_sum)
            loss_value, norm_value = float(loss_sum), float(norm)
            sync()
            t1 = time.perf_counter()
            if step == args.steps - 1 and meter:
                window.update(e1=meter.energy_mj(), t1=t1)
            local.release()
            rec = {"step": step, "loss": round(loss_value, 6), "step_ms": round((t1 - t0) * 1e3, 3),
                   "fwd_bwd_ms": round((t_backward - t_ready) * 1e3, 3), "ready_ms": round((t_ready - t0) * 1e3, 3),
                   "grad_norm": round(norm_value, 5), "lr": lr, "profiled": prof is not None}
            rec.update({k: round(float(v), 4) for k, v in local.stats.items()})
            records.append(rec)
            if log:
                log.write(json.dumps(rec) + "\n")
                log.flush()
            if not math.isfinite(loss_value):
                raise FloatingPointError(f"step {step}: loss {loss_value}")
            since_log.append(loss_value)
            if step % args.log_every == 0 or step == total_steps - 1:
                mean, since_log = sum(since_log) / len(since_log), []
                say(f"[{name}] step {step:4d} loss {loss_value:.4f} (mean since last line {mean:.4f}) "
                    f"{rec['step_ms']:8.1f} ms "
                    f"({args.tokens / (t1 - t0) / 1e3:.1f}K tok/s) wait {local.stats.get('waited_ms', 0.0):.2f} ms")
    finally:  # also when a step fails: the next run of the process starts clean
        it.close()  # the planner's lookahead steps are dropped with it
        if meter:
            if None not in (window.get("e0"), window.get("e1")):
                gpu = window_figures((window["e0"], window["e1"]), window["t1"] - window["t0"],
                                     args.steps - args.measure_from,
                                     meter.clocks_between(window["t0"], window["t1"]), meter.power_limit_w())
            meter.close()
        if log:
            log.close()
        if prof is not None and sys.exc_info()[0] is not None:
            prof.__exit__(None, None, None)
    peak = {}
    if cuda:
        peak = {"peak_allocated_gb": round(torch.cuda.max_memory_allocated(device) / 1e9, 2),
                "peak_reserved_gb": round(torch.cuda.max_memory_reserved(device) / 1e9, 2)}
    attention = {}
    if prof is not None:
        sync()
        prof.__exit__(None, None, None)
        attention = attention_profile(prof, sorted(backend.nodes.names), args.profile_steps, cuda)
        if args.trace:
            prof.export_chrome_trace(args.trace.format(name=name, rank=rank))

    # ---- figures over the measured steps, across ranks ----
    measured = [r for r in records[args.measure_from:args.steps]]
    step_ms = statistics.median(r["step_ms"] for r in measured)
    mine = {"fwd_bwd_ms": [r["fwd_bwd_ms"] for r in measured],
            "local_tokens": [r.get("local_tokens", 0) for r in measured],
            "attention_compute_ms": attention.get("fwd_ms", 0.0) + attention.get("bwd_ms", 0.0), "peak": peak,
            "gpu": gpu}
    ranks = gather(mine, world)
    per_step_ratio = [max_over_mean([r["fwd_bwd_ms"][i] for r in ranks]) for i in range(len(measured))]
    attn_compute = [r["attention_compute_ms"] for r in ranks]
    waited = [r.get("waited_ms", 0.0) for r in measured]
    result.update({
        "status": "ok",
        "measured_steps": [args.measure_from, args.steps],
        "step_ms_median": round(step_ms, 3),
        "step_ms_min": round(min(r["step_ms"] for r in measured), 3),
        "step_ms_max": round(max(r["step_ms"] for r in measured), 3),
        "tokens_per_s": round(args.tokens / (step_ms / 1e3), 1),
        "tokens_per_s_per_rank": round(args.tokens / (step_ms / 1e3) / world, 1),
        "loss_first": records[0]["loss"], "loss_last": records[-1]["loss"],
        "memory": {"rank0": peak, "max_peak_allocated_gb": max((r["peak"].get("peak_allocated_gb", 0) for r in ranks),
                                                               default=0)},
        "planner": {"waited_ms_median": round(statistics.median(waited), 4), "waited_ms_max": round(max(waited), 4),
                    "waited_share_of_step": round(statistics.median(waited) / step_ms, 6),
                    "planning_ms_median": round(statistics.median(r.get("planning_ms", 0.0) for r in measured), 3),
                    "steps_on_static_layouts": int(sum(r.get("static_layout", 0.0) for r in measured))}
        if mode in CP_METHODS else None,
        "imbalance": {"fwd_bwd_max_over_mean_median": round(statistics.median(per_step_ratio), 4),
                      "attention_compute_max_over_mean": round(max_over_mean(attn_compute), 4) if attention else None,
                      "fwd_bwd_ms_median_per_rank": [round(statistics.median(r["fwd_bwd_ms"]), 3) for r in ranks],
                      "local_tokens_median_per_rank": [statistics.median(r["local_tokens"]) for r in ranks]},
        "attention": dict(attention, share_of_step=round((attention["fwd_ms"] + attention["bwd_ms"]) / step_ms, 4),
                          profiled_steps=args.profile_steps) if attention else None,
        "gpu": run_figures([r["gpu"] for r in ranks], args.tokens),
        "data": dict(train_data.describe_steps(first_steps),
                     first_step_sha=train_data.first_step_checksum(first_steps[0])),
        "steps": [{k: r[k] for k in ("step", "loss", "step_ms")} for r in records],
    })
    write(result, out_json)
    say(f"[{name}] {result['tokens_per_s'] / 1e3:.1f}K tokens/s, step {step_ms:.1f} ms (median of steps "
        f"{args.measure_from}-{args.steps - 1})" + (f", attention {result['attention']['share_of_step']:.0%}"
                                                     f" (fwd {attention['fwd_ms']:.1f} + bwd {attention['bwd_ms']:.1f} ms)"
                                                     if attention else "") +
        (f", peak {peak['peak_allocated_gb']} GB" if peak else "") +
        (f", {result['gpu']['energy_j_per_step']:.0f} J a step" if result["gpu"] else "") +
        (f" at {result['gpu']['sm_clock_mhz_median']} MHz" if result["gpu"] and result["gpu"]["sm_clock_mhz_median"]
         else ""))
    del optimizer, grads, model, backend
    return result


def _give_up(name: str, seconds: float) -> None:
    """The run hung or is far slower than expected: leave it 'started' (the next launch with
    --skip-existing records it as failed) and end the process, whatever collective it waits in."""
    print(f"[{name}] no result after {seconds:.0f} s: giving up on this launch", file=sys.stderr, flush=True)
    os._exit(EXIT_STOPPED_EARLY)


def parse_runs(spec: str, args) -> List[argparse.Namespace]:
    runs = []
    for item in spec.split(","):
        parts = item.strip().split(":")
        try:
            ok = len(parts) in (2, 3) and parts[0] in MODES and bool(train_data.layer_pattern(parts[1]))
        except ValueError:
            ok = False
        if not ok:
            raise SystemExit(f"--runs item '{item}': expected MODE:MASK[:TOKENS], MODE one of {', '.join(MODES)}, "
                             f"MASK one of {', '.join(train_data.MASKS)} or a layer pattern (lambda*3+causal)")
        one = argparse.Namespace(**vars(args))
        one.cp, one.attn = (parts[0], "dcp") if parts[0] in CP_METHODS else ("torch", "flex") if parts[0] == "torch" \
            else ("dcp", parts[0])
        one.mask = parts[1]
        if len(parts) == 3:
            one.tokens = int(parts[2])
        runs.append(one)
    return runs


def pending(args) -> int:
    """Names of the runs of args still to do, one per line: no result yet, or a result left
    'started' (a failed run is done: its result says why)."""
    # A launcher's variables name the runs of its processes; before the launch (the usual case)
    # WORLD_SIZE alone says how many there will be.
    world = int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ else dcp.launch.detect().world_size
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    for one in parse_runs(args.runs, args) if args.runs else [args]:
        name = run_name(one, mode_of(one), world, device)
        try:
            with open(os.path.join(one.out, name + ".json")) as f:
                done = json.load(f).get("status") != "started"
        except (OSError, ValueError):
            done = False
        if not done:
            print(name)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.pending:
        return pending(args)
    rank, world, device = setup_distributed(args.device)
    os.makedirs(args.out, exist_ok=True)
    env = environment(device)
    if args.deterministic:
        dcp_torch.configure(deterministic=True, deterministic_one_pass=args.deterministic != "two-pass",
                            deterministic_ordered=args.deterministic == "ordered")
    env["deterministic_backward"] = args.deterministic or False
    corpus = train_data.text_corpus(args.data)
    runs = parse_runs(args.runs, args) if args.runs else [args]
    failures, stopped_early = 0, False
    for one in runs:
        mode = mode_of(one)
        name = run_name(one, mode, world, device)
        path = os.path.join(one.out, name + ".json")
        skip = None
        if rank == 0 and args.skip_existing and os.path.exists(path):
            with open(path) as f:
                previous = json.load(f)
            skip = previous.get("status")
            if skip == "started":  # the process ran it and died: killed by a timeout, or crashed
                previous.update(status="failed", error="the run did not finish (killed, hung or crashed: see the log)")
                with open(path, "w") as f:
                    json.dump(previous, f, indent=1)
                skip = "failed: it did not finish when launched before"
        skip = gather(skip, world)[0]
        if skip is not None:
            print(f"[{name}] skipped (already {skip})") if rank == 0 else None
            continue
        if mode == "torch" and native_cp_missing():
            if rank == 0:
                print(f"[{name}] {native_cp_missing()}")
                with open(path, "w") as f:
                    json.dump({"schema": "dcp-train/1", "name": name, "status": "unsupported",
                               "error": native_cp_missing(), "limits": NATIVE_CP_LIMITS}, f, indent=1)
            continue
        watchdog = None
        if one.run_timeout > 0:
            watchdog = threading.Timer(one.run_timeout, _give_up, args=(name, one.run_timeout))
            watchdog.daemon = True
            watchdog.start()
        try:
            train_run(one, mode, rank, world, device, env, corpus)
        except Exception as e:  # record it and go on with the next run: one failure loses nothing else
            failures += 1
            message = f"{type(e).__name__}: {e}"
            print(f"[{name}] rank {rank} FAILED: {message}\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            if rank == 0:
                record = {"schema": "dcp-train/1", "name": name, "status": "failed", "error": message[:4000],
                          "config": dict(vars(one), mode=mode, runs=None)}
                with open(path, "w") as f:
                    json.dump(record, f, indent=1)
            if world > 1 and device.type == "cuda" and one is not runs[-1]:
                stopped_early = True
                break  # a collective may be left half done: the next run could hang; the caller relaunches
        finally:
            if watchdog is not None:
                watchdog.cancel()
            gc.collect()  # the run's planner, model and optimizer go now, not at some later collection
            if device.type == "cuda":
                torch.cuda.empty_cache()
    # Tear down in order while the interpreter is whole: planners (their threads) and dcp's
    # cached communicators first, then the process group they were made from.
    gc.collect()
    dcp_torch.configure()  # drops dcp's per-device runtimes (communicators)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return EXIT_STOPPED_EARLY if stopped_early else 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
