#!/usr/bin/env python3
"""The built-in DCP placement against KaHyPar and Mt-KaHyPar on the same instances.

Outside partitioners are comparison points only (`pip install mtkahypar kahypar`); the library
never depends on them. The flow:

  1. `compare_partitioners export DIR` writes every instance (hMETIS .hgr, exact vertex weights,
     the built-in's token-block homes as a fixed-vertex file, metadata) and the built-in's
     partition and planning time (bench/compare_partitioners.cpp).
  2. This script partitions every instance hierarchically with the outside partitioners, as the
     built-in does: the nodes first (every cut byte crosses nodes: net weight = bytes), then the
     devices of each node (a net whose token block lives on another node costs
     inter_weight x bytes for every device it touches, otherwise bytes per extra device; the
     connectivity-minus-one objective sees that exactly, up to a constant per net). It writes
     DIR/NAME.METHOD.part and DIR/NAME.METHOD.time.
  3. `compare_partitioners report DIR` scores every partition with the library's own measure
     (objective = intra-node bytes + inter_weight x inter-node bytes; compute, owned memory and
     full memory bounds) and prints one table.

Constraints given to the outside partitioners. Compute: every device <= (1 + eps_compute) x the
global mean (a node <= (1 + eps_compute / 2) x its share, the built-in's node-level target).
Memory: hMETIS carries one vertex weight, so memory is expressed in one of three ways, each a
method of its own:
  *_fixed   token-block homes fixed to the built-in's devices (its owned memory, which holds);
  *_contig  token-block homes fixed to a contiguous layout (blocks in order, cut by owned bytes
            into equal shares: what a ring layout owns), independent of the built-in;
  *_mem     no fixed vertex; the vertex weight is compute share + memory share (both normalised
            to the total), balanced within the same tolerance: memory-aware but not bounded.
A partition violating any bound afterwards (full memory included: received copies and fp32
partials) is reported but not counted as "feasible".

Timing: the sum over the hierarchical calls of the partitioning call (construction excluded), on
--threads threads (Mt-KaHyPar) or one (KaHyPar), wall and process CPU time (all threads), the
fastest of --repeat runs for Mt-KaHyPar default with the built-in's homes (the reference of the
time target). The built-in's planning time (block table + placement) is its fastest of the
export's --repeat runs, twice: on one thread (wall and process CPU time) and on the export's
--threads threads (PlacementOptions::threads, default 2: wall time), the two alternating; the
export checks that both give the same placement. The time target compares the built-in on 2
threads with Mt-KaHyPar on 2 threads, wall against wall; the one-thread CPU time against
Mt-KaHyPar's CPU time per thread is reported beside it. On a shared machine wall times grow with
other jobs' load; CPU time does not, and Mt-KaHyPar's CPU time / threads is a lower bound of its
wall time on idle cores.

Usage: bench/compare_partitioners.py --bin build/bench/compare_partitioners --dir /tmp/cmp
         [--export-args "--seeds 1,2 --repeat 5 --threads 2"] [--skip-export] [--threads 2] [--methods LIST]
         [--kahypar-max-pins N] [--md bench/results/placement_vs_kahypar.md] [--json PATH]
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

SCALE = 10**8  # integer vertex weights: a level's total weight is about SCALE (int32 in both tools)

# KaHyPar's published direct k-way km1 preset (config/km1_kKaHyPar_sea20.ini in the kahypar
# repository), written out at run time: the pip package ships no preset files.
KAHYPAR_SEA20_KM1 = {
    "mode": "direct", "objective": "km1", "seed": "-1", "cmaxnet": "1000", "vcycles": "0",
    "p-use-sparsifier": "true", "p-sparsifier-min-median-he-size": "28",
    "p-sparsifier-max-hyperedge-size": "1200", "p-sparsifier-max-cluster-size": "10",
    "p-sparsifier-min-cluster-size": "2", "p-sparsifier-num-hash-func": "5",
    "p-sparsifier-combined-num-hash-func": "100", "p-detect-communities": "true",
    "p-detect-communities-in-ip": "true", "p-reuse-communities": "false",
    "p-max-louvain-pass-iterations": "100", "p-min-eps-improvement": "0.0001",
    "p-louvain-edge-weight": "hybrid", "p-large-he-threshold": "1000",
    "p-smallest-maxnet-threshold": "50000", "p-maxnet-removal-factor": "0.01",
    "c-type": "ml_style", "c-s": "1", "c-t": "160", "c-rating-score": "heavy_edge",
    "c-rating-use-communities": "true", "c-rating-heavy_node_penalty": "no_penalty",
    "c-rating-acceptance-criterion": "best_prefer_unmatched",
    "c-fixed-vertex-acceptance-criterion": "fixed_vertex_allowed", "i-mode": "recursive",
    "i-technique": "multi", "i-c-type": "ml_style", "i-c-s": "1", "i-c-t": "150",
    "i-c-rating-score": "heavy_edge", "i-c-rating-use-communities": "true",
    "i-c-rating-heavy_node_penalty": "no_penalty",
    "i-c-rating-acceptance-criterion": "best_prefer_unmatched",
    "i-c-fixed-vertex-acceptance-criterion": "fixed_vertex_allowed", "i-algo": "pool",
    "i-runs": "20", "i-bp-algorithm": "worst_fit", "i-bp-heuristic-prepacking": "false",
    "i-bp-early-restart": "true", "i-bp-late-restart": "true", "i-r-type": "twoway_fm",
    "i-r-runs": "-1", "i-r-fm-stop": "simple", "i-r-fm-stop-i": "50",
    "r-type": "kway_fm_hyperflow_cutter_km1", "r-runs": "-1", "r-fm-stop": "adaptive_opt",
    "r-fm-stop-alpha": "1", "r-fm-stop-i": "350", "r-flow-execution-policy": "exponential",
    "r-hfc-size-constraint": "mf-style", "r-hfc-scaling": "16",
    "r-hfc-distance-based-piercing": "true", "r-hfc-mbc": "true",
}


class Instance:
    def __init__(self, directory, name):
        self.name = name
        base = os.path.join(directory, name)
        with open(base + ".json") as f:
            self.meta = json.load(f)
        self.nodes = self.meta["nodes"]
        self.dpn = self.meta["devices_per_node"]
        self.eps_c = self.meta["eps_compute"]
        self.inter_weight = self.meta["inter_weight"]
        with open(base + ".hgr") as f:
            header = f.readline().split()
            num_nets, num_vertices = int(header[0]), int(header[1])
            self.net_weight, self.nets = [], []
            for _ in range(num_nets):
                vals = f.readline().split()
                self.net_weight.append(int(vals[0]))
                self.nets.append([int(x) - 1 for x in vals[1:]])  # first pin = the token block
        self.n = num_vertices
        self.compute, self.memory = [], []
        with open(base + ".weights") as f:
            for line in f:
                c, m = line.split()
                self.compute.append(float(c))
                self.memory.append(float(m))
        with open(base + ".fix") as f:
            self.fixed_ours = [int(x) for x in f]
        self.blocks = [v for v in range(self.n) if self.fixed_ours[v] >= 0]
        self.fixed_contig = self.contiguous_homes()

    def contiguous_homes(self):
        """Token blocks in order, cut by owned bytes into equal shares per device."""
        d = self.nodes * self.dpn
        total = sum(self.memory[v] for v in self.blocks)
        out, acc = [-1] * self.n, 0.0
        for v in self.blocks:
            mid = acc + 0.5 * self.memory[v]
            out[v] = min(d - 1, int(mid * d / total))
            acc += self.memory[v]
        return out


def int_weights(values, total):
    return [int(round(x / total * SCALE)) if total > 0 else 0 for x in values]


def run_level(tool, preset, verts, inst, nets, weights, k, max_weights, fixed, seed, threads):
    """One k-way partition of the sub-hypergraph on `verts`; returns (part per vert, seconds)."""
    index = {v: i for i, v in enumerate(verts)}
    edges, ew = [], []
    for pins, w in nets:
        local = sorted({index[p] for p in pins if p in index})
        if len(local) >= 2:
            edges.append(local)
            ew.append(max(1, int(w)))
    # Weight >= 1 everywhere: Mt-KaHyPar 1.7 was seen to ignore fixed vertices of weight 0.
    vw = [max(1, weights[v]) for v in verts]
    fx = [fixed[v] if fixed is not None else -1 for v in verts]
    # Timed: the partitioning call alone (hypergraph construction, which goes through Python lists
    # here, is left out in both tools' favour).
    if tool == "mtkahypar":
        import mtkahypar
        ctx = tool_state["mtk"].context_from_preset(getattr(mtkahypar.PresetType, preset))
        ctx.set_partitioning_parameters(k, 0.03, mtkahypar.Objective.KM1)
        ctx.logging = False
        ctx.set_individual_target_block_weights([max(1, int(x)) for x in max_weights])
        mtkahypar.set_seed(seed)
        hg = tool_state["mtk"].create_hypergraph(ctx, len(verts), len(edges), edges, vw, ew)
        if fixed is not None and any(x >= 0 for x in fx):
            hg.add_fixed_vertices(fx, k)
        t0, c0 = time.perf_counter(), time.process_time()
        phg = hg.partition(ctx)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        part = phg.get_partition()
    else:
        import kahypar
        index_vector, edge_vector = [0], []
        for e in edges:
            edge_vector.extend(e)
            index_vector.append(len(edge_vector))
        hg = kahypar.Hypergraph(len(verts), len(edges), index_vector, edge_vector, k, ew, vw)
        for i, b in enumerate(fx):
            if b >= 0:
                hg.fixNodeToBlock(i, b)
        ctx = kahypar.Context()
        ctx.loadINIconfiguration(tool_state["kahypar_ini"])
        ctx.setK(k)
        ctx.setEpsilon(0.03)
        ctx.setCustomTargetBlockWeights([max(1, int(x)) for x in max_weights])
        ctx.setSeed(seed)
        ctx.suppressOutput(True)
        t0, c0 = time.perf_counter(), time.process_time()
        kahypar.partition(hg, ctx)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        part = [hg.blockID(i) for i in range(len(verts))]
    moved = sum(1 for i, b in enumerate(fx) if b >= 0 and part[i] != b)
    if moved:
        raise RuntimeError(f"{tool} {preset}: {moved} fixed vertices not in their block")
    return part, seconds, cpu


tool_state = {}


def hierarchical(inst, tool, preset, memory_mode, seed, threads):
    """Nodes, then the devices of each node. Returns (device per vertex, wall s, CPU s)."""
    num_dev = inst.nodes * inst.dpn
    total_c = sum(inst.compute)
    total_m = sum(inst.memory)
    if memory_mode == "mem":
        w = [0.5 * (c / total_c + m / total_m) * SCALE for c, m in zip(inst.compute, inst.memory)]
        weights = [int(round(x)) for x in w]
    else:
        weights = int_weights(inst.compute, total_c)
    total_w = sum(weights)
    fixed_dev = {"fixed": inst.fixed_ours, "contig": inst.fixed_contig, "mem": None}[memory_mode]
    seconds = cpu = 0.0
    verts = list(range(inst.n))
    node_part = [0] * inst.n
    if inst.nodes > 1:
        fixed = None if fixed_dev is None else [b // inst.dpn if b >= 0 else -1 for b in fixed_dev]
        cap = (1 + inst.eps_c / 2) * total_w / inst.nodes
        nets = list(zip(inst.nets, inst.net_weight))
        part, s, c = run_level(tool, preset, verts, inst, nets, weights, inst.nodes,
                               [cap] * inst.nodes, fixed, seed, threads)
        seconds += s
        cpu += c
        node_part = part
    device = [0] * inst.n
    cap = (1 + inst.eps_c) * total_w / num_dev
    for node in range(inst.nodes):
        sub = [v for v in verts if node_part[v] == node]
        if not sub:
            continue
        inside = set(sub)
        nets = []
        for pins, wgt in zip(inst.nets, inst.net_weight):
            # Home on another node: every device touching the net pays inter_weight x bytes.
            nets.append((pins, wgt * (1 if pins[0] in inside else inst.inter_weight)))
        fixed = None
        if fixed_dev is not None:
            fixed = [-1] * inst.n
            for v in sub:
                b = fixed_dev[v]
                if b >= 0 and b // inst.dpn == node:
                    fixed[v] = b % inst.dpn
        if inst.dpn > 1:
            part, s, c = run_level(tool, preset, sub, inst, nets, weights, inst.dpn,
                                   [cap] * inst.dpn, fixed, seed, threads)
            seconds += s
            cpu += c
        else:
            part = [0] * len(sub)
        for v, p in zip(sub, part):
            device[v] = node * inst.dpn + p
    return device, seconds, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bench/compare_partitioners")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--export-args", default="")
    ap.add_argument("--skip-export", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of Mt-KaHyPar default with the built-in's homes (the timing reference); "
                         "the fastest is kept")
    ap.add_argument("--methods", default="mtkahypar_default_fixed,mtkahypar_quality_fixed,"
                    "mtkahypar_default_contig,mtkahypar_quality_contig,mtkahypar_default_mem,"
                    "mtkahypar_quality_mem,kahypar_sea20_fixed")
    ap.add_argument("--kahypar-max-pins", type=int, default=400000,
                    help="run KaHyPar (sequential, slow) only on instances up to this many pins")
    ap.add_argument("--md", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if not args.skip_export:
        subprocess.run([args.bin, "export", args.dir] + args.export_args.split(), check=True)
    methods = [m for m in args.methods.split(",") if m]
    if any(m.startswith("mtkahypar") for m in methods):
        import mtkahypar
        tool_state["mtk"] = mtkahypar.initialize(args.threads, False)
    if any(m.startswith("kahypar") for m in methods):
        ini = tempfile.NamedTemporaryFile("w", suffix=".ini", delete=False)
        ini.write("".join(f"{k}={v}\n" for k, v in KAHYPAR_SEA20_KM1.items()))
        ini.close()
        tool_state["kahypar_ini"] = ini.name
    import importlib.metadata as md
    versions = {}
    for pkg in ("mtkahypar", "kahypar"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    with open(os.path.join(args.dir, "outside.json"), "w") as f:
        json.dump({"threads": args.threads, "versions": versions, "methods": methods}, f)
    names = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(args.dir, "*.json"))
                   if os.path.basename(p) != "outside.json")
    for name in names:
        inst = Instance(args.dir, name)
        for method in methods:
            tool, preset, mode = method.split("_")
            if tool == "kahypar" and inst.meta["num_pins"] > args.kahypar_max_pins:
                continue
            runs = args.repeat if method == "mtkahypar_default_fixed" else 1
            secs = cpu = float("inf")
            for _ in range(runs):
                device, s, c = hierarchical(inst, tool, preset.upper(), mode, args.seed, args.threads)
                secs, cpu = min(secs, s), min(cpu, c)
            base = os.path.join(args.dir, f"{name}.{method}")
            with open(base + ".part", "w") as f:
                f.write("".join(f"{d}\n" for d in device))
            with open(base + ".time", "w") as f:
                f.write(f"{secs} {cpu}\n")
            print(f"{name:<40} {method:<26} {secs:8.3f} s wall {cpu:8.3f} s CPU", flush=True)
    report = [args.bin, "report", args.dir]
    if args.md:
        report += ["--md", args.md]
    if args.json:
        report += ["--json", args.json]
    subprocess.run(report, check=True)


if __name__ == "__main__":
    sys.exit(main())
