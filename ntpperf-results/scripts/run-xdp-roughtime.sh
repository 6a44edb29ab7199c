#!/usr/bin/env bash
# run-xdp-roughtime.sh: Roughtime (or, with --protocol ntp, NTP) over a veth pair, one core:
# chimed through AF_XDP (--xdp), chimed through its sockets, and (Roughtime) roughenough-server,
# each loaded in turn by `chime perf` at one fixed rate above their capacities, for several rounds
# with the order rotated (the cores here drift between a slow and a fast state; rotation gives
# each server both).
#
# --servers picks and orders them; the first is the one the others' ratios are taken against.
# chimed-driver (NTP only) is chimed answering plain NTP in the driver (--xdp --xdp-in-driver).
# A veth delivers the XDP_TX replies only to a peer with an XDP program of its own, so with it the
# client's end gets one for the whole run, for every server alike: a chimed there (CPU 1) with
# --xdp vc, serving a port nothing sends to, whose program passes every other frame to the stack.
#
# --napi-threads yes receives each side's packets in a NAPI kernel thread pinned with its side
# (vs's with the server on CPU 0, vc's with chime perf on CPU 1), so that everything the server's
# kernel does for a request, XDP program and copies or IP/UDP stack and socket queue, runs on the
# server's core as it would with a NIC whose interrupts go there, and is counted in the server's
# CPU per reply. Without it a veth receives on the sender's core. ntpperf cannot be used there:
# when the server's core falls behind, veth pushes back on the sender, and ntpperf exits on the
# first ENOBUFS; chime perf counts those as send errors and goes on.
#
# Topology, in two network namespaces this script makes and removes:
#   client netns: chime perf (CPU 1) on vc 10.97.0.2, sending complete UDP checksums
#                 (ethtool -K vc tx off: see docs/XDP.adoc, "Checksums, and veth")
#   server netns: the server under test (CPU 0) on vs 10.97.0.1:2002; chronyd -x on its loopback
#                 for chimed to mirror (chimed signs nothing while unsynchronised)
#
# Every reply is matched to its request by nonce, and one in --verify-every has its signatures and
# Merkle path verified. The figure that counts is replies the client accepted per second: chime
# perf's answered, less its stale replies. CPU per reply is the server process's (chime perf
# --server-pid). All three sign with one long-term key (chime keygen's seed is the hex line
# roughenough reads) and serve RFC 10049 version 1, each with its default batch size.
#
# This script fetches and builds nothing: it is given the binaries.
#
# Usage: sudo run-xdp-roughtime.sh --out DIR [--protocol roughtime|ntp] [--napi-threads yes|no]
#                                  [--rounds N] [--rate R] [--duration S]
#                                  [--chimed PATH] [--chime PATH] [--roughenough PATH]
#                                  [--servers "chimed-driver chimed-xdp chimed"]
# Outputs in DIR: <server>-round<N>.json (chime perf's), rounds.csv, summary.txt.

set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=napi.sh
. "$here/napi.sh"
repo=$(cd "$here/../.." && pwd)
out=
rounds=3
rate=200000
duration=5
verify_every=1000
chimed=$repo/target/release/chimed
chime=$repo/target/release/chime
roughenough=/opt/chime-peers/bin/roughenough_server
protocol=roughtime
napi=no
servers=
die() { echo "run-xdp-roughtime.sh: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
    [[ $# -ge 2 ]] || die "option $1 needs a value"
    case $1 in
        --out) out=$2 ;;
        --rounds) rounds=$2 ;;
        --rate) rate=$2 ;;
        --duration) duration=$2 ;;
        --chimed) chimed=$2 ;;
        --chime) chime=$2 ;;
        --roughenough) roughenough=$2 ;;
        --protocol) protocol=$2 ;;
        --napi-threads) napi=$2 ;;
        --servers) servers=$2 ;;
        *) die "unknown option $1" ;;
    esac
    shift 2
done
[[ -n $out ]] || die "--out DIR is required"
[[ $protocol == roughtime || $protocol == ntp ]] || die "--protocol: roughtime or ntp, not '$protocol'"
[[ $napi == yes || $napi == no ]] || die "--napi-threads: yes or no, not '$napi'"
[[ $EUID -eq 0 ]] || die "must run as root (network namespaces, XDP)"
for b in "$chimed" "$chime" "$roughenough" /usr/sbin/chronyd; do
    [[ -x $b ]] || die "$b is not an executable"
done
for tool in ip ethtool taskset python3; do
    command -v "$tool" >/dev/null || die "'$tool' not found in PATH"
done
mkdir -p "$out"

tag=$$
NS_S=chime-xrt-s-$tag
NS_C=chime-xrt-c-$tag
work=$(mktemp -d)
server_pid=
mirror_pid=
peer_pid=
cleanup() {
    [[ -z $server_pid ]] || kill "$server_pid" 2>/dev/null || true
    [[ -z $peer_pid ]] || kill "$peer_pid" 2>/dev/null || true
    [[ -z $mirror_pid ]] || kill "$mirror_pid" 2>/dev/null || true
    wait 2>/dev/null || true
    ip netns del "$NS_S" 2>/dev/null || true
    ip netns del "$NS_C" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$NS_S"
ip netns add "$NS_C"
ip link add vs numrxqueues 1 numtxqueues 1 netns "$NS_S" type veth peer name vc \
    numrxqueues 1 numtxqueues 1 netns "$NS_C"
for ns in "$NS_S" "$NS_C"; do
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
    ip -n "$ns" link set lo up
done
ip -n "$NS_S" addr add 10.97.0.1/24 dev vs
ip -n "$NS_C" addr add 10.97.0.2/24 dev vc
ip -n "$NS_S" link set vs up
ip -n "$NS_C" link set vc up
ip netns exec "$NS_C" ethtool -K vc tx off >/dev/null
NAPI_PIDS=()
NAPI_TICKS=0
[[ $napi == no ]] || napi_threaded "$NS_S" "$NS_C"
# Pins the NAPI threads with their sides (napi.sh) and lists the server's in NAPI_PIDS.
pin_napi() {
    [[ $napi == yes ]] || return 0
    napi_pin 0 1 || die "no napi/vs-* thread"
}

printf 'port 11123\nbindaddress 127.0.0.1\nallow 127.0.0.1\nlocal stratum 3\ncmdport 0\npidfile %s/chronyd.pid\ndriftfile %s/drift\n' \
    "$work" "$work" >"$work/chrony.conf"
ip netns exec "$NS_S" /usr/sbin/chronyd -x -d -u root -f "$work/chrony.conf" >"$work/chronyd.log" 2>&1 &
mirror_pid=$!

"$chime" keygen "$work/key" >"$work/keygen.txt"
public=$(sed -n 's/^public key (base64): //p' "$work/keygen.txt")
grep -v '^#' "$work/key" | grep . >"$work/seed"
chmod 600 "$work/seed"

{
    echo "date: $(date -u +%FT%TZ)"
    echo "kernel: $(uname -sr)"
    echo "cpus: $(nproc) ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1))"
    sha256sum "$chimed" "$chime" "$roughenough"
    echo "chime commit: $(git -C "$repo" rev-parse HEAD)$(git -C "$repo" diff --quiet HEAD || echo ' (work tree has changes)')"
    echo "protocol $protocol, NAPI threads $napi; rate $rate/s offered to each server, $duration s per server per round, $rounds rounds, verify 1 in $verify_every"
} >"$out/setup.txt"

start_server() {
    local name=$1
    local -a cmd
    case $name in
        chimed-driver | chimed-xdp | chimed)
            if [[ $protocol == ntp ]]; then
                cmd=("$chimed" -4 1 -a 10.97.0.1:123 -6 0 -s 127.0.0.1:11123 --stats-interval 0)
            else
                cmd=("$chimed" -4 1 -a 127.0.0.1:0 -6 0 -s 127.0.0.1:11123 --stats-interval 0
                    --roughtime-key "$work/key" --roughtime-ipv4-address 10.97.0.1:2002
                    --roughtime-ipv4-threads 1 --roughtime-ipv6-threads 0)
            fi
            [[ $name == chimed ]] || cmd+=(--xdp vs)
            [[ $name != chimed-driver ]] || cmd+=(--xdp-in-driver)
            ;;
        roughenough-server)
            cmd=(env NO_COLOR=1 "$roughenough" -i 10.97.0.1 -p 2002 -j 1 -q
                --metrics-interval 86400 --seed-file "$work/seed")
            ;;
    esac
    ip netns exec "$NS_S" taskset -c 0 "${cmd[@]}" >"$work/$name.log" 2>&1 &
    server_pid=$!
    local _
    for _ in $(seq 100); do
        kill -0 "$server_pid" 2>/dev/null || break
        if [[ $protocol == ntp ]]; then
            ip netns exec "$NS_C" "$chime" ntp 10.97.0.1:123 --timeout 0.2 --require-synchronised \
                >/dev/null 2>&1 && return
        elif ip netns exec "$NS_C" "$chime" roughtime 10.97.0.1:2002 --public-key "$public" \
            --timeout 0.2 >/dev/null 2>&1; then
            return
        fi
        sleep 0.1
    done
    cat "$work/$name.log" >&2
    die "$name did not answer"
}

# The server's own process: `ip netns exec` and `env` exec it, so server_pid is it.
if [[ -n $servers ]]; then
    read -r -a servers <<<"$servers"
else
    servers=(chimed-xdp chimed roughenough-server)
    [[ $protocol == roughtime ]] || servers=(chimed-xdp chimed)
fi
for name in "${servers[@]}"; do
    case $name in
        chimed | chimed-xdp) ;;
        roughenough-server) [[ $protocol == roughtime ]] || die "roughenough-server serves Roughtime only" ;;
        chimed-driver) [[ $protocol == ntp ]] || die "chimed-driver answers NTP only" ;;
        *) die "--servers: unknown server '$name'" ;;
    esac
done
echo "servers, the first the reference: ${servers[*]}" >>"$out/setup.txt"
if [[ " ${servers[*]} " == *" chimed-driver "* ]]; then
    ip netns exec "$NS_C" taskset -c 1 "$chimed" -4 1 -a 10.97.0.2:1123 -6 0 -s 127.0.0.1:9 \
        --stats-interval 0 --control-socket none --client-log 0 --xdp vc >"$work/peer.log" 2>&1 &
    peer_pid=$!
    for _ in $(seq 50); do
        ip -n "$NS_C" link show vc | grep -q xdp && break
        kill -0 "$peer_pid" 2>/dev/null || { cat "$work/peer.log" >&2; die "the client's XDP program did not attach"; }
        sleep 0.1
    done
fi
echo "round,server,offered_per_s,answered_per_s,accepted_per_s,stale_pct,lost_pct,cpu_us_per_reply" >"$out/rounds.csv"
for round in $(seq "$rounds"); do
    shift_by=$(((round - 1) % ${#servers[@]}))
    order=("${servers[@]:shift_by}" "${servers[@]:0:shift_by}")
    for name in "${order[@]}"; do
        echo "== round $round: $name" >&2
        start_server "$name"
        pin_napi
        json=$out/$name-round$round.json
        if [[ $protocol == ntp ]]; then
            load=(perf ntp --target 10.97.0.1:123)
        else
            load=(perf roughtime --target 10.97.0.1:2002 --public-key "$public"
                --verify-every "$verify_every")
        fi
        ip netns exec "$NS_S" ethtool -S vs >"$work/vs.before"
        ip netns exec "$NS_C" ethtool -S vc >"$work/vc.before"
        napi_ticks
        t0=$NAPI_TICKS
        ip netns exec "$NS_C" taskset -c 1 "$chime" "${load[@]}" --rate "$rate" \
            --duration "$duration" --warmup 1 --server-pid "$server_pid" --json "$json" \
            | tail -n 2 >&2
        # The server's NAPI threads' CPU over the whole load (warm-up included), for the CSV.
        napi_ticks
        echo $((NAPI_TICKS - t0)) >"$out/$name-round$round.napi-ticks"
        # Where frames went on each end (veth's own counters: XDP verdicts, drops on a full
        # ring), as what changed over the load.
        for end in vs:"$NS_S" vc:"$NS_C"; do
            ip netns exec "${end#*:}" ethtool -S "${end%%:*}" >"$work/after"
            awk 'NR == FNR { before[$1] = $2; next }
                 $2 != before[$1] { printf "%s %d\n", $1, $2 - before[$1] }' \
                "$work/${end%%:*}.before" "$work/after" \
                >"$out/$name-round$round.ethtool-${end%%:*}.txt"
        done
        kill "$server_pid"
        wait "$server_pid" 2>/dev/null || true
        server_pid=
        python3 - "$json" "$round" "$name" "$out/$name-round$round.napi-ticks" "$duration" \
            >>"$out/rounds.csv" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
s = d["steps"][-1]
offered = s["sent_rate"]
answered = s["answered_rate"]
accepted = s["accepted_rate"]
stale = s["stale_pct"]
lost = s["loss_pct"]
cpu = (s.get("server_cpu") or {}).get("us_per_reply")
cpu = float("nan") if cpu is None else cpu
# Add the server's NAPI threads (--napi-threads yes): their ticks over the warm-up second and the
# step, spread over the replies of both at the step's rate (an estimate: the warm-up is not in
# the step's counts).
ticks = int(open(sys.argv[4]).read() or 0)
if ticks and answered > 0:
    cpu += ticks / 100 * 1e6 / (answered * (float(sys.argv[5]) + 1))
print(f"{sys.argv[2]},{sys.argv[3]},{offered:.0f},{answered:.0f},{accepted:.0f},{stale:.2f},{lost:.2f},{cpu:.3f}")
EOF
    done
done

python3 - "$out/rounds.csv" "${servers[0]}" >"$out/summary.txt" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
ref = sys.argv[2]
by = {}
for r in rows:
    by.setdefault(r["server"], []).append(r)
print("One core, over veth: replies accepted per second (answered, less stale) and the server's")
print(f"CPU per reply; 'accepted' is {ref}'s accepted over each server's, 'cheaper' each server's")
print(f"CPU per reply over {ref}'s: per round, then of means")
print()
print(f"{'round':6}{'server':20}{'accepted/s':>12}{'lost %':>8}{'CPU us':>9}{'accepted':>10}{'cheaper':>9}")
for r in rows:
    x = next(x for x in rows if x["round"] == r["round"] and x["server"] == ref)
    acc = float(x["accepted_per_s"]) / max(float(r["accepted_per_s"]), 1)
    cpu = float(r["cpu_us_per_reply"]) / float(x["cpu_us_per_reply"])
    print(f"{r['round']:6}{r['server']:20}{float(r['accepted_per_s']):12.0f}{float(r['lost_pct']):8.2f}{float(r['cpu_us_per_reply']):9.2f}{acc:10.2f}{cpu:9.2f}")
print()
mean = {k: sum(float(x["accepted_per_s"]) for x in v) / len(v) for k, v in by.items()}
cpu = {k: sum(float(x["cpu_us_per_reply"]) for x in v) / len(v) for k, v in by.items()}
lost = {k: max(float(x["lost_pct"]) for x in v) for k, v in by.items()}
for k in by:
    line = f"mean {k:20}{mean[k]:12.0f} accepted/s, {cpu[k]:.2f} us CPU per reply, lost at most {lost[k]:.2f}%"
    if k != ref:
        line += f"; {ref} accepts {mean[ref] / mean[k]:.2f}x, {cpu[k] / cpu[ref]:.2f}x cheaper per reply"
    print(line)
EOF
cat "$out/summary.txt"
