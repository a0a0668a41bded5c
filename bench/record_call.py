#!/usr/bin/env python3
"""Record one device call's results in the repository's results files.

Usage:
  bench/record_call.py plans RUNS.json CALL PLANS.tar --about TEXT
      the tar's one-GPU whole plans (bench_1gpu_*.json, run_package_device.sh's plans phase) as
      call CALL of a runs file (bench/results/one_gpu_runs.json), TEXT appended to its "about"
      (say which GPU and tree ran them); the runs bench/calibration_points.py turns into fit points.
  bench/record_call.py kernels KERNELS.json KEY KERNELS.tar --about TEXT
      the tar's kernel table (bench_cuda_attention.json) and cuDNN's reference on the same shapes
      (sdpa_reference.json, where the call ran it) as entry KEY of a card's kernel file
      (bench/results/kernels_<card>_<date>.json), TEXT its "about" (the call, the GPU, the tree,
      the command).
A name already in the file is an error unless --replace is given. The files keep their layout
(JSON indented by one space, a newline at the end), so that a recorded call adds lines only.
"""
import argparse
import json
import sys
import tarfile

from ab_table import read_files


def members(path):
    """{file name: parsed JSON} of the tar's JSON files."""
    try:
        return read_files(path)
    except (OSError, tarfile.TarError) as e:
        sys.exit(f"record_call: {path}: {e}")
    except json.JSONDecodeError as e:
        sys.exit(f"record_call: {path}: a member is not JSON: {e}")


def load(path, top_key=None):
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"record_call: {path}: {e}")
    if top_key is not None and not isinstance(d.get(top_key), dict):
        sys.exit(f"record_call: {path}: no '{top_key}' object (not a runs file)")
    return d


def save(path, d):
    with open(path, "w") as f:
        f.write(json.dumps(d, indent=1) + "\n")


def add(table, name, value, path, replace):
    if name in table and not replace:
        sys.exit(f"record_call: {path} already holds '{name}' (--replace to overwrite it)")
    table[name] = value


def plans(args):
    found = {n[:-len(".json")]: d for n, d in members(args.tar).items() if n.startswith("bench_1gpu_")}
    if not found:
        sys.exit(f"record_call: {args.tar}: no bench_1gpu_*.json (a plans phase's plans.tar?)")
    d = load(args.file, "calls")
    add(d["calls"], args.name, {"runs": dict(sorted(found.items()))}, args.file, args.replace)
    d["about"] = (d.get("about", "") + " " + args.about).strip()
    save(args.file, d)
    print(f"{args.file}: call {args.name}, {len(found)} runs")


def kernels(args):
    found = members(args.tar)
    if "bench_cuda_attention.json" not in found:
        sys.exit(f"record_call: {args.tar}: no bench_cuda_attention.json (a kernels phase's kernels.tar?)")
    entry = {"about": args.about, "bench": found["bench_cuda_attention.json"]}
    if "sdpa_reference.json" in found:
        entry["sdpa_reference"] = found["sdpa_reference.json"]
    d = load(args.file)
    add(d, args.name, entry, args.file, args.replace)
    save(args.file, d)
    print(f"{args.file}: {args.name}, {len(entry['bench'].get('rows', []))} kernel rows"
          + (", cuDNN reference" if "sdpa_reference" in entry else ""))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    for what, fn, file_help, name_help in (
            ("plans", plans, "runs file (bench/results/one_gpu_runs.json)", "the call's name, e.g. 2026-12-07s61a"),
            ("kernels", kernels, "a card's kernel file (bench/results/kernels_*.json)", "the entry's key, e.g. s61_call_a")):
        p = sub.add_parser(what)
        p.add_argument("file", help=file_help)
        p.add_argument("name", help=name_help)
        p.add_argument("tar", help=f"{what}.tar of the call")
        p.add_argument("--about", required=True, help="what the call was: GPU, tree, command")
        p.add_argument("--replace", action="store_true", help="overwrite an entry of that name")
        p.set_defaults(fn=fn)
    args = ap.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()
