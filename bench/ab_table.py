"""B against A from one `bench/run_ab_device.sh` call.

Reads the call's ab.tgz (or its unpacked folder) and prints, per list and block size, the mean
forward and backward TFLOP/s of A and B over their runs and B / A; then the whole plans (every
mask, both orders) the same way, and cuDNN's figures of the call. Means over the runs because
the runs alternate A B A B: a drift of the GPU's clock between runs falls on both sides alike.

Usage: python3 bench/ab_table.py ab.tgz [--fwd-route wgmma-runs] [--bwd-route wgmma-cells] [--json OUT]
"""
import argparse
import io
import json
import os
import re
import sys
import tarfile


def read_files(path):
    """{basename: parsed JSON} of the call's JSON files."""
    out = {}
    if os.path.isdir(path):
        for root, _, files in os.walk(path):
            for f in files:
                if f.endswith(".json"):
                    with open(os.path.join(root, f)) as fh:
                        out[f] = json.load(fh)
        return out
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            if m.isfile() and m.name.endswith(".json"):
                out[m.name.rsplit("/", 1)[-1]] = json.load(io.TextIOWrapper(tar.extractfile(m)))
    return out


def mean(xs):
    return sum(xs) / len(xs) if xs else None


def compared(row, acc):
    """`row` with the mean forward and backward rates of A and B ({"A": (fwd list, bwd list),
    "B": ...}) and B / A."""
    for i, d in enumerate(("fwd", "bwd")):
        ma, mb = mean(acc["A"][i]), mean(acc["B"][i])
        row[f"{d}_A"], row[f"{d}_B"] = ma, mb
        row[f"{d}_B_over_A"] = mb / ma if ma and mb else None
    return row


def list_rows(files, fwd_route, bwd_route):
    """One row per (S, B, list): mean A and B rates over the runs, and B / A."""
    acc = {}
    for name, obj in files.items():
        m = re.fullmatch(r"kernels_([AB])_(\d+)\.json", name)
        if not m:
            continue
        side = m.group(1)
        for r in obj["rows"]:
            fk, bk = f"fwd_{fwd_route}_tflops", f"bwd_{bwd_route}_tflops"
            if fk not in r or bk not in r:
                raise SystemExit(f"{name}: no {fk if fk not in r else bk} (routes of the call: "
                                 f"{', '.join(sorted(k[4:-7] for k in r if k.startswith('fwd_') and k.endswith('_tflops')))})")
            a = acc.setdefault((r["seq"], r["block"], r["list"]), {"A": ([], []), "B": ([], [])})
            a[side][0].append(r[fk])
            a[side][1].append(r[bk])
    return [compared({"seq": seq, "block": block, "list": lst}, a) for (seq, block, lst), a in sorted(acc.items())]


def plan_rows(files):
    """One row per mask: mean A and B whole-plan rates over both orders, and B / A."""
    acc = {}
    for name, obj in files.items():
        m = re.fullmatch(r"plan_([AB])_(.+)_(AB|BA)\.json", name)
        if not m:
            continue
        r = obj["rows"][0]
        a = acc.setdefault(m.group(2), {"A": ([], []), "B": ([], [])})
        a[m.group(1)][0].append(r["fwd_tflops_per_gpu"])
        a[m.group(1)][1].append(r["bwd_tflops_per_gpu"])
    return [compared({"mask": mask}, a) for mask, a in sorted(acc.items())]


def fmt(x, spec):
    return format(x, spec) if x is not None else "-"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("call", help="ab.tgz of run_ab_device.sh, or the folder it unpacks to")
    ap.add_argument("--fwd-route", default="wgmma-runs", help="forward route (default wgmma-runs, as the executor runs plans)")
    ap.add_argument("--bwd-route", default="wgmma-cells", help="backward route (default wgmma-cells, the executor's backward)")
    ap.add_argument("--json", help="write both tables here")
    a = ap.parse_args(argv)
    files = read_files(a.call)
    lists, plans = list_rows(files, a.fwd_route, a.bwd_route), plan_rows(files)
    if not lists and not plans:
        raise SystemExit(f"{a.call}: no kernels_[AB]_N.json or plan_[AB]_MASK_ORDER.json files")
    print(f"lists: forward {a.fwd_route}, backward {a.bwd_route}; TFLOP/s, mean over the runs")
    print("| S | B | list | fwd A | fwd B | B / A | bwd A | bwd B | B / A |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in lists:
        print(f"| {r['seq']} | {r['block']} | {r['list']} | {fmt(r['fwd_A'], '.1f')} | {fmt(r['fwd_B'], '.1f')} | "
              f"{fmt(r['fwd_B_over_A'], '.3f')} | {fmt(r['bwd_A'], '.1f')} | {fmt(r['bwd_B'], '.1f')} | {fmt(r['bwd_B_over_A'], '.3f')} |")
    if plans:
        print("\nwhole one-GPU plans; TFLOP/s, mean over both orders")
        print("| mask | fwd A | fwd B | B / A | bwd A | bwd B | B / A |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in plans:
            print(f"| {r['mask']} | {fmt(r['fwd_A'], '.1f')} | {fmt(r['fwd_B'], '.1f')} | {fmt(r['fwd_B_over_A'], '.3f')} | "
                  f"{fmt(r['bwd_A'], '.1f')} | {fmt(r['bwd_B'], '.1f')} | {fmt(r['bwd_B_over_A'], '.3f')} |")
    sdpa = files.get("sdpa_reference.json")
    if sdpa:
        print("\ncuDNN in the same call: " + "; ".join(
            f"S {r['seq']} {'causal' if r['causal'] else 'non-causal'} {r['fwd_tflops']:.1f} / {r['bwd_tflops']:.1f}"
            for r in sdpa["rows"] if r["backend"] == "cudnn"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"lists": lists, "plans": plans}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
