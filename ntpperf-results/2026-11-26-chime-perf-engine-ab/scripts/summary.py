import csv, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def col(path, name):
    with open(path) as f:
        row = next(csv.DictReader(f))
    v = row[name]
    return float(v) if v != "" else float("nan")
for proto in ["ntp", "roughtime"]:
    for name in ["sent_rate", "answered_rate", "accepted_rate", "loss_pct", "rtt_p50_us", "rtt_p99_us",
                 "server_cpu_us_per_reply", "server_cpu_pct", "client_cpu_pct", "t2_t1_p50_us", "send_lag_p99_us"]:
        try:
            vals = {l: [col(f"{out}/{proto}-{l}-{r}.csv", name) for r in range(1, rounds + 1)] for l in "AB"}
        except FileNotFoundError:
            continue
        if all(v != v for v in vals["A"]):
            continue
        ratios = [b / a if a else float("nan") for a, b in zip(vals["A"], vals["B"])]
        print(f"{proto} {name}")
        for r in range(rounds):
            print(f"  round {r + 1}: A {vals['A'][r]:.3f}  B {vals['B'][r]:.3f}  B/A {ratios[r]:.3f}")
        ma, mb = statistics.mean(vals["A"]), statistics.mean(vals["B"])
        rr = [x for x in ratios if x == x]
        if ma and rr:
            print(f"  mean: A {ma:.3f}  B {mb:.3f}  B/A {mb / ma:.3f} (rounds {min(rr):.3f}..{max(rr):.3f})")
