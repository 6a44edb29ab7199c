#!/usr/bin/env bash
# NTS over NTPv4 against NTS over the NTPv5 draft, per core, side by side: one chimed (one NTP
# thread, CPU 0) with --ntpv5 and NTS, chime perf ntp --nts on CPU 1, six rounds alternating.
set -euo pipefail
BIN=${BIN:?release binaries}
REPO=${REPO:?the repository BIN was built from}
OUT=${OUT:?output dir}
ROUNDS=${ROUNDS:-6}
RATE=${RATE:-80000}
mkdir -p "$OUT"
work=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
CP=$(free_port); NP=$(free_port); KP=$(free_port)
cat > "$work/chrony.conf" <<C
port $CP
cmdport 0
bindaddress 127.0.0.1
local stratum 2
allow 127.0.0.1
pidfile $work/chronyd.pid
driftfile $work/drift
C
chronyd -x -d -f "$work/chrony.conf" > "$work/chronyd.log" 2>&1 &
CHRONY=$!
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$work/key.pem" \
  -out "$work/cert.pem" -days 2 -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
  -addext basicConstraints=critical,CA:FALSE 2>/dev/null
chmod 600 "$work/key.pem"
taskset -c 0 "$BIN/chimed" -s 127.0.0.1:$CP -4 1 -6 0 -a 127.0.0.1:$NP --ntpv5 \
  --nts-certificate "$work/cert.pem" --nts-private-key "$work/key.pem" --nts-ke-address 127.0.0.1:$KP \
  --nts-ke-threads 1 > "$work/chimed.log" 2>&1 &
CHIMED=$!
trap 'kill $CHIMED $CHRONY 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do grep -q "synchronised: stratum" "$work/chimed.log" && break; sleep 0.1; done
grep -q "synchronised: stratum" "$work/chimed.log" || { echo "chimed not synchronised" >&2; cat "$work/chimed.log" >&2; exit 1; }
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "commit: $(git -C "${REPO:?the repository the binaries were built from}" rev-parse --short HEAD)"
  echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), kernel $(uname -r)"
  echo "chimed: taskset -c 0 chimed -s 127.0.0.1:CHRONY -4 1 -6 0 -a 127.0.0.1:NTP --ntpv5 --nts-certificate cert.pem --nts-private-key key.pem --nts-ke-address 127.0.0.1:KE --nts-ke-threads 1"
  echo "each run: taskset -c 1 chime perf ntp --nts 127.0.0.1:KE --nts-ca cert.pem --rate $RATE --duration 3 --warmup 0.5 --server-pid PID [--ntp-version 5] --json FILE"
} > "$OUT/setup.txt"
: > "$OUT/rounds.txt"
for r in $(seq "$ROUNDS"); do
  if (( r % 2 )); then order="4 5"; else order="5 4"; fi
  for v in $order; do
    extra=(); [[ $v == 5 ]] && extra=(--ntp-version 5)
    json="$OUT/v$v-round$r.json"
    taskset -c 1 "$BIN/chime" perf ntp --nts 127.0.0.1:$KP --nts-ca "$work/cert.pem" --rate "$RATE" \
      --duration 3 --warmup 0.5 --server-pid $CHIMED "${extra[@]}" --json "$json" > "$work/perf.out" 2>&1 ||
      { cat "$work/perf.out" >&2; exit 1; }
    python3 - "$json" "$r" "$v" >> "$OUT/rounds.txt" <<'P'
import json, sys
d = json.load(open(sys.argv[1])); s = d["steps"][0]; c = s["server_cpu"]
print(f"round {sys.argv[2]} v{sys.argv[3]}: accepted {s['accepted_rate']:.0f}/s loss {s['loss_pct']:.2f}% "
      f"invalid {s['invalid']} refused {s['refused']} CPU {c['us_per_reply']:.3f} us/reply "
      f"(kernel {c['kernel_us_per_reply']:.3f}) per core {1e6 / c['us_per_reply']:.0f}/s")
P
    tail -1 "$OUT/rounds.txt"
  done
done
kill -TERM $CHIMED; wait $CHIMED || true
grep -E "totals at exit" "$work/chimed.log" | sed 's/^[^ ]* *INFO *//' > "$OUT/chimed-totals.txt" || true
