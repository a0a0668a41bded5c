"""Each variant against A from one `bench/run_ab_device.sh` call.

Reads the call's ab.tgz (or its unpacked folder) and prints, per list and block size, the mean
forward and backward TFLOP/s of A and of every other variant (B, C, ...) over their runs, and each
over A; then the whole plans (every mask, both orders) the same way, with the deterministic
backward's whole plans and their ratio to the default's where the call ran them (AB_DET=1), each
deterministic method over the default backward per list where the kernel bench timed them, the
plans' TFLOP per kJ where the call measured energy (AB_ENERGY), and cuDNN's figures of the call. Means over the runs because the runs alternate A B A B: a drift of
the GPU's clock between runs falls on every side alike.

Usage: python3 bench/ab_table.py ab.tgz [--fwd-route wgmma-runs] [--bwd-route wgmma-cells] [--json OUT]
(--bwd-route wgmma-det: the two-pass deterministic backward; wgmma-det-one-pass: the one-pass one.)
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


def ratio(x, y):
    return x / y if x and y else None


def compared(row, acc):
    """`row` with the mean forward and backward rates of every variant ({"A": (fwd list, bwd list),
    "B": ...}) and each variant's over A's (fwd_B_over_A, ...)."""
    for i, d in enumerate(("fwd", "bwd")):
        ma = mean(acc.get("A", ([], []))[i])
        row[f"{d}_A"] = ma
        for v in sorted(acc):
            if v == "A":
                continue
            mv = mean(acc[v][i])
            row[f"{d}_{v}"] = mv
            row[f"{d}_{v}_over_A"] = ratio(mv, ma)
    return row


def list_rows(files, fwd_route, bwd_route):
    """One row per (S, B, list): the mean rate of each variant over the runs, and each over A."""
    acc = {}
    for name, obj in files.items():
        m = re.fullmatch(r"kernels_([A-Z])_(\d+)\.json", name)
        if not m:
            continue
        side = m.group(1)
        for r in obj["rows"]:
            fk, bk = f"fwd_{fwd_route}_tflops", f"bwd_{bwd_route}_tflops"
            if fk not in r or bk not in r:
                raise SystemExit(f"{name}: no {fk if fk not in r else bk} (routes of the call: "
                                 f"{', '.join(sorted(k[4:-7] for k in r if k.startswith('fwd_') and k.endswith('_tflops')))})")
            # {(S, B, list): {variant: {run: (fwd, bwd)}}}
            acc.setdefault((r["seq"], r["block"], r["list"]), {}).setdefault(side, {})[int(m.group(2))] = (r[fk], r[bk])
    rows = []
    for (seq, block, lst), a in sorted(acc.items()):
        row = compared({"seq": seq, "block": block, "list": lst},
                       {v: ([f for f, _ in runs.values()], [b for _, b in runs.values()]) for v, runs in a.items()})
        # Each run of a variant over A's run of the same number (the runs alternate A B A B): how far
        # the ratio moves between runs, the spread that one call's mean carries.
        base = a.get("A", {})
        for v, runs in a.items():
            if v == "A":
                continue
            for i, d in enumerate(("fwd", "bwd")):
                per_run = [ratio(runs[n][i], base[n][i]) for n in sorted(runs) if n in base]
                per_run = [x for x in per_run if x]
                if per_run:
                    row[f"{d}_{v}_over_A_runs"] = [min(per_run), max(per_run)]
        rows.append(row)
    return rows


# The kernel bench's deterministic backward methods (DCP_BENCH_ROUTES with wgmma-det), by their key.
DET_METHODS = (("one pass", "bwd_wgmma-det-one-pass_tflops"), ("two passes", "bwd_wgmma-det_tflops"),
               ("ordered", "bwd_wgmma-det-ordered_tflops"))


def det_list_rows(files, bwd_route):
    """One row per (S, B, list) where the call timed the deterministic methods: each variant's mean
    rate of each method over its mean default backward rate (`bwd_route`) in the same runs."""
    acc = {}
    for name, obj in files.items():
        m = re.fullmatch(r"kernels_([A-Z])_(\d+)\.json", name)
        if not m:
            continue
        for r in obj["rows"]:
            if not any(k in r for _, k in DET_METHODS):
                continue
            a = acc.setdefault((r["seq"], r["block"], r["list"]), {}).setdefault(m.group(1), {})
            a.setdefault("default", []).append(r.get(f"bwd_{bwd_route}_tflops"))
            for method, k in DET_METHODS:
                a.setdefault(method, []).append(r.get(k))
    rows = []
    for (seq, block, lst), by_variant in sorted(acc.items()):
        row = {"seq": seq, "block": block, "list": lst}
        for v, a in sorted(by_variant.items()):
            base = mean([x for x in a["default"] if x])
            for method, _ in DET_METHODS:
                got = [x for x in a[method] if x]
                row[f"{method}_{v}_over_default"] = ratio(mean(got), base) if got else None
        rows.append(row)
    return rows


def rates(r):
    return r["fwd_tflops_per_gpu"], r["bwd_tflops_per_gpu"]


def energy_rates(r):
    """TFLOP per kJ of GPU 0 (dcp bench --energy-iters), or None where the run has none."""
    if "fwd_energy" not in r or "bwd_energy" not in r:
        return None
    return r["fwd_energy"]["tflop_per_kj"], r["bwd_energy"]["tflop_per_kj"]


def plan_rows(files, prefix="plan", figures=rates):
    """One row per mask: the mean whole-plan rate of each variant over both orders, and each over A
    (prefix detplan: the deterministic backward's runs; figures=energy_rates: TFLOP per kJ, where
    the runs measured it)."""
    acc = {}
    for name, obj in files.items():
        m = re.fullmatch(prefix + r"_([A-Z])_(.+)_([A-Z]+[0-9]*)\.json", name)
        if not m:
            continue
        f = figures(obj["rows"][0])
        if f is None:
            continue
        a = acc.setdefault(m.group(2), {}).setdefault(m.group(1), ([], []))
        a[0].append(f[0])
        a[1].append(f[1])
    return [compared({"mask": mask}, a) for mask, a in sorted(acc.items())]


def variants_of(rows):
    """The variants other than A that the rows hold, in order."""
    return sorted({k.split("_")[1] for r in rows for k in r if k.startswith("fwd_") and k.endswith("_over_A")})


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
        raise SystemExit(f"{a.call}: no kernels_V_N.json or plan_V_MASK_ORDER.json files")
    vs = variants_of(lists + plans)

    def cells(r, runs=False):
        out = []
        for d in ("fwd", "bwd"):
            out.append(fmt(r[f"{d}_A"], ".1f"))
            for v in vs:
                out += [fmt(r.get(f"{d}_{v}"), ".1f"), fmt(r.get(f"{d}_{v}_over_A"), ".3f")]
                if runs:
                    span = r.get(f"{d}_{v}_over_A_runs")
                    out.append(f"{span[0]:.3f}-{span[1]:.3f}" if span else "-")
        return out

    def header(runs=False):  # the columns of cells(r, runs)
        per_run = ("per run",) if runs else ()
        return [h for d in ("fwd", "bwd") for h in [f"{d} A"] + [x for v in vs for x in (f"{d} {v}", f"{v} / A") + per_run]]

    head = header()
    list_head = header(runs=True)
    print(f"lists: forward {a.fwd_route}, backward {a.bwd_route}; TFLOP/s, mean over the runs; per run: the lowest "
          "and highest ratio of one run over A's run of the same number")
    print("| S | B | list | " + " | ".join(list_head) + " |")
    print("|" + " --- |" * (3 + len(list_head)))
    for r in lists:
        print(f"| {r['seq']} | {r['block']} | {r['list']} | " + " | ".join(cells(r, runs=True)) + " |")
    def mask_table(title, rows):
        if not rows:
            return
        print(f"\n{title}")
        print("| mask | " + " | ".join(head) + " |")
        print("|" + " --- |" * (1 + len(head)))
        for r in rows:
            print(f"| {r['mask']} | " + " | ".join(cells(r)) + " |")

    mask_table("whole one-GPU plans; TFLOP/s, mean over both orders", plans)
    energy = plan_rows(files, "plan", energy_rates)
    mask_table("whole one-GPU plans, energy (AB_ENERGY): TFLOP per kJ of the GPU, mean over both orders", energy)
    default_bwd = {r["mask"]: r for r in plans}
    det_tables = {}
    for prefix, title in (("detplan", "deterministic backward"), ("det1plan", "one-pass deterministic backward"),
                          ("ordplan", "ordered deterministic backward")):
        detplans = det_tables[prefix] = plan_rows(files, prefix)
        if not detplans:
            continue
        print(f"\n{title}, whole one-GPU plans; backward TFLOP/s, mean over both orders, and over the default's")
        print("| mask | det A | det A / default A | " + " | ".join(f"det {v} | {v} / A | det {v} / default {v}" for v in vs) + " |")
        print("|" + " --- |" * (3 + 3 * len(vs)))
        for r in detplans:
            d = default_bwd.get(r["mask"], {})
            out = [fmt(r["bwd_A"], ".1f"), fmt(ratio(r["bwd_A"], d.get("bwd_A")), ".3f")]
            for v in vs:
                out += [fmt(r.get(f"bwd_{v}"), ".1f"), fmt(r.get(f"bwd_{v}_over_A"), ".3f"),
                        fmt(ratio(r.get(f"bwd_{v}"), d.get(f"bwd_{v}")), ".3f")]
            print(f"| {r['mask']} | " + " | ".join(out) + " |")
    det_lists = det_list_rows(files, a.bwd_route)
    if det_lists:
        methods = [m for m, _ in DET_METHODS if any(r.get(f"{m}_{v}_over_default") for r in det_lists for v in ["A"] + vs)]
        print(f"\ndeterministic backward, lists: each method over the default backward ({a.bwd_route}) of the same "
              "variant, mean rates over the runs")
        heads = [f"{m} {v}" for v in ["A"] + vs for m in methods]
        print("| S | B | list | " + " | ".join(heads) + " |")
        print("|" + " --- |" * (3 + len(heads)))
        for r in det_lists:
            print(f"| {r['seq']} | {r['block']} | {r['list']} | " +
                  " | ".join(fmt(r.get(f"{m}_{v}_over_default"), ".3f") for v in ["A"] + vs for m in methods) + " |")
    sdpa = files.get("sdpa_reference.json")
    if sdpa:
        print("\ncuDNN in the same call: " + "; ".join(
            f"S {r['seq']} {'causal' if r['causal'] else 'non-causal'} {r['fwd_tflops']:.1f} / {r['bwd_tflops']:.1f}"
            for r in sdpa["rows"] if r["backend"] == "cudnn"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"lists": lists, "plans": plans, "plans_tflop_per_kj": energy, "deterministic_plans": det_tables["detplan"],
                       "one_pass_deterministic_plans": det_tables["det1plan"],
                       "ordered_deterministic_plans": det_tables["ordplan"],
                       "deterministic_lists": det_lists}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
