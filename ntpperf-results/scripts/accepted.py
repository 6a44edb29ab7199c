#!/usr/bin/env python3
"""Restates run-comparison.sh and run-saturation.sh results on the replies clients accept.

ntpperf counts a reply invalid when its origin timestamp is not its client's latest request (the
reply came after the client's next request went out), and lost when none came. Older summaries
ranked servers by replies sent; this reads each run's steps.csv again and ranks by
    accepted = offered x (1 - lost% - invalid%) / 100
(ntpperf's own counts; offered as counted on the server's veth), the column run-comparison.sh
now writes itself. For a ladder: per server, the highest response rate of a step whose lost and
invalid together were under 1%, and the most accepted of any step. For a saturation run (round-N
directories): every server's mean accepted replies, and chimed-1's ratio over each other one (of
the means, and the range over rounds). Ratios are of chimed-1 where it ran, else of the first
server listed.

Usage: accepted.py RUN_DIR [RUN_DIR ...]   (e.g. accepted.py ../2026-11-22-ntp-ladders/run1[0-9])
"""
import csv
import os
import sys
from collections import OrderedDict


def steps(path):
    """The rows of one steps.csv, the last attempt at each (server, rate) only."""
    last = OrderedDict()
    with open(path) as f:
        for r in csv.DictReader(f):
            last[(r["server"], r["nominal_rate"])] = r
    return list(last.values())


def accepted(r):
    if "accepted_pps" in r and r["accepted_pps"] != "":
        return float(r["accepted_pps"])
    bad = float(r["ntpperf_lost_pct"]) + float(r["ntpperf_invalid_pct"])
    return max(0.0, float(r["offered_pps"]) * (1 - bad / 100))


def reference(servers):
    return "chimed-1" if "chimed-1" in servers else servers[0]


def ladder(run):
    rows = steps(os.path.join(run, "steps.csv"))
    servers = list(OrderedDict.fromkeys(r["server"] for r in rows))
    print(f"{run}: ladder")
    print(f"  {'server':<16} {'clean peak/s':>12} {'most sent/s':>12} {'most accepted/s':>16}"
          f" {'invalid% there':>15} {'worst invalid%':>15}")
    out = {}
    for s in servers:
        mine = [r for r in rows if r["server"] == s]
        clean = [float(r["response_pps"]) for r in mine
                 if float(r["ntpperf_lost_pct"]) + float(r["ntpperf_invalid_pct"]) < 1]
        top_sent = max(float(r["response_pps"]) for r in mine)
        top = max(mine, key=accepted)
        worst = max(float(r["ntpperf_invalid_pct"]) for r in mine)
        peak = max(clean) if clean else 0.0
        out[s] = (peak, accepted(top))
        print(f"  {s:<16} {peak:>12.0f} {top_sent:>12.0f} {accepted(top):>16.0f}"
              f" {float(top['ntpperf_invalid_pct']):>15.2f} {worst:>15.2f}")
    first = reference(servers)
    for s in servers:
        if s == first:
            continue
        p = out[first][0] / out[s][0] if out[s][0] else float("nan")
        a = out[first][1] / out[s][1] if out[s][1] else float("nan")
        print(f"  {first} over {s}: clean peak {p:.2f}x, most accepted {a:.2f}x")


def saturation(run):
    rounds = sorted((d for d in os.listdir(run) if d.startswith("round-")),
                    key=lambda d: int(d.split("-")[1]))
    per = OrderedDict()
    for d in rounds:
        for r in steps(os.path.join(run, d, "steps.csv")):
            per.setdefault(r["server"], []).append(
                (float(r["response_pps"]), accepted(r), float(r["ntpperf_invalid_pct"])))
    servers = list(per)
    first = reference(servers)
    print(f"{run}: {len(rounds)} rounds at saturation")
    for s in servers:
        sent = [x[0] for x in per[s]]
        acc = [x[1] for x in per[s]]
        inv = max(x[2] for x in per[s])
        line = (f"  {s:<16} sent {sum(sent) / len(sent):>8.0f}/s  accepted"
                f" {sum(acc) / len(acc):>8.0f}/s  invalid at most {inv:.2f}%")
        if s != first:
            mine = [x[1] for x in per[first]]
            ratios = [a / b for a, b in zip(mine, acc) if b]
            mean = (sum(mine) / len(mine)) / (sum(acc) / len(acc))
            sent_mean = (sum(x[0] for x in per[first]) / len(mine)) / (sum(sent) / len(sent))
            line += (f"  {first} over it: accepted {mean:.2f}x (rounds {min(ratios):.2f}-"
                     f"{max(ratios):.2f}), sent {sent_mean:.2f}x")
        print(line)


for run in sys.argv[1:]:
    run = run.rstrip("/")
    if os.path.exists(os.path.join(run, "steps.csv")):
        ladder(run)
    elif os.path.isdir(os.path.join(run, "round-1")):
        saturation(run)
    else:
        print(f"{run}: no steps.csv and no round-1/: not a run directory", file=sys.stderr)
        sys.exit(2)
