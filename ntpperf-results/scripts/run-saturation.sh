#!/usr/bin/env bash
# run-saturation.sh: each server's peak replies per second on its core, side by side: every
# server in turn under one fixed request rate above all their capacities, for several rounds, the
# order rotated each round, so that every server meets the machine in the same states.
#
# Why not just the ladder of run-comparison.sh: on these shared VMs the server's core runs in two
# states that alternate every few seconds, one about 1.5x slower than the other for the same
# kernel and server code (same profile, fewer replies; see README.md). A ladder gives each server
# one contiguous minute, so one server may get the slow state and another the fast. Short
# alternating windows at saturation sample both states for every server.
#
# Each round is one run of run-comparison.sh with --rate-start = --rate-max = RATE, so the
# network, the mirror, the buffers and the CPU placement are exactly the ladder's. Everything
# after the options below is passed to it (--ntpperf, --rsntp, --rmem, --server-cpus, ...).
#
# Outputs in --out: round-N/ (run-comparison.sh's outputs for round N), rounds.csv (one row per
# round and server) and summary.txt (per-round and overall ratios of the first server listed
# over each other one). Servers are ranked by the replies their clients accepted, not by the
# replies they sent: ntpperf counts a reply that came after the client's next request as
# invalid, and a server with a standing queue can send many replies no client can use.

set -euo pipefail

die() {
    echo "run-saturation.sh: $*" >&2
    exit 2
}

usage() {
    cat <<'EOF'
Usage: run-saturation.sh --out DIR [--rounds N] [--rate R] [--step-time S] [--servers LIST]
                         [run-comparison.sh options...]

  --out DIR         where results go (required)
  --rounds N        rounds, each server once per round, the order rotated (default 5)
  --rate R          the request rate every server gets, req/s (default 650000: above the
                    capacity of each server on one core of these machines)
  --step-time S     seconds each server is measured per round (default 10)
  --servers LIST    as run-comparison.sh; the first is the one the ratios are of
                    (default chimed-1,rsntp-1,chronyd)

Example:
  sudo ./run-saturation.sh --out run20 --ntpperf /path/ntpperf --rsntp /path/rsntp \
      --server-cpus 0 --client-cpus 1 --rmem 4194304
EOF
}

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=
ROUNDS=5
RATE=650000
STEP_TIME=10
SERVERS=chimed-1,rsntp-1,chronyd
pass=()
while [[ $# -gt 0 ]]; do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --out | --rounds | --rate | --step-time | --servers)
            [[ $# -ge 2 ]] || die "option $1 needs a value (see --help)"
            case $1 in
                --out) OUT=$2 ;;
                --rounds) ROUNDS=$2 ;;
                --rate) RATE=$2 ;;
                --step-time) STEP_TIME=$2 ;;
                --servers) SERVERS=$2 ;;
            esac
            shift 2
            ;;
        --rate-start | --rate-max | --rate-mult)
            die "$1 is set by this script (--rate)" ;;
        *) pass+=("$1"); shift ;;
    esac
done
[[ -n $OUT ]] || die "--out DIR is required (see --help)"
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer, not '$ROUNDS'"
[[ $RATE =~ ^[1-9][0-9]*$ ]] || die "--rate must be a positive integer, not '$RATE'"
IFS=, read -r -a servers <<<"$SERVERS"
((${#servers[@]} >= 2)) || die "--servers needs at least two servers to compare"
mkdir -p "$OUT"

for ((r = 1; r <= ROUNDS; r++)); do
    # Round r starts at server (r-1) mod n: each takes each place in the order in turn.
    order=()
    for ((i = 0; i < ${#servers[@]}; i++)); do
        order+=("${servers[(i + r - 1) % ${#servers[@]}]}")
    done
    list=$(IFS=,; echo "${order[*]}")
    echo "== round $r of $ROUNDS: $list at $RATE req/s, $STEP_TIME s each" >&2
    "$script_dir/run-comparison.sh" --rate-start "$RATE" --rate-max "$RATE" \
        --step-time "$STEP_TIME" --servers "$list" --out "$OUT/round-$r" "${pass[@]}"
done

# rounds.csv: steps.csv's columns that matter here, one row per round and server. A step
# run-comparison.sh ran again because other processes disturbed it has a row per attempt; the
# last is the one that counts, as in its own summary.
{
    echo "round,position,server,offered_pps,response_pps,accepted_pps,cpu_us_per_response,server_cpu_pct,ntpperf_lost_pct,ntpperf_invalid_pct,ntpperf_resp_time_mean_ns,step_udp_rcvbuf_errors,attempt,disturbed"
    for ((r = 1; r <= ROUNDS; r++)); do
        awk -F, -v r="$r" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
            {
                s = $c["server"]
                if (!(s in row)) order[++n] = s
                row[s] = s "," $c["offered_pps"] "," $c["response_pps"] "," $c["accepted_pps"] "," \
                    $c["cpu_us_per_response"] "," $c["server_cpu_pct"] "," $c["ntpperf_lost_pct"] "," \
                    $c["ntpperf_invalid_pct"] "," $c["ntpperf_resp_time_mean_ns"] "," \
                    $c["step_udp_rcvbuf_errors"] "," $c["attempt"] "," $c["disturbed"]
            }
            END { for (i = 1; i <= n; i++) print r "," i "," row[order[i]] }' \
            "$OUT/round-$r/steps.csv"
    done
} >"$OUT/rounds.csv"

# summary.txt: per round, every server's replies sent and replies its clients accepted (ntpperf's
# lost and invalid both taken off the offered rate: a reply that comes after the client's next
# request is stale), and the first server's accepted replies and CPU per reply sent over each
# other's; then the means over all rounds, the ratio of the means and the range of the per-round
# ratios. The ranking is by accepted replies.
awk -F, -v list="$SERVERS" -v rate="$RATE" -v step="$STEP_TIME" '
    BEGIN { k = split(list, names, ","); first = names[1] }
    NR == 1 { next }
    {
        pps[$1, $3] = $5; acc[$1, $3] = $6; us[$1, $3] = $7; bad[$1, $3] = $9 "/" $10
        wait[$1, $3] = $11 / 1e6; rounds[$1] = 1
        sum_pps[$3] += $5; sum_acc[$3] += $6; sum_us[$3] += $7; n[$3]++
        if ($10 > max_inv[$3]) max_inv[$3] = $10
        if ($14 == 1) disturbed++
    }
    END {
        printf "%s req/s offered to each server, %s s per server per round; ratios are %s over each other\n", rate, step, first
        printf "accepted = offered x (1 - lost - invalid), ntpperf'"'"'s own counts: the replies clients could use;\n"
        printf "T3-T2 is the server'"'"'s own transmit minus receive timestamp (ntpperf'"'"'s mean): with kernel receive\n"
        printf "timestamps (chimed, chronyd) it includes the wait in the socket queue, from rsntp (T2 read after it) not\n\n"
        printf "%-6s %-16s %10s %10s %14s %9s %8s %15s %16s\n", "round", "server", "sent/s", "accepted/s", "lost/invalid %", "T3-T2 ms", "CPU us", "accepted ratio", "CPU/reply ratio"
        for (r = 1; r in rounds; r++) {
            for (j = 1; j <= k; j++) {
                s = names[j]
                if (!((r, s) in pps)) continue
                ar = (s == first || acc[r, s] == 0) ? "" : sprintf("%.2f", acc[r, first] / acc[r, s])
                cr = (s == first) ? "" : sprintf("%.2f", us[r, s] / us[r, first])
                printf "%-6d %-16s %10d %10d %14s %9.1f %8.3f %15s %16s\n", r, s, pps[r, s], acc[r, s], bad[r, s], wait[r, s], us[r, s], ar, cr
                if (s != first && acc[r, s] > 0) {
                    q = acc[r, first] / acc[r, s]
                    if (!(s in lo) || q < lo[s]) lo[s] = q
                    if (!(s in hi) || q > hi[s]) hi[s] = q
                }
            }
        }
        printf "\nmeans over rounds:\n"
        for (j = 1; j <= k; j++) {
            s = names[j]
            if (!(s in n)) continue
            m = sum_acc[s] / n[s]; sent = sum_pps[s] / n[s]; u = sum_us[s] / n[s]
            printf "  %-16s %9.0f accepted/s (sent %9.0f/s, invalid at most %s%%)  %6.3f us/reply sent", s, m, sent, max_inv[s] + 0, u
            if (s != first && m > 0)
                printf "  accepted ratio of means %.2f (rounds %.2f-%.2f), CPU %.2f", (sum_acc[first] / n[first]) / m, lo[s], hi[s], u / (sum_us[first] / n[first])
            printf "\n"
        }
        printf "\ndisturbed steps (other processes over --max-other): %d\n", disturbed + 0
    }' "$OUT/rounds.csv" >"$OUT/summary.txt"
cat "$OUT/summary.txt" >&2
