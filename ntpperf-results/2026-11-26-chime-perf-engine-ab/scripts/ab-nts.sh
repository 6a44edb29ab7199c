#!/usr/bin/env bash
# Two chime builds (A, B) loading the same chimed with NTS and with NTS-KE sessions, rotated rounds.
set -euo pipefail
a=$1 b=$2 chimed=$3 out=$4 rounds=${5:-4} ntp_rate=${6:-80000} ke_rate=${7:-1200} duration=${8:-4}
mkdir -p "$out"
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
chime=$a
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../../scripts/bench-lib.sh"
start_upstream
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1 \
  -addext basicConstraints=critical,CA:FALSE \
  -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
chmod 600 "$work/key.pem"
ntp_port=$(free_port)
ke_port=$(free_port)
taskset -c 0 "$chimed" -s "127.0.0.1:$chrony_port" -4 1 -6 0 -a "127.0.0.1:$ntp_port" \
  --nts-certificate "$work/cert.pem" --nts-private-key "$work/key.pem" \
  --nts-ke-address "127.0.0.1:$ke_port" --nts-ke-threads 1 >"$work/chimed.log" 2>&1 &
pid=$!
pids+=("$pid")
for _ in $(seq 100); do
    grep -q 'synchronised: stratum' "$work/chimed.log" && grep -q 'nts-ke listening' "$work/chimed.log" && break
    sleep 0.1
done
{
    echo "date: $(date -u +%FT%TZ)"
    echo "A: $a ($(sha256sum "$a" | cut -c1-16))"
    echo "B: $b ($(sha256sum "$b" | cut -c1-16))"
    echo "rounds $rounds, NTS $ntp_rate/s, NTS-KE $ke_rate/s, $duration s each"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/setup.txt"
run_one() {
    local label=$1 bin=$2 round=$3
    echo "round $round $label load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/loads.txt"
    taskset -c 1 "$bin" perf ntp --nts "127.0.0.1:$ke_port" --nts-ca "$work/cert.pem" --rate "$ntp_rate" \
        --duration "$duration" --warmup 0.5 --server-pid "$pid" --csv "$out/nts-$label-$round.csv" \
        --json "$out/nts-$label-$round.json" >"$out/nts-$label-$round.txt" 2>&1
    taskset -c 1 "$bin" perf nts-ke --target "127.0.0.1:$ke_port" --nts-ca "$work/cert.pem" --rate "$ke_rate" \
        --duration "$duration" --sources 64 --connections 64 --server-pid "$pid" \
        --json "$out/ke-$label-$round.json" >"$out/ke-$label-$round.txt" 2>&1
}
busy() {
    pgrep -x rustc >/dev/null || pgrep -x clippy-driver >/dev/null || pgrep -f 'cargo-fuzz|fuzz/target|cargo (build|test|clippy)|/deps/' >/dev/null
}
wait_quiet() {
    local waited=0
    while busy; do sleep 5; waited=$((waited + 5)); done
    echo "waited ${waited}s for quiet" >>"$out/loads.txt"
}
for round in $(seq "$rounds"); do
    wait_quiet
    if ((round % 2)); then order=(A B); else order=(B A); fi
    for label in "${order[@]}"; do
        if [[ $label == A ]]; then run_one A "$a" "$round"; else run_one B "$b" "$round"; fi
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/setup.txt"
python3 - "$out" "$rounds" >"$out/summary.txt" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def get(path, keys):
    v = json.load(open(path))["steps"][0]
    for k in keys:
        v = v.get(k) if isinstance(v, dict) else None
    return float(v) if v is not None else float("nan")
for proto, name in [("nts", "answered_rate"), ("nts", "accepted_rate"), ("nts", "loss_pct"),
                    ("nts", "rtt_us.p50"), ("nts", "rtt_us.p99"), ("nts", "server_cpu.us_per_reply"),
                    ("nts", "client_cpu_percent"),
                    ("ke", "completed_rate"), ("ke", "failed_pct"), ("ke", "latency_ms.p50"),
                    ("ke", "latency_ms.p99"), ("ke", "queued_ms.p99"), ("ke", "server_cpu.us_per_reply"),
                    ("ke", "client_cpu_percent")]:
    keys = name.split(".")
    vals = {l: [get(f"{out}/{proto}-{l}-{r}.json", keys) for r in range(1, rounds + 1)] for l in "AB"}
    ratios = [b / a if a else float("nan") for a, b in zip(vals["A"], vals["B"])]
    print(f"{proto} {name}")
    for r in range(rounds):
        print(f"  round {r + 1}: A {vals['A'][r]:.3f}  B {vals['B'][r]:.3f}  B/A {ratios[r]:.3f}")
    ma, mb = statistics.mean(vals["A"]), statistics.mean(vals["B"])
    rr = [x for x in ratios if x == x]
    if ma and rr:
        print(f"  mean: A {ma:.3f}  B {mb:.3f}  B/A {mb / ma:.3f} (rounds {min(rr):.3f}..{max(rr):.3f})")
PY
cat "$out/summary.txt"
