#!/usr/bin/env python3
"""Is planning hidden behind training? Plans a stream of ldc batches for a cluster of --devices
ranks with the package's plan queue, `--lookahead` steps ahead, while a simulated training step
takes --step-ms; reports per step how long the training loop waited for its plan.

Simulated ranks: every rank plans the same batches with the same options (that is what keeps the
plans identical), so one process planning for a P-device cluster measures what each rank's
planner threads do; the step itself is a sleep, so no GPU is needed. On the GPU machine,
bench/op_bench.py --phases lookahead measures the same with real steps.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import dcp
from dcp import _dcp


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="ldc")
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--mask", default="causal")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--heads", type=int, nargs=3, default=[32, 8, 128])
    ap.add_argument("--cluster", default="h200-nvl")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--devices-per-node", type=int, default=8)
    ap.add_argument("--block", type=int, default=2048)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lookahead", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--step-ms", type=float, default=500.0, help="simulated training step")
    ap.add_argument("--json")
    a = ap.parse_args()

    cluster = _dcp.cluster(a.cluster, a.nodes, a.devices_per_node)
    opts = _dcp.PlanOptions()
    opts.block_size, opts.stages = a.block, a.stages
    hq, hkv, d = a.heads
    batches = dcp.profile_batches(a.profile, a.seed, a.tokens, a.mask, hq, hkv, d, a.steps)
    queue = _dcp.PlanQueue(cluster, opts, a.threads)
    for s in range(min(a.lookahead + 1, a.steps)):
        queue.submit(s, batches[s])
    rows = []
    for s in range(a.steps):
        t0 = time.perf_counter()
        plan = queue.get(s)
        waited = (time.perf_counter() - t0) * 1e3
        if s + a.lookahead + 1 < a.steps:
            queue.submit(s + a.lookahead + 1, batches[s + a.lookahead + 1])
        time.sleep(a.step_ms / 1e3)  # the step trains on `plan`
        rows.append({"step": s, "waited_ms": waited, "planning_ms": queue.stats(s)["planning_ms"],
                     "sequences": batches[s].num_sequences, "devices": plan.world_size})
    steady = rows[a.lookahead + 1:] or rows
    summary = {"devices": cluster.num_devices, "tokens": a.tokens, "step_ms": a.step_ms, "lookahead": a.lookahead,
               "threads": a.threads, "planning_ms_median": statistics.median(r["planning_ms"] for r in steady),
               "planning_ms_max": max(r["planning_ms"] for r in steady),
               "waited_ms_median": statistics.median(r["waited_ms"] for r in steady),
               "waited_ms_max": max(r["waited_ms"] for r in steady),
               "waited_share_of_step": max(r["waited_ms"] for r in steady) / a.step_ms}
    print(f"{'step':>4} {'planning ms':>12} {'waited ms':>10}")
    for r in rows:
        print(f"{r['step']:>4} {r['planning_ms']:>12.1f} {r['waited_ms']:>10.3f}")
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": summary, "steps": rows}, f, indent=1)


if __name__ == "__main__":
    main()
