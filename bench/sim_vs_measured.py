#!/usr/bin/env python3
"""Simulated vs measured time of the same plans: `dcp bench --json` results against `dcp simulate`.

Usage: bench/sim_vs_measured.py DCP_BINARY [--cluster PRESET] [--calibration FILE] RUNS...
RUNS as bench/exec_tables.py takes them (bench JSON files, .tar files, runs.json[:CALL]). For every
run (one batch, one mask, every placement) the same batch is simulated on PRESET (default: the
cluster the run records, else h200-nvl; h100-sxm for older runs on an H100) with the run's GPU
count (as 2 nodes of 1 GPU for the *_2nodes_* runs), block size and 2 stages, with the preset's
default calibration or FILE, and each placement's fwd / bwd times are compared.
"""
import re
import subprocess
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from exec_tables import load  # noqa: E402

METHODS = ("dcp", "ring", "zigzag", "ulysses", "a2a_p2p", "packing")


def simulate(dcp, cluster, cal, name, d):
    budget = re.search(d["profile"] + r"(\d+)", name)
    nodes = 2 if "_2nodes_" in name else 1
    cmd = [dcp, "simulate", "--profile", d["profile"], "--tokens", budget.group(1), "--mask", d["mask"],
           "--cluster", cluster, "--nodes", str(nodes), "--devices-per-node", str(d["world"] // nodes),
           "--stages", "2", "--block", str(d["block"]), "--batches", "1"]
    # Runs from before the option existed merged every output through a slot.
    cmd += [] if d.get("outputs_in_place", False) else ["--no-outputs-in-place"]
    cmd += ["--calibration", cal] if cal else []
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    sim = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) > 3 and f[0] in METHODS:
            sim[f[0]] = (float(f[1]), float(f[2]))
    return sim


def main(dcp, cluster, cal, paths):
    print("| run | method | measured fwd / bwd ms | simulated fwd / bwd ms | error fwd / bwd | error step |")
    print("|---|---|---|---|---|---|")
    worst = {}
    for name, d in load(paths):
        if d.get("search") or "rows" not in d:
            continue
        sim = simulate(dcp, cluster or d.get("cluster", "h200-nvl"), cal, name, d)
        for r in d["rows"]:
            if r["method"] not in sim:
                continue
            sf, sb = sim[r["method"]]
            mf, mb = r["fwd_ms"], r["bwd_ms"]
            step = (sf + sb - mf - mb) / (mf + mb)
            key = (r["method"], d["world"])
            worst[key] = max(worst.get(key, (0, 0)), (abs(step), max(abs(sf / mf - 1), abs(sb / mb - 1))))
            run = name.rsplit("/", 1)[-1].removeprefix("bench_")
            print(f'| {run} | {r["method"]} | {mf:.2f} / {mb:.2f} | {sf:.2f} / {sb:.2f} | '
                  f'{(sf - mf) / mf:+.0%} / {(sb - mb) / mb:+.0%} | {step:+.0%} |')
    print()
    print("Worst error per placement and GPU count (step; forward or backward): " +
          ", ".join(f"{m} {w} GPU(s) {s:.0%}; {p:.0%}" for (m, w), (s, p) in sorted(worst.items())))


if __name__ == "__main__":
    args = sys.argv[1:]
    options = {"--calibration": "", "--cluster": ""}
    for flag in options:
        if flag in args:
            i = args.index(flag)
            options[flag] = args[i + 1]
            del args[i:i + 2]
    if len(args) < 2:
        sys.exit(__doc__)
    main(args[0], options["--cluster"], options["--calibration"], args[1:])
