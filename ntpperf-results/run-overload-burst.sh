#!/usr/bin/env bash
# run-overload-burst.sh: chimed's NTP goodput when offered three times its capacity. chimed gets
# SHARE% (default 25) of CPU 0 through a CPU cgroup with a short period (the 1 ms minimum quota:
# 4 ms at 25%), so that `chime perf` on CPU 1 can offer well past what it answers. First a ladder
# finds its capacity: the highest rate whose answers come back with under 1% lost or stale. Then
# ROUNDS bursts of DURATION seconds at three times that: the accepted replies per second (answered
# within the client interval) against the capacity. The claim to check: goodput held at 90% or
# more, because chimed sheds a standing queue instead of answering everything late.
#
# Usage: run-overload-burst.sh [--share PCT] [--rounds N] [--duration S] [--out DIR]
#                              [--chimed PATH] [--chime PATH]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
share=25 rounds=3 duration=4
out="$here/overload-burst"
chimed="$repo/target/release/chimed" chime="$repo/target/release/chime"
while (($#)); do
  case $1 in
    --share) share=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --chimed) chimed=$2; shift 2 ;;
    --chime) chime=$2; shift 2 ;;
    *) echo "run-overload-burst.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
work=$(mktemp -d)
pids=() cgroup=""
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -z "$cgroup" ] || rmdir "$cgroup" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
chrony_port=$(free_port)
printf 'port %s\nbindaddress 127.0.0.1\nallow 127.0.0.1\nlocal stratum 3\ncmdport 0\npidfile %s/pid\ndriftfile %s/drift\n' \
  "$chrony_port" "$work" "$work" >"$work/chrony.conf"
/usr/sbin/chronyd -x -d -u root -f "$work/chrony.conf" >/dev/null 2>&1 &
pids+=($!)

period=$(( (100000 + share - 1) / share ))
quota=$((period * share / 100))
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  cgroup=/sys/fs/cgroup/chime-burst.$$
  mkdir "$cgroup"
  echo "$quota $period" >"$cgroup/cpu.max"
else
  cgroup=/sys/fs/cgroup/cpu/chime-burst.$$
  mkdir "$cgroup"
  echo "$period" >"$cgroup/cpu.cfs_period_us"
  echo "$quota" >"$cgroup/cpu.cfs_quota_us"
fi
ntp_port=$(free_port)
taskset -c 0 "$chimed" -s "127.0.0.1:$chrony_port" -4 1 -6 0 -a "127.0.0.1:$ntp_port" \
  >"$work/chimed.log" 2>&1 &
pid=$!
pids+=("$pid")
echo "$pid" >"$cgroup/cgroup.procs"
for _ in $(seq 100); do
  "$chime" ntp --json --timeout 0.5 "127.0.0.1:$ntp_port" 2>/dev/null | grep -q '"synchronised":true' && break
  sleep 0.1
done

echo "chimed given ${share}% of CPU 0 (quota ${quota} µs per ${period} µs)"
taskset -c 1 "$chime" perf ntp --target "127.0.0.1:$ntp_port" --steps 10000:1.1:30 --duration 2 \
  --max-loss 5 --server-pid "$pid" --json "$out/ladder.json" >"$out/ladder.txt"
capacity=$(python3 - "$out/ladder.json" <<'PY'
import json, sys
steps = json.load(open(sys.argv[1]))["steps"]
ok = [s for s in steps if s["loss_pct"] + s.get("stale_pct", 0) < 1.0]
print(int(max(s["accepted_rate"] for s in ok)) if ok else 0)
PY
)
echo "capacity: $capacity accepted replies/s (the ladder's best step under 1% lost or stale)"
burst=$((3 * capacity))
for r in $(seq "$rounds"); do
  taskset -c 1 "$chime" perf ntp --target "127.0.0.1:$ntp_port" --rate "$burst" \
    --duration "$duration" --warmup 0 --server-pid "$pid" --json "$out/burst-round$r.json" \
    >"$out/burst-round$r.txt"
done
python3 - "$out" "$rounds" "$capacity" <<'PY' | tee "$out/summary.txt"
import json, sys
out, rounds, capacity = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print(f"capacity {capacity}/s; offered {3 * capacity}/s in each burst")
for r in range(1, rounds + 1):
    s = json.load(open(f"{out}/burst-round{r}.json"))["steps"][0]
    print(f"round {r}: sent {s['sent_rate']:.0f}/s, answered {s['answered_rate']:.0f}/s, "
          f"accepted {s['accepted_rate']:.0f}/s = {100 * s['accepted_rate'] / capacity:.1f}% "
          f"of capacity; stale {s.get('stale_pct', 0):.2f}%, p99 {s['rtt_us']['p99']:.0f} µs")
PY
