#!/usr/bin/env bash
# Gateway replicas with and without shared state, in one `kvgate bench` run with three targets,
# each in front of its own four emulated engines (same seeds, real time): (single) one gateway;
# (shared) three replicas sharing state over NATS; (unshared) three replicas that do not. For
# the replica targets each request goes to one of the three at random, as an L4 balancer would
# send it. The bench samples every engine's requests running plus waiting every 100 ms and
# reports herding (busiest engine minus the mean) beside the engine-reported prefix hit ratio.
#
#   scripts/cluster-bench.sh [--rate SESSIONS_PER_S] [--duration S] [--policy NAME] [--out DIR]
#
# Needs nats-server (Debian's package). KVGATE=path/to/kvgate skips the release build.
# ~1 min plus --duration.
set -euo pipefail
cd "$(dirname "$0")/.."
rate=1.5
duration=90
policy=""
out=target/cluster-bench
seed=1
while [[ $# -gt 0 ]]; do
    case "$1" in
    --rate) rate="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --policy) policy="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
source scripts/lib.sh
kvgate_binary
kvgate=$KVGATE
nats=$(command -v nats-server || echo /usr/sbin/nats-server)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$nats" -a 127.0.0.1 -p "$port" >/dev/null 2>&1 &
pids+=($!)
policy_flag=()
[[ -n "$policy" ]] && policy_flag=(--policy "$policy")

engines() {
    local set=$1 list=() i
    for i in 0 1 2 3; do
        start "$kvgate" engine --listen 127.0.0.1:0 --id "$set$i" --seed "$i" --time-scale 1 \
            --model test-model
        list+=("$url")
    done
    urls=$(IFS=,; echo "${list[*]}")
    endpoint_flags=()
    for u in "${list[@]}"; do endpoint_flags+=(--endpoint "$u"); done
}
gateway() {
    start "$kvgate" serve --listen 127.0.0.1:0 --access-log off --scrape-interval-ms 100 \
        "${endpoint_flags[@]}" "${policy_flag[@]}" "$@"
}

engines s; single_engines=$urls
gateway; single=$url
engines c; shared_engines=$urls
shared=()
for _ in 0 1 2; do gateway --cluster "nats://127.0.0.1:$port" --cluster-name bench; shared+=("$url"); done
engines u; unshared_engines=$urls
unshared=()
for _ in 0 1 2; do gateway; unshared+=("$url"); done
sleep 2
join() { local IFS=,; echo "$*"; }
echo "== agentic, $rate sessions/s for ${duration}s, policy ${policy:-default}"
"$kvgate" bench --workload agentic --rate "$rate" --duration "$duration" --slo-ttft-ms 1000 \
    --seed "$seed" --timeout-s 120 --no-progress --json "$out/bench.json" ${BENCH_FLAGS:-} \
    --url "single=$single" --engines "$single_engines" \
    --url "shared=$(join "${shared[@]}")" --engines "$shared_engines" \
    --url "unshared=$(join "${unshared[@]}")" --engines "$unshared_engines" | tee "$out/bench.txt"
echo "-- state shared by the NATS replicas"
for g in "${shared[@]}"; do
    http GET "$g/metrics" | grep -E '^kvgate_cluster_(events_total|dropped_total|peers|peer_requests_expired_total|lag_seconds_(sum|count))' | tr '\n' ' '
    echo
done
