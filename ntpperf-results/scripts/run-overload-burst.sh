#!/usr/bin/env bash
# run-overload-burst.sh: chimed's goodput when offered more than its capacity, NTP over UDP or
# Roughtime over TCP (`--service`), for one chimed build or several side by side. Each build runs
# as its own chimed with SHARE% (default 25) of CPU 0 through a CPU cgroup of its own with a short
# period (the 1 ms minimum quota: 4 ms at 25%), so that `chime perf` on CPU 1 can offer well past
# what it answers; a build that is not being measured is idle and costs the others nothing.
#
# First a ladder per build finds its capacity: the most replies it accepts per second (answered
# within the client interval), however much is offered (the mean of its three best steps). Then,
# each of ROUNDS rounds, a shorter ladder around it finds each build's capacity again (this shared
# machine drifts by tens of percent from minute to minute), and a burst of DURATION seconds
# follows at each of MULTIPLES times the build's own capacity measured just before it (default
# 3), in an order that turns from round to round, each build in turn within it (also turning), so
# that builds meet the same moment of the machine. After each burst the short ladder runs again,
# and a burst is judged against the mean of the capacities measured just before and just after
# it. Reported: the accepted replies per second (answered within the client interval) against
# that capacity; the load the burst met, offered against that capacity (drift can make a "1.1x"
# burst meet less than the capacity, when no server can accept more than was offered); and from
# chimed's metrics the requests it received and of those the ones it shed
# (received only to go unanswered), and the kernel's drops, and its resident memory after the
# burst; and from `chime perf` the server's CPU (per cent of a core, and per reply: on a shared
# machine the cost of a reply drifts from one burst to the next, and the capacity with it).
# summary.txt has the table and, with two builds or more, each build's accepted replies
# against the first's, burst by burst.
#
# Usage: run-overload-burst.sh [--service ntp|roughtime-tcp] [--share PCT] [--rounds N]
#                              [--duration S] [--out DIR] [--multiples "1.1 1.5 3"]
#                              [--chimed [NAME=]PATH]... [--chime PATH]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
command_line=$(printf '%q ' "$0" "$@")
service=ntp share=25 rounds=3 duration=4 multiples=3
out=
chime="$repo/target/release/chime"
names=() paths=()
while (($#)); do
  case $1 in
    --service) service=$2; shift 2 ;;
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
case $service in
  ntp | roughtime-tcp) ;;
  *) echo "run-overload-burst.sh: --service is ntp or roughtime-tcp, not $service" >&2; exit 2 ;;
esac
out=${out:-"$(dirname "$here")/overload-burst/$(date -u +%F)-$service"}
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

declare -A port metrics_port pid capacity
# What each service needs: chimed's flags beyond NTP's, a query that succeeds once it serves,
# `chime perf`'s protocol and flags, and the metrics series its counts carry.
case $service in
  ntp)
    serve() { :; }
    ready() { "$chime" ntp --json --timeout 0.5 "127.0.0.1:$1" 2>/dev/null | grep -q '"synchronised":true'; }
    perf=(perf ntp)
    series='service="ntp"'
    ;;
  roughtime-tcp)
    serve() {
      echo --roughtime-key "$work/rt.key" --roughtime-ipv4-threads 1 --roughtime-ipv6-threads 0 \
        --roughtime-ipv4-address "127.0.0.1:$1" --roughtime-tcp-connections 4096 \
        --roughtime-tcp-per-address 4096
    }
    ready() { "$chime" roughtime --tcp --public-key "$public" "127.0.0.1:$1" >/dev/null 2>&1; }
    perf=(perf roughtime --tcp --tcp-connections 8 --batch-size 64 --public-key "$public" --verify-every 1000)
    series='service="roughtime",family="tcp"'
    ;;
esac
{
  echo "date: $(date -u '+%F %T UTC')"
  echo "command: $command_line"
  echo "repository HEAD: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null ||
    echo "none (the scripts were run from a copy; each build's commit is below)")"
  echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), kernel $(uname -r)"
  echo "service: $service; chimed given ${share}% of CPU 0 (quota ${quota} µs per ${period} µs); chime perf on CPU 1"
} >"$out/setup.txt"
for i in "${!names[@]}"; do
  n=${names[$i]}
  port[$n]=$(free_port)
  metrics_port[$n]=$(free_port)
  new_cgroup "$n"
  ntp_port=${port[$n]}
  [[ $service == ntp ]] || ntp_port=$(free_port)
  # shellcheck disable=SC2046 # serve's words are flags
  taskset -c 0 "${paths[$i]}" -s "127.0.0.1:$chrony_port" -4 1 -6 0 -a "127.0.0.1:$ntp_port" \
    $(serve "${port[$n]}") --metrics-address "127.0.0.1:${metrics_port[$n]}" >"$work/$n.log" 2>&1 &
  pid[$n]=$!
  pids+=("${pid[$n]}")
  echo "${pid[$n]}" >"$cg/cgroup.procs"
  commit=$(cat "$(dirname "${paths[$i]}")/COMMIT" 2>/dev/null || echo "?")
  echo "build $n: ${paths[$i]} (commit $commit, sha256 $(sha256sum "${paths[$i]}" | cut -c1-16))" \
    >>"$out/setup.txt"
done
for n in "${names[@]}"; do
  for _ in $(seq 100); do ready "${port[$n]}" && break; sleep 0.1; done
  ready "${port[$n]}" || { echo "run-overload-burst.sh: $n does not serve" >&2; cat "$work/$n.log" >&2; exit 1; }
done
cat "$out/setup.txt"

# What the build can answer in time, however much is offered (a batching server answers more
# under load than where its losses begin): the mean of the three steps of the ladder in JSON
# file $1 that accepted the most replies per second (the most alone would favour a lucky step).
most_accepted() {
  python3 - "$1" <<'PY'
import json, sys
rates = sorted(s["accepted_rate"] for s in json.load(open(sys.argv[1]))["steps"])
print(int(sum(rates[-3:]) / len(rates[-3:])))
PY
}
for n in "${names[@]}"; do
  taskset -c 1 "$chime" "${perf[@]}" --target "127.0.0.1:${port[$n]}" --steps 10000:1.1:40 \
    --duration 2 --max-loss 50 --server-pid "${pid[$n]}" --json "$out/ladder-$n.json" \
    >"$out/ladder-$n.txt"
  capacity[$n]=$(most_accepted "$out/ladder-$n.json")
  echo "capacity of $n: ${capacity[$n]} accepted replies/s (the mean of the ladder's three best steps)"
  ((capacity[$n] > 0)) || { echo "run-overload-burst.sh: $n has no capacity" >&2; exit 1; }
done

# A build's counters, summed over its threads: received, shed, kernel drops.
counters() {
  python3 - "$1" "$series" <<'PY'
import sys, urllib.request
page = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
def total(name):
    rows = [l for l in page.splitlines() if l.startswith(name + "{") and sys.argv[2] in l]
    if not rows:
        sys.exit(f"run-overload-burst.sh: no {name} with {sys.argv[2]} in chimed's metrics")
    return sum(float(l.rsplit(" ", 1)[1]) for l in rows)
print(" ".join(str(int(total(n))) for n in
               ("chimed_requests_received_total", "chimed_requests_shed_total",
                "chimed_kernel_receive_drops_total")))
PY
}
rss_kib() { sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\).*/\1/p' "/proc/$1/status"; }
read -ra mults <<<"$multiples"
nm=${#mults[@]} nb=${#names[@]}
# A short ladder from 75% to 127% of the build's first capacity, into JSON file $2: what build
# $1 accepts now, however much is offered.
probe() {
  local start
  start=$(python3 -c "print(round(0.75 * ${capacity[$1]}))")
  taskset -c 1 "$chime" "${perf[@]}" --target "127.0.0.1:${port[$1]}" --steps "$start:1.06:10" \
    --duration 1 --warmup 0.5 --max-loss 100 --server-pid "${pid[$1]}" --json "$2" >"${2%.json}.txt"
  most_accepted "$2"
}
declare -A latest
for r in $(seq "$rounds"); do
  # This round's capacity of each build, which sets the rates offered.
  for j in $(seq 0 $((nb - 1))); do
    n=${names[$(( (j + r - 1) % nb ))]}
    latest[$n]=$(probe "$n" "$out/probe-$n-round$r.json")
    echo "$n $r ${latest[$n]}" >>"$out/round-capacity.txt"
  done
  for i in $(seq 0 $((nm - 1))); do
    # The order turns: round r starts at the r-th multiple and the r-th build.
    m=${mults[$(( (i + r - 1) % nm ))]}
    for j in $(seq 0 $((nb - 1))); do
      n=${names[$(( (j + r - 1) % nb ))]}
      # A multiple of what this build accepted just before: of itself, at this moment.
      base=${latest[$n]}
      ((base > 0)) || base=${capacity[$n]}
      rate=$(python3 -c "print(round($m * $base))")
      before=$(counters "${metrics_port[$n]}")
      taskset -c 1 "$chime" "${perf[@]}" --target "127.0.0.1:${port[$n]}" --rate "$rate" \
        --duration "$duration" --warmup 0 --server-pid "${pid[$n]}" \
        --json "$out/burst-$n-x$m-round$r.json" >"$out/burst-$n-x$m-round$r.txt"
      after=$(counters "${metrics_port[$n]}")
      echo "$n $m $r $before $after $(rss_kib "${pid[$n]}")" >>"$out/counters.txt"
      # The capacity the burst met: the mean of the probes just before and just after it, so
      # that a burst is judged against the machine's moment rather than the round's start.
      sleep 1
      now=$(probe "$n" "$out/probe-$n-x$m-round$r-after.json")
      echo "$n $m $r ${latest[$n]} $now" >>"$out/burst-capacity.txt"
      latest[$n]=$now
    done
  done
done
for n in "${names[@]}"; do
  echo "$n peak RSS $(sed -n 's/^VmHWM:[[:space:]]*//p' "/proc/${pid[$n]}/status")" >>"$out/setup.txt"
done
python3 - "$out" "$rounds" "$multiples" "${names[@]}" <<'PY' | tee "$out/summary.txt"
import json, sys
out, rounds, mults, names = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
cap, around = {}, {}
for line in open(f"{out}/round-capacity.txt"):
    n, r, c = line.split()
    cap[(n, int(r))] = int(c)
for line in open(f"{out}/burst-capacity.txt"):
    n, m, r, before, after = line.split()
    around[(n, m, int(r))] = (int(before), int(after))
counts, rss = {}, {}
for line in open(f"{out}/counters.txt"):
    n, m, r, *v = line.split()
    b, a = list(map(int, v[:3])), list(map(int, v[3:6]))
    counts[(n, m, int(r))] = [y - x for x, y in zip(b, a)]
    rss[(n, m, int(r))] = int(v[6]) / 1024
print("Each round measures each build's capacity again (the mean of the three best steps of a "
      "ladder around its first); each burst offers a multiple of the build's capacity measured "
      "just before it, and is judged against the build's capacity just before and just after it "
      "(their mean). 'met' is the load the burst met: offered over that capacity.")
print("build    multiple round  before/s   after/s  offered/s   met  accepted/s  % of capacity"
      "  received/s  shed/s  kernel drops/s  p99 µs  RSS MiB  CPU %  µs/reply")
acc, worst, met_all, cost = {}, {}, {}, {}
def pct(x, c):
    return 100 * x / c if c else float("nan")
for n in names:
    for m in mults:
        for r in range(1, rounds + 1):
            s = json.load(open(f"{out}/burst-{n}-x{m}-round{r}.json"))["steps"][0]
            acc[(n, m, r)] = s["accepted_rate"]
            rec, shed, drops = (c / s["duration"] for c in counts[(n, m, r)])
            before, after = around[(n, m, r)]
            p = pct(s["accepted_rate"], (before + after) / 2)
            met = s["sent_rate"] / ((before + after) / 2)
            worst[(n, m)] = min(worst.get((n, m), p), p)
            met_all.setdefault((n, m), []).append(met)
            cpu = s.get("server_cpu") or {}
            cost[(n, m)] = cost.get((n, m), []) + [cpu.get("us_per_reply", float("nan"))]
            print(f"{n:<8} {m:>8} {r:>5} {before:>9} {after:>9} {s['sent_rate']:>10.0f} "
                  f"{met:>5.2f} {s['accepted_rate']:>11.0f} {p:>13.1f}% {rec:>11.0f} {shed:>7.0f} "
                  f"{drops:>15.0f} {s['rtt_us']['p99']:>7.0f} {rss[(n, m, r)]:>8.1f} "
                  f"{cpu.get('percent', float('nan')):>6.1f} {cost[(n, m)][-1]:>9.2f}")
print("\nLeast accepted, as a share of the capacity around the burst, over the rounds:")
for (n, m), p in worst.items():
    met = met_all[(n, m)]
    c = cost[(n, m)]
    print(f"  {n} x{m}: {p:.1f}% (the load met: {min(met):.2f}-{max(met):.2f} times the capacity; "
          f"the server's CPU per reply {min(c):.2f}-{max(c):.2f} µs)")
for n in names[1:]:
    print(f"\n{n} / {names[0]}, accepted replies, burst by burst (the two a few seconds apart):")
    for m in mults:
        ratios = [acc[(n, m, r)] / acc[(names[0], m, r)] for r in range(1, rounds + 1)]
        mean_b = sum(acc[(n, m, r)] for r in range(1, rounds + 1))
        mean_a = sum(acc[(names[0], m, r)] for r in range(1, rounds + 1))
        print(f"  x{m}: {mean_b / mean_a:.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})")
PY
