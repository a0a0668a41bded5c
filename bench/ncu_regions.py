#!/usr/bin/env python3
"""Where a kernel's warps spend their time, by code region, from Nsight Compute's SASS source page.

Input: the CSV of `ncu --import REPORT --page source --print-source sass --csv` (plain or .gz; the
ncu phase of bench/run_exec_device.sh writes ncu_src_<kernel>_<list>_b<B>[_<route>].csv.gz). Each SASS
instruction carries its warp-state samples. The instructions are cut into regions at the ones
that separate the phases of a tensor-core loop (HGMMA issues, their waits, barriers, memory
fences, mbarrier operations), and each region's share of all samples is printed with its first
and last instruction, so that "issue of S and dP", "softmax", "waiting for the other warpgroup"
read off directly. With --top N the N instructions with the most samples follow, with their
largest stall reasons where the CSV has per-reason columns.

With --roles, a warp-specialised kernel is split at its register reallocations (USETMAXREG: the
code after the first runs in the warps that grow, the consumers; after the second in those that
shrink, the producer) and each role's share of the samples, its largest stall reasons and its
executed warp instructions are printed; --units N divides the instruction counts by N (sub-tiles
of the list, for instructions per sub-tile), --warps C,P further by each role's warps (the forward
and backward kernels: 8,4).

Usage: bench/ncu_regions.py FILE [FILE...] [--min-share 0.5] [--top 20] [--roles [--units N] [--warps C,P]]
"""
import argparse
import csv
import gzip
import io
import re
import sys

# Instructions that end a region: the loop's synchronisation and tensor-core points.
CUT = re.compile(r"\b(HGMMA|WARPGROUP\.DEPBAR|WARPGROUP\.ARRIVE|BAR\.|BAR\b|MEMBAR|FENCE|SYNCS|UTMALDG|UTMAREDG|UBLKCP|UBLKRED|EXIT|BRA\.U\.ANY|WARPSYNC)")


def read_rows(path):
    raw = gzip.open(path, "rb").read() if path.endswith(".gz") else open(path, "rb").read()
    text = raw.decode("utf-8", errors="replace")
    # ncu may print lines before the CSV header (the kernel's name): start at the header.
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"#"') or '"Source"' in line), 0)
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def number(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return 0.0


def print_roles(rows, src, samples, reasons, total, units, warps):
    cuts = [i for i, r in enumerate(rows) if "USETMAXREG" in r[src]]
    if len(cuts) < 2:
        print("(--roles: fewer than two USETMAXREG instructions; not a warp-specialised kernel)")
        return
    executed = next((c for c in rows[0] if c.strip() == "Instructions Executed"), None)
    issued = [c for c in reasons if "Not Issued" not in c]
    print(f"\nroles (split at instructions {cuts[0]} and {cuts[1]}); executed instructions per warp and {units:g} units")
    for (name, part), w in zip((("consumers", rows[cuts[0]:cuts[1]]), ("producer", rows[cuts[1]:])), warps + [1.0]):
        share = 100.0 * sum(number(r[samples]) for r in part) / total
        stalls = {c: sum(number(r[c]) for r in part) for c in issued}
        stall_total = sum(stalls.values()) or 1.0
        top = sorted(stalls.items(), key=lambda kv: -kv[1])[:6]
        line = f"{name:>10}: {share:5.1f} % of the samples; " + ", ".join(f"{c.replace('stall_', '')} {100.0 * v / stall_total:.1f} %" for c, v in top)
        if executed is not None:
            line += f"; executed {sum(number(r[executed]) for r in part) / units / w:.1f}"
        print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--min-share", type=float, default=0.5, help="regions below this share (%%) are folded")
    ap.add_argument("--top", type=int, default=0, help="also list the N instructions with the most samples")
    ap.add_argument("--roles", action="store_true", help="split at the kernel's USETMAXREG: consumers and producer")
    ap.add_argument("--units", type=float, default=1.0, help="with --roles: executed instructions divided by this")
    ap.add_argument("--warps", default="1,1", help="with --roles: and by the warps of each role, consumers,producer")
    args = ap.parse_args()
    for path in args.files:
        rows = read_rows(path)
        if not rows:
            print(f"{path}: no rows", file=sys.stderr)
            continue
        cols = list(rows[0].keys())
        src = next((c for c in cols if c.strip() == "Source"), None)
        samples = next((c for c in cols if c.startswith("Warp Stall Sampling (All")), None)
        if src is None or samples is None:
            print(f"{path}: no Source / Warp Stall Sampling columns (have: {', '.join(cols[:12])} ...)", file=sys.stderr)
            continue
        reasons = [c for c in cols if c.startswith("stall_") or c.startswith("Stall ")]
        total = sum(number(r[samples]) for r in rows) or 1.0
        print(f"## {path}: {len(rows)} instructions, {total:.0f} samples")
        acc, first = 0.0, None
        out = []
        for i, r in enumerate(rows):
            s = number(r[samples])
            if first is None:
                first = i
            acc += s
            if CUT.search(r[src]) or i == len(rows) - 1:
                out.append((first, i, acc))
                first, acc = None, 0.0
        folded = 0.0
        print(f"{'share %':>8}  {'instr':>11}  region (first .. last instruction)")
        for a, z, s in out:
            share = 100.0 * s / total
            if share < args.min_share:
                folded += share
                continue
            print(f"{share:8.1f}  {a:5d}-{z:5d}  {rows[a][src].strip()[:60]}  ..  {rows[z][src].strip()[:60]}")
        print(f"{folded:8.1f}  (regions under {args.min_share} % each)")
        if args.roles:
            print_roles(rows, src, samples, reasons, total, args.units, [float(w) for w in args.warps.split(",")])
        if args.top > 0:
            print(f"\ntop {args.top} instructions")
            for i in sorted(range(len(rows)), key=lambda k: -number(rows[k][samples]))[: args.top]:
                r = rows[i]
                why = sorted(((number(r[c]), c) for c in reasons), reverse=True)[:3]
                whys = ", ".join(f"{c.replace('stall_', '')} {v:.0f}" for v, c in why if v > 0)
                print(f"{100.0 * number(r[samples]) / total:6.2f} %  {i:5d}  {r[src].strip()[:70]}  {whys}")
        print()


if __name__ == "__main__":
    main()
