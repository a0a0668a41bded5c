#!/usr/bin/env python3
"""Simulated vs measured time of the same plans: `dcp bench --json` results against `dcp simulate`.

Usage: bench/sim_vs_measured.py DCP_BINARY CALIBRATION.json BENCH.tar|BENCH.json...
For every bench file (one batch, one mask, every placement) the same batch is simulated with the
calibration (same profile, tokens, cluster h200-nvl with the bench's GPU count as one node, B and
stages of the bench: 1024 and 2) and each placement's fwd / bwd times are compared.
"""
import subprocess
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from exec_tables import load  # noqa: E402


def simulate(dcp, cal, d):
    cmd = [dcp, "simulate", "--profile", d["profile"], "--tokens", "131072" if d["tokens"] > 65536 else "65536",
           "--mask", d["mask"], "--cluster", "h200-nvl", "--nodes", "1", "--devices-per-node", str(d["world"]),
           "--stages", "2", "--block", str(d["block"]), "--calibration", cal, "--batches", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    sim = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) > 3 and f[0] in ("dcp", "ring", "zigzag", "ulysses", "a2a_p2p", "packing"):
            sim[f[0]] = (float(f[1]), float(f[2]))
    return sim


def main(dcp, cal, paths):
    print("| batch | mask | method | measured fwd / bwd ms | simulated fwd / bwd ms | error fwd / bwd | error step |")
    print("|---|---|---|---|---|---|---|")
    worst = {}
    for name, d in load(paths):
        if d.get("search") or d["world"] < 2 or "rows" not in d:
            continue
        sim = simulate(dcp, cal, d)
        for r in d["rows"]:
            if r["method"] not in sim:
                continue
            sf, sb = sim[r["method"]]
            mf, mb = r["fwd_ms"], r["bwd_ms"]
            step = (sf + sb - mf - mb) / (mf + mb)
            worst[r["method"]] = max(worst.get(r["method"], 0), abs(step))
            print(f'| {d["profile"]} {d["tokens"]} | {d["mask"]} | {r["method"]} | {mf:.2f} / {mb:.2f} | '
                  f'{sf:.2f} / {sb:.2f} | {(sf - mf) / mf:+.0%} / {(sb - mb) / mb:+.0%} | {step:+.0%} |')
    print()
    print("Worst step error per placement: " + ", ".join(f"{k} {v:.0%}" for k, v in worst.items()))


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
