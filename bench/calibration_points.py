#!/usr/bin/env python3
"""The one-GPU whole plans of a device call, as points for the kernel-model fit and its test.

Usage: bench/calibration_points.py [--in-place-only] DCP_BINARY RUNS.json:CALL [RUNS.json:CALL ...]
         > tests/sim/data/<h200 or h100>_one_gpu_plans.json
RUNS.json is a runs file of bench/results (bench/exec_tables.py describes it). Every one-GPU
`dcp bench` run of the call (bench_1gpu_<profile><tokens>_<mask>, as bench/run_exec_device.sh
names them) becomes one point: its measured forward and backward time per layer, its block size,
stages and outputs_in_place, and the batch itself, regenerated with `dcp plan --write-batch` from the same profile,
token budget and mask and checked against the run's token and sequence counts (so a later change
of the profile generator cannot silently change what the point describes).
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from exec_tables import load  # noqa: E402

# bench_1gpu_<profile><tokens>_<mask>[_b<block>][_merged]
NAME = re.compile(r"bench_1gpu_([a-z]+?)(\d+)_([a-z_]+?)(?:_b\d+)?(?:_merged)?$")


def batch_of(dcp, profile, tokens, mask):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "batch.json")
        subprocess.run([dcp, "plan", "--profile", profile, "--tokens", str(tokens), "--mask", mask, "--cluster",
                        "h200-nvl", "--nodes", "1", "--devices-per-node", "1", "--method", "dcp",
                        "--write-batch", path], check=True, capture_output=True)
        with open(path) as f:
            return json.load(f)


def main(dcp, sources, in_place_only=False):
    points = []
    for name, d in load(sources):
        if in_place_only and not d.get("outputs_in_place", False):
            continue
        m = NAME.match(name.rsplit("/", 1)[-1])
        if not m or d.get("world") != 1 or "rows" not in d:
            continue
        profile, budget, mask = m.group(1), int(m.group(2)), m.group(3)
        batch = batch_of(dcp, profile, budget, mask)
        lengths = [s["length"] for s in batch["sequences"]]
        if sum(lengths) != d["tokens"] or len(lengths) != d["sequences"]:
            sys.exit(f"{name}: the regenerated batch has {sum(lengths)} tokens in {len(lengths)} sequences, "
                     f"the run {d['tokens']} in {d['sequences']}")
        row = next(r for r in d["rows"] if r["method"] == "dcp")
        # Runs from before the option existed merged every output through a slot.
        in_place = bool(d.get("outputs_in_place", False))
        points.append({"name": f"{profile}{budget}_{mask}_b{d['block']}" + ("" if in_place else "_merged"),
                       "block": d["block"], "stages": 2, "outputs_in_place": in_place,
                       "fwd_ms": round(row["fwd_ms"], 4), "bwd_ms": round(row["bwd_ms"], 4), "batch": batch})
    if not points:
        sys.exit(f"{' '.join(sources)}: no one-GPU run")
    out = {"about": "Measured forward / backward time per layer of one-GPU whole DCP plans (dcp bench, CUDA "
                    "backend, default kernel routes), with the batch each ran; written by "
                    "bench/calibration_points.py",
           "source": " ".join(sources), "plans": points}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    args = sys.argv[1:]
    only = "--in-place-only" in args
    args = [a for a in args if a != "--in-place-only"]
    if len(args) < 2:
        sys.exit(__doc__)
    main(args[0], args[1:], only)
