#!/usr/bin/env bash
# What a careful client measures from chronyd itself, from chimed A and from chimed B, side by
# side in one run: each round, for each target in rotated order, a chronyd client (-x, kernel
# timestamps, the source noselect so that it never corrects itself and every offset is from the
# system clock) polls the target 16 times a second until it has logged MEASUREMENTS measurements;
# the offsets it logged give the median and the spread (p90 - p10). The chronyd both chimeds
# mirror serves the system clock (-x, a local reference): the steady state, where B must not be
# noisier than A. (chronyd logs offsets to three significant digits, so an upstream far from the
# system clock is measured by crates/chimed/tests/served_time.rs instead.)
set -euo pipefail
BIN_A=${BIN_A:?release binaries of A}
BIN_B=${BIN_B:?release binaries of B}
REPO=${REPO:?the repository B was built from}
OUT=${OUT:?output dir}
ROUNDS=${ROUNDS:-6}
WARMUP=${WARMUP:-70}
MEASUREMENTS=${MEASUREMENTS:-100}
CHRONYD=${CHRONYD:-/usr/sbin/chronyd}
mkdir -p "$OUT"
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
CP=$(free_port)
source="local stratum 2"
cat > "$work/chrony.conf" <<C
port $CP
cmdport 0
bindaddress 127.0.0.1
allow 127.0.0.1
$source
pidfile $work/chronyd.pid
driftfile $work/drift
C
"$CHRONYD" -x -d -u root -f "$work/chrony.conf" > "$work/chronyd.log" 2>&1 &
pids+=($!)
AP=$(free_port); BP=$(free_port)
"$BIN_A/chimed" -s 127.0.0.1:$CP -4 1 -6 0 -a 127.0.0.1:$AP > "$work/a.log" 2>&1 &
pids+=($!)
"$BIN_B/chimed" -s 127.0.0.1:$CP -4 1 -6 0 -a 127.0.0.1:$BP > "$work/b.log" 2>&1 &
pids+=($!)
for log in a b; do
  for _ in $(seq 300); do grep -q "synchronised: stratum" "$work/$log.log" && break; sleep 0.1; done
  grep -q "synchronised: stratum" "$work/$log.log" || { echo "chimed $log not synchronised" >&2; cat "$work/$log.log" >&2; exit 1; }
done
# WARMUP polls more (70 by default), so that B's follower has its whole history of 64.
sleep "$WARMUP"
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "commit of B: $(git -C "$REPO" rev-parse --short HEAD)"
  echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), kernel $(uname -r)"
  echo "upstream: chronyd $("$CHRONYD" --version | awk '{print $4}') -x, $source"
  echo "A and B: chimed -s 127.0.0.1:CHRONY -4 1 -6 0 -a 127.0.0.1:PORT"
  echo "client: chronyd -x -d 'server 127.0.0.1 port PORT minpoll -4 maxpoll -4 noselect' 'log measurements', $MEASUREMENTS measurements a target a round"
} > "$OUT/setup.txt"
: > "$OUT/rounds.txt"
measure() { # name port round
  local dir="$work/client-$1-$3"
  mkdir -p "$dir"
  "$CHRONYD" -x -d -u root "server 127.0.0.1 port $2 minpoll -4 maxpoll -4 noselect" "port 0" "cmdport 0" \
    "pidfile $dir/pid" "driftfile $dir/drift" "logdir $dir" "log measurements" > "$dir/out" 2>&1 &
  local client=$!
  for _ in $(seq 600); do
    (( $(grep -c '^[0-9]' "$dir/measurements.log" 2>/dev/null || echo 0) >= MEASUREMENTS )) && break
    sleep 0.1
  done
  kill $client; wait $client 2>/dev/null || true
  python3 - "$dir/measurements.log" "$1" "$3" "$MEASUREMENTS" >> "$OUT/rounds.txt" <<'P'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l[:1].isdigit()][: int(sys.argv[4])]
off = sorted(float(r[11]) for r in rows)
q = statistics.quantiles(off, n=10)
print(f"round {sys.argv[3]} {sys.argv[2]}: n {len(off)} median {statistics.median(off) * 1e6:+.1f} us "
      f"p10 {q[0] * 1e6:+.1f} p90 {q[8] * 1e6:+.1f} spread {(q[8] - q[0]) * 1e6:.1f} us")
P
  tail -1 "$OUT/rounds.txt"
}
targets=("chronyd $CP" "A $AP" "B $BP")
for r in $(seq "$ROUNDS"); do
  for k in 0 1 2; do
    read -r name port <<< "${targets[$(( (k + r) % 3 ))]}"
    measure "$name" "$port" "$r"
  done
done
python3 - "$OUT/rounds.txt" > "$OUT/summary.txt" <<'P'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"round (\d+) (\S+): .* median ([-+\d.]+) us .* spread ([\d.]+) us", line)
    rows.setdefault(m[2], []).append((float(m[3]), float(m[4])))
for name, v in rows.items():
    print(f"{name}: median offset {statistics.mean(x[0] for x in v):+.1f} us (mean of rounds), "
          f"spread p90-p10 {statistics.mean(x[1] for x in v):.1f} us (mean of rounds)")
a = [x[1] for x in rows["A"]]; b = [x[1] for x in rows["B"]]
print("spread B/A by round: " + ", ".join(f"{y / x:.2f}" for x, y in zip(a, b))
      + f"; on the means {statistics.mean(b) / statistics.mean(a):.3f}")
P
cat "$OUT/summary.txt"
