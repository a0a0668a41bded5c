#!/usr/bin/env python3
"""Fails when a part of the library includes a header of a part it does not depend on.

Reads the part records CMake writes (dcp_parts.jsonl: each part's sources, public headers under
include/dcp/ and part dependencies, as declared by dcp_add_part) and checks every #include "..."
of every source and public header: a header owned by another part must belong to a part in the
includer's transitive dependencies, so the layering of docs/architecture.md holds in the code and
not only in the link lines. Every header under include/dcp/ must be owned by exactly one part.

Headers under include/dcp/detail/ are a part's internals that other parts (and tools and tests)
may still use; they are checked the same way.

usage: check_layers.py <source dir> <dcp_parts.jsonl>
"""
import json
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main(src_dir, records_path):
    parts = {}
    with open(records_path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                r = {k: [x for x in v if x] if isinstance(v, list) else v for k, v in r.items()}
                parts[r["part"]] = r
    owner = {}
    errors = []
    for name, r in parts.items():
        for h in r["headers"]:
            if h in owner:
                errors.append(f"include/dcp/{h}: owned by both {owner[h]} and {name}")
            owner[h] = name
    public_dir = os.path.join(src_dir, "include", "dcp")
    for root, _, files in os.walk(public_dir):
        for f in sorted(files):
            h = os.path.relpath(os.path.join(root, f), public_dir)
            if h.endswith(".h") and h not in owner:
                errors.append(f"include/dcp/{h}: no part owns it (list it in a dcp_add_part HEADERS)")

    closure = {}

    def deps_of(name, trail=()):
        if name in closure:
            return closure[name]
        if name in trail:
            errors.append("dependency cycle: " + " -> ".join(trail + (name,)))
            return set()
        out = {name}
        for d in parts[name]["deps"]:
            if d in parts:
                out |= deps_of(d, trail + (name,))
        closure[name] = out
        return out

    # Private headers: a folder under src/ belongs to the parts declared in it.
    dir_parts = {}
    for name, r in parts.items():
        dir_parts.setdefault(r["dir"], set()).add(name)

    def check(part, path):
        allowed = deps_of(part)
        with open(os.path.join(src_dir, path), errors="replace") as f:
            text = f.read()
        for inc in INCLUDE.findall(text):
            if inc.startswith("dcp/"):
                h = inc[len("dcp/"):]  # "plan.h", or "detail/comm_order.h"
                o = owner.get(h)
                if o is None:
                    errors.append(f"{path}: includes {inc}, which no part owns")
                elif o not in allowed:
                    errors.append(f"{path} (part {part}): includes {inc} of part {o}, not among its dependencies "
                                  f"({', '.join(sorted(allowed))})")
                continue
            folder = "src/" + inc.rsplit("/", 1)[0] if "/" in inc else None
            if folder is None:
                continue  # same folder
            holders = set()
            d = folder
            while d.startswith("src/") and not holders:
                holders = dir_parts.get(d, set())
                d = d.rsplit("/", 1)[0]
            if holders and not (holders & allowed):
                errors.append(f"{path} (part {part}): includes {inc} of part {'/'.join(sorted(holders))}, not among "
                              f"its dependencies")

    for name, r in parts.items():
        for s in r["sources"]:
            check(name, s)
            base = os.path.splitext(s)[0]
            for ext in (".h", ".cuh"):  # private headers beside the sources
                if os.path.exists(os.path.join(src_dir, base + ext)):
                    check(name, base + ext)
        for h in r["headers"]:
            check(name, os.path.join("include", "dcp", h))

    for e in errors:
        print("layering:", e)
    print(f"checked {len(parts)} parts, {len(owner)} public headers: {len(errors)} problem(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
