#!/usr/bin/env bash
# Event-fed prefix state against the gateway's approximate index, on a fleet whose engines evict
# often: two identical fleets of four emulated engines (time-scale 1, small KV pools, the test
# tokenizer in test-data/tokenizer), one behind a gateway that tokenizes prompts and ingests the
# engines' KV events, one behind a gateway with neither (the default). One `kvgate bench` run
# sends both the same many-tenant agentic sessions at the same times, so the engine-reported hit
# ratio and the TTFT percentiles compare directly; each gateway's cache-prediction score
# (kvgate_cache_prediction_total) and KV-event incidents are printed after.
#
#   scripts/kv-events-bench.sh [--policy NAME] [--rate R] [--duration S] [--kv-blocks N]
#                              [--tenants N] [--tokens-only] [--out DIR]
#
# --tokens-only adds a third fleet whose gateway tokenizes but ingests no events, to tell the two
# effects apart. KVGATE=path/to/kvgate skips the release build. ~2 min plus --duration.
set -euo pipefail
cd "$(dirname "$0")/.."

policy=predicted_ttft
rate=0.2
duration=120
blocks=1536
tenants=16
tokens_only=false
out=target/kv-events-bench
while [[ $# -gt 0 ]]; do
    case "$1" in
    --policy) policy="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --kv-blocks) blocks="$2"; shift 2 ;;
    --tenants) tenants="$2"; shift 2 ;;
    --tokens-only) tokens_only=true; shift ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
source scripts/lib.sh
kvgate_binary
kvgate=$KVGATE
tokenizer=$(pwd)/test-data/tokenizer
max_len=$((blocks * 16 < 16384 ? blocks * 16 : 16384))

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# fleet NAME EVENTS(true|false) TOKENIZE(true|false): four engines and their gateway; sets $gateway.
fleet() {
    local name=$1 events=$2 tokenize=$3 config="$out/$1.yaml"
    : >"$config"
    [[ $tokenize == true ]] && echo "tokenizers: {'*': '$tokenizer'}" >>"$config"
    echo "policy: {name: $policy}" >>"$config"
    echo "endpoints:" >>"$config"
    for i in 0 1 2 3; do
        local kv=() port
        if [[ $events == true ]]; then
            port=$(free_port)
            kv=(--kv-events "tcp://127.0.0.1:$port")
        fi
        start "$kvgate" engine --listen 127.0.0.1:0 --id "$name-$i" --seed "$i" --time-scale 1 \
            --max-num-seqs 64 --kv-blocks "$blocks" --max-model-len "$max_len" \
            --tokenizer "$tokenizer" "${kv[@]}"
        if [[ $events == true ]]; then
            echo "  - {url: '$url', kv_events: 'bind:tcp://127.0.0.1:$port'}" >>"$config"
        else
            echo "  - {url: '$url'}" >>"$config"
        fi
    done
    start "$kvgate" serve --listen 127.0.0.1:0 --config "$config"
    gateway=$url
    if [[ $events == true ]]; then
        # Engines connect on their own schedule (ZMQ retries for up to ~5 s); wait for all four.
        for _ in $(seq 1 200); do
            n=$(http GET "$gateway/metrics" | grep -c '^kvgate_kv_event_connections_total' || true)
            [[ $n -ge 4 ]] && break
            sleep 0.1
        done
    fi
}

fleet events true true
events_url=$gateway
fleet approximate false false
approx_url=$gateway
urls=(--url "$events_url" --url "$approx_url")
names=(events approximate)
if [[ $tokens_only == true ]]; then
    fleet tokens false true
    urls+=(--url "$gateway")
    names+=(tokens-only)
fi
echo "== policy $policy, $tenants tenants, $blocks blocks of 16 tokens per engine, $rate sessions/s for ${duration}s"
"$kvgate" bench "${urls[@]}" --workload agentic --agentic-tenants "$tenants" \
    --agentic-max-context $((max_len / 4)) --rate "$rate" --duration "$duration" --ignore-eos \
    --slo-ttft-ms 1000 --timeout-s 120 --seed 1 --no-progress --json "$out/bench.json" \
    --plot "$out/bench.svg" | tee "$out/bench.txt"

python3 - "$out/bench.json" "${names[@]}" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
names = sys.argv[2:]
print(f"\n{'gateway':<14} {'requests':>8} {'hit ratio':>9} {'TTFT p50':>9} {'p95':>7} {'p99':>7} {'SLO %':>6}")
for name, r in zip(names, d["results"]):
    t = r["ttft_ms"]
    hit = r.get("cache_hit_ratio")
    att = "-" if r["slo_attainment"] is None else f"{100 * r['slo_attainment']:.1f}"
    print(f"{name:<14} {r['completed']:>8} {hit if hit is None else round(hit, 3)!s:>9} "
          f"{t['p50'] or float('nan'):>9.0f} {t['p95'] or float('nan'):>7.0f} {t['p99'] or float('nan'):>7.0f} "
          f"{att:>6}")
EOF
for pair in "events $events_url" "approximate $approx_url"; do
    set -- $pair
    echo "-- $1: cache predictions and KV-event incidents"
    http GET "$2/metrics" | grep -E '^kvgate_(cache_prediction_total|kv_event_incidents_total|tokenized_prompts_total)' || true
done
