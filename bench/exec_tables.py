#!/usr/bin/env python3
"""Markdown tables from `dcp bench --json` files: DCP against every static placement.

Usage: bench/exec_tables.py FILE... where FILE is a bench JSON, a .tar of them (as
bench/run_exec_device.sh writes), or a runs file that gathers several device calls
(bench/results/h200_*/runs.json) with the call after a colon: runs.json:2026-11-30f (no colon: every call).
Speed-up = (fwd + bwd time of the best static placement) / (fwd + bwd time of dcp); "best CP"
leaves out packing (whole sequences per device, no context parallelism), which is shown apart.
"""
import json
import sys
import tarfile

STATIC_CP = ("ring", "zigzag", "ulysses", "a2a_p2p")


def load(paths):
    """(name, bench JSON) of every run in `paths` (see the usage above)."""
    for p in paths:
        path, _, call = p.partition(":")
        if path.endswith("runs.json"):
            with open(path) as f:
                calls = json.load(f)["calls"]
            if call and call not in calls:
                sys.exit(f"{path}: no call '{call}' (calls: {', '.join(calls)})")
            for c, entry in calls.items():
                if not call or c == call:
                    for name, d in entry["runs"].items():
                        yield f"{c}/{name}", d
        elif p.endswith(".tar"):
            with tarfile.open(p) as t:
                for m in sorted(t.getmembers(), key=lambda m: m.name):
                    if m.isfile() and m.name.endswith(".json"):
                        yield m.name.lstrip("./"), json.load(t.extractfile(m))
        else:
            with open(p) as f:
                yield p, json.load(f)


def main(paths):
    print("| run | batch | GPUs | mask | dcp fwd / bwd ms | dcp fwd / bwd TFLOP/s per GPU | best CP (fwd+bwd ms) "
          "| vs best CP | packing ms | vs every static |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, d in load(paths):
        if "rows" not in d:  # e.g. the PyTorch varlen reference (bench/varlen_reference.py)
            continue
        rows = {r["method"]: r for r in d["rows"]}
        if "dcp" not in rows:
            continue
        dcp = rows["dcp"]
        t_dcp = dcp["fwd_ms"] + dcp["bwd_ms"]
        cp = [(rows[m]["fwd_ms"] + rows[m]["bwd_ms"], m) for m in STATIC_CP if m in rows]
        pack = rows.get("packing")
        t_pack = pack["fwd_ms"] + pack["bwd_ms"] if pack else None
        best_cp = min(cp) if cp else None
        every = [t for t, _ in cp] + ([t_pack] if t_pack else [])
        batch = f'{d["profile"]} {d["tokens"]} ({d["sequences"]} seqs)'
        run = name.rsplit("/", 1)[-1].removeprefix("bench_").removesuffix(".json")
        cells = [run, batch, str(d["world"]), d["mask"],
                 f'{dcp["fwd_ms"]:.2f} / {dcp["bwd_ms"]:.2f}',
                 f'{dcp["fwd_tflops_per_gpu"]:.0f} / {dcp["bwd_tflops_per_gpu"]:.0f}',
                 f"{best_cp[1]} {best_cp[0]:.1f}" if best_cp else "-",
                 f"{best_cp[0] / t_dcp:.2f}x" if best_cp else "-",
                 f"{t_pack:.1f}" if t_pack else "-",
                 f"{min(every) / t_dcp:.2f}x" if every else "-"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
