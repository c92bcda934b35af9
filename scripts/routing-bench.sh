#!/usr/bin/env bash
# Capacity of routing policies through the gateway, on four emulated engines in real time
# (time-scale 1), under the failure modes of `kvgate sim` (crates/sim/README.md): for each
# policy a fresh fleet and gateway, then `kvgate bench --sweep` of the scenario's workload. The
# SLO is the sim's: TTFT within 1 s (3 s for fanout-long) for 95% of requests (`--capacity-attainment 0.95`), a failed
# request counting as a miss. Prints one table; JSON per policy in the output directory.
#
#   scripts/routing-bench.sh SCENARIO [--policies a,b,...] [--sweep A:B:STEP] [--duration S]
#                            [--out DIR] [--seed N]
#
# SCENARIO: fanout (3 shared 4,000-token prompts in bursts of 16 calls; rates in bursts/s),
# fanout-long (the same over an 8,000-token parent context, SLO 3 s; the sim's
# `--set context_tokens=8000 --set slo_ttft_ms=3000`), heterogeneous (agentic sessions; engines 3 and 4 run 2.5x slower; rates in sessions/s), mix
# (agentic sessions on four equal engines). Each rate runs --duration seconds of arrivals, then
# waits for the last answers. Latency CDFs and the sweep curves go to DIR/SCENARIO-POLICY.svg.
# KVGATE=path/to/kvgate skips the release build. Takes (rates x duration + drain) per policy: ~15 min per
# scenario with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."

scenario=${1:?usage: scripts/routing-bench.sh fanout|fanout-long|heterogeneous|mix [flags]}
shift
policies=predicted_ttft,cache_aware,consistent_hash,prefix_hash,least_outstanding
out=target/routing-bench
seed=1
sweep=
duration=
while [[ $# -gt 0 ]]; do
    case "$1" in
    --policies) policies="$2"; shift 2 ;;
    --sweep) sweep="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
    esac
done

scales=(1 1 1 1)
slo_ms=1000
case "$scenario" in
fanout)
    workload=(--workload fanout)
    sweep=${sweep:-0.5:1.25:0.25}
    duration=${duration:-40}
    ;;
fanout-long)
    workload=(--workload fanout --fanout-context-len 8000)
    slo_ms=3000
    sweep=${sweep:-0.3:0.9:0.2}
    duration=${duration:-60}
    ;;
heterogeneous)
    workload=(--workload agentic --agentic-max-context 16000)
    scales=(1 1 2.5 2.5)
    sweep=${sweep:-5:8:1.5}
    duration=${duration:-60}
    ;;
mix)
    workload=(--workload agentic --agentic-max-context 16000)
    sweep=${sweep:-8:12:2}
    duration=${duration:-60}
    ;;
*) echo "unknown scenario $scenario" >&2; exit 2 ;;
esac

mkdir -p "$out"
source scripts/lib.sh
kvgate_binary
kvgate=$KVGATE

IFS=, read -r -a names <<<"$policies"
for policy in "${names[@]}"; do
    endpoints=()
    for i in 0 1 2 3; do
        # The sim's failure-mode fleet: 128 slots, 16,384 blocks of 16 tokens, chunked prefill.
        start "$kvgate" engine --listen 127.0.0.1:0 --id "engine-$i" --seed "$i" \
            --time-scale "${scales[$i]}" --max-num-seqs 128 --kv-blocks 16384
        endpoints+=(--endpoint "$url")
    done
    start "$kvgate" serve --listen 127.0.0.1:0 "${endpoints[@]}" --policy "$policy"
    gateway=$url
    echo "== $scenario: $policy (gateway $gateway)"
    "$kvgate" bench --url "$gateway" "${workload[@]}" --sweep "$sweep" --duration "$duration" \
        --ignore-eos --slo-ttft-ms "$slo_ms" --capacity-attainment 0.95 --timeout-s 120 \
        --seed "$seed" --no-progress --json "$out/$scenario-$policy.json" \
        --plot "$out/$scenario-$policy.svg" >"$out/$scenario-$policy.txt"
    tail -n 3 "$out/$scenario-$policy.txt"
    stop_all
done

python3 - "$out" "$scenario" "$slo_ms" "${names[@]}" <<'EOF'
import json, sys
out, scenario, slo_ms, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
print(f"\n{scenario}: capacity at TTFT <= {slo_ms / 1000:g} s for 95% of requests (req/s offered per rate; sessions or bursts per rate)")
print(f"{'policy':<20} {'capacity':>9} " + " ".join(f"{'rate':>5} {'req/s':>6} {'SLO%':>5} {'p95 ms':>7} {'hit':>5}" for _ in range(1)))
for name in names:
    d = json.load(open(f"{out}/{scenario}-{name}.json"))
    cap = d["capacity"][0]["rate"] if d["capacity"] else None
    rows = []
    for r in d["results"]:
        hit = r.get("cache_hit_ratio")
        rows.append(f"{r['offered_rate']:>5g} {r['achieved_rate']:>6.1f} {100*r['slo_attainment']:>5.1f} "
                    f"{r['ttft_ms']['p95'] or float('nan'):>7.0f} {hit if hit is None else round(hit, 3)!s:>5}")
    print(f"{name:<20} {cap!s:>9} " + " | ".join(rows))
EOF
