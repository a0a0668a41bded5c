"""The kernel benchmark against cuDNN, read from one device call.

Reads bench_cuda_attention's JSON and bench/sdpa_reference.py's JSON of the same call (the
kernels phase of bench/run_package_device.sh packs both into kernels.tar) and prints, per list,
block size and route, forward and backward TFLOP/s with:
  - full lists: the ratio to cuDNN non-causal at the same S; causal sequences: to cuDNN causal;
    the diagonal lists (causal, partial): to cuDNN on the same work, S / B causal sequences of B
    tokens in one batch (where the reference has those rows; no target);
  - every list: the share of the full list's rate at the same S, B and route (the issue's
    "window and partial lists >= 85 % of the full-tile rate");
and checks the kernel issue's targets (forward >= 0.95x cuDNN at B >= 2048, >= 0.90x at
B = 1024; backward >= 0.95x; window and partial >= 85 % of the full rate). Where the files carry
energy (DCP_BENCH_ENERGY_S, SDPA_ENERGY_S) a second table gives each pass's TFLOP per kJ, watts and
SM clock, and the ratio to cuDNN's TFLOP per kJ on the same counterpart.

Usage: python3 bench/kernel_ratios.py kernels.tar [--route wgmma-runs] [--json OUT]
       python3 bench/kernel_ratios.py --bench bench_cuda_attention.json --sdpa sdpa_reference.json
       python3 bench/kernel_ratios.py --bench F --sdpa F   (F: a recorded bench/results/kernels_h200_*.json
                                                           that holds both)
"""
import argparse
import io
import json
import sys
import tarfile

FWD_TARGET = {1024: 0.90}  # other block sizes: 0.95
BWD_TARGET = 0.95
SHARE_TARGET = 0.85


def load_tar(path):
    """(bench, sdpa) JSON objects from a kernels.tar."""
    with tarfile.open(path) as tar:
        found = {}
        for member in tar.getmembers():
            name = member.name.rsplit("/", 1)[-1]
            if name in ("bench_cuda_attention.json", "sdpa_reference.json"):
                found[name] = json.load(io.TextIOWrapper(tar.extractfile(member)))
    missing = {"bench_cuda_attention.json", "sdpa_reference.json"} - found.keys()
    if missing:
        raise SystemExit(f"{path}: no {', '.join(sorted(missing))} in the archive")
    return found["bench_cuda_attention.json"], found["sdpa_reference.json"]


def cudnn_rates(sdpa):
    """{(seq, causal, block): (fwd, bwd)} of the cuDNN rows; block None: one sequence of seq
    tokens, else a batch of seq / block sequences of block tokens."""
    return {(r["seq"], bool(r["causal"]), r.get("block")): (r["fwd_tflops"], r["bwd_tflops"])
            for r in sdpa["rows"] if r["backend"] == "cudnn"}


def routes_of(bench):
    return sorted({k[len("fwd_"):-len("_tflops")] for r in bench["rows"] for k in r
                   if k.startswith("fwd_") and k.endswith("_tflops")})


def ratios(bench, sdpa, route):
    """One dict per list row: rates, the ratio to cuDNN where it has a counterpart, the share of
    the full list's rate, and the targets that apply."""
    ref = cudnn_rates(sdpa)
    rows = bench["rows"]
    full = {(r["seq"], r["block"]): r for r in rows if r["list"] == "full"}
    out = []
    for r in rows:
        fk, bk = f"fwd_{route}_tflops", f"bwd_{route}_tflops"
        if fk not in r:
            raise SystemExit(f"route {route} is not in the benchmark (routes: {', '.join(routes_of(bench))})")
        row = {"seq": r["seq"], "block": r["block"], "list": r["list"], "fwd": r[fk], "bwd": r.get(bk)}
        # The counterpart: one sequence for the full and sequence lists (with targets), the same
        # batch of B-token causal sequences for the diagonal lists (no target).
        key = {"full": (r["seq"], False, None), "sequence": (r["seq"], True, None),
               "causal": (r["seq"], True, r["block"]), "partial": (r["seq"], True, r["block"])}.get(r["list"])
        if key is not None and key in ref:
            cf, cb = ref[key]
            row["cudnn_fwd"], row["cudnn_bwd"] = cf, cb
            row["fwd_x"] = r[fk] / cf
            if row["bwd"] is not None:
                row["bwd_x"] = row["bwd"] / cb
            if key[2] is None:
                row["fwd_target"] = FWD_TARGET.get(r["block"], 0.95)
                row["bwd_target"] = BWD_TARGET
        f = full.get((r["seq"], r["block"]))
        if f is not None and r["list"] != "full":
            row["fwd_share"] = r[fk] / f[fk]
            if row["bwd"] is not None and f.get(bk):
                row["bwd_share"] = row["bwd"] / f[bk]
            if r["list"] in ("window", "partial"):
                row["share_target"] = SHARE_TARGET
        out.append(row)
    return out


def cudnn_energy(sdpa):
    """{(seq, causal): (fwd, bwd) TFLOP per kJ} of the cuDNN rows that carry energy."""
    return {(r["seq"], bool(r["causal"])): (r["fwd_tflop_per_kj"], r["bwd_tflop_per_kj"])
            for r in sdpa["rows"] if r["backend"] == "cudnn" and "bwd_tflop_per_kj" in r and r.get("block") is None}


def energy_rows(bench, sdpa, route):
    """One dict per list row with energy: TFLOP per kJ, watts and MHz of each pass, and the ratio
    to cuDNN's TFLOP per kJ (full: non-causal, sequence: causal) where the reference has it."""
    ref = cudnn_energy(sdpa)
    out = []
    for r in bench["rows"]:
        if f"bwd_{route}_tflop_per_kj" not in r:
            continue
        row = {"seq": r["seq"], "block": r["block"], "list": r["list"]}
        for side in ("fwd", "bwd"):
            for what in ("tflop_per_kj", "watts", "mhz"):
                row[f"{side}_{what}"] = r.get(f"{side}_{route}_{what}")
        key = {"full": (r["seq"], False), "sequence": (r["seq"], True)}.get(r["list"])
        if key in ref:
            row["fwd_kj_x"] = row["fwd_tflop_per_kj"] / ref[key][0]
            row["bwd_kj_x"] = row["bwd_tflop_per_kj"] / ref[key][1]
        out.append(row)
    return out


def cell(x, fmt):
    """x formatted, or "-" where the row has no value."""
    return format(x, fmt) if x is not None else "-"


def markdown(caption, columns, body):
    """A caption line, then a markdown table of `columns` over the cell lists in `body`."""
    lines = [caption, "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def energy_table(rows, route):
    body = [[str(r["seq"]), str(r["block"]), r["list"]] +
            [c for s in ("fwd", "bwd") for c in (cell(r[f"{s}_tflop_per_kj"], ".0f"), cell(r[f"{s}_watts"], ".0f"),
                                                   cell(r[f"{s}_mhz"], ".0f"), cell(r.get(f"{s}_kj_x"), ".3f"))]
            for r in rows]
    return markdown(f"route {route}; work per joule at the GPU's power limit, and its ratio to cuDNN's (full: "
                    "non-causal, sequence: causal)",
                    ["S", "B", "list", "fwd TFLOP/kJ", "W", "MHz", "x cuDNN", "bwd TFLOP/kJ", "W", "MHz", "x cuDNN"], body)


def verdicts(row):
    """(what, met) pairs of the targets this row carries."""
    v = []
    if "fwd_target" in row:
        v.append((f"fwd {row['fwd_x']:.3f}x >= {row['fwd_target']:.2f}x", row["fwd_x"] >= row["fwd_target"]))
    if "bwd_x" in row and "bwd_target" in row:
        v.append((f"bwd {row['bwd_x']:.3f}x >= {row['bwd_target']:.2f}x", row["bwd_x"] >= row["bwd_target"]))
    if "share_target" in row:
        for side in ("fwd", "bwd"):
            if f"{side}_share" in row:
                s = row[f"{side}_share"]
                v.append((f"{side} {100 * s:.0f} % of full >= {100 * row['share_target']:.0f} %", s >= row["share_target"]))
    return v


def table(rows, route):
    body = [[str(r["seq"]), str(r["block"]), r["list"]] +
            [c for s in ("fwd", "bwd") for c in (cell(r[s], ".1f"), cell(r.get(f"{s}_x"), ".3f"),
                                                   cell(r.get(f"{s}_share"), ".2f"))] +
            ["; ".join(f"{w}: {'met' if ok else 'missed'}" for w, ok in verdicts(r))]
            for r in rows]
    return markdown(f"route {route}; ratios to cuDNN in the same call (full: non-causal, sequence: causal, causal and "
                    "partial: S / B causal sequences of B tokens); share: of the full list's rate",
                    ["S", "B", "list", "fwd TFLOP/s", "x cuDNN", "share", "bwd TFLOP/s", "x cuDNN", "share", "targets"], body)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tar", nargs="?", help="kernels.tar of run_package_device.sh's kernels phase")
    ap.add_argument("--bench", help="bench_cuda_attention JSON (instead of the tar)")
    ap.add_argument("--sdpa", help="sdpa_reference.py JSON (instead of the tar)")
    ap.add_argument("--route", default="wgmma-runs", help="kernel route to read (default: wgmma-runs, as the executor runs plans)")
    ap.add_argument("--json", help="write the rows with their ratios here")
    a = ap.parse_args(argv)
    if a.tar:
        bench, sdpa = load_tar(a.tar)
    elif a.bench and a.sdpa:
        with open(a.bench) as f:
            bench = json.load(f)
        with open(a.sdpa) as f:
            sdpa = json.load(f)
        # A recorded table (bench/results/kernels_h200_*.json) carries both under one file.
        sdpa = sdpa.get("sdpa_reference", sdpa)
    else:
        ap.error("give kernels.tar, or both --bench and --sdpa")
    rows = ratios(bench, sdpa, a.route)
    print(table(rows, a.route))
    energy = energy_rows(bench, sdpa, a.route)
    if energy:
        print()
        print(energy_table(energy, a.route))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"route": a.route, "rows": rows, "energy": energy}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
