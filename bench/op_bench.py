#!/usr/bin/env python3
"""The PyTorch operator on one GPU against `dcp bench` of the same plan, its host cost per call,
and planning hidden behind training steps.

Phases (all by default; --phases picks):
  op         forward of every layer, then backward of every layer in reverse (as autograd runs
             them), through dcp.torch.attention on q, k, v views of one fused projection; median
             per-layer times over --iters steps, mask-area TFLOP/s. Compare with
             `dcp bench --method dcp` on the same profile, seed, tokens, block and stages
             (bench/run_op_device.sh runs both).
  host       host time of one forward call with the GPU kept busy (what the op costs the Python
             thread), median over calls.
  lookahead  --steps steps, each a new batch of the profile planned with lookahead 2 while the
             previous step trains: the time get() waited per step.
  graph      the op phase's step (every layer's forward, then backward; operator calls without
             autograd) captured once into a CUDA graph, its replay timed against the same step
             called eagerly: what a graph saves of the host's launch work (most on short steps).
Prints a table and, with --json, writes the figures. Under torchrun with several ranks (one GPU
each, NCCL) every phase runs on every rank and reports, step by step, the slowest rank's time,
as `dcp bench` does; host costs are rank 0's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import dcp
import dcp.torch as dt


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="ldc")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--mask", default="causal")
    ap.add_argument("--heads", type=int, nargs=3, default=[32, 8, 128], metavar=("Q", "KV", "DIM"))
    ap.add_argument("--block", type=int, default=2048)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12, help="lookahead phase: training steps")
    ap.add_argument("--lookahead", type=int, default=2)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--phases", default="op,host,lookahead")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", help="write the figures here")
    return ap.parse_args()


def options(a):
    return {"method": "dcp", "block_size": a.block, "stages": a.stages}


def batches(a, count):
    hq, hkv, d = a.heads
    return dcp.profile_batches(a.profile, a.seed, a.tokens, a.mask, hq, hkv, d, count)


def slowest(values):
    """Per entry, the slowest rank's value (a step waits for it); with one rank, the values."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def first_plan(a):
    """The profile's first batch and its plan on this one device."""
    batch = batches(a, 1)[0]
    planner = dcp.Planner(None, "h200-nvl", options(a), shape=tuple(a.heads))
    planner.submit(0, batch)
    return batch, planner.get(0)


class Layers:
    """Per layer: q, k, v as views of one fused projection output, and an upstream gradient."""

    def __init__(self, tokens, heads, layers, device, dtype):
        hq, hkv, d = heads
        g = torch.Generator(device=device).manual_seed(7)
        self.qkv = [torch.randn(tokens, hq + 2 * hkv, d, device=device, dtype=dtype, generator=g).requires_grad_()
                    for _ in range(layers)]
        self.grad = [torch.randn(tokens, hq, d, device=device, dtype=dtype, generator=g) for _ in range(layers)]
        self.hq, self.hkv = hq, hkv

    def views(self, layer):
        x = self.qkv[layer]
        return x[:, : self.hq], x[:, self.hq: self.hq + self.hkv], x[:, self.hq + self.hkv:]


def step(plan, layers, n_layers, events=None, autograd=True):
    """Forward of every layer, then backward in reverse; events (fwd0, fwd1, bwd1) if given.
    autograd=False calls the operator's forward and backward directly (what `dcp bench` times:
    attention alone, without autograd's bookkeeping of the fused projection's gradient)."""
    outs = []
    if events:
        events[0].record()
    for l in range(n_layers):
        q, k, v = layers.views(l)
        if autograd:
            outs.append(dt.attention(q, k, v, plan, l))
        else:
            q, k, v = q.detach(), k.detach(), v.detach()
            outs.append((q, k, v) + tuple(torch.ops.dcp.attention_forward(q, k, v, plan.handle)))
    if events:
        events[1].record()
    for l in reversed(range(n_layers)):
        if autograd:
            outs[l].backward(layers.grad[l])
        else:
            torch.ops.dcp.attention_backward(*outs[l], layers.grad[l], plan.handle)
    if events:
        events[2].record()


def phase_op(a, device):
    batch, plan = first_plan(a)
    layers = Layers(plan.num_tokens, a.heads, a.layers, device, torch.bfloat16)
    flops = batch.forward_flops
    out = {"tokens": batch.total_tokens, "sequences": batch.num_sequences, "plan_hash": plan.plan.hash}
    for name, autograd in (("op", False), ("autograd", True)):
        for _ in range(a.warmup):
            step(plan, layers, a.layers, autograd=autograd)
        torch.cuda.synchronize()
        fwd, bwd = [], []
        for _ in range(a.iters):
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            step(plan, layers, a.layers, ev, autograd=autograd)
            torch.cuda.synchronize()
            fwd.append(ev[0].elapsed_time(ev[1]) / a.layers)
            bwd.append(ev[1].elapsed_time(ev[2]) / a.layers)
        f, b = statistics.median(slowest(fwd)), statistics.median(slowest(bwd))
        out.update({f"{name}_fwd_ms_per_layer": f, f"{name}_bwd_ms_per_layer": b,
                    f"{name}_fwd_tflops": flops / (f * 1e-3) / 1e12, f"{name}_bwd_tflops": 2.5 * flops / (b * 1e-3) / 1e12})
    return out


def phase_host(a, device):
    _, plan = first_plan(a)
    layers = Layers(plan.num_tokens, a.heads, 1, device, torch.bfloat16)
    q, k, v = (t.detach() for t in layers.views(0))
    dt.attention(q, k, v, plan, 0)  # first call: runtime and scratch
    torch.cuda.synchronize()
    # Keep the GPU busy so each call returns as soon as its launches are queued; few enough calls
    # a loop that the launch queue (about a thousand launches) never fills and blocks the host.
    busy = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)

    def keep_busy():
        nonlocal busy
        for _ in range(20):
            busy = busy @ busy
            busy = busy / busy.norm()

    def timed(call, n=60):
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        return statistics.median(times), sorted(times)[int(0.9 * n)]

    keep_busy()
    whole = timed(lambda: dt.attention(q, k, v, plan, 0))
    # The C++ part alone: the same call with the tensor views and outputs made beforehand.
    from dcp import torch as impl
    attn = impl._attention_of(plan, q.device)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    views = (impl._view(q), impl._view(k), impl._view(v), impl._view(o), impl._lse_view(lse))
    keep_busy()
    cxx = timed(lambda: attn.forward(*views))
    return {"host_us_per_call_median": whole[0], "host_us_per_call_p90": whole[1],
            "cxx_us_per_call_median": cxx[0], "python_us_per_call_median": whole[0] - cxx[0]}


def phase_graph(a, device):
    batch, plan = first_plan(a)
    layers = Layers(plan.num_tokens, a.heads, a.layers, device, torch.bfloat16)
    run = lambda: step(plan, layers, a.layers, autograd=False)  # noqa: E731
    dt.prepare(plan)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up before the capture, as PyTorch asks
        for _ in range(a.warmup):
            run()
    torch.cuda.current_stream().wait_stream(side)
    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()

    def timed(call):
        times = []
        for _ in range(max(a.iters, 20)):
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            torch.cuda.synchronize()
            ev[0].record()
            call()
            ev[1].record()
            torch.cuda.synchronize()
            times.append(ev[0].elapsed_time(ev[1]))
        return times

    eager, replay = statistics.median(slowest(timed(run))), statistics.median(slowest(timed(graph.replay)))
    flops = batch.forward_flops * a.layers * 3.5
    return {"tokens": batch.total_tokens, "layers": a.layers, "eager_ms_per_step": eager,
            "replay_ms_per_step": replay, "eager_over_replay": eager / replay,
            "eager_tflops": flops / (eager * 1e-3) / 1e12, "replay_tflops": flops / (replay * 1e-3) / 1e12}


def phase_lookahead(a, device):
    items = batches(a, a.steps)
    planner = dcp.Planner(None, "h200-nvl", options(a), shape=tuple(a.heads), threads=a.threads, lookahead=a.lookahead)
    rows = []
    layers = None
    for s, batch, plan in planner.iterate([(b, None) for b in items]):
        t0 = time.perf_counter()
        if layers is None or layers.qkv[0].shape[0] != plan.num_tokens:
            layers = Layers(plan.num_tokens, a.heads, a.layers, device, torch.bfloat16)
        step(plan, layers, a.layers)
        torch.cuda.synchronize()
        st = planner.stats(s)
        rows.append({"step": s, "step_ms": (time.perf_counter() - t0) * 1e3, **st})
    for key in ("waited_ms", "step_ms"):
        for r, value in zip(rows, slowest(r[key] for r in rows)):
            r[key] = value
    measured = rows[a.lookahead:]  # the first steps wait for a planner that had no head start
    return {"steps": rows, "waited_ms_median": statistics.median(r["waited_ms"] for r in measured),
            "waited_ms_max": max(r["waited_ms"] for r in measured),
            "planning_ms_median": statistics.median(r["planning_ms"] for r in measured),
            "step_ms_median": statistics.median(r["step_ms"] for r in measured)}


def main():
    a = parse()
    device = torch.device(a.device)
    rank, world = 0, int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # torchrun: one GPU per rank
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        rank = dist.get_rank()
    out = {"args": vars(a), "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__, "ranks": world}
    for phase in a.phases.split(","):
        out[phase] = {"op": phase_op, "host": phase_host, "lookahead": phase_lookahead,
                      "graph": phase_graph}[phase](a, device)
        shown = {k: v for k, v in out[phase].items() if k != "steps"}
        if rank == 0:
            print(f"{phase}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in shown.items()), flush=True)
    if a.json and rank == 0:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
