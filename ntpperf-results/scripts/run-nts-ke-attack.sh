#!/usr/bin/env bash
# run-nts-ke-attack.sh: how well honest NTS-KE clients are served while a distributed attack holds
# the server's connections, chimed builds against chronyd, on loopback. Each server runs on CPU 0
# (taskset -c 0; chimed with --nts-ke-threads 1 and its default session limits, chronyd with
# `ntsprocesses 1`); the attacker and the honest client share CPU 1.
#
# Per server and round, in an order that turns from round to round, a fresh server:
#   baseline  `chime perf nts-ke` alone: 5 new sessions/s from 127.0.0.1 for --baseline seconds
#   attack    nts-ke-attack.py for --attack seconds: --connections hostile connections (a third
#             each garbage, drip and silent-after-handshake) from --sources addresses 127.0.1.1 up,
#             each reopened as soon as it closes; --warmup seconds in, the same honest client for
#             --good seconds (each session may take 3 s, connect to last record)
#
# Figures (summary.txt, a row per server and round): good sessions completed / tried, as a
# percentage, and the p50 and p99 time of the completed ones, with and without the attack; how the
# failed ones failed (chime perf's failure kinds); the hostile connections the attacker opened
# (TCP connects that succeeded) over the attack; the server's CPU time over the attack (user +
# system from /proc, its helper processes included) per 1000 of them; its resident memory peak
# (VmHWM, summed over its processes) at the end; and the attacker's CPU share (near 100% means its
# core, not the server, bounded the attack). The good client shares the attacker's core, so its
# session times carry some scheduling delay of its own under the attack; compare servers with each
# other, not with the baseline alone.
#
# Usage: run-nts-ke-attack.sh [--rounds N] [--out DIR] [--chime PATH] [--chimed PATH]
#                             [--server NAME=PATH]... [--attack S] [--warmup S] [--good S]
#                             [--baseline S] [--connections N] [--sources N]
#
# Servers: each --server adds one, NAME being its label in the results (letters, digits, . _ -);
# PATH a chimed binary, or chronyd (any path ending in chronyd, or NAME chronyd with PATH left
# out: `--server chronyd`). Without --server: `chimed` (the --chimed binary) and `chronyd`. To
# compare two chimed builds with chronyd:
#   run-nts-ke-attack.sh --chime /tmp/chime-A/chime --server A=/tmp/chime-A/chimed \
#     --server B=/tmp/chime-B/chimed --server chronyd

set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
command_line=$(printf '%q ' "$0" "$@")
rounds=3
out="$(dirname "$here")/$(date -u +%F)-nts-ke-attack"
chime="$repo/target/release/chime"
chimed="$repo/target/release/chimed"
chronyd=/usr/sbin/chronyd
attack=60
warmup=5
good=50
baseline=10
connections=2000
sources=250
rate=5
timeout=3
servers=()

while (($#)); do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --chime) chime=$2; shift 2 ;;
    --chimed) chimed=$2; shift 2 ;;
    --server) servers+=("$2"); shift 2 ;;
    --attack) attack=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --good) good=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    --sources) sources=$2; shift 2 ;;
    *) echo "run-nts-ke-attack.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
((${#servers[@]})) || servers=("chimed=$chimed" chronyd)

# Each server as three parallel arrays: its label, its binary, and which daemon it is.
names=() paths=() kinds=()
for s in "${servers[@]}"; do
  name=${s%%=*} path=${s#*=}
  [[ $s == *=* ]] || { [[ $name == chronyd ]] && path=$chronyd || path=$chimed; }
  [[ $name =~ ^[A-Za-z0-9._-]+$ ]] || {
    echo "run-nts-ke-attack.sh: --server $s: the name must be letters, digits, . _ or -" >&2
    exit 2
  }
  for n in "${names[@]}"; do
    [[ $n != "$name" ]] || { echo "run-nts-ke-attack.sh: --server $name given twice" >&2; exit 2; }
  done
  [[ -x $path ]] || { echo "run-nts-ke-attack.sh: --server $s: $path: not executable" >&2; exit 2; }
  kind=chimed
  [[ $(basename "$path") == chronyd ]] && kind=chronyd
  names+=("$name") paths+=("$path") kinds+=("$kind")
done
[[ -x $chime ]] || { echo "run-nts-ke-attack.sh: --chime $chime: not an executable" >&2; exit 2; }
python3 -c "import sys; sys.exit(not ($warmup + $good + $timeout <= $attack))" 2>/dev/null || {
  echo "run-nts-ke-attack.sh: --warmup $warmup + --good $good + the ${timeout} s session timeout" \
    "must fit in --attack $attack" >&2; exit 2; }

mkdir -p "$out/raw"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
# Drops reaped processes from `pids`, so that cleanup never signals a PID the system reused.
forget() {
  local keep=() p q
  for p in "${pids[@]}"; do
    for q in "$@"; do [[ $p != "$q" ]] || continue 2; done
    keep+=("$p")
  done
  pids=("${keep[@]}")
}
. "$here/bench-lib.sh"

# One P-256 certificate for every server; the clients name the server by 127.0.0.1, so that the
# honest client's source is 127.0.0.1 and never an address of the attacker's.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
  -addext basicConstraints=critical,CA:FALSE \
  -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
chmod 600 "$work/key.pem"

# chronyd -x as chimed's upstream (bench-lib.sh): it never touches the clock.
start_upstream

# A process and its descendants (chronyd's NTS-KE helper is a child of its main process).
tree() {
  echo "$1"
  local c
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do tree "$c"; done
}
# User + system clock ticks of a process tree, summed over its threads.
cpu_ticks() {
  local t=0 p f
  for p in $(tree "$1"); do
    read -r -a f < <(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null) || continue
    t=$((t + f[11] + f[12]))
  done
  echo "$t"
}
# Peak resident memory of a process tree, kB, summed over its processes.
vmhwm_kb() {
  local t=0 p v
  for p in $(tree "$1"); do
    v=$(awk '/^VmHWM:/ {print $2}' "/proc/$p/status" 2>/dev/null) || continue
    t=$((t + ${v:-0}))
  done
  echo "$t"
}
now() { date +%s.%N; }
# Busy and total clock ticks of CPU 0 and CPU 1 since boot (/proc/stat: all but idle and iowait),
# as four numbers; over the attack they show whether anything besides the server used its core.
cpu_busy() {
  awk '$1 == "cpu0" || $1 == "cpu1" {
    t = 0; for (i = 2; i <= 9; i++) t += $i; printf "%d %d ", t - $5 - $6, t }' /proc/stat
}

# Starts server $1 (index into names) in its own directory: sets srv_pid, srv_ke, srv_dir.
start_server() {
  local i=$1 ntp
  srv_dir="$work/${names[$i]}-$round"
  mkdir -p "$srv_dir"
  ntp=$(free_port) srv_ke=$(free_port)
  if [[ ${kinds[$i]} == chronyd ]]; then
    # No driftfile (nothing to keep), no command port or socket (two chronyds run side by side).
    cat >"$srv_dir/chronyd.conf" <<EOF
port $ntp
bindaddress 127.0.0.1
allow 127.0.0.0/8
local stratum 3
cmdport 0
bindcmdaddress /
ntsport $srv_ke
ntsserverkey $work/key.pem
ntsservercert $work/cert.pem
ntsprocesses 1
ntsdumpdir $srv_dir
pidfile $srv_dir/chronyd.pid
EOF
    taskset -c 0 "${paths[$i]}" -x -d -u root -f "$srv_dir/chronyd.conf" >"$srv_dir/log" 2>&1 &
  else
    taskset -c 0 "${paths[$i]}" -s "127.0.0.1:$chrony_port" -4 1 -6 0 -a "127.0.0.1:$ntp" \
      --nts-certificate "$work/cert.pem" --nts-private-key "$work/key.pem" \
      --nts-ke-address "127.0.0.1:$srv_ke" --nts-ke-threads 1 --stats-interval 0 \
      >"$srv_dir/log" 2>&1 &
  fi
  srv_pid=$!
  pids+=("$srv_pid")
  # Ready: one authenticated NTP exchange.
  for _ in $(seq 100); do
    "$chime" ntp --nts "127.0.0.1:$srv_ke" --nts-ca "$work/cert.pem" >/dev/null 2>&1 && break
    kill -0 "$srv_pid" 2>/dev/null || break
    sleep 0.1
  done
  "$chime" ntp --nts "127.0.0.1:$srv_ke" --nts-ca "$work/cert.pem" >/dev/null 2>&1 || {
    echo "run-nts-ke-attack.sh: no NTS exchange with ${names[$i]} at 127.0.0.1:$srv_ke" >&2
    cat "$srv_dir/log" >&2
    exit 1
  }
  # Its helpers too, so that cleanup finds them should the main process die first.
  local p
  for p in $(tree "$srv_pid"); do [[ $p == "$srv_pid" ]] || pids+=("$p"); done
}

# SIGTERM (chronyd stops its helpers itself), then SIGKILL for whatever of the tree is left.
stop_server() {
  local p all
  all=$(tree "$srv_pid")
  kill "$srv_pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$srv_pid" 2>/dev/null || break; sleep 0.1; done
  for p in $all; do kill -9 "$p" 2>/dev/null || true; done
  wait "$srv_pid" 2>/dev/null || true
  # shellcheck disable=SC2086
  forget $all
}

good_client() { # duration json
  taskset -c 1 "$chime" perf nts-ke --target "127.0.0.1:$srv_ke" --nts-ca "$work/cert.pem" \
    --sources 1 --rate "$rate" --duration "$1" --timeout "$timeout" --json "$2" \
    >>"$srv_dir/perf.out" 2>>"$srv_dir/perf.err" || {
    echo "run-nts-ke-attack.sh: chime perf failed against $name:" >&2
    cat "$srv_dir/perf.err" >&2
    exit 1
  }
}

{
  echo "date: $(date -u '+%F %T UTC')"
  echo "command: ${command_line% }"
  echo "repository HEAD: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "chime: $chime ($("$chime" --version | head -1), sha256 $(sha256sum "$chime" | cut -c1-16))"
  for i in "${!names[@]}"; do
    v=$("${paths[$i]}" --version | head -1)
    commit_file=$(dirname "${paths[$i]}")/COMMIT
    [[ ! -f $commit_file ]] || v="$v, $commit_file: $(head -1 "$commit_file")"
    echo "server ${names[$i]}: ${paths[$i]} ($v, sha256 $(sha256sum "${paths[$i]}" | cut -c1-16))"
  done
  echo "upstream for chimed: $(/usr/sbin/chronyd --version | head -1)"
  echo "machine: $(nproc) CPUs,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)," \
    "kernel $(uname -r)"
  echo "python: $(python3 --version 2>&1);" \
    "ip_local_port_range $(tr '\t' - </proc/sys/net/ipv4/ip_local_port_range)," \
    "somaxconn $(cat /proc/sys/net/core/somaxconn)"
  echo "attack: $connections connections from $sources addresses for $attack s; good client" \
    "$rate sessions/s (timeout $timeout s) from $warmup s for $good s; baseline $baseline s"
} | tee "$out/setup.txt"

n=${#names[@]}
for round in $(seq "$rounds"); do
  for k in $(seq 0 $((n - 1))); do
    i=$(((round - 1 + k) % n))
    name=${names[$i]}
    raw="$out/raw/$name-round$round"
    start_server "$i"
    good_client "$baseline" "$raw-baseline.json"

    cpu0=$(cpu_ticks "$srv_pid") t0=$(now) busy0=$(cpu_busy)
    taskset -c 1 python3 "$here/nts-ke-attack.py" "127.0.0.1:$srv_ke" --connections "$connections" \
      --sources "$sources" --duration "$attack" >"$raw-attacker.json" 2>"$srv_dir/attacker.err" &
    attacker=$!
    pids+=("$attacker")
    sleep "$warmup"
    good_client "$good" "$raw-attack.json"
    # Its exit status is 1 after its hard end (duration + 5 s): its report is still there, marked.
    wait "$attacker" || grep -q '"hard_end": true' "$raw-attacker.json" || {
      echo "run-nts-ke-attack.sh: the attacker failed against $name:" >&2
      cat "$srv_dir/attacker.err" >&2
      exit 1
    }
    forget "$attacker"
    cpu1=$(cpu_ticks "$srv_pid") t1=$(now) busy1=$(cpu_busy)
    python3 - "$raw-server.json" <<EOF
import json, sys
b0, t0, b1, t1 = map(int, "$busy0".split())
e0, u0, e1, u1 = map(int, "$busy1".split())
json.dump({"server": "$name", "kind": "${kinds[$i]}", "path": "${paths[$i]}", "round": $round,
           "pid": $srv_pid, "processes": $(tree "$srv_pid" | wc -l),
           "cpu_ticks": $((cpu1 - cpu0)), "clk_tck": $(getconf CLK_TCK),
           "window_s": round($t1 - $t0, 3), "vmhwm_kb": $(vmhwm_kb "$srv_pid"),
           "cpu0_busy_pct": round(100 * (e0 - b0) / max(u0 - t0, 1), 1),
           "cpu1_busy_pct": round(100 * (e1 - b1) / max(u1 - t1, 1), 1)},
          open(sys.argv[1], "w"))
open(sys.argv[1], "a").write("\n")
EOF
    stop_server
    cp "$srv_dir/log" "$raw-server.log"
    if [[ -s $srv_dir/attacker.err ]]; then cp "$srv_dir/attacker.err" "$raw-attacker.err"; fi
    printf 'round %s %-10s done\n' "$round" "$name"
  done
done

python3 - "$out" "$rounds" "${names[@]}" <<'EOF' | tee "$out/summary.txt"
import json, os, statistics, sys
out, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
raw = os.path.join(out, "raw")

def load(name, r, what):
    try:
        return json.load(open(os.path.join(raw, f"{name}-round{r}-{what}.json")))
    except (OSError, ValueError):
        return None

def good(report):
    """Completed/tried and its percentage, p50 and p99 ms of the completed, the failure kinds."""
    if not report:
        return None, "-", "-", "-", "-"
    s = report["steps"][0]
    tried, done = s["scheduled"], s["completed"]
    pct = 100 * done / tried if tried else 0.0
    lat = s.get("latency_ms") or {}
    p50 = f"{lat['p50']:.1f}" if done and "p50" in lat else "-"
    p99 = f"{lat['p99']:.1f}" if done and "p99" in lat else "-"
    fails = " ".join(f"{k}:{v}" for k, v in sorted((s.get("failures") or {}).items())) or "-"
    return pct, f"{done}/{tried} {pct:5.1f}%", p50, p99, fails

rows = [(name, r) for name in names for r in range(1, rounds + 1) if load(name, r, "server")]

print("Good NTS-KE sessions, 5/s from 127.0.0.1 (3 s each at most, connect to last record):")
print("completed / tried, p50 and p99 ms of the completed; alone, then under the attack.")
print(f"{'server':10} {'rnd':>3}  {'alone':>16} {'p50':>6} {'p99':>7}  "
      f"{'attacked':>16} {'p50':>6} {'p99':>7}  failures under attack")
attacked = {}
for name, r in rows:
    b, a = good(load(name, r, "baseline")), good(load(name, r, "attack"))
    if a[0] is not None:
        attacked.setdefault(name, []).append(a[0])
    print(f"{name:10} {r:3}  {b[1]:>16} {b[2]:>6} {b[3]:>7}  "
          f"{a[1]:>16} {a[2]:>6} {a[3]:>7}  {a[4]}")
for name, v in attacked.items():
    print(f"  {name}: completed under attack {min(v):.1f}-{max(v):.1f}% over {len(v)} round(s),"
          f" median {statistics.median(v):.1f}%")

print()
print("The attack: hostile TCP connects made (and per second); the server's user + system CPU")
print("over it (its helpers included), per 1000 hostile connections and as a share of one core")
print("(srv), beside CPU 0's busy share in all (cpu0: well above srv means something else ran on")
print("the server's core); VmHWM: the server's peak resident memory at the end; atk: the")
print("attacker's CPU share (near 100%: its core, not the server, bounded the connection rate).")
print(f"{'server':10} {'rnd':>3}  {'hostile':>8} {'/s':>6}  {'CPU ms':>7} {'ms/1k':>7} "
      f"{'srv':>4} {'cpu0':>4}  {'VmHWM MB':>8}  {'atk':>4}")
for name, r in rows:
    atk, srv = load(name, r, "attacker"), load(name, r, "server")
    opened = atk["opened"] if atk else 0
    cpu_ms = srv["cpu_ticks"] * 1000 / srv["clk_tck"]
    per_k = f"{cpu_ms / (opened / 1000):7.1f}" if opened else f"{'-':>7}"
    rate = f"{opened / atk['duration']:6.0f}" if atk else f"{'-':>6}"
    atk_cpu = f"{100 * atk['cpu_s'] / atk['duration']:3.0f}%" if atk else f"{'-':>4}"
    print(f"{name:10} {r:3}  {opened:8} {rate}  {cpu_ms:7.0f} {per_k} "
          f"{100 * cpu_ms / 1000 / srv['window_s']:3.0f}% {srv.get('cpu0_busy_pct', -1):3.0f}%  "
          f"{srv['vmhwm_kb'] / 1024:8.1f}  {atk_cpu}")

print()
print("Hostile connections by kind: opened / closed by the server (/ TLS handshakes completed);")
print("the attacker's mean established connections, and its connects still pending at the end:")
for name, r in rows:
    atk = load(name, r, "attacker")
    if not atk:
        continue
    kinds = "  ".join(f"{k} {v['opened']}/{v['closed_by_server']}"
                      + (f"/{v['handshakes']}" if k.startswith("silent") else "")
                      for k, v in atk["kinds"].items())
    print(f"{name:10} {r:3}  {kinds}  established {atk['established_mean']:.0f}"
          f"  pending {atk['connecting_at_end']}  connect errors {atk['connect_errors']}"
          + ("  (stopped at its hard end)" if atk["hard_end"] else ""))
EOF
