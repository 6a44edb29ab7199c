# napi.sh: sourced by run-comparison.sh and run-xdp-roughtime.sh for their --napi-threads yes.
#
# A veth receives on the sender's core: the server's receive path (the IP/UDP stack, or an XDP
# program and its copies) runs on the client's CPU and the client's on the server's. With GRO on
# and /sys/class/net/DEV/threaded set, each end receives in a NAPI kernel thread (named
# napi/<dev>-<id>) that can be pinned with its side, as a NIC's interrupts would be.

# Makes vs (in namespace $1) and vc (in namespace $2) receive in NAPI threads.
napi_threaded() {
    ip netns exec "$1" ethtool -K vs gro on >/dev/null
    ip netns exec "$2" ethtool -K vc gro on >/dev/null
    ip netns exec "$1" sh -c 'echo 1 >/sys/class/net/vs/threaded'
    ip netns exec "$2" sh -c 'echo 1 >/sys/class/net/vc/threaded'
}

# Pins vs's NAPI threads to CPU list $1 and vc's to $2, and lists vs's in NAPI_PIDS. Attaching or
# detaching an XDP program may make new threads, so callers run this again once a server is up.
# Returns 1 if vs has none.
napi_pin() {
    NAPI_PIDS=()
    local d comm
    for d in /proc/[0-9]*; do
        read -r comm 2>/dev/null <"$d/comm" || continue
        case $comm in
            napi/vs-*) taskset -pc "$1" "${d#/proc/}" >/dev/null; NAPI_PIDS+=("${d#/proc/}") ;;
            napi/vc-*) taskset -pc "$2" "${d#/proc/}" >/dev/null ;;
        esac
    done
    ((${#NAPI_PIDS[@]} > 0))
}

# Sets NAPI_TICKS to the CPU time (utime + stime, clock ticks) of the threads in NAPI_PIDS.
# Builtins only (no fork), so a caller's sample stays tight.
napi_ticks() {
    NAPI_TICKS=0
    local pid st
    local -a f
    for pid in "${NAPI_PIDS[@]}"; do
        if read -r st 2>/dev/null <"/proc/$pid/stat"; then
            st=${st##*) }
            read -r -a f <<<"$st"
            NAPI_TICKS=$((NAPI_TICKS + f[11] + f[12]))
        fi
    done
}
