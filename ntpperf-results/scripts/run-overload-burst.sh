#!/usr/bin/env bash
# run-overload-burst.sh: chimed's NTP goodput when offered more than its capacity. chimed gets
# SHARE% (default 25) of CPU 0 through a CPU cgroup with a short period (the 1 ms minimum quota:
# 4 ms at 25%), so that `chime perf` on CPU 1 can offer well past what it answers. First a ladder
# finds its capacity: the highest rate whose answers come back with under 1% lost or stale. Then,
# each of ROUNDS rounds, a burst of DURATION seconds at each of MULTIPLES times that (default 3),
# in an order that turns from round to round: the accepted replies per second (answered within
# the client interval) against the capacity, and from chimed's metrics the requests it received
# and of those the ones it shed (received only to go unanswered), and the kernel's drops. The
# claim to check: goodput held near capacity, because chimed sheds a standing queue instead of
# answering everything late.
#
# Usage: run-overload-burst.sh [--share PCT] [--rounds N] [--duration S] [--out DIR]
#                              [--multiples "1.1 1.5 3"] [--chimed PATH] [--chime PATH]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
share=25 rounds=3 duration=4 multiples=3
out="$(dirname "$here")/overload-burst/$(date -u +%F)"
chimed="$repo/target/release/chimed" chime="$repo/target/release/chime"
while (($#)); do
  case $1 in
    --share) share=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --multiples) multiples=$2; shift 2 ;;
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
metrics_port=$(free_port)
taskset -c 0 "$chimed" -s "127.0.0.1:$chrony_port" -4 1 -6 0 -a "127.0.0.1:$ntp_port" \
  --metrics-address "127.0.0.1:$metrics_port" >"$work/chimed.log" 2>&1 &
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
# chimed's NTP counters, summed over its threads: received, shed, kernel drops.
counters() {
  python3 - "$metrics_port" <<'PY'
import sys, urllib.request
page = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
def total(name):
    rows = [l for l in page.splitlines() if l.startswith(name + "{") and 'service="ntp"' in l]
    if not rows:
        sys.exit(f"run-overload-burst.sh: no {name} for ntp in chimed's metrics")
    return sum(float(l.rsplit(" ", 1)[1]) for l in rows)
print(" ".join(str(int(total(n))) for n in
               ("chimed_requests_received_total", "chimed_requests_shed_total",
                "chimed_kernel_receive_drops_total")))
PY
}
read -ra mults <<<"$multiples"
for r in $(seq "$rounds"); do
  # The order turns: round r starts at the r-th multiple.
  n=${#mults[@]}
  for i in $(seq 0 $((n - 1))); do
    m=${mults[$(( (i + r - 1) % n ))]}
    rate=$(python3 -c "print(round($m * $capacity))")
    before=$(counters)
    taskset -c 1 "$chime" perf ntp --target "127.0.0.1:$ntp_port" --rate "$rate" \
      --duration "$duration" --warmup 0 --server-pid "$pid" --json "$out/burst-x$m-round$r.json" \
      >"$out/burst-x$m-round$r.txt"
    after=$(counters)
    echo "$m $r $before $after" >>"$out/counters.txt"
    sleep 1
  done
done
python3 - "$out" "$rounds" "$capacity" "$multiples" <<'PY' | tee "$out/summary.txt"
import json, sys
out, rounds, capacity, mults = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
counts = {}
for line in open(f"{out}/counters.txt"):
    m, r, *v = line.split()
    b, a = list(map(int, v[:3])), list(map(int, v[3:]))
    counts[(m, int(r))] = [y - x for x, y in zip(b, a)]
print(f"capacity {capacity}/s")
print("multiple round   offered/s  accepted/s  % of capacity  received/s  shed/s  kernel drops/s  p99 µs")
for m in mults:
    for r in range(1, rounds + 1):
        s = json.load(open(f"{out}/burst-x{m}-round{r}.json"))["steps"][0]
        rec, shed, drops = (c / s["duration"] for c in counts[(m, r)])
        print(f"{m:>8} {r:>5} {s['sent_rate']:>11.0f} {s['accepted_rate']:>11.0f} "
              f"{100 * s['accepted_rate'] / capacity:>13.1f}% {rec:>11.0f} {shed:>7.0f} "
              f"{drops:>15.0f} {s['rtt_us']['p99']:>7.0f}")
PY
