#!/usr/bin/env bash
# Two chime builds (A, B) loading the same chimed, in rotated rounds (A B, B A, ...).
# chimed pinned to CPU 0 (1 NTP thread, 1 Roughtime thread), chime perf pinned to CPU 1.
set -euo pipefail
a=$1 b=$2 chimed=$3 out=$4 rounds=${5:-4} ntp_rate=${6:-400000} rt_rate=${7:-40000} duration=${8:-4}
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
ntp_port=$(free_port)
rt_port=$(free_port)
taskset -c 0 "$chimed" -s "127.0.0.1:$chrony_port" -4 1 -6 0 -a "127.0.0.1:$ntp_port" \
    --roughtime-key "$work/rt.key" --roughtime-ipv4-threads 1 --roughtime-ipv6-threads 0 \
    --roughtime-ipv4-address "127.0.0.1:$rt_port" --roughtime-tcp-connections 0 \
    >"$work/chimed.log" 2>&1 &
pid=$!
pids+=("$pid")
for _ in $(seq 100); do
    grep -q 'synchronised: stratum' "$work/chimed.log" && break
    sleep 0.1
done
grep -q 'synchronised: stratum' "$work/chimed.log" || { cat "$work/chimed.log" >&2; exit 1; }
{
    echo "date: $(date -u +%FT%TZ)"
    echo "A: $a ($(sha256sum "$a" | cut -c1-16))"
    echo "B: $b ($(sha256sum "$b" | cut -c1-16))"
    echo "chimed: $chimed"
    echo "rounds $rounds, NTP $ntp_rate/s, Roughtime $rt_rate/s, $duration s each"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/setup.txt"
run_one() {
    local label=$1 bin=$2 round=$3
    echo "round $round $label load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/loads.txt"
    taskset -c 1 "$bin" perf ntp --target "127.0.0.1:$ntp_port" --rate "$ntp_rate" \
        --duration "$duration" --server-pid "$pid" --csv "$out/ntp-$label-$round.csv" \
        --json "$out/ntp-$label-$round.json" >"$out/ntp-$label-$round.txt" 2>&1
    taskset -c 1 "$bin" perf roughtime --target "127.0.0.1:$rt_port" --public-key "$public" \
        --rate "$rt_rate" --duration "$duration" --verify-every 1000 --server-pid "$pid" \
        --csv "$out/roughtime-$label-$round.csv" --json "$out/roughtime-$label-$round.json" \
        >"$out/roughtime-$label-$round.txt" 2>&1
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
python3 "$here/summary.py" "$out" "$rounds" >"$out/summary.txt"
cat "$out/summary.txt"
