#!/usr/bin/env bash
# The fault matrix: three emulated engines in real time behind `kvgate serve`, a steady
# open-loop stream of chat requests from `kvgate bench`, and one fault per row injected after a
# clean stretch. One table: requests sent, failed before the first token and after it, retry
# amplification (upstream attempts / client requests, from the gateway's own counters) and TTFT
# p95 during the fault against before it.
#
#   scripts/fault-matrix.sh [--short] [--rate R] [--out DIR] [--rows a,b,...]
#
# --short (CI): 3 s before, 10 s during, 6 req/s; default 10 s before, 20 s during, 8 req/s.
# Exits non-zero when a row breaks its promise: any failure before the first token (except
# when every engine is down, which must get a clean 503 with Retry-After, and requests sent
# after the gateway's own SIGTERM, which it must refuse), or retry amplification above 1.2.
# KVGATE=path/to/kvgate skips the release build (CI passes the debug binary).
set -euo pipefail
cd "$(dirname "$0")/.."

before=10 during=20 rate=8 out=target/fault-matrix
rows=kill-mid-prefill,kill-mid-stream,429-storm,5xx-burst,resets,stall-first,stall-mid,slow-decode,drain,config-reload,gateway-sigterm,all-down
while [[ $# -gt 0 ]]; do
    case "$1" in
    --short) before=3 during=10 rate=6; shift ;;
    --rate) rate="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --rows) rows="$2"; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
source scripts/lib.sh
kvgate_binary

faults() { # engine-url spec...
    local url=$1 list
    shift
    list=$(printf '"%s",' "$@")
    http POST "$url/admin/faults" "{\"faults\": [${list%,}]}" >/dev/null
}

summary="$out/summary.jsonl"
: >"$summary"
IFS=, read -r -a names <<<"$rows"
for row in "${names[@]}"; do
    input=512 output=64
    case "$row" in
    kill-mid-prefill) input=1500 output=16 ;;
    kill-mid-stream) input=256 output=256 ;;
    esac
    engines=() engine_pids=()
    for i in 0 1 2; do
        start "$KVGATE" engine --listen 127.0.0.1:0 --id "engine-$i" --seed "$i" --model fault-model
        engines+=("$url")
        engine_pids+=("${pids[-1]}")
    done
    config="$out/$row.yaml"
    printf 'endpoints:\n' >"$config"
    for e in "${engines[@]}"; do printf '  - url: %s\n' "$e" >>"$config"; done
    start "$KVGATE" serve --listen 127.0.0.1:0 --config "$config" --scrape-interval-ms 200
    gateway=$url gateway_pid=${pids[-1]}
    launched=$(date +%s.%N)
    "$KVGATE" bench --url "$gateway" --rate "$rate" --duration "$((before + during))" \
        --random-input-len "$input" --output-len "$output" --ignore-eos --seed 1 --timeout-s 60 \
        --no-progress --quiet --records "$out/$row.records.jsonl" >"$out/$row.bench.txt" 2>&1 &
    bench=$!
    sleep "$before"
    metrics_before=$(http GET "$gateway/metrics")
    fault_at=$(date +%s.%N)
    unavailable=""
    case "$row" in
    kill-mid-prefill | kill-mid-stream) kill -9 "${engine_pids[0]}" ;;
    429-storm) faults "${engines[0]}" "429:retry_after=2" ;;
    5xx-burst) faults "${engines[0]}" "500:p=0.5" "503:p=0.5" ;;
    resets) faults "${engines[0]}" "reset:p=0.5" ;;
    stall-first) faults "${engines[0]}" "stall_first:ms=2000,p=0.5" ;;
    stall-mid) faults "${engines[0]}" "stall_mid:after=4,ms=2000,p=0.5" ;;
    slow-decode) faults "${engines[0]}" "slow_decode:factor=4" ;;
    drain) faults "${engines[0]}" "drain" ;;
    config-reload)
        # Drop one endpoint, switch the policy, then bring the endpoint back.
        { printf 'policy: {name: least_outstanding}\nendpoints:\n'
          printf '  - url: %s\n' "${engines[@]:0:2}"; } >"$config.new" && mv "$config.new" "$config"
        sleep 2
        { printf 'policy: {name: predicted_ttft}\nendpoints:\n'
          printf '  - url: %s\n' "${engines[@]}"; } >"$config.new" && mv "$config.new" "$config"
        ;;
    gateway-sigterm) kill -TERM "$gateway_pid" ;;
    all-down)
        for p in "${engine_pids[@]}"; do kill -9 "$p"; done
        sleep 1.5 # two scrape periods and then some: every endpoint unhealthy
        unavailable=$(http POST "$gateway/v1/chat/completions" \
            '{"model": "fault-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}' |
            tr -d '\r' | grep -iE '^HTTP/|^retry-after:' | tr '\n' ' ')
        ;;
    esac
    wait "$bench" || true
    metrics_after=""
    [[ "$row" != gateway-sigterm ]] && metrics_after=$(http GET "$gateway/metrics")
    # TTFT P95 before and during the fault, by kvgate's own percentile: the bench re-reads its
    # records, split at the fault.
    offset=$(python3 -c "print($fault_at - $launched)")
    "$KVGATE" bench --from-records "$out/$row.records.jsonl" --window="0:$offset" \
        --window="$offset:1e9" --quiet --json "$out/$row.windows.json"
    python3 - "$row" "$out/$row.records.jsonl" "$offset" "$unavailable" \
        <(printf '%s' "$metrics_before") <(printf '%s' "$metrics_after") "$out/$row.windows.json" \
        >>"$summary" <<'PY'
import json, sys
row, records_path, offset, unavailable, before_path, after_path, windows_path = sys.argv[1:8]
offset = float(offset)
records = [json.loads(l) for l in open(records_path)]

def p95(lo):
    """TTFT P95 of the successful requests sent in the window starting at `lo` (null if none)."""
    for r in json.load(open(windows_path))["results"]:
        if r["window_s"][0] == lo and r["ttft_ms"]["p95"] is not None:
            return round(r["ttft_ms"]["p95"], 1)
    return None

def counters(path):
    out = {}
    for line in open(path):
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        key = name.split("{")[0]
        if key == "kvgate_hedges_total" and 'reason="launched"' not in name:
            continue
        try:
            out[key] = out.get(key, 0.0) + float(value)
        except ValueError:
            pass
    return out

late = [r for r in records if r["sent_s"] >= offset]
# Failures count over the whole run: nothing fails before the fault unless something is wrong.
failed_before = [r for r in records if r["error"] and r["ttft_ms"] is None]
failed_after = [r for r in records if r["error"] and r["ttft_ms"] is not None]
m0, m1 = counters(before_path), counters(after_path)
amplification = None
if m1:
    delta = lambda k: m1.get(k, 0.0) - m0.get(k, 0.0)
    requests = delta("kvgate_requests_total")
    attempts = requests + delta("kvgate_retries_total") + delta("kvgate_hedges_total")
    amplification = round(attempts / requests, 3) if requests else None
print(json.dumps({
    "row": row,
    "sent": len(records),
    "sent_during": len(late),
    "failed_before_first_token": len(failed_before),
    "failed_after_first_token": len(failed_after),
    "failed_before_kinds": sorted({r["error"] for r in failed_before}),
    "retry_amplification": amplification,
    "ttft_p95_before_ms": p95(0.0),
    "ttft_p95_during_ms": p95(offset),
    "unavailable_answer": unavailable.strip() or None,
}))
PY
    echo "== $row: $(tail -n 1 "$out/$row.bench.txt" 2>/dev/null)"
    stop_all
done

python3 - "$summary" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
head = ("fault", "sent", "failed before 1st token", "failed after", "retry ampl.",
        "TTFT p95 before", "TTFT p95 during", "ratio")
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
broken = []
for r in rows:
    b, d = r["ttft_p95_before_ms"], r["ttft_p95_during_ms"]
    ratio = f"{d / b:.2f}x" if b and d else "-"
    amp = r["retry_amplification"]
    fb = r["failed_before_first_token"]
    note = ""
    if r["row"] == "all-down":
        note = f" ({r['unavailable_answer']})"
        ok = (r["unavailable_answer"] or "").startswith("HTTP/1.1 503") and "retry-after" in r["unavailable_answer"].lower()
        if not ok:
            broken.append(f"all-down: answer {r['unavailable_answer']!r}, want 503 with Retry-After")
    elif r["row"] == "gateway-sigterm":
        note = " (refused: sent after SIGTERM)"
    elif fb:
        broken.append(f"{r['row']}: {fb} failed before the first token {r['failed_before_kinds']}")
    if amp is not None and amp > 1.2:
        broken.append(f"{r['row']}: retry amplification {amp}")
    cells = (r["row"], r["sent"], f"{fb}{note}", r["failed_after_first_token"],
             "-" if amp is None else f"{amp:.2f}x", "-" if b is None else f"{b:.0f} ms",
             "-" if d is None else f"{d:.0f} ms", ratio)
    print("| " + " | ".join(str(c) for c in cells) + " |")
for b in broken:
    print("BROKEN:", b)
sys.exit(1 if broken else 0)
PY
