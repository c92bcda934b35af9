#!/usr/bin/env bash
# Gateway overhead, several builds side by side in one run: one time-scale-0 engine; for each
# (kvgate binary, policy) a gateway in front of it; the same load generator against the engine
# directly and through each gateway, open loop at 1,000 and 5,000 req/s (added p50/p99) and
# closed loop with 64 connections (req/s). Rounds alternate between the builds so that the
# machine's other tenants weigh on each alike; compare medians across rounds.
#
#   scripts/overhead.sh [--rounds N] [--policy P]... [--variant "SERVE FLAGS"]... [KVGATE_BINARY]...
#
# Each --variant adds a gateway per (binary, policy) started with those extra `kvgate serve`
# flags, e.g. --variant "--access-log off" --variant "--access-log /tmp/access.log" to measure
# what the access log costs. Without one, each gateway runs with its defaults.
#
# Default: the release build of this tree (built if missing), policies cache_aware and
# predicted_ttft. Pass an older binary too to measure before/after, e.g.
#   git worktree add /tmp/old <commit> && (cd /tmp/old && cargo build --release -p kvgate)
#   scripts/overhead.sh target/release/kvgate /tmp/old/target/release/kvgate
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=2
policies=()
binaries=()
variants=()
while [[ $# -gt 0 ]]; do
    case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --policy) policies+=("$2"); shift 2 ;;
    --variant) variants+=("$2"); shift 2 ;;
    *) binaries+=("$1"); shift ;;
    esac
done
[[ ${#policies[@]} -gt 0 ]] || policies=(cache_aware predicted_ttft)
[[ ${#variants[@]} -gt 0 ]] || variants=("")
if [[ ${#binaries[@]} -eq 0 ]]; then
    cargo build --release -q -p kvgate
    binaries=("${CARGO_TARGET_DIR:-target}"/release/kvgate)
fi
cargo build --release -q -p kvgate-gateway --example loadgen
loadgen="${CARGO_TARGET_DIR:-target}"/release/examples/loadgen

source scripts/lib.sh

start "${binaries[0]}" engine --listen 127.0.0.1:0 --time-scale 0 || exit 1
engine=$url
names=()
gateways=()
for bin in "${binaries[@]}"; do
    for policy in "${policies[@]}"; do
        for variant in "${variants[@]}"; do
            # An older build may lack a policy or a flag: that gateway is skipped.
            # shellcheck disable=SC2086 # a variant is a list of flags
            start "$bin" serve --listen 127.0.0.1:0 --endpoint "$engine" --policy "$policy" $variant || continue
            names+=("$bin $policy $variant")
            gateways+=("$url")
        done
    done
done
sleep 1

for round in $(seq 1 "$rounds"); do
    for i in "${!gateways[@]}"; do
        echo "== round $round: ${names[$i]}"
        "$loadgen" --direct "$engine" --via "${gateways[$i]}" --rate 1000 --secs 10
        "$loadgen" --direct "$engine" --via "${gateways[$i]}" --rate 5000 --secs 6
        "$loadgen" --via "${gateways[$i]}" --max --concurrency 64 --secs 5
    done
done
