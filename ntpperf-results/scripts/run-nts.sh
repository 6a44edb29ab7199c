#!/usr/bin/env bash
# run-nts.sh: NTS under load, chimed against chronyd (as an NTS server) and ntpd-rs, side by side on
# loopback, one server core each (CPU 0; the load generator on CPU 1):
#
#   ntp     authenticated NTP: `chime perf ntp --nts`, a pool of NTS-KE sessions made first, then
#           requests at a fixed rate, each spending a cookie; every reply is checked as a client
#           checks it (identifier, authenticator, header) and its new cookie put to use
#   nts-ke  cold NTS-KE: `chime perf nts-ke`, a new TCP connection and a full TLS 1.3 handshake per
#           session, from 64 loopback source addresses in turn (so that no server's per-address
#           limit is what is measured)
#
# The servers: chimed (one NTP thread, --nts-ke-threads 1); chronyd from Debian (ntsprocesses 0:
# NTS-KE in its one process); ntpd-rs (the `ntpd` crate, built by the caller with
# `cargo install ntpd --version 1.9.0 --locked`, never committed). All three use one P-256
# certificate. Rates are interleaved: for each rate the order of the servers turns, from rate to
# rate and round to round, so all meet the same machine (these shared cores drift between a slow
# and a fast state, see README.md).
#
# Figures per server, mode and round: the highest rate with under 1% loss or failure (accepted
# replies, or completed sessions), the server's CPU time per reply or session there (/proc, user +
# system), and the p99 latency. One core's worth is 1e6 / (CPU µs per reply): the rate one core
# would carry, which the ladder's top rung may not reach when the generator, not the server, is
# the limit. summary.txt has the table; nts.svg plots the per-core figures.
#
# Usage: run-nts.sh [--rounds N] [--duration S] [--out DIR] [--modes "ntp nts-ke"]
#                   [--ntp-rates "R1 R2 ..."] [--ke-rates "R1 R2 ..."]
#                   [--chimed PATH] [--chime PATH] [--ntpd-rs PATH]

set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
rounds=3
duration=2
out="$(dirname "$here")/$(date -u +%F)-nts"
modes="ntp nts-ke"
ntp_rates="20000 40000 80000 120000 160000"
ke_rates="300 600 1200 1800 2400 3000"
chimed="$repo/target/release/chimed"
chime="$repo/target/release/chime"
ntpd_rs=/work/ext/ntpd-rs/bin/ntp-daemon

while (($#)); do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --ntp-rates) ntp_rates=$2; shift 2 ;;
    --ke-rates) ke_rates=$2; shift 2 ;;
    --chimed) chimed=$2; shift 2 ;;
    --chime) chime=$2; shift 2 ;;
    --ntpd-rs) ntpd_rs=$2; shift 2 ;;
    *) echo "run-nts.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for bin in "$chimed" "$chime" "$ntpd_rs" /usr/sbin/chronyd; do
  [[ -x $bin ]] || { echo "run-nts.sh: $bin: not an executable" >&2; exit 2; }
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

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1 \
  -addext basicConstraints=critical,CA:FALSE \
  -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
chmod 600 "$work/key.pem"

# chronyd -x as chimed's upstream: it never touches the clock.
upstream_port=$(free_port)
cat >"$work/upstream.conf" <<EOF
port $upstream_port
bindaddress 127.0.0.1
allow 127.0.0.1
local stratum 3
cmdport 0
pidfile $work/upstream.pid
driftfile $work/upstream.drift
EOF
/usr/sbin/chronyd -x -d -u root -f "$work/upstream.conf" >"$work/upstream.log" 2>&1 &
pids+=($!)

chimed_ntp=$(free_port) chimed_ke=$(free_port)
taskset -c 0 "$chimed" -s "127.0.0.1:$upstream_port" -4 1 -6 0 -a "127.0.0.1:$chimed_ntp" \
  --nts-certificate "$work/cert.pem" --nts-private-key "$work/key.pem" \
  --nts-ke-address "127.0.0.1:$chimed_ke" --nts-ke-threads 1 >"$work/chimed.log" 2>&1 &
chimed_pid=$!
pids+=("$chimed_pid")

# chronyd as the NTS server under test: its own NTP port, NTS-KE in its main process.
chronyd_ntp=$(free_port) chronyd_ke=$(free_port)
cat >"$work/chronyd.conf" <<EOF
port $chronyd_ntp
bindaddress 127.0.0.1
allow 127.0.0.0/8
local stratum 3
cmdport 0
ntsport $chronyd_ke
ntsserverkey $work/key.pem
ntsservercert $work/cert.pem
ntsprocesses 0
pidfile $work/chronyd.pid
driftfile $work/chronyd.drift
EOF
taskset -c 0 /usr/sbin/chronyd -x -d -u root -f "$work/chronyd.conf" >"$work/chronyd.log" 2>&1 &
chronyd_pid=$!
pids+=("$chronyd_pid")

# ntpd-rs with no time source (it serves the system clock, as unsynchronised, and never steers it).
ntpdrs_ntp=$(free_port) ntpdrs_ke=$(free_port)
cat >"$work/ntpd-rs.toml" <<EOF
[observability]
log-level = "warn"

[[server]]
listen = "127.0.0.1:$ntpdrs_ntp"

[[nts-ke-server]]
listen = "127.0.0.1:$ntpdrs_ke"
certificate-chain-path = "$work/cert.pem"
private-key-path = "$work/key.pem"
key-exchange-timeout-ms = 2000
ntp-port = $ntpdrs_ntp
ntp-server = "127.0.0.1"
EOF
taskset -c 0 "$ntpd_rs" -c "$work/ntpd-rs.toml" >"$work/ntpd-rs.log" 2>&1 &
ntpdrs_pid=$!
pids+=("$ntpdrs_pid")

# Ready: one authenticated exchange each.
ready() {
  for _ in $(seq 100); do
    "$chime" ntp --nts "$1" --nts-ca "$work/cert.pem" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "run-nts.sh: no NTS exchange with $2 at $1" >&2
  cat "$work/$2.log" >&2
  exit 1
}
ready "127.0.0.1:$chimed_ke" chimed
ready "127.0.0.1:$chronyd_ke" chronyd
ready "127.0.0.1:$ntpdrs_ke" ntpd-rs
{
  echo "chimed $("$chimed" --version | head -1), pid $chimed_pid"
  echo "chronyd $(/usr/sbin/chronyd -v | head -1), pid $chronyd_pid"
  echo "ntpd-rs $("$ntpd_rs" --version 2>&1 | head -1), pid $ntpdrs_pid"
  echo "$(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
} | tee "$out/setup.txt"

perf() { # server mode round rate
  local server=$1 mode=$2 round=$3 rate=$4 ke pid
  case $server in
    chimed) ke=127.0.0.1:$chimed_ke pid=$chimed_pid ;;
    chronyd) ke=127.0.0.1:$chronyd_ke pid=$chronyd_pid ;;
    ntpd-rs) ke=127.0.0.1:$ntpdrs_ke pid=$ntpdrs_pid ;;
  esac
  local json="$out/$server-$mode-round$round-$rate.json"
  case $mode in
    ntp)
      taskset -c 1 "$chime" perf ntp --nts "$ke" --nts-ca "$work/cert.pem" --rate "$rate" \
        --duration "$duration" --warmup 0.5 --server-pid "$pid" --json "$json" \
        >"$work/perf.out" 2>"$work/perf.err" ;;
    nts-ke)
      taskset -c 1 "$chime" perf nts-ke --target "$ke" --nts-ca "$work/cert.pem" --rate "$rate" \
        --duration "$duration" --sources 64 --connections 64 --server-pid "$pid" --json "$json" \
        >"$work/perf.out" 2>"$work/perf.err" ;;
  esac || { echo "chime perf failed for $server $mode $rate:" >&2; cat "$work/perf.err" >&2; exit 1; }
}

servers=(chimed chronyd ntpd-rs)
turn=0
for round in $(seq "$rounds"); do
  for mode in $modes; do
    rates=$ntp_rates
    [[ $mode == nts-ke ]] && rates=$ke_rates
    for rate in $rates; do
      for k in 0 1 2; do
        server=${servers[$(((turn + k) % 3))]}
        perf "$server" "$mode" "$round" "$rate"
        printf 'round %s %-6s %-8s %7s/s\n' "$round" "$mode" "$server" "$rate"
      done
      turn=$((turn + 1))
    done
  done
done

python3 - "$out" "$rounds" <<'EOF' | tee "$out/summary.txt"
import glob, json, os, re, sys
out, rounds = sys.argv[1], int(sys.argv[2])
servers = ("chimed", "chronyd", "ntpd-rs")
runs = {}
for path in glob.glob(os.path.join(out, "*.json")):
    m = re.match(r"(chimed|chronyd|ntpd-rs)-(ntp|nts-ke)-round(\d+)-(\d+)\.json", os.path.basename(path))
    if m:
        runs.setdefault((m[1], m[2], int(m[3])), []).append(json.load(open(path))["steps"][0])

def figures(mode, s):
    cpu = (s.get("server_cpu") or {}).get("us_per_reply")
    if mode == "ntp":
        return s["accepted_rate"], s["loss_pct"] + s.get("stale_pct", 0), cpu, s["rtt_us"]["p99"] / 1000
    return s["completed_rate"], s["failed_pct"], cpu, s["latency_ms"]["p99"]

per_core = {}
print("NTS, one server core each. Best: the highest rate with under 1% lost, stale or failed;")
print("CPU: server user + system µs per reply or session there; per core: 1e6 / CPU.")
for mode, unit in (("ntp", "authenticated replies"), ("nts-ke", "NTS-KE sessions")):
    if not any(k[1] == mode for k in runs):
        continue
    print(f"\n{mode} ({unit}/s):")
    for r in range(1, rounds + 1):
        for server in servers:
            steps = [figures(mode, s) for s in runs.get((server, mode, r), [])]
            ok = [f for f in steps if f[1] < 1.0]
            if not ok:
                print(f"  round {r} {server:8}: none under 1%")
                continue
            rate, bad, cpu, p99 = max(ok, key=lambda f: f[0])
            core = 1e6 / cpu if cpu else float("nan")
            per_core.setdefault((mode, server), []).append(core)
            print(f"  round {r} {server:8}: best {rate:9.0f}/s  CPU {cpu or float('nan'):7.2f} µs"
                  f"  per core {core:9.0f}/s  p99 {p99:7.2f} ms")
    for server in servers:
        v = per_core.get((mode, server))
        if v:
            print(f"  {server:8} per core over {len(v)} rounds: {min(v):.0f}-{max(v):.0f}/s")
    c = per_core.get((mode, "chimed"))
    for peer in ("chronyd", "ntpd-rs"):
        p = per_core.get((mode, peer))
        if c and p:
            ratios = [a / b for a, b in zip(c, p)]
            print(f"  chimed / {peer}, round by round: {min(ratios):.2f}-{max(ratios):.2f}x per core")

# The plot: median per-core figure for each server and mode, as bars.
import statistics
bars = [(mode, server, statistics.median(per_core[(mode, server)]))
        for mode in ("ntp", "nts-ke") for server in servers if (mode, server) in per_core]
colours = {"chimed": "#1f77b4", "chronyd": "#ff7f0e", "ntpd-rs": "#2ca02c"}
w, h, left, top, panel = 760, 340, 70, 40, 330
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
       f'<rect width="{w}" height="{h}" fill="white"/>',
       f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">NTS per server core '
       f'(median of {rounds} rounds; 1e6 / server CPU µs)</text>']
for i, (mode, title) in enumerate((("ntp", "authenticated NTP replies/s"), ("nts-ke", "NTS-KE sessions/s"))):
    vals = [b for b in bars if b[0] == mode]
    if not vals:
        continue
    x0 = left + i * (panel + 40)
    top_v = max(v for _, _, v in vals) * 1.15
    base = h - 50
    svg.append(f'<text x="{x0 + panel / 2}" y="{top + 5}" text-anchor="middle">{title}</text>')
    svg.append(f'<line x1="{x0}" y1="{base}" x2="{x0 + panel - 40}" y2="{base}" stroke="black"/>')
    bw = (panel - 40) / len(vals)
    for j, (_, server, v) in enumerate(vals):
        bh = (base - top - 20) * v / top_v
        x = x0 + j * bw + 10
        svg.append(f'<rect x="{x}" y="{base - bh}" width="{bw - 20}" height="{bh}" fill="{colours[server]}"/>')
        svg.append(f'<text x="{x + (bw - 20) / 2}" y="{base - bh - 4}" text-anchor="middle">{v:,.0f}</text>')
        svg.append(f'<text x="{x + (bw - 20) / 2}" y="{base + 16}" text-anchor="middle">{server}</text>')
svg.append("</svg>")
open(os.path.join(out, "nts.svg"), "w").write("\n".join(svg) + "\n")
EOF
