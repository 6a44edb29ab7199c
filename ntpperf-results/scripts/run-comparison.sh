#!/usr/bin/env bash
# run-comparison.sh: load-test NTP servers side by side with ntpperf, over a veth pair between two
# private network namespaces, and report per server the highest response rate with <1% loss and
# the server's CPU time per response.
#
# Topology (everything lives in namespaces this script creates and deletes on exit):
#
#   client netns "C"                          server netns "S"
#   ntpperf -i vc  --- vc 10.99.0.2 <===> vs 10.99.0.1 ---  server under test on 10.99.0.1:123
#   raw-table DROP of replies to               route 172.18.0.0/16 via 10.99.0.2
#   172.18.0.0/16 (ntpperf reads them          mirror chronyd on 127.0.0.1:11123 (chimed/rsntp
#   with pcap before netfilter)                poll it for leap/stratum/refid...)
#
# ntpperf is not run as one long ladder: the script drives the ladder itself and starts ntpperf
# once per rate (`-r RATE`), so that every step can be bracketed by samples of the server's CPU
# time (/proc/PID/stat utime+stime, all threads) and of the veth counters on the server side
# (`vs` rx = requests that reached the server, tx = replies it sent). The counters are read
# from /proc/<pid in S>/net/dev, the same numbers as /sys/class/net/vs/statistics in S. Under
# `-l` ntpperf's nominal rate overstates what it managed to send above ~300k/s, so the offered
# and response rates in the CSV are the ones counted on `vs`, not ntpperf's rate column.
#
# This script fetches and builds nothing: it is given the binaries.
#
# Outputs (in --out, default: the directory of this script):
#   raw/<server>.txt  every ntpperf output, the counters around each step, the server's log tail
#   steps.csv         one row per server and rate step
#   summary.csv       one row per server
#   setup.txt         kernel, CPUs, binaries (sha256), versions, ladder parameters
#
# Needs root (namespaces, raw sockets), iproute2, iptables, coreutils `timeout`, awk.

set -euo pipefail

usage() {
    cat <<'EOF'
Usage: run-comparison.sh [options]

Binaries (flag or environment variable):
  --ntpperf PATH      NTPPERF   ntpperf binary (required)
  --chronyd PATH      CHRONYD   chronyd binary (default /usr/sbin/chronyd); runs the mirror and
                                is itself a server under test
  --chimed PATH       CHIMED    chimed binary (default <repo>/target/release/chimed); the chimed
                                runs are skipped with a note if it does not exist
  --rsntp PATH        RSNTP     rsntp binary (optional; rsntp runs only if given)

What to run:
  --servers LIST      SERVERS   comma-separated, from: chronyd chimed-1 chimed-2 rsntp-1 rsntp-2
                                chimed-rl-1 chimed-rl-2 (chimed-N / rsntp-N = N IPv4 threads;
                                chimed-rl-N = chimed-N with RATELIMIT_ARGS); default
                                chronyd,chimed-1,chimed-2,rsntp-1
  --ntp-mode M        NTP_MODE    basic (ntpperf -B, the default) or interleaved (ntpperf -I:
                                each client sends in RFC 9769's interleaved mode; the
                                ntpperf_xleave_pct column says how many replies were)
  --ratelimit-args A  RATELIMIT_ARGS  chimed flags for chimed-rl-N (default: a limit ntpperf's
                                clients stay under, so that the run measures the limiter's
                                cost: ntpperf sends round robin from rate/10 clients, at most
                                16384, so each polls rate/16384 times a second above 163840
                                req/s, 61/s at 1M; --ratelimit --ratelimit-interval -6
                                --ratelimit-burst 16 allows 64/s)
  --out DIR           OUT_DIR   where results go (default: ntpperf-results/DATE-ntp-ladder)
  --rmem BYTES        RMEM      the receive buffer every server's socket gets, as the kernel
                                counts it (ss -m's rb): chronyd and rsntp through
                                net.core.rmem_default (set for the run, put back on exit),
                                chimed through --recv-buffer BYTES/2, since the kernel doubles
                                what a program asks for; each server's rb is read back with ss
                                and must match. ntpperf's bursts overflow the usual 208 KiB
                                below saturation (step_udp_rcvbuf_errors). Default: leave both
                                as they are (chimed then asks for its own 4 MiB, i.e. 8)

Rate ladder (one ntpperf run per step; rate_{n+1} = int(rate_n * mult), as ntpperf does):
  --rate-start N      RATE_START  first request rate, req/s (default 10000)
  --rate-max N        RATE_MAX    last rate at most (default 1000000, ntpperf's own limit)
  --rate-mult X       RATE_MULT   multiplier between steps (default 1.5)
  --step-time S       STEP_TIME   ntpperf sampling interval per step, seconds (default 2.0, >= 0.8)
  --stop-loss PCT     STOP_LOSS   stop a server's ladder after a step losing more (default 50)
  --settle S          SETTLE      wait after a server starts, for its first mirror poll (default 3)

Shared machines (other work competing for the CPUs spoils a step; see other_cpu_pct):
  --max-other PCT     MAX_OTHER   a step during which other processes used more than PCT % of
                                  one CPU counts as disturbed (default 30)
  --retries N         RETRIES     run a disturbed step again, up to N times, 5 s apart; the last
                                  attempt is the one the summary uses (default 2; 0 = never)

Placement (optional, taskset CPU lists; default: let the scheduler decide):
  --server-cpus LIST  SERVER_CPUS
  --client-cpus LIST  CLIENT_CPUS
  --napi-threads yes  NAPI_THREADS  receive each side's packets in a NAPI kernel thread (GRO on,
                                  /sys/class/net/*/threaded), pinned with its side: vs's with the
                                  server, vc's with the client, and count vs's thread's CPU as the
                                  server's. Without it a veth receives on the sender's CPU, so
                                  the server's receive path (the IP/UDP stack, or an XDP program)
                                  runs on the client's CPU and the client's on the server's; a
                                  NIC whose interrupts go to the server's core does neither
                                  (default no; needs ethtool and --server-cpus, --client-cpus)

Example:
  sudo NTPPERF=/path/to/ntpperf RSNTP=/path/to/rsntp ./run-comparison.sh
EOF
}

die() {
    echo "run-comparison.sh: $*" >&2
    exit 1
}

note() {
    echo "== $*" >&2
}

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=napi.sh
. "$script_dir/napi.sh"
repo_dir=$(cd "$script_dir/../.." && pwd)

NTPPERF=${NTPPERF:-}
CHRONYD=${CHRONYD:-/usr/sbin/chronyd}
CHIMED=${CHIMED:-$repo_dir/target/release/chimed}
RSNTP=${RSNTP:-}
SERVERS=${SERVERS:-}
OUT_DIR=${OUT_DIR:-$(dirname "$script_dir")/$(date -u +%F)-ntp-ladder}
RATE_START=${RATE_START:-10000}
RATE_MAX=${RATE_MAX:-1000000}
RATE_MULT=${RATE_MULT:-1.5}
STEP_TIME=${STEP_TIME:-2.0}
STOP_LOSS=${STOP_LOSS:-50}
SETTLE=${SETTLE:-3}
MAX_OTHER=${MAX_OTHER:-30}
RETRIES=${RETRIES:-2}
NTP_MODE=${NTP_MODE:-basic}
RATELIMIT_ARGS=${RATELIMIT_ARGS:---ratelimit --ratelimit-interval -6 --ratelimit-burst 16}
SERVER_CPUS=${SERVER_CPUS:-}
CLIENT_CPUS=${CLIENT_CPUS:-}
RMEM=${RMEM:-}
NAPI_THREADS=${NAPI_THREADS:-no}
NAPI_PIDS=()
OLD_RMEM=

while [[ $# -gt 0 ]]; do
    opt=$1
    case $opt in
        -h | --help) usage; exit 0 ;;
        --ntpperf | --chronyd | --chimed | --rsntp | --servers | --out | --rate-start | --rate-max | \
            --rate-mult | --step-time | --stop-loss | --settle | --server-cpus | --client-cpus | \
            --max-other | --retries | --ratelimit-args | --ntp-mode | --rmem | --napi-threads) ;;
        *) die "unknown option $opt (see --help)" ;;
    esac
    [[ $# -ge 2 ]] || die "option $opt needs a value (see --help)"
    case $opt in
        --ntpperf) NTPPERF=$2 ;;
        --chronyd) CHRONYD=$2 ;;
        --chimed) CHIMED=$2 ;;
        --rsntp) RSNTP=$2 ;;
        --servers) SERVERS=$2 ;;
        --out) OUT_DIR=$2 ;;
        --rate-start) RATE_START=$2 ;;
        --rate-max) RATE_MAX=$2 ;;
        --rate-mult) RATE_MULT=$2 ;;
        --step-time) STEP_TIME=$2 ;;
        --stop-loss) STOP_LOSS=$2 ;;
        --settle) SETTLE=$2 ;;
        --server-cpus) SERVER_CPUS=$2 ;;
        --client-cpus) CLIENT_CPUS=$2 ;;
        --max-other) MAX_OTHER=$2 ;;
        --retries) RETRIES=$2 ;;
        --ratelimit-args) RATELIMIT_ARGS=$2 ;;
        --ntp-mode) NTP_MODE=$2 ;;
        --rmem) RMEM=$2 ;;
        --napi-threads) NAPI_THREADS=$2 ;;
    esac
    shift 2
done

# --- validation -----------------------------------------------------------------------------

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
is_num() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]]; }
num_ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }
num_gt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a > b) }'; }

[[ $EUID -eq 0 ]] || die "must run as root (network namespaces, raw sockets)"
[[ -n $NTPPERF ]] || die "no ntpperf binary given (--ntpperf PATH or NTPPERF=PATH)"
[[ -x $NTPPERF ]] || die "ntpperf binary '$NTPPERF' is not an executable file"
[[ -x $CHRONYD ]] || die "chronyd binary '$CHRONYD' is not an executable file (it runs the mirror)"
[[ -z $RSNTP || -x $RSNTP ]] || die "rsntp binary '$RSNTP' is not an executable file"
[[ -z $RMEM ]] || { is_uint "$RMEM" && ((RMEM >= 4096)); } || die "--rmem must be a byte count >= 4096, not '$RMEM'"
if ! is_uint "$RATE_START" || ((RATE_START < 1000)); then
    die "--rate-start '$RATE_START': want an integer >= 1000"
fi
if ! is_uint "$RATE_MAX" || ((RATE_MAX < RATE_START || RATE_MAX > 1000000)); then
    die "--rate-max '$RATE_MAX': want an integer between --rate-start and 1000000"
fi
if ! is_num "$RATE_MULT" || ! num_ge "$RATE_MULT" 1.05; then
    die "--rate-mult '$RATE_MULT': want a number >= 1.05"
fi
if ! is_num "$STEP_TIME" || ! num_ge "$STEP_TIME" 0.8; then
    die "--step-time '$STEP_TIME': want seconds >= 0.8"
fi
is_num "$STOP_LOSS" || die "--stop-loss '$STOP_LOSS': want a percentage"
is_num "$SETTLE" || die "--settle '$SETTLE': want seconds"
is_num "$MAX_OTHER" || die "--max-other '$MAX_OTHER': want a percentage of one CPU"
is_uint "$RETRIES" || die "--retries '$RETRIES': want a count"
for tool in ip iptables timeout awk sha256sum; do
    command -v "$tool" >/dev/null || die "'$tool' not found in PATH"
done
case $NAPI_THREADS in
    no) ;;
    yes)
        [[ -n $SERVER_CPUS && -n $CLIENT_CPUS ]] || die "--napi-threads yes needs --server-cpus and --client-cpus"
        command -v ethtool >/dev/null || die "'ethtool' not found in PATH (needed for --napi-threads)"
        ;;
    *) die "--napi-threads '$NAPI_THREADS': want yes or no" ;;
esac
if [[ -n $SERVER_CPUS || -n $CLIENT_CPUS ]]; then
    command -v taskset >/dev/null || die "'taskset' not found in PATH (needed for --*-cpus)"
fi

explicit_servers=1
if [[ -z $SERVERS ]]; then
    explicit_servers=0
    SERVERS=chronyd,chimed-1,chimed-2
    if [[ -n $RSNTP ]]; then
        SERVERS+=,rsntp-1
    fi
fi
IFS=, read -r -a server_list <<<"$SERVERS"
for s in "${server_list[@]}"; do
    case $s in
        chronyd) ;;
        chimed-[1-9] | chimed-[1-9][0-9] | chimed-rl-[1-9] | chimed-rl-[1-9][0-9] | \
            chimed-noshed-[1-9] | chimed-noshed-[1-9][0-9] | chimed-xdp-[1-9] | chimed-xdp-[1-9][0-9])
            if [[ ! -x $CHIMED ]] && ((explicit_servers)); then
                die "server $s asked for, but chimed binary '$CHIMED' is missing"
            fi
            ;;
        rsntp-[1-9] | rsntp-[1-9][0-9])
            [[ -n $RSNTP ]] || die "server $s asked for, but no rsntp binary given (--rsntp PATH)"
            ;;
        *) die "unknown server '$s' (want chronyd, chimed-N, chimed-rl-N, chimed-noshed-N, chimed-xdp-N or rsntp-N)" ;;
    esac
done

case $NTP_MODE in
    basic) NTPPERF_MODE=-B ;;
    interleaved) NTPPERF_MODE=-I ;;
    *) die "--ntp-mode '$NTP_MODE': want basic or interleaved" ;;
esac

# --- fixed addresses ------------------------------------------------------------------------

SERVER_IP=10.99.0.1
CLIENT_IP=10.99.0.2
CLIENT_NET=172.18.0.0/16
MIRROR_PORT=11123
CLK_TCK=$(getconf CLK_TCK)
NCPU=$(grep -c '^cpu[0-9]' /proc/stat)
# /proc/net/udp spells a bound socket as little-endian hex address : big-endian hex port.
UDP_SERVER_HEX=0100630A:007B   # 10.99.0.1:123
UDP_MIRROR_HEX=0100007F:2B73   # 127.0.0.1:11123

# --- setup and teardown ---------------------------------------------------------------------

NS_S=chime-perf-s-$$
NS_C=chime-perf-c-$$
WORK=$(mktemp -d /tmp/chime-perf.XXXXXX)
MIRROR_PID=
SERVER_PID=
NTPPERF_PID=
CLIENT_PIDS=()
SERVER_TICKS=0

# Stops one process we started, by PID: TERM, up to 5 s grace, then KILL.
stop_pid() {
    local pid=$1 i
    [[ -n $pid ]] || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    set +e
    stop_pid "$NTPPERF_PID"
    stop_pid "$SERVER_PID"
    stop_pid "$MIRROR_PID"
    ip netns del "$NS_C" 2>/dev/null
    ip netns del "$NS_S" 2>/dev/null
    [[ -n $OLD_RMEM ]] && sysctl -qw net.core.rmem_default="$OLD_RMEM"
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# net.core.rmem_default is one value for every network namespace (a child namespace may not set
# it): set here, it applies to the servers' sockets in theirs.
set_rmem() {
    [[ -n $RMEM ]] || return 0
    OLD_RMEM=$(sysctl -n net.core.rmem_default)
    sysctl -qw net.core.rmem_default="$RMEM"
}

setup_network() {
    ip netns add "$NS_S"
    ip netns add "$NS_C"
    ip link add vs netns "$NS_S" type veth peer name vc netns "$NS_C"
    local ns
    for ns in "$NS_S" "$NS_C"; do
        # No IPv6 on the link: keeps router solicitations and DAD out of the packet counts.
        ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
        ip -n "$ns" link set lo up
    done
    ip -n "$NS_S" addr add "$SERVER_IP/24" dev vs
    ip -n "$NS_C" addr add "$CLIENT_IP/24" dev vc
    ip -n "$NS_S" link set vs up
    ip -n "$NS_C" link set vc up
    # Replies to the simulated clients go back over the veth ...
    ip -n "$NS_S" route add "$CLIENT_NET" via "$CLIENT_IP"
    # ... where ntpperf reads them with pcap; the client kernel must not answer them itself.
    ip netns exec "$NS_C" iptables -t raw -A PREROUTING -p udp -d "$CLIENT_NET" -j DROP
    SERVER_MAC=$(ip netns exec "$NS_S" cat /sys/class/net/vs/address)
    if [[ $NAPI_THREADS == yes ]]; then
        napi_threaded "$NS_S" "$NS_C"
        pin_napi
    fi
}

# Pins the NAPI threads with their sides (napi.sh) and lists the server's in NAPI_PIDS.
pin_napi() {
    [[ $NAPI_THREADS == yes ]] || return 0
    napi_pin "$SERVER_CPUS" "$CLIENT_CPUS" || die "--napi-threads: no napi/vs-* kernel thread found"
}

# Waits until the process `pid` is alive and has a UDP socket bound to `hex` (/proc/net/udp form)
# in its namespace; up to `secs` seconds.
wait_bound() {
    local pid=$1 hex=$2 secs=$3 i
    for ((i = 0; i < secs * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || return 1
        grep -q " $hex " "/proc/$pid/net/udp" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

start_mirror() {
    cat >"$WORK/mirror.conf" <<EOF
# Upstream that chimed and rsntp mirror: a free-running local clock, reachable on loopback only.
local stratum 1
port $MIRROR_PORT
bindaddress 127.0.0.1
allow 127.0.0.1
cmdport 0
bindcmdaddress /
pidfile $WORK/mirror.pid
EOF
    ip netns exec "$NS_S" "$CHRONYD" -x -d -u root -f "$WORK/mirror.conf" >"$WORK/mirror.log" 2>&1 &
    MIRROR_PID=$!
    wait_bound "$MIRROR_PID" "$UDP_MIRROR_HEX" 10 || {
        cat "$WORK/mirror.log" >&2
        die "mirror chronyd did not come up on 127.0.0.1:$MIRROR_PORT"
    }
}

# Prints the command line of a server under test, one word per line.
server_command() {
    local name=$1 threads=${1##*-}
    case $name in
        chronyd)
            cat >"$WORK/server-chronyd.conf" <<EOF
# chronyd as the server under test: its own instance, serving 10.99.0.1:123 to anyone.
local stratum 1
port 123
bindaddress $SERVER_IP
allow all
cmdport 0
bindcmdaddress /
pidfile $WORK/server-chronyd.pid
EOF
            if [[ $NTP_MODE == interleaved ]]; then
                # chronyd keeps interleaved-mode timestamps in its client log, by default 512 KiB
                # (4096 clients): far fewer than ntpperf's, which would leave it answering basic.
                # 256 MiB holds them all; the log grows only as clients come.
                echo "clientloglimit 268435456" >>"$WORK/server-chronyd.conf"
            fi
            printf '%s\n' "$CHRONYD" -x -d -u root -f "$WORK/server-chronyd.conf"
            ;;
        chimed-*)
            printf '%s\n' "$CHIMED" -4 "$threads" -6 0 -a "$SERVER_IP:123" -s "127.0.0.1:$MIRROR_PORT"
            if [[ -n $RMEM ]]; then
                printf '%s\n' --recv-buffer $((RMEM / 2))
            fi
            if [[ $name == chimed-noshed-* ]]; then
                printf '%s\n' --shed-target 0
            fi
            if [[ $name == chimed-xdp-* ]]; then
                # The same sockets, and NTP on vs through AF_XDP: N XDP threads, one per queue.
                printf '%s\n' --xdp vs --xdp-threads "$threads"
            fi
            if [[ $name == chimed-rl-* ]]; then
                local -a extra
                read -r -a extra <<<"$RATELIMIT_ARGS"
                printf '%s\n' "${extra[@]}"
            fi
            ;;
        rsntp-*)
            printf '%s\n' "$RSNTP" -4 "$threads" -6 0 -a "$SERVER_IP:123" -s "127.0.0.1:$MIRROR_PORT"
            ;;
    esac
}

# --- measurement ----------------------------------------------------------------------------

# Takes one sample into SAMPLE, as "time cpu_ticks vs_rx vs_tx vs_rx_drop vs_tx_drop udp_in
# udp_rcvbuf_errors host_busy host_nice host_total client_ticks" (host_* in ticks over all
# CPUs, from /proc/stat; client_ticks summed over CLIENT_PIDS, i.e. ntpperf and its sender).
# Builtins only (no fork), so the timestamp sits tight against the counters and the sampling
# itself takes no CPU away from the processes being measured.
sample() {
    local now=$EPOCHREALTIME st name rest
    local -a f
    local host_busy host_nice host_total
    read -r name rest </proc/stat # cpu user nice system idle iowait irq softirq steal ...
    read -r -a f <<<"$rest"
    host_busy=$((f[0] + f[1] + f[2] + f[5] + f[6] + f[7]))
    host_nice=${f[1]}
    host_total=$((host_busy + f[3] + f[4]))
    # utime + stime: fields 14 and 15 of stat, all threads. A server that died keeps its last
    # figure; run_server notices the death and says so.
    if read -r st 2>/dev/null <"/proc/$SERVER_PID/stat"; then
        st=${st##*) }
        read -r -a f <<<"$st"
        SERVER_TICKS=$((f[11] + f[12]))
    fi
    # With --napi-threads, the server's receive path runs in vs's NAPI threads: its CPU too.
    napi_ticks
    local ticks=$((SERVER_TICKS + NAPI_TICKS)) pid
    local rx=0 tx=0 rxd=0 txd=0
    while read -r name rest; do
        if [[ $name == vs:* ]]; then
            rest="${name#vs:} $rest"
            read -r -a f <<<"$rest"
            rx=${f[1]} rxd=${f[3]} tx=${f[9]} txd=${f[11]}
            break
        fi
    done <"/proc/$MIRROR_PID/net/dev"
    local -a hdr val
    local udp_in=0 udp_rcvbuf=0 i seen=0
    while read -r name rest; do
        [[ $name == Udp: ]] || continue
        if ((seen == 0)); then
            read -r -a hdr <<<"$rest"
            seen=1
        else
            read -r -a val <<<"$rest"
            for i in "${!hdr[@]}"; do
                case ${hdr[i]} in
                    InDatagrams) udp_in=${val[i]} ;;
                    RcvbufErrors) udp_rcvbuf=${val[i]} ;;
                esac
            done
            break
        fi
    done <"/proc/$MIRROR_PID/net/snmp"
    local client_ticks=0
    for pid in "${CLIENT_PIDS[@]}"; do
        if read -r st 2>/dev/null <"/proc/$pid/stat"; then
            st=${st##*) }
            read -r -a f <<<"$st"
            client_ticks=$((client_ticks + f[11] + f[12]))
        fi
    done
    SAMPLE="$now $ticks $rx $tx $rxd $txd $udp_in $udp_rcvbuf $host_busy $host_nice $host_total $client_ticks"
}

# Sets CLIENT_PIDS to every process in the client namespace: ntpperf and the sender process it
# forks (which busy-waits for each request's send time, so it keeps one CPU fully busy).
find_client_pids() {
    CLIENT_PIDS=()
    local d
    for d in /proc/[0-9]*; do
        if [[ $d/ns/net -ef /run/netns/$NS_C ]]; then
            CLIENT_PIDS+=("${d#/proc/}")
        fi
    done
}

# Runs one ntpperf step at `rate` against the running server; appends to the raw file and the
# step CSV; sets STEP_LOST (ntpperf's loss %, or empty if ntpperf gave no result) and
# STEP_DISTURBED (1 if other processes took more than MAX_OTHER % of a CPU in the window).
#
# Two brackets per step:
# - the window, from 0.4 s after ntpperf starts to STEP_TIME s after it starts: steady load, so
#   rates and CPU per response come from here. ntpperf sends each of its min(rate/10, 16384)
#   clients two warm-up requests first, 2 * clients / rate <= 0.2 s, then measures for STEP_TIME
#   s; at 1M/s the warm-up is only 33 ms, so the window may not reach further than STEP_TIME;
# - the whole step, from before ntpperf starts to after it exits (nothing in flight at either
#   end): exact request, reply and receive-buffer-drop counts, so server-side loss comes from here.
run_step() {
    local name=$1 rate=$2 raw=$3 attempt=$4
    local out=$WORK/ntpperf.out
    local limit window
    limit=$(awk -v t="$STEP_TIME" 'BEGIN { printf "%d", t * 3 + 10 }')
    window=$(awk -v t="$STEP_TIME" 'BEGIN { printf "%.2f", t - 0.4 }')
    local -a cmd=(ip netns exec "$NS_C")
    if [[ -n $CLIENT_CPUS ]]; then
        cmd+=(taskset -c "$CLIENT_CPUS")
    fi
    cmd+=("$NTPPERF" -i vc -m "$SERVER_MAC" -d "$SERVER_IP" -s "$CLIENT_NET" "$NTPPERF_MODE" -l -r "$rate" -t "$STEP_TIME")

    local s0 a b s1 rc=0
    sample
    s0=$SAMPLE
    timeout "$limit" "${cmd[@]}" >"$out" 2>&1 &
    NTPPERF_PID=$!
    sleep 0.4
    find_client_pids
    sample
    a=$SAMPLE
    sleep "$window"
    sample
    b=$SAMPLE
    wait "$NTPPERF_PID" || rc=$?
    NTPPERF_PID=
    CLIENT_PIDS=()
    sleep 0.05 # let the server empty its queue
    sample
    s1=$SAMPLE

    {
        echo "### step: rate $rate, attempt $attempt, ntpperf exit $rc"
        echo "### $(printf '%q ' timeout "$limit" "${cmd[@]}")"
        cat "$out"
        echo "### samples (time cpu_ticks vs_rx vs_tx vs_rx_drop vs_tx_drop udp_InDatagrams udp_RcvbufErrors host_busy host_nice host_total client_ticks):"
        echo "###   step start:   $s0"
        echo "###   window start: $a"
        echo "###   window end:   $b"
        echo "###   step end:     $s1"
    } >>"$raw"

    # ntpperf's result row: rate clients lost% invalid% basic% xleave% [min mean max stddev]
    local row
    row=$(grep -E '^[0-9]+ +[0-9]+ +[0-9.]+%' "$out" | tail -n 1 || true)
    STEP_DISTURBED=0
    if [[ -z $row ]]; then
        STEP_LOST=
        return
    fi
    STEP_LOST=$(awk '{ sub("%", "", $3); print $3 }' <<<"$row")
    local csv_row
    csv_row=$(awk -v name="$name" -v rate="$rate" -v tck="$CLK_TCK" -v ncpu="$NCPU" -v row="$row" \
        -v s0="$s0" -v a="$a" -v b="$b" -v s1="$s1" -v attempt="$attempt" -v max_other="$MAX_OTHER" '
    BEGIN {
        split(s0, S0, " "); split(a, A, " "); split(b, B, " "); split(s1, S1, " ")
        n = split(row, R, " ")
        for (i = 3; i <= 6; i++) sub("%", "", R[i])
        # window: rates and CPU
        dt = B[1] - A[1]
        cpu = (B[2] - A[2]) / tck
        tx = B[4] - A[4]
        offered = (B[3] - A[3]) / dt; resp = tx / dt
        us = tx > 0 ? 1e6 * cpu / tx : 0
        # whole step: exact counts
        req = S1[3] - S0[3]; rep = S1[4] - S0[4]
        srv_loss = req > 0 ? 100 * (req - rep) / req : 0
        mean = n >= 8 ? R[8] + 0 : ""
        # Everything in % of one CPU. "other" is what the machine spent on neither the server nor
        # ntpperf: builds of other users, ksoftirqd, this script. A step with much of it was
        # disturbed, and its loss may come from scheduling rather than from the server.
        # Machine-wide shares use the total of /proc/stat as the clock: over a window of about a
        # second its busy ticks can run ahead of wall time by a tenth.
        # If an ntpperf process ended inside the window, its ticks vanish from the second
        # sample and the client and other shares are unknown: left empty.
        client = ""; other = ""
        if (B[12] >= A[12]) {
            client = sprintf("%.1f", 100 * (B[12] - A[12]) / tck / dt)
            ht = B[11] - A[11]
            if (ht > 0) {
                other = 100 * ncpu * (B[9] - A[9]) / ht - 100 * cpu / dt - client
                other = sprintf("%.1f", other < 0 ? 0 : other)
            }
        }
        ht = B[11] - A[11]
        niced = ht > 0 ? 100 * ncpu * (B[10] - A[10]) / ht : 0
        disturbed = other != "" && other + 0 > max_other + 0 ? 1 : 0
        # What the clients accepted: ntpperf counts a reply invalid when its origin timestamp is
        # not the latest request of its client (it came after the next one went out), and lost
        # when none came; what is left of the offered rate is what clients could use.
        accepted = offered * (1 - (R[3] + R[4]) / 100)
        printf "%s,%d,%d,%.2f,%.2f,%.0f,%.0f,%.1f,%.3f,%s,%.3f,%d,%d,%.2f,%d,%d,%s,%s,%.1f,%d,%d,%.2f,%.0f\n",
            name, rate, R[2], R[3], R[4], offered, resp, 100 * cpu / dt, us, mean, dt,
            req, rep, srv_loss, S1[8] - S0[8], (S1[5] - S0[5]) + (S1[6] - S0[6]),
            client, other, niced, attempt, disturbed, R[6], accepted < 0 ? 0 : accepted
    }')
    echo "$csv_row" >>"$STEPS_CSV"
    # Column 21 (disturbed); ntpperf_xleave_pct and accepted_pps came after it.
    STEP_DISTURBED=$(cut -d, -f21 <<<"$csv_row")
}

# Per-server summary row from its step rows, taking the last attempt at each rate. The peak is
# the highest response rate of any step whose lost and invalid replies together were < 1% (by
# ntpperf's count: a stale reply is no more use to a client than none), not of the last
# step before the first lossy one: on a shared machine a lone noisy step low in the ladder would
# otherwise hide the real knee. disturbed_steps counts the steps whose last attempt was still
# disturbed; their losses may be the scheduler's doing, and other_cpu_pct in steps.csv says how much.
summarise() {
    local name=$1 status=$2 ladder_us=$3
    awk -F, -v name="$name" -v status="$status" -v ladder_us="$ladder_us" '
    $1 == name {
        if (!($2 in row)) order[++steps] = $2
        row[$2] = $0
    }
    END {
        for (i = 1; i <= steps; i++) {
            split(row[order[i]], f, ",")
            if (f[4] + f[5] < 1 && f[7] > best) { best = f[7]; best_off = f[6]; best_rate = f[2]; best_us = f[9]; best_cpu = f[8] }
            if (f[7] > top) { top = f[7]; top_us = f[9]; top_loss = f[4] }
            if (f[23] > top_acc) { top_acc = f[23]; top_acc_bad = f[4] + f[5] }
            disturbed += f[21]
        }
        # no step under 1% loss: leave the peak columns empty rather than print zeros
        peak = best == "" ? ",,,," : sprintf("%.0f,%d,%.0f,%.3f,%.1f", best, best_rate, best_off, best_us, best_cpu)
        printf "%s,%s,%d,%s,%.0f,%.2f,%.3f,%s,%d,%.0f,%.2f\n", name, status, steps, peak,
            top, top_loss, top_us, ladder_us, disturbed, top_acc, top_acc_bad
    }' "$STEPS_CSV" >>"$SUMMARY_CSV"
}

run_server() {
    local name=$1
    local raw=$OUT_DIR/raw/$name.txt
    local -a cmd
    mapfile -t cmd < <(server_command "$name")
    local bin=${cmd[0]}

    if [[ ! -x $bin ]]; then
        note "$name: binary '$bin' not found, skipped"
        echo "# $name: skipped, binary '$bin' not found" >"$raw"
        echo "$name,skipped (no binary),0,,,,,,,,,,,," >>"$SUMMARY_CSV"
        return
    fi

    note "$name: $(printf '%q ' "${cmd[@]}")"
    {
        echo "# server: $name"
        echo "# command (in netns S): $(printf '%q ' "${cmd[@]}")"
        if [[ -n $SERVER_CPUS ]]; then
            echo "# pinned to CPUs $SERVER_CPUS"
        fi
        if [[ $name == chronyd ]]; then
            sed 's/^/# conf: /' "$WORK/server-chronyd.conf"
        fi
    } >"$raw"

    local -a launch=(ip netns exec "$NS_S")
    if [[ -n $SERVER_CPUS ]]; then
        launch+=(taskset -c "$SERVER_CPUS")
    fi
    "${launch[@]}" "${cmd[@]}" >"$WORK/$name.log" 2>&1 &
    SERVER_PID=$! # ip netns exec and taskset exec the server, so this is the server's PID

    local status=ok
    if ! wait_bound "$SERVER_PID" "$UDP_SERVER_HEX" 10; then
        status="failed to start"
    else
        sleep "$SETTLE"
        kill -0 "$SERVER_PID" 2>/dev/null || status="died during settle"
        pin_napi
    fi
    # The receive buffer the kernel gave each of the server's sockets on port 123 (ss -m's rb).
    local rb
    rb=$(ip netns exec "$NS_S" ss -uamn "sport = :123" |
        sed -n 's/.*skmem:([^)]*rb\([0-9]*\).*/\1/p' | sort -u | paste -sd/)
    echo "# receive buffer (ss rb): ${rb:-unknown}" >>"$raw"
    note "$name: receive buffer ${rb:-unknown} bytes"
    if [[ $status == ok && -n $RMEM && $rb != "$RMEM" ]]; then
        status="receive buffer ${rb:-unknown}, not --rmem $RMEM"
    fi

    local ladder_us=
    if [[ $status == ok ]]; then
        local first last rate=$RATE_START
        SERVER_TICKS=0
        sample
        first=$SAMPLE
        while ((rate <= RATE_MAX)); do
            if ! kill -0 "$MIRROR_PID" 2>/dev/null; then
                tail -n 20 "$WORK/mirror.log" >&2
                die "the mirror chronyd died"
            fi
            local attempt=1
            while true; do
                if ((attempt == 1)); then
                    note "$name: $rate req/s"
                else
                    note "$name: $rate req/s, attempt $attempt"
                fi
                run_step "$name" "$rate" "$raw" "$attempt"
                ((STEP_DISTURBED && attempt <= RETRIES)) || break
                note "$name: $rate req/s was disturbed by other processes, again in 5 s"
                attempt=$((attempt + 1))
                sleep 5
            done
            if [[ -z $STEP_LOST ]]; then
                status="ntpperf gave no result at $rate"
                break
            fi
            if ! kill -0 "$SERVER_PID" 2>/dev/null; then
                status="server died at $rate"
                break
            fi
            if num_gt "$STEP_LOST" "$STOP_LOSS"; then
                break
            fi
            rate=$(awk -v r="$rate" -v m="$RATE_MULT" 'BEGIN { printf "%d", r * m }')
        done
        if kill -0 "$SERVER_PID" 2>/dev/null; then
            sample
            last=$SAMPLE
            ladder_us=$(awk -v a="$first" -v b="$last" -v tck="$CLK_TCK" 'BEGIN {
                split(a, A, " "); split(b, B, " "); tx = B[4] - A[4]
                if (tx > 0) printf "%.3f", 1e6 * (B[2] - A[2]) / tck / tx }')
            {
                echo "# whole ladder: first $first"
                echo "# whole ladder: last  $last"
                echo "# whole ladder: CPU us per reply sent = $ladder_us"
            } >>"$raw"
        fi
    fi

    stop_pid "$SERVER_PID"
    SERVER_PID=
    {
        echo "# status: $status"
        echo "# server output (last 40 lines):"
        # without terminal colour codes, which some loggers emit even into a file
        tail -n 40 "$WORK/$name.log" | sed -e 's/\x1b\[[0-9;]*m//g' -e 's/^/#   /'
    } >>"$raw"
    summarise "$name" "$status" "$ladder_us"
    note "$name: $status"
}

write_setup() {
    {
        echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "kernel: $(uname -srm)"
        echo "cpus: $(nproc) ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo))"
        echo "load before run: $(cat /proc/loadavg)"
        echo "net.core.rmem_default: $(cat /proc/sys/net/core/rmem_default)"
        echo "net.core.netdev_max_backlog: $(cat /proc/sys/net/core/netdev_max_backlog)"
        echo "chronyd: $CHRONYD ($("$CHRONYD" -v 2>&1 | head -n 1))"
        local b
        for b in "$CHRONYD" "$NTPPERF" "$CHIMED" "$RSNTP"; do
            if [[ -n $b && -f $b ]]; then
                echo "sha256: $(sha256sum "$b")"
            fi
        done
        if git -C "$repo_dir" rev-parse --git-dir >/dev/null 2>&1; then
            local head dirty=
            head=$(git -C "$repo_dir" rev-parse --verify -q HEAD || echo "no commit yet")
            if git -C "$repo_dir" status --porcelain 2>/dev/null | grep -q .; then
                dirty=" (work tree has changes)"
            fi
            echo "chime commit: $head$dirty"
        fi
        echo "servers: $SERVERS"
        if [[ $SERVERS == *chimed-rl-* ]]; then
            echo "chimed-rl-N flags: $RATELIMIT_ARGS"
        fi
        echo "ladder: start $RATE_START, max $RATE_MAX, mult $RATE_MULT, step ${STEP_TIME}s," \
            "stop after a step losing > $STOP_LOSS%"
        echo "placement: server CPUs ${SERVER_CPUS:-any}, client CPUs ${CLIENT_CPUS:-any}, NAPI threads: $NAPI_THREADS"
        echo "disturbed: other processes > $MAX_OTHER% of a CPU in a step's window; retries $RETRIES"
        echo "network: netns $NS_S (vs $SERVER_IP, MAC $SERVER_MAC) <-> netns $NS_C (vc $CLIENT_IP);" \
            "clients $CLIENT_NET; ntpperf $NTPPERF_MODE -l"
        echo "mirror chronyd conf:"
        sed 's/^/  /' "$WORK/mirror.conf"
    } >"$OUT_DIR/setup.txt"
}

# --- main -----------------------------------------------------------------------------------

mkdir -p "$OUT_DIR/raw"
STEPS_CSV=$OUT_DIR/steps.csv
SUMMARY_CSV=$OUT_DIR/summary.csv
echo "server,nominal_rate,clients,ntpperf_lost_pct,ntpperf_invalid_pct,offered_pps,response_pps,server_cpu_pct,cpu_us_per_response,ntpperf_resp_time_mean_ns,window_s,step_requests,step_replies,step_server_loss_pct,step_udp_rcvbuf_errors,step_veth_drops,ntpperf_cpu_pct,other_cpu_pct,niced_cpu_pct,attempt,disturbed,ntpperf_xleave_pct,accepted_pps" >"$STEPS_CSV"
echo "server,status,steps,peak_response_pps_lt1pct_lost_or_invalid,nominal_rate_at_peak,offered_pps_at_peak,cpu_us_per_response_at_peak,server_cpu_pct_at_peak,max_response_pps,ntpperf_lost_pct_at_max,cpu_us_per_response_at_max,cpu_us_per_response_whole_ladder,disturbed_steps,max_accepted_pps,ntpperf_lost_plus_invalid_pct_at_max_accepted" >"$SUMMARY_CSV"

set_rmem
setup_network
start_mirror
write_setup
for s in "${server_list[@]}"; do
    run_server "$s"
done

note "results in $OUT_DIR (summary.csv, steps.csv, raw/, setup.txt)"
column -s, -t "$SUMMARY_CSV" >&2 2>/dev/null || cat "$SUMMARY_CSV" >&2
