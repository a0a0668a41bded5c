#!/usr/bin/env python3
"""DCP against the static layouts on two H200s (h200-nvl, one node of 2), simulated.

For each profile (ldc, longalign), batch size (65536, 131072 tokens) and mask, `dcp simulate
--search` plans 2 batches twice: with DCP's own placements only (--dcp-only) and with the static
layouts among the planner's candidates (PlannerOptions::static_layouts, the default). The table
gives both against the best static layout, over the two batches and on the worse batch, and which
placement the planner chose per batch. Prints a Markdown table (bench/results/plan_sim.md).

Usage: bench/sim_pair.py [path/to/dcp] [--batches N] [--search-args "--search-tighten 2 ..."]
"""
import argparse
import json
import re
import subprocess


def simulate(dcp, prof, tokens, mask, batches, extra):
    cmd = [dcp, "simulate", "--profile", prof, "--tokens", str(tokens), "--mask", mask, "--cluster", "h200-nvl",
           "--nodes", "1", "--devices-per-node", "2", "--batches", str(batches), "--search", "--json"] + extra
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def total(method, b):
    return method["per_batch"][b]["fwd_ms"] + method["per_batch"][b]["bwd_ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dcp", nargs="?", default="build/dcp")
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--search-args", default="", help="more `dcp simulate` flags for every search")
    args = ap.parse_args()
    more = args.search_args.split()
    print("| profile | tokens | mask | DCP's own ms | with static candidates ms | best static layout ms | "
          "speed-up, own (worse batch) | speed-up, with static (worse batch) | chosen per batch |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for prof in ("ldc", "longalign"):
        for tokens in (65536, 131072):
            for mask in ("causal", "lambda", "causal_blockwise", "shared_question"):
                own = simulate(args.dcp, prof, tokens, mask, args.batches, ["--dcp-only"] + more)
                mixed = simulate(args.dcp, prof, tokens, mask, args.batches, ["--method", "dcp"] + more)
                dcp_own = next(m for m in own["methods"] if m["method"] == "dcp")
                dcp_mixed = mixed["methods"][0]
                statics = [m for m in own["methods"] if m["method"] != "dcp"]
                best = min(statics, key=lambda m: m["total_ms"])
                n = len(dcp_own["per_batch"])
                best_per_batch = [min(total(s, b) for s in statics) for b in range(n)]
                worst_own = min(best_per_batch[b] / total(dcp_own, b) for b in range(n))
                worst_mixed = min(best_per_batch[b] / total(dcp_mixed, b) for b in range(n))
                chosen = []
                for c in dcp_mixed["planner_choices"]:
                    c = re.sub(r"batch \d+: planner chose ", "", c)
                    chosen.append(c.split(" stages")[0].replace("static layout ", "") if c.startswith("static") else "dcp")
                print(f"| {prof} | {tokens} | {mask} | {dcp_own['total_ms']:.2f} | {dcp_mixed['total_ms']:.2f} | "
                      f"{best['method']} {best['total_ms']:.2f} | {best['total_ms'] / dcp_own['total_ms']:.3f}x "
                      f"({worst_own:.3f}x) | {best['total_ms'] / dcp_mixed['total_ms']:.3f}x ({worst_mixed:.3f}x) | "
                      f"{', '.join(chosen)} |")


if __name__ == "__main__":
    main()
