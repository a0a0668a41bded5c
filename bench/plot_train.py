#!/usr/bin/env python3
"""Reads examples/train.py results: tables, the training targets checked, and the two charts.

    bench/plot_train.py report RUNS [RUNS...] [--out DIR]
        RUNS: directories or .tar/.tar.gz files of NAME.json results (bench/run_train_device.sh
        brings back train_<phases>.tar.gz). Writes DIR/summary.md (every run, the targets, the
        failed runs), DIR/loss.svg (loss against step, every mode on one chart per model, mask
        and step size) and DIR/tokens.svg (tokens/s per mode and mask, as bars).
    bench/plot_train.py grads A.pt B.pt [--tol 0.02] [--json OUT]
        First-step gradients saved by train.py --dump-grads, compared tensor by tensor
        (relative error ||a - b|| / ||b||); exit status 1 if any exceeds --tol.

Targets (docs/training.md): one GPU, dcp >= 1.15x FlexAttention's tokens/s on causal and >= 1.3x
on lambda and shared question; planner wait < 1 % of a step; two GPUs >= 1.9x one GPU (dcp);
dcp never slower than the best static layout, >= 1.15x it on lambda and shared question; loss
within 0.02 of the reference at every step of the long runs.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tarfile
from collections import defaultdict
from typing import Dict, List, Tuple

STATIC = ("zigzag", "ring", "ulysses", "a2a_p2p", "packing")
SINGLE_TARGET = {"causal": 1.15, "lambda": 1.3, "shared_question": 1.3}
DET_TARGET = 0.9  # the deterministic backward against the default, kernel speed
BEST_STATIC_TARGET = {"causal": 1.0, "lambda": 1.15, "shared_question": 1.15}
LOSS_TOLERANCE = 0.02
LONG_RUN_STEPS = 100  # runs this long are the loss comparisons
MODE_ORDER = ("flex", "torch", "dcp") + STATIC + ("flex32", "dcp+det", "dcp+det1", "dcp+detord")
MODE_COLORS = {m: f"C{i}" for i, m in enumerate(MODE_ORDER)}


# ---- loading -------------------------------------------------------------------------------------
def load(sources: List[str]) -> List[Dict]:
    """Every NAME.json result (not step logs) in the directories and tar files given; a later
    source's result replaces an earlier one of the same name."""
    found: Dict[str, Dict] = {}

    def take(name: str, text: str):
        if not name.endswith(".json") or os.path.basename(name).startswith("grads_"):
            return
        try:
            r = json.loads(text)
        except json.JSONDecodeError:
            return
        if isinstance(r, dict) and r.get("schema") == "dcp-train/1":
            found[r["name"]] = r

    for src in sources:
        if os.path.isdir(src):
            for root, _, files in os.walk(src):
                for f in sorted(files):
                    with open(os.path.join(root, f)) as fh:
                        take(f, fh.read()) if f.endswith(".json") else None
        else:
            with tarfile.open(src) as tar:
                for m in tar.getmembers():
                    if m.isfile() and m.name.endswith(".json"):
                        take(m.name, tar.extractfile(m).read().decode())
    return sorted(found.values(), key=lambda r: r["name"])


def grads_reports(sources: List[str]) -> List[Dict]:
    out = []
    for src in sources:
        if os.path.isdir(src):
            for root, _, files in os.walk(src):
                for f in sorted(files):
                    if f.startswith("grads_") and f.endswith(".json"):
                        with open(os.path.join(root, f)) as fh:
                            out.append(json.load(fh))
        else:
            with tarfile.open(src) as tar:
                for m in tar.getmembers():
                    if m.isfile() and os.path.basename(m.name).startswith("grads_") and m.name.endswith(".json"):
                        out.append(json.load(io.TextIOWrapper(tar.extractfile(m))))
    return out


def key(r: Dict):
    c = r["config"]
    return c["preset"], c["mask"], c["tokens"], c.get("checkpoint", False)


def ranks(r: Dict) -> int:
    return r["config"]["world_size"]


def variant(r: Dict) -> str:
    """The mode, and '+det' for dcp's deterministic backward (the same kernels otherwise), '+det1' for
    its one-pass method, '+detord' for its ordered method."""
    det = r["config"].get("deterministic")
    return r["config"]["mode"] + {"one-pass": "+det1", "ordered": "+detord"}.get(det, "+det" if det else "")


def label(r: Dict) -> str:
    return f"{variant(r)} {ranks(r)}x{'gpu' if 'gpu' in r['name'] else 'cpu'}"


# ---- tables and targets ----------------------------------------------------------------------------
def fmt(x, spec="{:.1f}"):
    return "-" if x is None else spec.format(x)


def energy(r: Dict) -> str:
    """The GPUs' energy per step and the slowest GPU's median SM clock (train_power.py), if measured."""
    g = r.get("gpu")
    if not g:
        return "-"
    return f"{g['energy_j_per_step']:.0f}" + (f" ({g['sm_clock_mhz_median']:.0f})" if g.get("sm_clock_mhz_median") else "")


def runs_table(results: List[Dict]) -> List[str]:
    lines = ["| run | ranks | mode | mask | tokens | ckpt | step ms (median) | tokens/s | attention share | peak GB "
             "| planner wait ms (share) | fwd+bwd imbalance | energy per step J (SM clock MHz) | loss first -> last |",
             "|" + " --- |" * 14]
    for r in results:
        if r.get("status") != "ok":
            continue
        c = r["config"]
        att = (r.get("attention") or {}).get("share_of_step")
        pl = r.get("planner")
        wait = f"{pl['waited_ms_median']:.3f} ({pl['waited_share_of_step']:.3%})" if pl else "-"
        lines.append(f"| {r['name']} | {ranks(r)} | {c['mode']} | {c['mask']} | {c['tokens']} | "
                     f"{'yes' if c.get('checkpoint') else 'no'} | {r['step_ms_median']:.1f} | "
                     f"{r['tokens_per_s'] / 1e3:.1f}K | "
                     f"{fmt(att, '{:.0%}')} | {fmt(r['memory'].get('max_peak_allocated_gb') or None)} | {wait} | "
                     f"{r['imbalance']['fwd_bwd_max_over_mean_median']:.3f} | {energy(r)} | "
                     f"{r['loss_first']:.3f} -> {r['loss_last']:.3f} |")
    return lines


def check(ok: bool) -> str:
    return "met" if ok else "**missed**"


def targets(results: List[Dict]) -> List[str]:
    ok = [r for r in results if r.get("status") == "ok"]
    by = defaultdict(dict)  # (preset, mask, tokens, ckpt) -> {(mode, ranks): result}
    for r in ok:
        by[key(r)][(variant(r), ranks(r))] = r
    lines = ["### One GPU: dcp against FlexAttention (tokens/s)", "",
             "| model | mask | tokens | ckpt | flex | dcp | dcp / flex | target | energy per step J, flex / dcp "
             "(SM clock MHz) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (preset, mask, tokens, ckpt), runs in sorted(by.items()):
        f, d = runs.get(("flex", 1)), runs.get(("dcp", 1))
        if f and d:
            ratio = d["tokens_per_s"] / f["tokens_per_s"]
            want = SINGLE_TARGET.get(mask, 1.0)
            lines.append(f"| {preset} | {mask} | {tokens} | {'yes' if ckpt else 'no'} | "
                         f"{f['tokens_per_s'] / 1e3:.1f}K | "
                         f"{d['tokens_per_s'] / 1e3:.1f}K | {ratio:.2f}x | >= {want}x: {check(ratio >= want)} | "
                         f"{energy(f)} / {energy(d)} |")
    lines += ["", "### Two GPUs: dcp against one GPU and against the best static layout (tokens/s)", "",
              "| model | mask | tokens | ckpt | dcp 1 GPU | dcp 2 GPUs | scaling (>= 1.9x) | best static "
              "| dcp / best static | target | native CP (torch) |", "|" + " --- |" * 11]
    for (preset, mask, tokens, ckpt), runs in sorted(by.items()):
        d2 = runs.get(("dcp", 2))
        if not d2:
            continue
        d1 = runs.get(("dcp", 1))
        scaling = d2["tokens_per_s"] / d1["tokens_per_s"] if d1 else None
        static = [(runs[(m, 2)]["tokens_per_s"], m) for m in STATIC if (m, 2) in runs]
        best = max(static) if static else None
        ratio = d2["tokens_per_s"] / best[0] if best else None
        want = BEST_STATIC_TARGET.get(mask, 1.0)
        torch_cp = runs.get(("torch", 2))
        lines.append(
            f"| {preset} | {mask} | {tokens} | {'yes' if ckpt else 'no'} | "
            f"{fmt(d1 and d1['tokens_per_s'] / 1e3, '{:.1f}K')} | {d2['tokens_per_s'] / 1e3:.1f}K | "
            f"{fmt(scaling, '{:.2f}x')}{'' if scaling is None else ': ' + check(scaling >= 1.9)} | "
            f"{best[1] + ' ' + format(best[0] / 1e3, '.1f') + 'K' if best else '-'} | {fmt(ratio, '{:.2f}x')} | "
            f"{'-' if ratio is None else '>= ' + str(want) + 'x: ' + check(ratio >= want)} | "
            f"{fmt(torch_cp and torch_cp['tokens_per_s'] / 1e3, '{:.1f}K')} |")
    det_rows = []
    for (preset, mask, tokens, ckpt), runs in sorted(by.items()):
        base = runs.get(("dcp", 1))
        for v in ("dcp+det1", "dcp+det", "dcp+detord"):
            d = runs.get((v, 1))
            if not (base and d):
                continue
            ba, da = base.get("attention") or {}, d.get("attention") or {}
            speed = ba["bwd_ms"] / da["bwd_ms"] if ba.get("bwd_ms") and da.get("bwd_ms") else None
            det_rows.append(f"| {preset} | {mask} | {tokens} | {'yes' if ckpt else 'no'} | {v} | "
                            f"{d['tokens_per_s'] / base['tokens_per_s']:.3f}x | "
                            f"{fmt(ba.get('bwd_ms'))} / {fmt(da.get('bwd_ms'))} | {fmt(speed, '{:.3f}x')} | "
                            f"{'-' if speed is None else check(speed >= DET_TARGET)} |")
    if det_rows:
        lines += ["", f"### Deterministic backward against the default (>= {DET_TARGET}x its speed)", "",
                  "Backward attention kernels of the profiled steps (ms), default / deterministic; speed = their ratio.",
                  "", "| model | mask | tokens | ckpt | method | tokens/s over the default | backward attention ms "
                  "| backward speed | target |", "|" + " --- |" * 9] + det_rows
    lines += ["", "### Planning hidden: planner wait < 1 % of a step", ""]
    waits = [(r["planner"]["waited_share_of_step"], r["name"]) for r in ok if r.get("planner")]
    if waits:
        worst = max(waits)
        lines.append(f"Worst median wait: {worst[0]:.3%} of the step ({worst[1]}), over {len(waits)} runs: "
                     f"{check(worst[0] < 0.01)}.")
    lines += ["", f"### Loss: within {LOSS_TOLERANCE} of the reference at every logged step "
              f"(runs of >= {LONG_RUN_STEPS} steps)", "",
              "Every pair of runs of one model, mask and step size. Besides dcp against FlexAttention (flex): "
              "dcp against itself with the deterministic backward (dcp+det: the same kernels, dQ summed in another "
              "order), which shows how far two trainings whose attention differs only by rounding drift apart. "
              "A logged step is every `--log-every`-th step and the last; its loss is read two ways: the loss of "
              "that one step, and the mean over the steps since the previous logged step (what Hugging Face's "
              "Trainer and Megatron-LM log). The target is checked on the mean.", "",
              "| model | mask | tokens | run | against | steps | median abs loss difference | "
              "max at the logged steps, one step (at step) | max at the logged steps, interval mean (at step) | "
              "max over every step (at step) | target (logged interval means) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    order = {m: i for i, m in enumerate(MODE_ORDER)}
    for (preset, mask, tokens, ckpt), runs in sorted(by.items()):
        long = sorted((r for r in runs.values() if len(r["steps"]) >= LONG_RUN_STEPS),
                      key=lambda r: (order.get(variant(r), 99), ranks(r)))
        for i, ref in enumerate(long):
            for r in long[i + 1:]:
                every = max(1, int(r["config"].get("log_every") or 1))
                diffs = [(abs(a["loss"] - b["loss"]), a["step"]) for a, b in zip(r["steps"], ref["steps"])]
                logged = [d for d in diffs if d[1] % every == 0 or d[1] == diffs[-1][1]]
                means = [(abs(a - b), s) for (a, s), (b, _) in zip(logged_means(r["steps"], every),
                                                                   logged_means(ref["steps"], every))]
                worst, worst_logged, worst_mean = max(diffs), max(logged), max(means)
                lines.append(f"| {preset} | {mask} | {tokens} | {label(r)} | {label(ref)} | {len(diffs)} | "
                             f"{statistics.median(d[0] for d in diffs):.4f} | "
                             f"{worst_logged[0]:.4f} ({worst_logged[1]}) | {worst_mean[0]:.4f} ({worst_mean[1]}) | "
                             f"{worst[0]:.4f} ({worst[1]}) | {check(worst_mean[0] <= LOSS_TOLERANCE)} |")
    return lines


def logged_means(steps: List[Dict], every: int) -> List[Tuple[float, int]]:
    """(mean loss over the steps since the previous logged step, logged step) for every logged step
    (step % every == 0, and the last): the loss a logger that averages its interval reports."""
    out, since = [], []
    for i, s in enumerate(steps):
        since.append(s["loss"])
        if s["step"] % every == 0 or i == len(steps) - 1:
            out.append((sum(since) / len(since), s["step"]))
            since = []
    return out


def grads_lines(reports: List[Dict]) -> List[str]:
    if not reports:
        return []
    lines = ["", "### First-step gradients", "",
             "| a | b | loss a | loss b | worst tensor | relative error | tolerance | |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for g in reports:
        lines.append(f"| {g['a']} | {g['b']} | {g['loss_a']:.5f} | {g['loss_b']:.5f} | {g['worst_tensor']} | "
                     f"{g['worst_rel_error']:.2e} | {g['tolerance']} | "
                     f"{check(g['worst_rel_error'] <= g['tolerance'])} |")
    return lines


def failures(results: List[Dict]) -> List[str]:
    bad = [r for r in results if r.get("status") != "ok"]
    if not bad:
        return []
    lines = ["", "### Runs without a result", ""]
    for r in bad:
        lines.append(f"- {r['name']}: {r.get('status')}: {str(r.get('error', ''))[:400]}")
    return lines


# ---- charts -------------------------------------------------------------------------------------------
def reference_of(runs: List[Dict]):
    """The run others are compared with: FlexAttention on one GPU, else dcp on one GPU."""
    by_mode = {(variant(r), ranks(r)): r for r in runs}
    return by_mode.get(("flex", 1)) or by_mode.get(("dcp", 1))


def plot_loss(results: List[Dict], path: str) -> None:
    """One row per (model, mask, step size): the loss of every mode, and each mode's difference
    from the reference (the curves coincide at the scale of the loss)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = defaultdict(list)
    for r in results:
        if r.get("status") == "ok":
            groups[key(r)].append(r)
    groups = {k: v for k, v in groups.items() if len(v) > 1 or len(v[0]["steps"]) >= LONG_RUN_STEPS}
    if not groups:
        return
    fig, axes = plt.subplots(len(groups), 2, figsize=(12, 3.4 * len(groups)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 2]})
    for (ax, dax), ((preset, mask, tokens, ckpt), runs) in zip(axes, sorted(groups.items())):
        ref = reference_of(runs)
        for r in sorted(runs, key=label):
            steps = [s["step"] for s in r["steps"]]
            ax.plot(steps, [s["loss"] for s in r["steps"]], label=label(r), color=MODE_COLORS.get(variant(r)),
                    linestyle="-" if ranks(r) == 1 else "--", linewidth=1)
            if ref is not None and r is not ref:
                base = {s["step"]: s["loss"] for s in ref["steps"]}
                both = [s for s in r["steps"] if s["step"] in base]
                dax.plot([s["step"] for s in both], [s["loss"] - base[s["step"]] for s in both],
                         color=MODE_COLORS.get(variant(r)), linestyle="-" if ranks(r) == 1 else "--",
                         linewidth=1, label=label(r))
        title = f"{preset}, {mask} mask, {tokens} tokens/step{' (checkpointing)' if ckpt else ''}"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats/byte)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        dax.set_title(f"minus {label(ref)}" if ref else "(no one-GPU reference)", fontsize=9)
        dax.axhspan(-LOSS_TOLERANCE, LOSS_TOLERANCE, color="0.9")
        dax.set_xlabel("step")
        dax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_tokens(results: List[Dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if r.get("status") == "ok" and len(r["steps"]) < LONG_RUN_STEPS]
    panels = defaultdict(list)  # (preset, tokens, ckpt) -> runs
    for r in ok:
        c = r["config"]
        panels[(c["preset"], c["tokens"], c.get("checkpoint", False))].append(r)
    if not panels:
        return
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.8 * len(panels)), squeeze=False)
    order = {m: i for i, m in enumerate(MODE_ORDER)}
    for ax, ((preset, tokens, ckpt), runs) in zip(axes[:, 0], sorted(panels.items())):
        masks = [m for m in ("causal", "lambda", "shared_question") if any(r["config"]["mask"] == m for r in runs)]
        series = sorted({(ranks(r), r["config"]["mode"]) for r in runs}, key=lambda s: (s[0], order.get(s[1], 99)))
        width = 0.8 / max(1, len(series))
        for i, (n, mode) in enumerate(series):
            values = []
            for m in masks:
                hit = [r for r in runs if r["config"]["mask"] == m and r["config"]["mode"] == mode and ranks(r) == n]
                values.append(hit[0]["tokens_per_s"] / 1e3 if hit else 0)
            xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(masks))]
            bars = ax.bar(xs, values, width, label=f"{mode}, {n} GPU{'s' if n > 1 else ''}",
                          color=MODE_COLORS.get(mode),
                          hatch="" if n == 1 else "//" if n == 2 else "xx", edgecolor="white", linewidth=0.5)
            for b, v in zip(bars, values):
                if v:
                    ax.annotate(f"{v:.0f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(masks)))
        ax.set_xticklabels(masks)
        ax.set_ylabel("thousand tokens/s")
        ax.set_title(f"{preset}, {tokens} tokens/step{' (checkpointing)' if ckpt else ''}")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report(args) -> int:
    results = load(args.sources)
    if not results:
        print(f"no results in {args.sources}", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    env = next((r["environment"] for r in results if r.get("environment")), {})
    lines = ["# Training results", "",
             f"{len(results)} runs; {env.get('gpu', 'cpu')}, torch {env.get('torch')}, dcp {env.get('dcp')}, commit "
             f"{env.get('commit')}, {env.get('date')}. Step time: median over the measured steps (each run's "
             "`measured_steps`); tokens/s = tokens per step / that median. Attention share: attention kernels "
             "(forward, recomputation, backward; NCCL apart) of the profiled steps over the median step.", ""]
    lines += runs_table(results) + [""] + targets(results)
    lines += grads_lines(grads_reports(args.sources)) + failures(results)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        plot_loss(results, os.path.join(args.out, "loss.svg"))
        plot_tokens(results, os.path.join(args.out, "tokens.svg"))
    except ImportError as e:
        print(f"charts skipped: {e}", file=sys.stderr)
    print("\n".join(lines))
    return 0


def grads(args) -> int:
    import torch

    a, b = torch.load(args.a, map_location="cpu"), torch.load(args.b, map_location="cpu")
    if a["grads"].keys() != b["grads"].keys():
        raise SystemExit(f"{args.a} and {args.b} hold different parameters")
    errors = {n: float((a["grads"][n] - g).norm() / g.norm().clamp_min(1e-30)) for n, g in b["grads"].items()}
    worst = max(errors, key=errors.get)
    out = {"a": a.get("name", args.a), "b": b.get("name", args.b), "loss_a": a["loss"], "loss_b": b["loss"],
           "worst_tensor": worst, "worst_rel_error": errors[worst], "tolerance": args.tol,
           "median_rel_error": sorted(errors.values())[len(errors) // 2], "per_tensor": errors}
    print(f"{out['a']} vs {out['b']}: loss {out['loss_a']:.5f} / {out['loss_b']:.5f}; worst gradient {worst} "
          f"relative error {errors[worst]:.3e} (tolerance {args.tol}), median {out['median_rel_error']:.3e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if errors[worst] <= args.tol else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("report", help="tables, targets and charts from results")
    r.add_argument("sources", nargs="+", help="directories or tar files of train.py results")
    r.add_argument("--out", default="train_report")
    g = sub.add_parser("grads", help="compare two --dump-grads files")
    g.add_argument("a")
    g.add_argument("b")
    g.add_argument("--tol", type=float, default=0.02, help="largest relative error per tensor (default: bf16's 2e-2)")
    g.add_argument("--json", default=None)
    args = p.parse_args(argv)
    return report(args) if args.command == "report" else grads(args)


if __name__ == "__main__":
    sys.exit(main())
