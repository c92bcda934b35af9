#!/usr/bin/env bash
# Prefill/decode disaggregation's modes through the gateway on four emulated engines in real
# time (time-scale 1): `never` on four whole-request engines, `always`, `threshold` and
# `conditional` on `--prefill` prefill engines and the rest decode engines (the same fleet size), each on
# a fresh fleet and gateway, then one `kvgate bench` run of long-prompt agentic sessions. The
# same comparison as `kvgate sim --scenario pd`, whose sessions come from the same agentic
# generator at this shape; `--ignore-eos` makes the engines answer the drawn lengths, as the
# simulator does. Prints one table; JSON per mode in DIR.
#
#   scripts/pd-bench.sh [--rate SESSIONS_PER_S] [--requests N] [--protocol vllm|sglang]
#                       [--prefill N] [--stall-weight W] [--out DIR] [--seed N]
#                       [--duplicate-weight W] [--only MODE,MODE...]
#
# --prefill N: prefill engines of the four in the disaggregated modes (the rest decode);
# --stall-weight W: the conditional decision's decode_stall_weight (default: the gateway's).
# --duplicate-weight W: the prefill choice's duplicate_prefill_weight (default: the gateway's).
# `moved`: remote turns whose session's previous turn was prefilled remotely on another
# prefill engine (which then computed the whole context again), of all such pairs.
#
# KVGATE=path/to/kvgate skips the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

rate=0.5
requests=400
protocol=vllm
prefill=1
out=target/pd-bench
seed=1
stall=
duplicate=
only=never,always,threshold,conditional
while [[ $# -gt 0 ]]; do
    case $1 in
        --rate) rate=$2; shift 2 ;;
        --requests) requests=$2; shift 2 ;;
        --protocol) protocol=$2; shift 2 ;;
        --prefill) prefill=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --stall-weight) stall=", decode_stall_weight: $2"; shift 2 ;;
        --duplicate-weight) duplicate=", duplicate_prefill_weight: $2"; shift 2 ;;
        --only) only=$2; shift 2 ;;
        *) echo "unknown flag $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
kvgate_binary

run_mode() {
    local mode=$1 config="$out/$mode.yaml" i role port
    echo "endpoints:" >"$config"
    for i in 0 1 2 3; do
        role=decode
        if [[ $mode == never ]]; then role=both; elif (( i < prefill )); then role=prefill; fi
        start "$KVGATE" engine --listen 127.0.0.1:0 --id "e$i" --model pd-model --role "$role" \
            --time-scale 1 --seed "$i"
        port=${url##*:}
        echo "  - {url: \"$url\", role: $role, bootstrap_port: $port}" >>"$config"
    done
    echo "disaggregation: {protocol: $protocol, decision: {mode: $mode$stall$duplicate}}" >>"$config"
    start "$KVGATE" serve --listen 127.0.0.1:0 --config "$config" --access-log "$out/$mode.access.jsonl"
    local gateway=$url
    for _ in $(seq 1 100); do
        [[ $(http GET "$gateway/ready" | head -1) == *200* ]] && break
        sleep 0.1
    done
    "$KVGATE" bench --url "$gateway" --workload agentic --rate "$rate" --num-requests "$requests" \
        --agentic-tenants 64 --agentic-system-len 8000 --agentic-user-len 1000 \
        --agentic-turns 4 --agentic-output-len 200 --agentic-think-time-ms 1000 \
        --agentic-fanout-prob 0 --ignore-eos --slo-ttft-ms 2000 --slo-tpot-ms 50 --seed "$seed" \
        --no-progress --quiet --json "$out/$mode.json"
    http GET "$gateway/metrics" | grep '^kvgate_disagg_requests_total' >"$out/$mode.disagg.txt" || true
    stop_all
}

for mode in ${only//,/ }; do
    case $mode in
        never|always|threshold|conditional) run_mode "$mode" ;;
        *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
done
python3 - "$out" "$only" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])


def moved(mode):
    turns = {}
    for line in (out / f"{mode}.access.jsonl").read_text().splitlines():
        r = json.loads(line)
        turns.setdefault(r.get("session"), []).append((r["request_id"], r.get("prefill_endpoint")))
    pairs = [(a[1], b[1]) for t in turns.values() for a, b in zip(sorted(t), sorted(t)[1:])
             if a[1] and b[1]]
    return f"{sum(a != b for a, b in pairs)}/{len(pairs)}" if pairs else "-"


print(f"{'mode':<12} {'remote':>7} {'moved':>8} {'TTFT p50':>9} {'TTFT p95':>9} {'TPOT p50':>9} {'TPOT p95':>9} {'SLO met':>8} {'failed':>6}")
for mode in sys.argv[2].split(","):
    report = json.loads((out / f"{mode}.json").read_text())
    r = report["results"][0]
    counts = {}
    for line in (out / f"{mode}.disagg.txt").read_text().splitlines():
        outcome = line.split('outcome="')[1].split('"')[0]
        counts[outcome] = float(line.rsplit(" ", 1)[1])
    total = sum(counts.values())
    remote = f"{counts.get('remote', 0) / total:.0%}" if total else "-"
    def f(x, d=0):
        return "-" if x is None else f"{x:.{d}f}"
    slo = r['slo_attainment']
    print(f"{mode:<12} {remote:>7} {moved(mode):>8} {f(r['ttft_ms']['p50']):>9} {f(r['ttft_ms']['p95']):>9} "
          f"{f(r['tpot_ms']['p50'], 1):>9} {f(r['tpot_ms']['p95'], 1):>9} "
          f"{'-' if slo is None else f'{slo:.0%}':>8} {r['failed']:>6}")
PY
