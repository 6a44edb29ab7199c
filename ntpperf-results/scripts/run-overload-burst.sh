#!/usr/bin/env bash
# run-overload-burst.sh: chimed's NTP goodput when offered more than its capacity, for one chimed
# build or several side by side. Each build runs as its own chimed with SHARE% (default 25) of
# CPU 0 through a CPU cgroup of its own with a short period (the 1 ms minimum quota: 4 ms at
# 25%), so that `chime perf` on CPU 1 can offer well past what it answers; a build that is not
# being measured is idle and costs the others nothing.
#
# First a ladder per build finds its capacity: the highest rate whose answers come back with
# under 1% lost or stale. Then, each of ROUNDS rounds, a burst of DURATION seconds at each of
# MULTIPLES times the first build's capacity (default 3), in an order that turns from round to
# round, each build in turn within it (also turning), so that builds meet the same moment of the
# machine: the accepted replies per second (answered within the client interval) against the
# build's capacity, and from chimed's metrics the requests it received and of those the ones it
# shed (received only to go unanswered), and the kernel's drops. summary.txt has the table and,
# with two builds or more, each build's accepted replies against the first's, burst by burst.
#
# Usage: run-overload-burst.sh [--share PCT] [--rounds N] [--duration S] [--out DIR]
#                              [--multiples "1.1 1.5 3"] [--chimed [NAME=]PATH]...
#                              [--chime PATH]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
command_line=$(printf '%q ' "$0" "$@")
share=25 rounds=3 duration=4 multiples=3
out="$(dirname "$here")/overload-burst/$(date -u +%F)"
chime="$repo/target/release/chime"
names=() paths=()
while (($#)); do
  case $1 in
    --share) share=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --multiples) multiples=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --chimed)
      case $2 in
        *=*) names+=("${2%%=*}"); paths+=("${2#*=}") ;;
        *) names+=("chimed${#names[@]}"); paths+=("$2") ;;
      esac
      shift 2 ;;
    --chime) chime=$2; shift 2 ;;
    *) echo "run-overload-burst.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if ((${#paths[@]} == 0)); then names=(chimed); paths=("$repo/target/release/chimed"); fi
mkdir -p "$out"
work=$(mktemp -d)
pids=() cgroups=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # A killed chimed may take a moment to leave its cgroup.
  for c in "${cgroups[@]}"; do
    for _ in 1 2 3 4 5; do rmdir "$c" 2>/dev/null && break; sleep 0.2; done
  done
  rm -rf "$work"
}
trap cleanup EXIT
# shellcheck source=bench-lib.sh
. "$here/bench-lib.sh"

start_upstream

period=$(( (100000 + share - 1) / share ))
quota=$((period * share / 100))
# A cgroup with SHARE% of a CPU, for one build, in `cg` (not printed: a command substitution's
# subshell would lose it from `cgroups`, which cleanup removes).
new_cgroup() {
  local c
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    c=/sys/fs/cgroup/chime-burst.$$.$1
    mkdir "$c"
    echo "$quota $period" >"$c/cpu.max"
  else
    c=/sys/fs/cgroup/cpu/chime-burst.$$.$1
    mkdir "$c"
    echo "$period" >"$c/cpu.cfs_period_us"
    echo "$quota" >"$c/cpu.cfs_quota_us"
  fi
  cgroups+=("$c")
  cg=$c
}

declare -A ntp_port metrics_port pid capacity
{
  echo "date: $(date -u '+%F %T UTC')"
  echo "command: $command_line"
  echo "repository HEAD: $(git -C "$repo" rev-parse --short HEAD)"
  echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), kernel $(uname -r)"
  echo "chimed given ${share}% of CPU 0 (quota ${quota} µs per ${period} µs); chime perf on CPU 1"
} >"$out/setup.txt"
for i in "${!names[@]}"; do
  n=${names[$i]}
  ntp_port[$n]=$(free_port)
  metrics_port[$n]=$(free_port)
  new_cgroup "$n"
  taskset -c 0 "${paths[$i]}" -s "127.0.0.1:$chrony_port" -4 1 -6 0 -a "127.0.0.1:${ntp_port[$n]}" \
    --metrics-address "127.0.0.1:${metrics_port[$n]}" >"$out/$n.log" 2>&1 &
  pid[$n]=$!
  pids+=("${pid[$n]}")
  echo "${pid[$n]}" >"$cg/cgroup.procs"
  commit=$(cat "$(dirname "${paths[$i]}")/COMMIT" 2>/dev/null || echo "?")
  echo "build $n: ${paths[$i]} (commit $commit, sha256 $(sha256sum "${paths[$i]}" | cut -c1-16))" \
    >>"$out/setup.txt"
done
for n in "${names[@]}"; do
  for _ in $(seq 100); do
    "$chime" ntp --json --timeout 0.5 "127.0.0.1:${ntp_port[$n]}" 2>/dev/null |
      grep -q '"synchronised":true' && break
    sleep 0.1
  done
done
cat "$out/setup.txt"

for n in "${names[@]}"; do
  taskset -c 1 "$chime" perf ntp --target "127.0.0.1:${ntp_port[$n]}" --steps 10000:1.1:30 \
    --duration 2 --max-loss 5 --server-pid "${pid[$n]}" --json "$out/ladder-$n.json" \
    >"$out/ladder-$n.txt"
  capacity[$n]=$(python3 - "$out/ladder-$n.json" <<'PY'
import json, sys
steps = json.load(open(sys.argv[1]))["steps"]
ok = [s for s in steps if s["loss_pct"] + s.get("stale_pct", 0) < 1.0]
print(int(max(s["accepted_rate"] for s in ok)) if ok else 0)
PY
)
  echo "capacity of $n: ${capacity[$n]} accepted replies/s (the ladder's best step under 1% lost or stale)"
  echo "$n ${capacity[$n]}" >>"$out/capacity.txt"
done
base=${capacity[${names[0]}]}

# A build's NTP counters, summed over its threads: received, shed, kernel drops.
counters() {
  python3 - "$1" <<'PY'
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
nm=${#mults[@]} nb=${#names[@]}
for r in $(seq "$rounds"); do
  for i in $(seq 0 $((nm - 1))); do
    # The order turns: round r starts at the r-th multiple and the r-th build.
    m=${mults[$(( (i + r - 1) % nm ))]}
    rate=$(python3 -c "print(round($m * $base))")
    for j in $(seq 0 $((nb - 1))); do
      n=${names[$(( (j + r - 1) % nb ))]}
      before=$(counters "${metrics_port[$n]}")
      taskset -c 1 "$chime" perf ntp --target "127.0.0.1:${ntp_port[$n]}" --rate "$rate" \
        --duration "$duration" --warmup 0 --server-pid "${pid[$n]}" \
        --json "$out/burst-$n-x$m-round$r.json" >"$out/burst-$n-x$m-round$r.txt"
      after=$(counters "${metrics_port[$n]}")
      echo "$n $m $r $before $after" >>"$out/counters.txt"
      sleep 1
    done
  done
done
python3 - "$out" "$rounds" "$multiples" "${names[@]}" <<'PY' | tee "$out/summary.txt"
import json, sys
out, rounds, mults, names = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
cap = dict(l.split() for l in open(f"{out}/capacity.txt"))
counts = {}
for line in open(f"{out}/counters.txt"):
    n, m, r, *v = line.split()
    b, a = list(map(int, v[:3])), list(map(int, v[3:]))
    counts[(n, m, int(r))] = [y - x for x, y in zip(b, a)]
print("capacity: " + ", ".join(f"{n} {cap[n]}/s" for n in names)
      + f"; each burst offers a multiple of {names[0]}'s")
print("build    multiple round   offered/s  accepted/s  % of its capacity  received/s  shed/s"
      "  kernel drops/s  p99 µs")
acc = {}
for n in names:
    for m in mults:
        for r in range(1, rounds + 1):
            s = json.load(open(f"{out}/burst-{n}-x{m}-round{r}.json"))["steps"][0]
            acc[(n, m, r)] = s["accepted_rate"]
            rec, shed, drops = (c / s["duration"] for c in counts[(n, m, r)])
            print(f"{n:<8} {m:>8} {r:>5} {s['sent_rate']:>11.0f} {s['accepted_rate']:>11.0f} "
                  f"{100 * s['accepted_rate'] / int(cap[n]):>17.1f}% {rec:>11.0f} {shed:>7.0f} "
                  f"{drops:>15.0f} {s['rtt_us']['p99']:>7.0f}")
for n in names[1:]:
    print(f"\n{n} / {names[0]}, accepted replies, burst by burst (the two a few seconds apart):")
    for m in mults:
        ratios = [acc[(n, m, r)] / acc[(names[0], m, r)] for r in range(1, rounds + 1)]
        mean_b = sum(acc[(n, m, r)] for r in range(1, rounds + 1))
        mean_a = sum(acc[(names[0], m, r)] for r in range(1, rounds + 1))
        print(f"  x{m}: {mean_b / mean_a:.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})")
PY
