#!/usr/bin/env python3
"""Draws the AF_XDP runs as one SVG, with no plotting library: per server, the replies its clients
accepted per second on one core, the mean over rounds as a bar and each round as a dot.

Usage: plot-xdp.py NTP_ROUNDS_CSV ROUGHTIME_ROUNDS_CSV OUT.svg
  NTP_ROUNDS_CSV        run-saturation.sh's rounds.csv (columns server, accepted_pps)
  ROUGHTIME_ROUNDS_CSV  run-xdp-roughtime.sh's rounds.csv (columns server, accepted_per_s)
"""

import csv
import sys
from collections import OrderedDict


def rounds(path, column):
    by = OrderedDict()
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            by.setdefault(row["server"], []).append(float(row[column]))
    return by


def panel(x0, title, data, width, height):
    """One bar chart at x offset x0; returns SVG elements."""
    top = max(v for vals in data.values() for v in vals)
    scale = (height - 90) / (top * 1.1)
    base = height - 50
    out = [
        f'<text x="{x0 + width / 2}" y="24" text-anchor="middle" font-size="15">{title}</text>',
        f'<line x1="{x0 + 50}" y1="{base}" x2="{x0 + width - 10}" y2="{base}" stroke="#333"/>',
    ]
    # Gridlines every 100k.
    step = 100_000
    v = step
    while v < top * 1.1:
        y = base - v * scale
        out.append(
            f'<line x1="{x0 + 50}" y1="{y:.1f}" x2="{x0 + width - 10}" y2="{y:.1f}" '
            f'stroke="#ddd"/>'
        )
        out.append(
            f'<text x="{x0 + 45}" y="{y + 4:.1f}" text-anchor="end" font-size="11">'
            f"{v // 1000}k</text>"
        )
        v += step
    n = len(data)
    slot = (width - 70) / n
    for i, (server, vals) in enumerate(data.items()):
        mean = sum(vals) / len(vals)
        cx = x0 + 60 + slot * i + slot / 2
        bw = slot * 0.6
        color = "#2a7ab9" if "xdp" in server else "#9aa5b1"
        out.append(
            f'<rect x="{cx - bw / 2:.1f}" y="{base - mean * scale:.1f}" width="{bw:.1f}" '
            f'height="{mean * scale:.1f}" fill="{color}"/>'
        )
        for v in vals:
            out.append(f'<circle cx="{cx:.1f}" cy="{base - v * scale:.1f}" r="2.5" fill="#222"/>')
        out.append(
            f'<text x="{cx:.1f}" y="{base - mean * scale - 8:.1f}" text-anchor="middle" '
            f'font-size="11">{mean / 1000:.0f}k</text>'
        )
        out.append(
            f'<text x="{cx:.1f}" y="{base + 16}" text-anchor="middle" font-size="11">{server}</text>'
        )
    out.append(
        f'<text x="{x0 + 14}" y="{base - (height - 90) / 2}" font-size="11" '
        f'transform="rotate(-90 {x0 + 14} {base - (height - 90) / 2})" text-anchor="middle">'
        "accepted replies/s, one core</text>"
    )
    return out


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    ntp = rounds(sys.argv[1], "accepted_pps")
    rt = rounds(sys.argv[2], "accepted_per_s")
    w, h = 520, 360
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w}" height="{h}" '
        'font-family="sans-serif">',
        f'<rect width="{2 * w}" height="{h}" fill="white"/>',
    ]
    parts += panel(0, "NTP (ntpperf), veth, one core", ntp, w, h)
    parts += panel(w, "Roughtime (chime perf), veth, one core", rt, w, h)
    parts.append(
        f'<text x="{w}" y="{h - 10}" text-anchor="middle" font-size="11">bars: mean over rounds; '
        "dots: each round (order rotated); blue: chimed through AF_XDP (copy mode)</text>"
    )
    parts.append("</svg>")
    with open(sys.argv[3], "w") as f:
        f.write("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
