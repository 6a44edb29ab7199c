#!/usr/bin/env bash
# run-roughtime-tcp.sh: Roughtime over TCP, chimed against tannerryan's roughtime server (Go), side
# by side on loopback with `chime perf roughtime --tcp`: each server pinned to CPU 0 (the Go one
# with GOMAXPROCS=1), the generator to CPU 1. Two ways of using TCP:
#
#   reuse  --tcp-connections N (default 64) per generator thread, requests pipelined on each
#   cold   a new connection for every request, closed once its reply is in: the handshake and the
#          close are in every exchange
#
# Rates are interleaved: each rate goes to one server and then the other, the first alternating
# from rate to rate and round to round, so both meet the same machine (these shared cores drift
# between a slow and a fast state, see README.md). Both serve drafts 12-19 (0x8000000c: tannerryan
# 1.20 speaks no version 1) with Ed25519 keys of their own; one reply in --verify-every has its
# signatures and path checked.
#
# tannerryan's server handles a connection's requests one at a time and closes a connection whose
# queue fills, losing what it held; with 4 connections it answered nothing at 20k/s, with 64 all.
# So reuse runs with 64 connections, which neither server finds short.
#
# The figure for each server, mode and round is the highest rate answered with under 1% loss
# (accepted replies, as every speed figure here), with the server's CPU time per reply there
# (--server-pid: /proc, user and system). This script fetches and builds nothing: it is given the
# binaries.
#
# Usage: run-roughtime-tcp.sh [--rounds N] [--duration S] [--connections N] [--out DIR]
#                             [--reuse-rates "R1 R2 ..."] [--cold-rates "R1 R2 ..."]
#                             [--modes "reuse cold"]
#                             [--chimed PATH] [--chime PATH] [--tannerryan PATH]
# Outputs in --out (default: ntpperf-results/DATE-roughtime-tcp): one chime perf JSON per run,
# named <server>-<mode>-round<N>-<rate>.json, and summary.txt.

set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
rounds=3
duration=2
connections=64
out="$(dirname "$here")/$(date -u +%F)-roughtime-tcp"
reuse_rates="20000 40000 60000 80000 100000 120000"
cold_rates="2000 4000 6000 8000 10000 12000"
chimed="$repo/target/release/chimed"
chime="$repo/target/release/chime"
tannerryan=/work/ext/tannerryan-bin/roughtime
verify_every=1000
modes="reuse cold"

while (($#)); do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --reuse-rates) reuse_rates=$2; shift 2 ;;
    --cold-rates) cold_rates=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --chimed) chimed=$2; shift 2 ;;
    --chime) chime=$2; shift 2 ;;
    --tannerryan) tannerryan=$2; shift 2 ;;
    *) echo "run-roughtime-tcp.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for bin in "$chimed" "$chime" "$tannerryan"; do
  [[ -x $bin ]] || { echo "run-roughtime-tcp.sh: $bin: not an executable" >&2; exit 2; }
done
mkdir -p "$out"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
p = s.getsockname()[1]; u.bind(("127.0.0.1", p)); print(p)'
}

# chronyd -x as chimed's upstream: it never touches the clock.
chrony_port=$(free_port)
cat >"$work/chrony.conf" <<EOF
port $chrony_port
bindaddress 127.0.0.1
allow 127.0.0.1
local stratum 3
cmdport 0
pidfile $work/chronyd.pid
driftfile $work/drift
EOF
/usr/sbin/chronyd -x -d -u root -f "$work/chrony.conf" >"$work/chronyd.log" 2>&1 &
pids+=($!)

"$chime" keygen "$work/chimed.key" >"$work/chimed-keygen.txt"
chimed_key=$(awk '/public key \(base64\)/ {print $NF}' "$work/chimed-keygen.txt")
"$tannerryan" -keygen "$work/tannerryan.key" >"$work/tannerryan-keygen.txt" 2>&1
tannerryan_key=$(awk '/base64/ {print $NF}' "$work/tannerryan-keygen.txt" | tail -1)

chimed_port=$(free_port)
taskset -c 0 "$chimed" -s "127.0.0.1:$chrony_port" -4 1 -6 0 -a 127.0.0.1:0 \
  --roughtime-key "$work/chimed.key" --roughtime-ipv4-address "127.0.0.1:$chimed_port" \
  --roughtime-ipv6-threads 0 --roughtime-tcp-connections 65536 \
  --roughtime-tcp-per-address 65536 >"$work/chimed.log" 2>&1 &
chimed_pid=$!
pids+=("$chimed_pid")
tannerryan_port=$(free_port)
GOMAXPROCS=1 taskset -c 0 "$tannerryan" -port "$tannerryan_port" \
  -root-key-file "$work/tannerryan.key" -grease-rate 0 -log-level warn >"$work/tannerryan.log" 2>&1 &
tannerryan_pid=$!
pids+=("$tannerryan_pid")

# Ready: each answers one verified query over TCP.
ready() {
  for _ in $(seq 100); do
    "$chime" roughtime --tcp --version 0x8000000c --public-key "$2" "$1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "run-roughtime-tcp.sh: no verified reply from $1" >&2
  exit 1
}
ready "127.0.0.1:$chimed_port" "$chimed_key"
ready "127.0.0.1:$tannerryan_port" "$tannerryan_key"
echo "chimed $("$chimed" --version 2>/dev/null | head -1) pid $chimed_pid; tannerryan pid $tannerryan_pid"

perf() { # server mode round rate
  local server=$1 mode=$2 round=$3 rate=$4 addr key pid conns
  case $server in
    chimed) addr=127.0.0.1:$chimed_port key=$chimed_key pid=$chimed_pid ;;
    tannerryan) addr=127.0.0.1:$tannerryan_port key=$tannerryan_key pid=$tannerryan_pid ;;
  esac
  case $mode in reuse) conns=$connections ;; cold) conns=0 ;; esac
  taskset -c 1 "$chime" perf roughtime --target "$addr" --public-key "$key" --version 0x8000000c \
    --tcp --tcp-connections "$conns" --rate "$rate" --duration "$duration" --warmup 0.5 \
    --verify-every "$verify_every" --server-pid "$pid" \
    --json "$out/$server-$mode-round$round-$rate.json" >/dev/null 2>"$work/perf.err" ||
    { echo "chime perf failed for $server $mode $rate:" >&2; cat "$work/perf.err" >&2; exit 1; }
}

flip=0
for round in $(seq "$rounds"); do
  for mode in $modes; do
    rates=$reuse_rates
    [[ $mode == cold ]] && rates=$cold_rates
    for rate in $rates; do
      if ((flip)); then order="tannerryan chimed"; else order="chimed tannerryan"; fi
      flip=$((1 - flip))
      for server in $order; do
        perf "$server" "$mode" "$round" "$rate"
        printf 'round %s %-5s %-10s %7s/s\n' "$round" "$mode" "$server" "$rate"
      done
    done
  done
done

python3 - "$out" "$rounds" <<'EOF' | tee "$out/summary.txt"
import glob, json, os, re, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {}
for path in glob.glob(os.path.join(out, "*.json")):
    m = re.match(r"(\w+)-(reuse|cold)-round(\d+)-(\d+)\.json", os.path.basename(path))
    if not m:
        continue
    step = json.load(open(path))["steps"][0]
    runs.setdefault((m[1], m[2], int(m[3])), []).append(step)
print("Roughtime over TCP, one server core each: highest rate with < 1% loss (accepted replies/s),")
print("server CPU per reply there (user + system, µs), p50 and p99 round trip (µs)")
for mode in ("reuse", "cold"):
    if not any(k[1] == mode for k in runs):
        continue
    print(f"\n{mode}:")
    ratios = []
    for r in range(1, rounds + 1):
        best = {}
        for server in ("chimed", "tannerryan"):
            ok = [s for s in runs.get((server, mode, r), []) if s["loss_pct"] < 1.0]
            if not ok:
                best[server] = None
                print(f"  round {r} {server:10}: none under 1% loss")
                continue
            s = max(ok, key=lambda s: s.get("accepted_rate", s["answered_rate"]))
            s["accepted_rate"] = s.get("accepted_rate", s["answered_rate"])
            best[server] = s
            cpu = s.get("server_cpu") or {}
            print(f"  round {r} {server:10}: {s['accepted_rate']:9.0f}/s  "
                  f"CPU {cpu.get('us_per_reply', float('nan')):6.2f} µs/reply  "
                  f"p50 {s['rtt_us']['p50']:8.1f}  p99 {s['rtt_us']['p99']:8.1f}")
        if best["chimed"] and best["tannerryan"]:
            ratio = best["chimed"]["accepted_rate"] / best["tannerryan"]["accepted_rate"]
            ratios.append(ratio)
            cpu = lambda s: (s.get("server_cpu") or {}).get("us_per_reply")
            c, t = cpu(best["chimed"]), cpu(best["tannerryan"])
            extra = f", CPU per reply {t / c:.2f}x less" if c and t else ""
            print(f"  round {r} chimed / tannerryan: {ratio:.2f}x the rate{extra}")
    if ratios:
        print(f"  {mode}: chimed {min(ratios):.2f}-{max(ratios):.2f}x tannerryan over {len(ratios)} rounds"
              " (a ladder's top rung is a floor: see the rates)")
EOF
