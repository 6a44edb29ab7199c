#!/usr/bin/env python3
"""Plots steps.csv (from run-comparison.sh): response rate against offered request rate per server,
and the server's CPU time per response. Usage: plot.py [steps.csv] [out.svg]"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

src = sys.argv[1] if len(sys.argv) > 1 else "steps.csv"
out = sys.argv[2] if len(sys.argv) > 2 else "response-vs-request.svg"
rows = defaultdict(list)
with open(src) as f:
    for r in csv.DictReader(f):
        if r.get("disturbed", "0") == "1":
            continue
        rows[r["server"]].append(r)

fig, (rate, cpu) = plt.subplots(1, 2, figsize=(12, 5))
top = 0
for server, steps in rows.items():
    steps.sort(key=lambda r: float(r["offered_pps"]))
    x = [float(r["offered_pps"]) / 1e3 for r in steps]
    y = [float(r["response_pps"]) / 1e3 for r in steps]
    c = [float(r["cpu_us_per_response"]) for r in steps]
    top = max(top, max(x))
    rate.plot(x, y, marker="o", markersize=3, label=server)
    cpu.plot(x, c, marker="o", markersize=3, label=server)
rate.plot([0, top], [0, top], color="grey", linestyle=":", linewidth=1, label="every request answered")
rate.set_xlabel("offered requests (k/s, counted on the server's veth)")
rate.set_ylabel("responses (k/s)")
rate.set_title("Response rate against request rate (ntpperf, one server core)")
rate.grid(True, alpha=0.3)
rate.legend()
cpu.set_xlabel("offered requests (k/s)")
cpu.set_ylabel("server CPU time per response (µs)")
cpu.set_title("Server CPU per response")
cpu.set_ylim(bottom=0)
cpu.grid(True, alpha=0.3)
cpu.legend()
fig.tight_layout()
fig.savefig(out)
fig.savefig(out.rsplit(".", 1)[0] + ".png", dpi=80)
