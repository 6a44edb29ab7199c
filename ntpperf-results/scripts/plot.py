#!/usr/bin/env python3
"""Plots steps.csv (from run-comparison.sh): accepted replies (ntpperf's lost and invalid taken off
the offered rate: the replies clients could use) and replies sent against offered request rate per
server, and the server's CPU time per reply sent. Steps.csv files from before accepted_pps existed
get it computed the same way. Usage: plot.py [steps.csv] [out.svg]"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

def accepted(r):
    if r.get("accepted_pps"):
        return float(r["accepted_pps"])
    bad = float(r["ntpperf_lost_pct"]) + float(r["ntpperf_invalid_pct"])
    return max(0.0, float(r["offered_pps"]) * (1 - bad / 100))


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
    y = [accepted(r) / 1e3 for r in steps]
    sent = [float(r["response_pps"]) / 1e3 for r in steps]
    c = [float(r["cpu_us_per_response"]) for r in steps]
    top = max(top, max(x))
    line, = rate.plot(x, y, marker="o", markersize=3, label=f"{server} accepted")
    rate.plot(x, sent, linestyle="--", linewidth=1, color=line.get_color(), label=f"{server} sent")
    cpu.plot(x, c, marker="o", markersize=3, label=server)
rate.plot([0, top], [0, top], color="grey", linestyle=":", linewidth=1, label="every request answered")
rate.set_xlabel("offered requests (k/s, counted on the server's veth)")
rate.set_ylabel("replies (k/s): accepted by ntpperf's clients, and sent")
rate.set_title("Replies against request rate (ntpperf, one server core)")
rate.grid(True, alpha=0.3)
rate.legend()
cpu.set_xlabel("offered requests (k/s)")
cpu.set_ylabel("server CPU time per reply sent (µs)")
cpu.set_title("Server CPU per reply")
cpu.set_ylim(bottom=0)
cpu.grid(True, alpha=0.3)
cpu.legend()
fig.tight_layout()
fig.savefig(out)
fig.savefig(out.rsplit(".", 1)[0] + ".png", dpi=80)
