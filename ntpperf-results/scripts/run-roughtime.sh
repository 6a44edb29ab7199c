#!/usr/bin/env bash
# run-roughtime.sh: load-test chimed's Roughtime service and roughenough-server side by side on
# loopback with `chime perf roughtime`, the server pinned to CPU 0 and the generator to CPU 1, and
# report per run the highest rate with < 1% loss and the server's CPU time per reply there.
#
# Both servers sign with the same long-term key (chime keygen's seed is the hex line roughenough
# reads), serve RFC 10049 version 1 with their default batch sizes (chimed 256, roughenough 64;
# see --batch-size and --roughenough-batch-size), and get the same ladder. The order
# alternates between rounds, so neither always runs on a warmer or quieter machine. chimed mirrors
# a chronyd -x started here on a free loopback port (it signs nothing while unsynchronised); its
# one NTP thread, idle, listens on a loopback port of its own.
#
# Every reply is matched to its request by nonce; one in --verify-every (default 1000) also has
# both signatures and its Merkle path verified. Ed25519 verification costs the generator ~40 µs a
# reply, so at 1 in 100 it took a fifth of the generator's core at 230k/s and the generator, not
# the server, ran out first.
#
# Receive buffers: a 1 KiB request takes ~2.3 KiB of socket buffer, so the usual default of 208 KiB
# (net.core.rmem_default) holds about 90 requests, less than two batches, and bursts overflow it
# well below saturation; and on a shared machine a server is held up for tens of milliseconds now
# and then, which only a deep buffer rides out. --rmem BYTES (default 32 MiB, what chimed's
# default --roughtime-recv-buffer of 16 MiB gives) is the buffer both servers get, as the kernel
# counts it (`ss -m`'s rb): roughenough-server, which asks for nothing, through
# net.core.rmem_default (set for the run, put back on exit), and chimed through
# --roughtime-recv-buffer BYTES/2, since the kernel doubles what a program asks for. Each server's
# rb is read back with ss once it answers, printed, and must be BYTES. --rmem 0 runs both as
# shipped: chimed's default, the system's for roughenough.
# (Before this was checked, the runs up to 2026-11-22-b gave roughenough rmem_default = 4 MiB and
# chimed --recv-buffer 4 MiB, which the kernel made 8: chimed had twice roughenough's buffer.)
#
# --cpu-share PCT gives each server only PCT% of CPU 0 (a CPU cgroup whose period is as short as
# the kernel's 1 ms minimum quota allows, 2 ms at 50%, so a server is held back about a millisecond
# at a time; the 4 MiB buffers absorb that). On two cores the load generator, whose kernel path for a request and its reply costs
# about what the server's does, runs out near 210k/s; a server faster than that measures as the
# generator's ceiling on a whole core, but its true capacity on a share of one.
#
# --interleave runs the two servers' ladders step by step instead of one whole ladder after the
# other: both servers are up for the round, and each rate goes to one and then the other (the
# first alternating from step to step). On these shared machines a core alternates every few
# seconds between two states about 1.5x apart in speed (see README.md, NTP runs 20-21); a whole
# ladder per server lets one draw the slow state and the other the fast, interleaved steps
# seconds apart give both servers the same machine at each rate.
#
# The summary splits CPU per reply into the server's own (user) time and the kernel's (system
# time: the receive and send system calls, and the loopback delivery to the generator that runs on
# the server's core). The kernel's part is much the same for any server, so roughenough's whole
# cost over chimed's kernel part alone bounds what any speed-up of chimed's own code could give.
#
# This script fetches and builds nothing: it is given the binaries.
#
# --chimed-args "FLAGS" adds flags to chimed's command line (e.g. "--roughtime-gather 0.0005").
# --batch-size N is chimed's --roughtime-batch-size (default: chimed's, 256) and
# --roughenough-batch-size N roughenough's -b (default: its own, 64): the most requests one
# signature covers.
#
# Usage: run-roughtime.sh [--rounds N] [--steps START:FACTOR:COUNT] [--duration S] [--out DIR]
#                         [--verify-every N] [--rmem BYTES] [--chimed-args FLAGS] [--batch-size N]
#                         [--roughenough-batch-size N] [--cpu-share PCT] [--interleave]
#                         [--chimed PATH] [--chime PATH] [--roughenough PATH]
# Outputs in --out (default: ntpperf-results/roughtime/DATE): <server>-round<N>.json (chime
# perf's JSON for each ladder) and summary.txt.

set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
rounds=2
steps=100000:1.12:10
duration=2
verify_every=1000
rmem=33554432
out="$(dirname "$here")/roughtime/$(date -u +%F)"
chimed_args=""
batch=256
rbatch=64
share=100
interleave=0
chimed="$repo/target/release/chimed"
chime="$repo/target/release/chime"
roughenough=/opt/chime-peers/bin/roughenough_server

while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --duration) duration=$2; shift 2 ;;
        --verify-every) verify_every=$2; shift 2 ;;
        --rmem) rmem=$2; shift 2 ;;
        --chimed-args) chimed_args=$2; shift 2 ;;
        --batch-size) batch=$2; shift 2 ;;
        --roughenough-batch-size) rbatch=$2; shift 2 ;;
        --cpu-share) share=$2; shift 2 ;;
        --interleave) interleave=1; shift ;;
        --out) out=$2; shift 2 ;;
        --chimed) chimed=$2; shift 2 ;;
        --chime) chime=$2; shift 2 ;;
        --roughenough) roughenough=$2; shift 2 ;;
        *) echo "run-roughtime.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
for b in "$chimed" "$chime" "$roughenough" /usr/sbin/chronyd; do
    [ -x "$b" ] || { echo "run-roughtime.sh: $b is not an executable" >&2; exit 2; }
done
[ "$(nproc)" -ge 2 ] || { echo "run-roughtime.sh: needs 2 CPUs (server on 0, load on 1)" >&2; exit 2; }
mkdir -p "$out"
work=$(mktemp -d)
pids=()
old_rmem=$(sysctl -n net.core.rmem_default)
cgroup=""
cleanup() {
    sysctl -q -w net.core.rmem_default="$old_rmem" || true
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    [ -z "$cgroup" ] || rmdir "$cgroup" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

chimed_rcvbuf=()
if [ "$rmem" != 0 ]; then
    [ $((rmem % 2)) -eq 0 ] || { echo "run-roughtime.sh: --rmem $rmem is odd" >&2; exit 2; }
    sysctl -q -w net.core.rmem_default="$rmem"
    chimed_rcvbuf=(--roughtime-recv-buffer $((rmem / 2)))
fi

# The servers' CPU cgroup, if --cpu-share is under 100: cgroup v2's cpu.max, else v1's CFS quota.
if [ "$share" -lt 100 ]; then
    [ "$share" -ge 10 ] || { echo "run-roughtime.sh: --cpu-share $share is under 10" >&2; exit 2; }
    # The shortest period whose quota is still the 1 ms minimum: 2 ms at 50%.
    period=$(( (100000 + share - 1) / share ))
    [ "$period" -ge 1000 ] || period=1000
    quota=$((period * share / 100))
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        cgroup=/sys/fs/cgroup/chime-bench.$$
        mkdir "$cgroup"
        echo "$quota $period" > "$cgroup/cpu.max"
    else
        cgroup=/sys/fs/cgroup/cpu/chime-bench.$$
        mkdir "$cgroup"
        echo "$period" > "$cgroup/cpu.cfs_period_us"
        echo "$quota" > "$cgroup/cpu.cfs_quota_us"
    fi
fi

free_port() { python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# The mirror chronyd.
chrony_port=$(free_port)
printf 'port %s\nbindaddress 127.0.0.1\nallow 127.0.0.1\nlocal stratum 3\ncmdport 0\npidfile %s/chronyd.pid\ndriftfile %s/drift\n' \
    "$chrony_port" "$work" "$work" > "$work/chrony.conf"
/usr/sbin/chronyd -x -d -u root -f "$work/chrony.conf" > "$work/chronyd.log" 2>&1 &
pids+=($!)

# One key for both servers.
"$chime" keygen "$work/key" > "$work/keygen.txt"
public=$(sed -n 's/^public key (base64): //p' "$work/keygen.txt")
grep -v '^#' "$work/key" | grep . > "$work/seed"
chmod 600 "$work/seed"

# Starts server $1 on port $2, pinned to CPU 0; sets started_pid once it answers. Called in this
# shell, not a subshell, so the server is this shell's child: `wait` reaps it after `kill`.
start_server() {
    local name=$1 port=$2 pid
    case "$name" in
        chimed)
            taskset -c 0 "$chimed" -4 1 -a 127.0.0.1:0 -6 0 -s "127.0.0.1:$chrony_port" --stats-interval 0 \
                --roughtime-key "$work/key" --roughtime-ipv4-address "127.0.0.1:$port" \
                --roughtime-ipv4-threads 1 --roughtime-ipv6-threads 0 --roughtime-batch-size "$batch" \
                "${chimed_rcvbuf[@]}" $chimed_args > "$work/$name.log" 2>&1 &
            ;;
        roughenough-server)
            NO_COLOR=1 taskset -c 0 "$roughenough" -i 127.0.0.1 -p "$port" -j 1 -b "$rbatch" -q \
                --metrics-interval 86400 --seed-file "$work/seed" > "$work/$name.log" 2>&1 &
            ;;
    esac
    pid=$!
    pids+=("$pid")
    [ -z "$cgroup" ] || echo "$pid" > "$cgroup/cgroup.procs"
    # Ready when a verified query succeeds (bounded: 10 s).
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        if "$chime" roughtime "127.0.0.1:$port" --public-key "$public" --version 1 --timeout 0.2 \
            > /dev/null 2>&1; then
            started_pid=$pid
            return
        fi
        sleep 0.1
    done
    echo "run-roughtime.sh: $name did not answer; its log:" >&2
    cat "$work/$name.log" >&2
    exit 1
}

# Starts server $1 and checks its receive buffer; sets port_of[$1] and pid_of[$1].
declare -A port_of pid_of
launch() {
    local name=$1 port pid rb
    port=$(free_port)
    start_server "$name" "$port"
    pid=$started_pid
    # The receive buffer the kernel gave the server's socket (ss -m's rb).
    rb=$(ss -uamn "sport = :$port" | sed -n 's/.*skmem:([^)]*rb\([0-9]*\).*/\1/p' | head -n 1)
    echo "round $round: $name (pid $pid) on 127.0.0.1:$port, receive buffer ${rb:-unknown} bytes" >&2
    echo "$rb" > "$out/$name-round$round.rcvbuf"
    if [ "$rmem" != 0 ] && [ "$rb" != "$rmem" ]; then
        echo "run-roughtime.sh: $name's receive buffer is ${rb:-unknown}, not --rmem $rmem" >&2
        exit 1
    fi
    port_of[$name]=$port
    pid_of[$name]=$pid
}

# Runs chime perf against server $1 with --steps $2, writing its JSON to $3.
load() {
    taskset -c 1 "$chime" perf roughtime --target "127.0.0.1:${port_of[$1]}" --public-key "$public" \
        --version 1 --steps "$2" --duration "$duration" --warmup 0.5 --verify-every "$verify_every" \
        --server-pid "${pid_of[$1]}" --json "$3" | tail -n 3 >&2
}

stop() {
    kill "${pid_of[$1]}"
    wait "${pid_of[$1]}" 2>/dev/null || true
}

for round in $(seq "$rounds"); do
    order="chimed roughenough-server"
    [ $((round % 2)) -eq 0 ] && order="roughenough-server chimed"
    if [ "$interleave" = 0 ]; then
        for name in $order; do
            launch "$name"
            load "$name" "$steps" "$out/$name-round$round.json"
            stop "$name"
        done
        continue
    fi
    # Interleaved: both servers up (the idle one costs nothing), each rate offered to one and then
    # the other, the first alternating from step to step; the steps' JSON are then joined into one
    # ladder per server in the same form as above.
    for name in $order; do launch "$name"; done
    IFS=: read -r start factor count <<<"$steps"
    for k in $(seq 0 $((count - 1))); do
        rate=$(awk -v s="$start" -v f="$factor" -v k="$k" 'BEGIN { printf "%.0f", s * f ^ k }')
        pair=$order
        [ $((k % 2)) -eq 1 ] && pair=$(echo "$order" | awk '{ print $2, $1 }')
        for name in $pair; do
            echo "round $round, step $((k + 1)) of $count: $name at $rate/s" >&2
            load "$name" "$rate:1:1" "$work/$name-round$round-step$k.json"
        done
    done
    for name in $order; do
        stop "$name"
        python3 - "$work" "$name" "$round" "$count" > "$out/$name-round$round.json" <<'PY'
import json, sys
work, name, rnd, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
parts = [json.load(open(f"{work}/{name}-round{rnd}-step{k}.json")) for k in range(count)]
run = parts[0]
run["steps"] = [p["steps"][0] for p in parts]
for i, step in enumerate(run["steps"], 1):
    step["step"] = i
run["interleaved"] = True
json.dump(run, sys.stdout, indent=1)
PY
    done
done

python3 - "$out" "$rounds" "$share" <<'PY' | tee "$out/summary.txt"
import json, sys
out, rounds, share = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if share < 100:
    print(f"each server given {share}% of CPU 0 (CPU cgroup quota)")
bufs = sorted({open(f"{out}/{n}-round{r}.rcvbuf").read().strip() for r in range(1, rounds + 1) for n in ("chimed", "roughenough-server")})
print(f"receive buffers (ss rb): {', '.join(bufs)} bytes")
print("round  server              highest rate <1% loss   CPU µs/reply there (kernel)   most answered/s")
best = {}
for r in range(1, rounds + 1):
    for name in ("chimed", "roughenough-server"):
        steps = json.load(open(f"{out}/{name}-round{r}.json"))["steps"]
        ok = [s for s in steps if s["loss_pct"] < 1.0 and s["invalid"] == 0]
        top = max(ok, key=lambda s: s["answered_rate"]) if ok else None
        most = max(s["answered_rate"] for s in steps)
        cpu = (top or {}).get("server_cpu") or {}
        rate = top["answered_rate"] if top else 0
        best.setdefault(name, []).append(rate)
        nan = float("nan")
        there = f"{cpu.get('us_per_reply') or nan:.2f} ({cpu.get('kernel_us_per_reply') or nan:.2f})"
        print(f"{r:>5}  {name:<18}  {rate:>20.0f}   {there:>27}   {most:>15.0f}")
# Losses before a server's peak: at such a step the server still had capacity to spare, so the
# loss came from a stall; steal says whether the hypervisor's.
print("steps losing >= 1% below the server's most answered rate (CPU 0 steal during each, %):")
for r in range(1, rounds + 1):
    for name in ("chimed", "roughenough-server"):
        steps = json.load(open(f"{out}/{name}-round{r}.json"))["steps"]
        peak = max(range(len(steps)), key=lambda i: steps[i]["answered_rate"])
        early = [s for s in steps[:peak] if s["loss_pct"] >= 1.0]
        steal = ", ".join(f"{(s.get('steal_pct') or [float('nan')])[0]:.1f}" for s in early)
        print(f"{r:>5}  {name:<18}  {len(early)}" + (f" ({steal})" if early else ""))
# The kernel's part (system time: receiving, sending, and the loopback delivery to the generator
# that runs on the server's core) is much the same for any server; what a server can shrink is
# its own (user) part. Measured at the same offered rates, at the steps both served with < 1%
# loss: roughenough's whole cost over chimed's kernel part alone is the most chimed could gain
# if its own work cost nothing.
print("per reply at the steps both served with < 1% loss, mean µs: user + kernel")
for r in range(1, rounds + 1):
    runs = {n: json.load(open(f"{out}/{n}-round{r}.json"))["steps"] for n in ("chimed", "roughenough-server")}
    both = [i for i in range(min(map(len, runs.values())))
            if all(runs[n][i]["loss_pct"] < 1.0 and (runs[n][i].get("server_cpu") or {}).get("kernel_us_per_reply") is not None for n in runs)]
    if not both:
        print(f"{r:>5}  no step both served with < 1% loss, or no kernel time recorded")
        continue
    mean = {}
    for n, steps in runs.items():
        cpu = [steps[i]["server_cpu"] for i in both]
        kernel = sum(c["kernel_us_per_reply"] for c in cpu) / len(cpu)
        total = sum(c["us_per_reply"] for c in cpu) / len(cpu)
        mean[n] = (total - kernel, kernel)
    (cu, ck), (ru, rk) = mean["chimed"], mean["roughenough-server"]
    print(f"{r:>5}  {len(both)} steps: chimed {cu:.2f} + {ck:.2f}, roughenough {ru:.2f} + {rk:.2f}; "
          f"user ratio {ru / cu:.2f}, total ratio {(ru + rk) / (cu + ck):.2f}, "
          f"roughenough total / chimed kernel {(ru + rk) / ck:.2f}")
for r, (a, b) in enumerate(zip(best["chimed"], best["roughenough-server"]), 1):
    print(f"round {r}: chimed / roughenough-server = {a / b:.2f}" if b else f"round {r}: roughenough-server had no step under 1% loss")
PY
