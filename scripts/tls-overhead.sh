#!/usr/bin/env bash
# What TLS to an upstream costs the gateway: one time-scale-0 engine behind two kvgate proxies,
# one plain and one serving TLS (a private CA and certificate made here with openssl; HTTP/2
# by ALPN); a front gateway in front of each (`https://` with `ca_file` for the TLS one). The
# loadgen example sends the same requests straight to the plain proxy and through each front
# gateway, open loop at 500 and 2,000 req/s (added p50/p99 over the direct path) and closed
# loop with 64 connections (req/s). Rounds alternate between the two; compare medians.
#
#   scripts/tls-overhead.sh [--rounds N]        KVGATE=path/to/kvgate skips the release build
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=2
[[ "${1:-}" == "--rounds" ]] && rounds=$2
source scripts/lib.sh
kvgate_binary
kvgate=$KVGATE
cargo build --release -q -p kvgate-gateway --example loadgen
loadgen="${CARGO_TARGET_DIR:-target}"/release/examples/loadgen
dir=$(mktemp -d)
tls_pki "$dir"

start "$kvgate" engine --listen 127.0.0.1:0 --time-scale 0
engine=$url
start "$kvgate" serve --listen 127.0.0.1:0 --endpoint "$engine" --access-log off
plain_proxy=$url
start "$kvgate" serve --listen 127.0.0.1:0 --endpoint "$engine" --access-log off \
    --tls-cert "$dir/cert.pem" --tls-key "$dir/key.pem"
tls_proxy=$url
echo "endpoints: [{url: '$plain_proxy'}]" >"$dir/plain.yaml"
echo "endpoints: [{url: '$tls_proxy', ca_file: '$dir/ca.pem'}]" >"$dir/tls.yaml"
start "$kvgate" serve --listen 127.0.0.1:0 --config "$dir/plain.yaml" --access-log off
via_plain=$url
start "$kvgate" serve --listen 127.0.0.1:0 --config "$dir/tls.yaml" --access-log off
via_tls=$url
sleep 1
for round in $(seq 1 "$rounds"); do
    for pair in "plain $via_plain" "tls $via_tls"; do
        set -- $pair
        echo "== round $round: upstream $1"
        "$loadgen" --direct "$plain_proxy" --via "$2" --rate 500 --secs 8
        "$loadgen" --direct "$plain_proxy" --via "$2" --rate 2000 --secs 6
        "$loadgen" --via "$2" --max --concurrency 64 --secs 5
    done
done
