# bench-lib.sh: what the A/B scripts here share, sourced by them: a free loopback port, and a
# chronyd -x to mirror with a Roughtime key made beside it. The sourcing script sets `work` (a
# scratch directory), `pids` (an array its cleanup kills) and `chime` (the chime binary) first.

# A loopback port free for both UDP and TCP (Roughtime over TCP binds its UDP socket's port).
free_port() {
    python3 -c '
import socket
while True:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", 0))
    t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        t.bind(("127.0.0.1", u.getsockname()[1])); print(u.getsockname()[1]); break
    except OSError:
        pass'
}

# Starts chronyd -x on a free loopback port (`chrony_port`), serving its own clock at stratum 3,
# and makes a Roughtime long-term key in "$work/rt.key" (`public`, its base64 public key).
start_upstream() {
    chrony_port=$(free_port)
    cat >"$work/chrony.conf" <<EOF
port $chrony_port
bindaddress 127.0.0.1
allow 127.0.0.1
local stratum 3
cmdport 0
pidfile $work/chronyd.pid
driftfile $work/drift
EOF
    /usr/sbin/chronyd -x -d -u root -f "$work/chrony.conf" >"$work/chronyd.log" 2>&1 &
    pids+=($!)
    "$chime" keygen "$work/rt.key" >"$work/keygen.txt"
    public=$(sed -n 's/.*public key (base64): \([^ ]*\).*/\1/p' "$work/keygen.txt" | head -1)
    [[ -n $public ]] || { echo "no public key from chime keygen:" >&2; cat "$work/keygen.txt" >&2; exit 1; }
}
