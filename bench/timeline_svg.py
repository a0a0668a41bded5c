#!/usr/bin/env python3
"""Draw measured per-instruction timelines (`dcp bench --trace`) of several runs as one SVG.

Usage: bench/timeline_svg.py OUT.svg LABEL=PREFIX [LABEL=PREFIX ...]
PREFIX.rank<r>.json are the measured traces of one method (one file per rank). Each run gets one
row per rank and pass: Attend (blue), Merge (green), CommWait (red: the compute stream idle,
waiting for a transfer), others grey, all on one time axis, so runs compare at a glance.
"""
import glob
import json
import sys

COLOURS = {"Attend": "#4e79a7", "Merge": "#59a14f", "CommWait": "#e15759"}


def rows_of(prefix):
    rows = []
    for path in sorted(glob.glob(prefix + ".rank*.json")):
        rank = path.rsplit(".rank", 1)[1].split(".")[0]
        events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
        for tid, name in ((0, "fwd"), (1, "bwd")):
            rows.append((f"rank {rank} {name}", [e for e in events if e["tid"] == tid]))
    return rows


def main(out, runs):
    left, width, row_h, gap = 170, 900, 16, 6
    blocks = [(label, rows_of(prefix)) for label, prefix in runs]
    t_max = max(e["ts"] + e["dur"] for _, rows in blocks for _, ev in rows for e in ev) / 1e3  # ms
    scale = width / t_max
    y = 20
    parts = []
    for label, rows in blocks:
        parts.append(f'<text x="4" y="{y + 12}" font-weight="bold">{label}</text>')
        y += row_h + 2
        for name, events in rows:
            parts.append(f'<text x="12" y="{y + 12}">{name}</text>')
            for e in events:
                x = left + e["ts"] / 1e3 * scale
                w = max(e["dur"] / 1e3 * scale, 0.3)
                colour = COLOURS.get(e["name"], "#bab0ac")
                parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 2}" fill="{colour}">'
                             f'<title>{e["name"]} {e["dur"] / 1e3:.2f} ms</title></rect>')
            y += row_h
        y += gap
    for t in range(0, int(t_max) + 1, max(1, int(t_max / 10) // 50 * 50 or 50)):
        x = left + t * scale
        parts.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 5}" stroke="black"/>'
                     f'<text x="{x:.1f}" y="{y + 18}" text-anchor="middle">{t} ms</text>')
    legend_y = y + 34
    for i, (name, colour) in enumerate(list(COLOURS.items()) + [("other", "#bab0ac")]):
        parts.append(f'<rect x="{left + i * 120}" y="{legend_y}" width="12" height="12" fill="{colour}"/>'
                     f'<text x="{left + i * 120 + 16}" y="{legend_y + 11}">{name}</text>')
    height = legend_y + 24
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" height="{height}" '
           f'font-family="sans-serif" font-size="11">' + "".join(parts) + "</svg>\n")
    open(out, "w").write(svg)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]])
