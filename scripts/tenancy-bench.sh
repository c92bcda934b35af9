#!/usr/bin/env bash
# What tenancy does under load, on emulated engines in real time (time-scale 1):
#
#   fairness   a light tenant alone, then beside two backlogged heavy tenants (one sending 3x the
#              other's tokens), with the admission queue in `fifo` and in `fair` order: the light
#              tenant's TTFT p95 against running alone, and Jain's index of the heavy tenants'
#              weighted service (from kvgate_tenant_service_weighted_tokens_total).
#   ratelimit  one key with an input-token limit, offered 3x that limit for 75 s: accepted input
#              tokens per minute (kvgate_tenant_tokens_total over 60 s of steady state) and
#              whether every refusal was a 429 with Retry-After.
#   fanout     the fanout workload (shared prompts in parallel bursts) through predicted_ttft with
#              fan-out serialisation on and off: engine-reported hit ratio and TTFT p95.
#
#   scripts/tenancy-bench.sh [fairness|ratelimit|fanout|all] [--duration S] [--out DIR]
#                            [--max-concurrency N] [--headroom N] [--max-prefills N]
#                            (fairness: the gateway's slots, default 24, admission.fair_headroom
#                            and admission.max_prefills)
#
# KVGATE=path/to/kvgate skips the release build. ~12 min for `all` with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
[[ $# -gt 0 ]] && shift
duration=60
out=target/tenancy-bench
slots=24
headroom=null
prefills=null
while [[ $# -gt 0 ]]; do
    case "$1" in
    --max-concurrency) slots="$2"; shift 2 ;;
    --headroom) headroom="$2"; shift 2 ;;
    --max-prefills) prefills="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
source scripts/lib.sh
kvgate_binary
kvgate=$KVGATE

sha() { printf %s "$1" | sha256sum | cut -d' ' -f1; }

engines() {
    endpoints=()
    for i in $(seq 0 $(($1 - 1))); do
        start "$kvgate" engine --listen 127.0.0.1:0 --id "engine-$i" --seed "$i" \
            --time-scale 1 --max-num-seqs 128 --kv-blocks 16384
        endpoints+=(--endpoint "$url")
    done
}

gateway() { # CONFIG_FILE
    start "$kvgate" serve --listen 127.0.0.1:0 --scrape-interval-ms 200 "${endpoints[@]}" --config "$1"
    gw=$url
}

metric_sum() { # URL PREFIX: sum of the samples whose line starts with PREFIX
    http GET "$1/metrics" | awk -v p="$2" 'index($0, p) == 1 { s += $NF } END { printf "%.0f\n", s + 0 }'
}

bench() { # NAME KEY RATE INPUT_LEN OUTPUT_LEN [extra...]
    local name=$1 key=$2 rate=$3 in=$4 outl=$5
    shift 5
    "$kvgate" bench --url "$gw" --api-key "$key" --workload random --rate "$rate" \
        --random-input-len "$in" --random-output-len "$outl" --random-range-ratio 0.5 \
        --duration "$duration" --seed "$RANDOM" --no-progress --quiet \
        --json "$out/$name.json" "$@" >/dev/null
}

p95() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"][0]; print("%.0f" % r["ttft_ms"]["p95"])' "$1"; }
jain() { python3 -c 'import sys; x=[float(v) for v in sys.argv[1:]]; print("%.3f" % (sum(x)**2/(len(x)*sum(v*v for v in x))))' "$@"; }

fairness() {
    rm -f "$out"/access-*.jsonl
    engines 2
    local cfg="$out/fair.yaml"
    for order in alone fifo fair; do
        local o=$order
        [[ $o == alone ]] && o=fair
        cat >"$cfg" <<EOF
admission: {max_concurrency: $slots, fair_headroom: $headroom, max_prefills: $prefills, max_queue: 4096, queue_timeout_ms: 120000, order: $o}
observability: {access_log: "$out/access-$order.jsonl"}
tenancy:
  keys:
    - {name: light, key_sha256: "$(sha kvg-light)", tenant: light}
    - {name: heavy-a, key_sha256: "$(sha kvg-heavy-a)", tenant: heavy-a}
    - {name: heavy-b, key_sha256: "$(sha kvg-heavy-b)", tenant: heavy-b}
EOF
        gateway "$cfg"
        if [[ $order == alone ]]; then
            bench light-alone kvg-light 1 500 64
            alone=$(p95 "$out/light-alone.json")
        else
            local a0 b0
            a0=$(metric_sum "$gw" 'kvgate_tenant_service_weighted_tokens_total{tenant="heavy-a"}')
            b0=$(metric_sum "$gw" 'kvgate_tenant_service_weighted_tokens_total{tenant="heavy-b"}')
            # Heavy tenants start first so the queue is backlogged when the light one measures.
            bench "heavy-a-$order" kvg-heavy-a 12 2000 256 --timeout-s 300 &
            local ha=$!
            bench "heavy-b-$order" kvg-heavy-b 4 2000 256 --timeout-s 300 &
            local hb=$!
            sleep 5
            bench "light-$order" kvg-light 1 500 64
            local a1 b1
            a1=$(metric_sum "$gw" 'kvgate_tenant_service_weighted_tokens_total{tenant="heavy-a"}')
            b1=$(metric_sum "$gw" 'kvgate_tenant_service_weighted_tokens_total{tenant="heavy-b"}')
            kill "$ha" "$hb" 2>/dev/null || true
            wait "$ha" "$hb" 2>/dev/null || true
            local light
            light=$(p95 "$out/light-$order.json")
            echo "light queue wait in the gateway (ms): $("$kvgate" stats --field queue_ms --where tenant=light "$out/access-$order.jsonl")" >&2
            printf '| %s | %s ms | %s ms | %.2fx | %s | %s | %s |\n' "$order" "$alone" "$light" \
                "$(python3 -c "print($light/$alone)")" "$((a1 - a0))" "$((b1 - b0))" \
                "$(jain $((a1 - a0)) $((b1 - b0)))" >>"$out/fairness.md"
        fi
        kill "${pids[-1]}"
        wait "${pids[-1]}" 2>/dev/null || true
        unset 'pids[-1]'
    done
    stop_all
    echo "| order | light TTFT p95 alone | with heavy | ratio | heavy-a service | heavy-b service | Jain |"
    echo "|---|---|---|---|---|---|---|"
    cat "$out/fairness.md"
}

ratelimit() {
    engines 2
    local cfg="$out/ratelimit.yaml"
    # 60,000 input tokens a minute; offered 3x: 6 req/s of ~500 tokens.
    cat >"$cfg" <<EOF
tenancy:
  keys:
    - {name: limited, key_sha256: "$(sha kvg-limited)", tenant: limited, limits: {input_tpm: 60000}}
EOF
    gateway "$cfg"
    local prefix='kvgate_tenant_tokens_total{tenant="limited",kind="input"}'
    duration=75 bench limited kvg-limited 6 500 16 &
    local b=$!
    sleep 10
    local t0 t1
    t0=$(metric_sum "$gw" "$prefix")
    sleep 60
    t1=$(metric_sum "$gw" "$prefix")
    wait "$b"
    echo "gateway refusals of the key by limit: $(http GET "$gw/metrics" | grep '^kvgate_tenant_refused_requests_total{tenant="limited"' | tr '\n' ' ')"
    echo "gateway outcomes: $(http GET "$gw/metrics" | grep '^kvgate_requests_total' | tr '\n' ' ')"
    python3 - "$out/limited.json" "$t0" "$t1" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
accepted = int(sys.argv[3]) - int(sys.argv[2])
print(f"input tokens accepted in 60 s of steady state: {accepted} (limit 60000, {accepted / 60000:.3f}x)")
print(f"requests sent {r['requests']}, completed {r['completed']}, failed {r['failed']}: {r['errors']}")
EOF
    stop_all
}

fanout() {
    engines 4
    for serialize in true false; do
        local cfg="$out/fanout-$serialize.yaml"
        echo "tenancy: {agents: {serialize_fanout: $serialize}}" >"$cfg"
        gateway "$cfg"
        "$kvgate" bench --url "$gw" --workload fanout --rate 1 --duration "$duration" --seed 1 \
            --slo-ttft-ms 1000 --no-progress --quiet --json "$out/fanout-$serialize.json" >/dev/null
        python3 - "$out/fanout-$serialize.json" "$serialize" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
print(f"| {sys.argv[2]} | {r['cache_hit_ratio']:.3f} | {r['ttft_ms']['p50']:.0f} ms | {r['ttft_ms']['p95']:.0f} ms | {'-' if r['slo_attainment'] is None else format(r['slo_attainment'], '.3f')} | {r['failed']} |")
EOF
        kill "${pids[-1]}"
        wait "${pids[-1]}" 2>/dev/null || true
        unset 'pids[-1]'
        # Fresh engines: the first run's cache must not serve the second.
        stop_all
        if [[ $serialize == true ]]; then engines 4; fi
    done
}

: >"$out/fairness.md"
case "$what" in
fairness) fairness ;;
ratelimit) ratelimit ;;
fanout) echo "| serialise | hit ratio | TTFT p50 | TTFT p95 | SLO 1 s | failed |"; echo "|---|---|---|---|---|---|"; fanout ;;
all) fairness; ratelimit; echo "| serialise | hit ratio | TTFT p50 | TTFT p95 | SLO 1 s | failed |"; echo "|---|---|---|---|---|---|"; fanout ;;
*) echo "unknown part $what" >&2; exit 2 ;;
esac
