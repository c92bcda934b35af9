#!/usr/bin/env bash
# Spillover from a self-hosted tier to a hosted one under overload, in one `kvgate bench` run
# with two targets: (A) a gateway over two self-hosted emulated engines alone, (B) a gateway
# over two identical self-hosted engines (tier 0) and a "hosted" tier (tier 1: two more engines
# behind a kvgate serving TLS with its own certificate, reached over https with `ca_file` and an
# API key), spilling over when the self-hosted queue reaches --queue. Engines run in real time
# with few slots, so the offered rate is past the self-hosted tier's capacity.
#
#   scripts/spillover-bench.sh [--rate R] [--duration S] [--queue N] [--ttft-ms X]
#                              [--policy NAME] [--out DIR]
#
# --ttft-ms spills on the policy's predicted TTFT instead of (or besides) the queue; it needs a
# policy that predicts one (`--policy predicted_ttft`).
#
# KVGATE=path/to/kvgate skips the release build. ~2 min plus --duration.
set -euo pipefail
cd "$(dirname "$0")/.."
rate=6
duration=90
queue=2
ttft=null
policy=least_outstanding
out=target/spillover-bench
while [[ $# -gt 0 ]]; do
    case "$1" in
    --rate) rate="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --queue) queue="$2"; shift 2 ;;
    --ttft-ms) ttft="$2"; shift 2 ;;
    --policy) policy="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
source scripts/lib.sh
kvgate_binary
kvgate=$KVGATE
dir=$(mktemp -d)
tls_pki "$dir"

engine() {
    start "$kvgate" engine --listen 127.0.0.1:0 --id "$1" --seed "$2" --time-scale 1 \
        --max-num-seqs 8 --model test-model
}
# A: self-hosted alone.
engine a0 0; a0=$url
engine a1 1; a1=$url
start "$kvgate" serve --listen 127.0.0.1:0 --endpoint "$a0" --endpoint "$a1" --policy "$policy"
alone=$url
# B: the same self-hosted tier, and a hosted tier behind TLS with a key.
engine b0 0; b0=$url
engine b1 1; b1=$url
engine h0 2; h0=$url
engine h1 3; h1=$url
key_sha=$(printf %s sk-hosted | sha256sum | cut -d' ' -f1)
cat >"$dir/hosted.yaml" <<YAML
tenancy: {keys: [{name: front, key_sha256: "$key_sha"}]}
policy: {name: least_outstanding}
endpoints: [{url: "$h0"}, {url: "$h1"}]
YAML
start "$kvgate" serve --listen 127.0.0.1:0 --config "$dir/hosted.yaml" --tls-cert "$dir/cert.pem" --tls-key "$dir/key.pem"
hosted=$url
[[ $queue == 0 ]] && queue=null
cat >"$dir/front.yaml" <<YAML
policy: {name: $policy}
spillover: {queue: $queue, ttft_ms: $ttft}
scrape: {interval_ms: 100}
endpoints:
  - {url: "$b0", name: local-0, model: test-model}
  - {url: "$b1", name: local-1, model: test-model}
  - {url: "$hosted", name: hosted, tier: 1, model: test-model, api_key: sk-hosted, ca_file: "$dir/ca.pem"}
YAML
start "$kvgate" serve --listen 127.0.0.1:0 --config "$dir/front.yaml"
front=$url
sleep 1
echo "== $rate req/s for ${duration}s, $policy; A: self-hosted alone ($alone), B: with a hosted tier, spillover {queue: $queue, ttft_ms: $ttft} ($front)"
"$kvgate" bench --url "$alone" --url "$front" --workload random --random-input-len 1000 \
    --random-output-len 200 --ignore-eos --rate "$rate" --duration "$duration" --slo-ttft-ms 1000 \
    --timeout-s 120 --seed 1 --no-progress --json "$out/bench.json" | tee "$out/bench.txt"
echo "-- B's placements"
http GET "$front/metrics" | grep -E '^kvgate_(spillover_total|requests_total)' || true
