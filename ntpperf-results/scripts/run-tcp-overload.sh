#!/usr/bin/env bash
# run-tcp-overload.sh: Roughtime over TCP past capacity, two builds of chimed side by side in
# rotated rounds (A B, then B A, ...): the replies a client accepts per second (answered within
# its poll interval, as `chime perf` counts them) and the server's peak memory, at a rate above
# what one core can sign.
#
# Each build runs alone, pinned to CPU 0, with one Roughtime thread and Roughtime over TCP on
# loopback, mirroring a chronyd -x started here; `chime perf roughtime --tcp` runs pinned to CPU 1
# over reused connections. One core of the server's can sign faster than one core of the
# generator's can send over TCP, so to load the server past its capacity `--cpu-share PCT` holds it
# to that share of CPU 0 (a cgroup v1 CPU quota of 1.2 ms per 120/PCT ms: 4 ms periods at 30%,
# 8 ms at 15%). The summary gives each round's figures, each build's mean, and B/A.
#
# This script builds nothing: it is given the binaries. Needs chronyd, taskset, python3.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: run-tcp-overload.sh --a CHIMED --b CHIMED --chime CHIME --out DIR [options]
  --a PATH, --b PATH   the two chimed binaries (A is the reference)
  --chime PATH         the chime binary whose perf loads them
  --out DIR            where results go: one CSV per run, summary.txt
  --rounds N           rounds, each running A and B once (default 3)
  --rate R             Roughtime requests per second over TCP (default 150000)
  --connections N      connections per perf thread (default 64)
  --duration S         seconds of each run (default 5)
  --cpu-share PCT      hold the server to PCT% of CPU 0 (default: all of it)
EOF
}

a='' b='' chime='' out='' rounds=3 rate=150000 connections=64 duration=5 share=''
while (($#)); do
    case $1 in
    --a) a=$2; shift 2 ;;
    --b) b=$2; shift 2 ;;
    --chime) chime=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --cpu-share) share=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run-tcp-overload.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done
for f in "$a" "$b" "$chime"; do
    [[ -x $f ]] || { echo "run-tcp-overload.sh: not an executable: '$f'" >&2; usage >&2; exit 2; }
done
[[ -n $out ]] || { echo "run-tcp-overload.sh: --out is needed" >&2; exit 2; }
mkdir -p "$out"
work=$(mktemp -d)
pids=()
group=/sys/fs/cgroup/cpu/chime-bench-$$
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
    [[ -d $group ]] && rmdir "$group" 2>/dev/null || true
}
trap cleanup EXIT
if [[ -n $share ]]; then
    mkdir "$group"
    echo $((120000 / share)) >"$group/cpu.cfs_period_us"
    echo 1200 >"$group/cpu.cfs_quota_us"
fi

# A port free for both UDP and TCP: Roughtime over TCP binds the UDP socket's port.
# shellcheck source=bench-lib.sh
source "$(dirname "$0")/bench-lib.sh"
start_upstream

run_one() {
    local label=$1 bin=$2 round=$3
    local ntp_port rt_port
    ntp_port=$(free_port)
    rt_port=$(free_port)
    taskset -c 0 "$bin" -s "127.0.0.1:$chrony_port" -4 1 -6 0 -a "127.0.0.1:$ntp_port" \
        --roughtime-key "$work/rt.key" --roughtime-ipv4-threads 1 --roughtime-ipv6-threads 0 \
        --roughtime-ipv4-address "127.0.0.1:$rt_port" --roughtime-tcp-per-address 4096 \
        --roughtime-tcp-connections 4096 >"$work/$label-$round.log" 2>&1 &
    local pid=$!
    pids+=("$pid")
    for _ in $(seq 100); do
        grep -q 'synchronised: stratum' "$work/$label-$round.log" && break
        sleep 0.1
    done
    grep -q 'synchronised: stratum' "$work/$label-$round.log" ||
        { echo "run-tcp-overload.sh: $label did not synchronise" >&2; cat "$work/$label-$round.log" >&2; exit 1; }
    if [[ -n $share ]]; then
        for task in /proc/"$pid"/task/*; do echo "${task##*/}" >"$group/tasks"; done
    fi
    taskset -c 1 "$chime" perf roughtime --tcp --tcp-connections "$connections" \
        --target "127.0.0.1:$rt_port" --public-key "$public" --rate "$rate" \
        --duration "$duration" --verify-every 1000 --server-pid "$pid" \
        --csv "$out/tcp-$label-$round.csv" >"$out/tcp-$label-$round.txt" 2>&1
    # Peak resident memory over the run, in KiB.
    sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\).*/\1/p' "/proc/$pid/status" >"$out/tcp-$label-$round.hwm"
    kill -TERM "$pid"
    wait "$pid" || true
    grep 'roughtime-tcp totals at exit' "$work/$label-$round.log" >"$out/tcp-$label-$round.totals" || true
}

for round in $(seq "$rounds"); do
    if ((round % 2)); then order=(A B); else order=(B A); fi
    for label in "${order[@]}"; do
        if [[ $label == A ]]; then run_one A "$a" "$round"; else run_one B "$b" "$round"; fi
    done
done

python3 - "$out" "$rounds" >"$out/summary.txt" <<'EOF'
import csv, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def col(label, r, name):
    if name == "peak_rss_kib":
        return float(open(f"{out}/tcp-{label}-{r}.hwm").read().strip() or 0)
    with open(f"{out}/tcp-{label}-{r}.csv") as f:
        return float(next(csv.DictReader(f))[name] or "nan")
for name in ["offered_rate", "sent_rate", "answered_rate", "accepted_rate", "stale_pct",
             "rtt_p50_us", "rtt_p99_us", "server_cpu_pct", "peak_rss_kib"]:
    vals = {l: [col(l, r, name) for r in range(1, rounds + 1)] for l in "AB"}
    print(name)
    for r in range(rounds):
        print(f"  round {r + 1}: A {vals['A'][r]:.1f}  B {vals['B'][r]:.1f}")
    ma, mb = statistics.mean(vals["A"]), statistics.mean(vals["B"])
    print(f"  mean: A {ma:.1f}  B {mb:.1f}  B/A {mb / ma if ma else float('nan'):.3f}")
EOF
cat "$out/summary.txt"
