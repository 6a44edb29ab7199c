#!/usr/bin/env bash
# run-ab.sh: two builds of chimed side by side on loopback, for a change that must not change
# their speed: NTP replies the client accepts per second with the server's core saturated, and
# Roughtime CPU time per reply at a fixed rate, in rotated rounds (A B, then B A, ...), so that
# neither build always runs on a warmer or quieter machine.
#
# Each build runs alone, pinned to CPU 0, with one NTP thread and one Roughtime thread on loopback,
# mirroring a chronyd -x started here; `chime perf` runs pinned to CPU 1 and reads the server's CPU
# time from /proc. Per round and build: `chime perf ntp --rate NTP_RATE` (above one core's
# capacity: what counts is how many replies arrive in time to be accepted, and what each cost),
# then `chime perf roughtime --rate RT_RATE` (below capacity: what counts is the CPU each reply
# cost), then with `--nts-rate` `chime perf ntp --nts` (authenticated NTP over NTS-KE sessions made
# first, below capacity: the CPU each reply cost). The summary gives each round's figures, each build's mean, and B/A of the means with the
# per-round range of B/A. The server's CPU % says whether the NTP run saturated it: if not, the
# generator (or another process) was short of CPU, and only CPU per reply compares.
#
# This script builds nothing: it is given the binaries. Needs chronyd, taskset, python3.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: run-ab.sh --a CHIMED --b CHIMED --chime CHIME --out DIR [options]
  --a PATH, --b PATH   the two chimed binaries (A is the reference)
  --chime PATH         the chime binary whose perf loads them
  --out DIR            where results go: one CSV per run, summary.txt, setup.txt
  --rounds N           rounds, each running A and B once (default 4)
  --ntp-rate R         NTP requests per second (default 400000)
  --rt-rate R          Roughtime requests per second (default 40000)
  --duration S         seconds of each run (default 4)
  --nts-rate R         also authenticated NTP (NTS) at R requests per second (default: not run)
EOF
}

a='' b='' chime='' out='' rounds=4 ntp_rate=400000 rt_rate=40000 duration=4 nts_rate=''
while (($#)); do
    case $1 in
    --a) a=$2; shift 2 ;;
    --b) b=$2; shift 2 ;;
    --chime) chime=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --ntp-rate) ntp_rate=$2; shift 2 ;;
    --rt-rate) rt_rate=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --nts-rate) nts_rate=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run-ab.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done
for f in "$a" "$b" "$chime"; do
    [[ -x $f ]] || { echo "run-ab.sh: not an executable: '$f'" >&2; usage >&2; exit 2; }
done
[[ -n $out ]] || { echo "run-ab.sh: --out is needed" >&2; exit 2; }
mkdir -p "$out"
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# shellcheck source=bench-lib.sh
source "$(dirname "$0")/bench-lib.sh"
start_upstream
nts_args=()
if [[ -n $nts_rate ]]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1 \
        -addext basicConstraints=critical,CA:FALSE \
        -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
    chmod 600 "$work/key.pem"
    nts_args=(--nts-certificate "$work/cert.pem" --nts-private-key "$work/key.pem" --nts-ke-threads 1)
fi

{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(uname -n), kernel $(uname -r), $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
    echo "A: $a ($(sha256sum "$a" | cut -c1-16))"
    echo "B: $b ($(sha256sum "$b" | cut -c1-16))"
    echo "chime: $chime"
    echo "rounds $rounds, NTP $ntp_rate/s, Roughtime $rt_rate/s, NTS ${nts_rate:-not run}/s, $duration s each"
} >"$out/setup.txt"

# One build, one round: start it, wait until it mirrors chronyd, load NTP then Roughtime.
run_one() {
    local label=$1 bin=$2 round=$3
    local ntp_port rt_port ke_port nts=()
    ntp_port=$(free_port)
    rt_port=$(free_port)
    ke_port=$(free_port)
    [[ -n $nts_rate ]] && nts=("${nts_args[@]}" --nts-ke-address "127.0.0.1:$ke_port")
    taskset -c 0 "$bin" -s "127.0.0.1:$chrony_port" -4 1 -6 0 -a "127.0.0.1:$ntp_port" "${nts[@]}" \
        --roughtime-key "$work/rt.key" --roughtime-ipv4-threads 1 --roughtime-ipv6-threads 0 \
        --roughtime-ipv4-address "127.0.0.1:$rt_port" --roughtime-tcp-connections 0 \
        >"$work/$label-$round.log" 2>&1 &
    local pid=$!
    pids+=("$pid")
    for _ in $(seq 100); do
        grep -q 'synchronised: stratum' "$work/$label-$round.log" && break
        sleep 0.1
    done
    grep -q 'synchronised: stratum' "$work/$label-$round.log" ||
        { echo "run-ab.sh: $label did not synchronise:" >&2; cat "$work/$label-$round.log" >&2; exit 1; }
    taskset -c 1 "$chime" perf ntp --target "127.0.0.1:$ntp_port" --rate "$ntp_rate" \
        --duration "$duration" --server-pid "$pid" --csv "$out/ntp-$label-$round.csv" \
        >"$out/ntp-$label-$round.txt" 2>&1
    taskset -c 1 "$chime" perf roughtime --target "127.0.0.1:$rt_port" --public-key "$public" \
        --rate "$rt_rate" --duration "$duration" --verify-every 1000 --server-pid "$pid" \
        --csv "$out/roughtime-$label-$round.csv" >"$out/roughtime-$label-$round.txt" 2>&1
    if [[ -n $nts_rate ]]; then
        taskset -c 1 "$chime" perf ntp --nts "127.0.0.1:$ke_port" --nts-ca "$work/cert.pem" \
            --rate "$nts_rate" --duration "$duration" --warmup 0.5 --server-pid "$pid" \
            --csv "$out/nts-$label-$round.csv" >"$out/nts-$label-$round.txt" 2>&1
    fi
    kill -TERM "$pid"
    wait "$pid" || true
}

for round in $(seq "$rounds"); do
    if ((round % 2)); then order=(A B); else order=(B A); fi
    for label in "${order[@]}"; do
        if [[ $label == A ]]; then run_one A "$a" "$round"; else run_one B "$b" "$round"; fi
    done
done

python3 - "$out" "$rounds" "$nts_rate" >"$out/summary.txt" <<'EOF'
import csv, statistics, sys
out, rounds, nts = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def col(path, name):
    with open(path) as f:
        row = next(csv.DictReader(f))
    return float(row[name])
for proto, name, what in [("ntp", "accepted_rate", "NTP accepted replies/s"),
                          ("ntp", "server_cpu_us_per_reply", "NTP server CPU us/reply"),
                          ("ntp", "server_cpu_pct", "NTP server CPU % (100: saturated)"),
                          ("roughtime", "server_cpu_us_per_reply", "Roughtime server CPU us/reply"),
                          ("roughtime", "accepted_rate", "Roughtime accepted replies/s")] + (
                         [("nts", "server_cpu_us_per_reply", "NTS server CPU us/reply"),
                          ("nts", "accepted_rate", "NTS accepted replies/s")] if nts else []):
    vals = {l: [col(f"{out}/{proto}-{l}-{r}.csv", name) for r in range(1, rounds + 1)] for l in "AB"}
    ratios = [b / a for a, b in zip(vals["A"], vals["B"])]
    print(f"{what}")
    for r in range(rounds):
        print(f"  round {r + 1}: A {vals['A'][r]:.2f}  B {vals['B'][r]:.2f}  B/A {ratios[r]:.3f}")
    ma, mb = statistics.mean(vals["A"]), statistics.mean(vals["B"])
    print(f"  mean: A {ma:.2f}  B {mb:.2f}  B/A {mb / ma:.3f} (rounds {min(ratios):.3f}..{max(ratios):.3f})")
EOF
cat "$out/summary.txt"
