#!/usr/bin/env bash
# LoRA adapter-aware routing through the gateway: two emulated engines in real time (time-scale
# 1), each serving adapters a, b and c with one adapter per batch (--max-loras 1, the vLLM
# default) and --lora-load-ms to load one that is not in memory. An open-loop adapter mix
# (a JSONL replay whose lines name the adapter as `model`) is sent through a fresh fleet and
# gateway per policy: round_robin, predicted_ttft blind to adapters (lora_aware=false),
# predicted_ttft adapter-aware without the LoRA gate (lora.gate.enabled=false), with the gate's
# pricing but no holds (lora.gate.hold=false), and with the gate (the default); the
# adapter-aware ones are told the engines' --lora-load-ms. The first three run without the gate, as kvgate routed before it had one.
# Prints one table of TTFT percentiles per policy, and per adapter from the gateways' access
# logs.
#
#   scripts/lora-bench.sh [--rate R] [--requests N] [--mix A,B,C] [--output N] [--load-ms MS]
#                         [--seed N] [--out DIR] [--only LABEL,...]
#
# --only runs some of the five (labels as in the table: round_robin, blind_predicted_ttft,
# ungated_predicted_ttft, priced_predicted_ttft, predicted_ttft). --mix gives the shares of adapters a, b and c (default 0.5,0.3,0.2); prompts are 256 random
# words, answers --output tokens (default 64, ignore_eos). KVGATE names the binary (default:
# cargo build --release).
set -euo pipefail
RATE=4 REQUESTS=600 MIX=0.5,0.3,0.2 OUTPUT=64 LOAD_MS=100 SEED=1 OUT=${TMPDIR:-/tmp}/kvgate-lora-bench
ONLY=round_robin,blind_predicted_ttft,ungated_predicted_ttft,priced_predicted_ttft,predicted_ttft
while [ $# -gt 0 ]; do
  case $1 in
    --rate) RATE=$2; shift 2 ;;
    --requests) REQUESTS=$2; shift 2 ;;
    --mix) MIX=$2; shift 2 ;;
    --output) OUTPUT=$2; shift 2 ;;
    --load-ms) LOAD_MS=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
if [ -z "${KVGATE:-}" ]; then cargo build -q --release -p kvgate; KVGATE="${CARGO_TARGET_DIR:-target}"/release/kvgate; fi
mkdir -p "$OUT"
python3 - "$OUT/mix.jsonl" "$REQUESTS" "$MIX" "$OUTPUT" "$SEED" <<'PY'
import json, random, sys
path, n, mix, output, seed = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
shares = [float(x) for x in mix.split(",")]
rng = random.Random(seed)
words = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by"]
with open(path, "w") as f:
    for i in range(n):
        model = rng.choices(["a", "b", "c"], weights=shares)[0]
        prompt = f"request {i} " + " ".join(rng.choice(words) for _ in range(256))
        f.write(json.dumps({"model": model, "prompt": prompt, "max_tokens": output}) + "\n")
PY

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
start() {  # LOG ARGS... -> sets URL from the readiness line (not in a subshell: pids must stay)
  local log=$1; shift
  "$KVGATE" "$@" > "$log" 2>&1 &
  pids+=($!)
  URL=
  for _ in $(seq 1 200); do
    URL=$(grep -o 'http://[0-9.:]*' "$log" | head -1 || true)
    [ -n "$URL" ] && return
    sleep 0.05
  done
  echo "no readiness line in $log" >&2; exit 1
}

run() {  # LABEL POLICY [serve flags...]
  local label=$1; shift
  case ",$ONLY," in *",$label,"*) ;; *) return ;; esac
  local e0 e1 gw
  start "$OUT/$label-e0.log" engine --listen 127.0.0.1:0 --id e0 --model base --seed 1 \
    --lora-modules a b c --max-loras 1 --lora-load-ms "$LOAD_MS"
  e0=$URL
  start "$OUT/$label-e1.log" engine --listen 127.0.0.1:0 --id e1 --model base --seed 2 \
    --lora-modules a b c --max-loras 1 --lora-load-ms "$LOAD_MS"
  e1=$URL
  start "$OUT/$label-gw.log" serve --listen 127.0.0.1:0 --endpoint "$e0" --endpoint "$e1" \
    --scrape-interval-ms 100 --policy "$@"
  gw=$URL
  for _ in $(seq 1 100); do curl -sf "$gw/v1/models" | grep -q '"c"' && break; sleep 0.1; done
  "$KVGATE" bench --url "$label=$gw" --workload "$OUT/mix.jsonl" --rate "$RATE" \
    --num-requests "$REQUESTS" --api completions --ignore-eos --seed "$SEED" \
    --json "$OUT/$label.json" > "$OUT/$label.txt" 2>&1
  curl -sf "$gw/metrics" > "$OUT/$label.metrics" || true
  cleanup; pids=()
}

printf 'lora: { gate: { enabled: false } }\n' > "$OUT/ungated.yaml"
UNGATED=(--config "$OUT/ungated.yaml")
printf 'lora: { gate: { hold: false } }\n' > "$OUT/priced.yaml"
run round_robin round_robin "${UNGATED[@]}"
run blind_predicted_ttft predicted_ttft --policy-set lora_aware=false "${UNGATED[@]}"
run ungated_predicted_ttft predicted_ttft --policy-set lora_load_ms="$LOAD_MS" "${UNGATED[@]}"
run priced_predicted_ttft predicted_ttft --policy-set lora_load_ms="$LOAD_MS" --config "$OUT/priced.yaml"
run predicted_ttft predicted_ttft --policy-set lora_load_ms="$LOAD_MS"
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
print(f"{'policy':24} {'ok':>5} {'err':>4} {'TTFT p50 ms':>12} {'TTFT p95 ms':>12} {'TTFT p99 ms':>12}")
for label in ("round_robin", "blind_predicted_ttft", "ungated_predicted_ttft", "priced_predicted_ttft", "predicted_ttft"):
    if not os.path.exists(f"{out}/{label}.json"):
        continue
    report = json.load(open(f"{out}/{label}.json"))
    r = report["results"][0]
    t = r["ttft_ms"]
    f = lambda v: "-" if v is None else f"{v:.0f}"
    print(f"{label:24} {r['completed']:>5} {r['failed']:>4} {f(t.get('p50')):>12} {f(t.get('p95')):>12} {f(t.get('p99')):>12}")
PY
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
print(f"\nTTFT p95 ms per adapter (requests): {'a':>12} {'b':>12} {'c':>12}")
for label in ("round_robin", "blind_predicted_ttft", "ungated_predicted_ttft", "priced_predicted_ttft", "predicted_ttft"):
    by = {}
    if not os.path.exists(f"{out}/{label}-gw.log"):
        continue
    for line in open(f"{out}/{label}-gw.log"):
        if line.startswith("{"):
            r = json.loads(line)
            if r.get("ttft_ms") is not None and r.get("model") in ("a", "b", "c"):
                by.setdefault(r["model"], []).append(r["ttft_ms"])
    cells = []
    for m in ("a", "b", "c"):
        v = sorted(by.get(m, []))
        cells.append(f"{v[int(len(v) * 0.95)]:.0f} ({len(v)})" if v else "-")
    print(f"{label:36} {cells[0]:>12} {cells[1]:>12} {cells[2]:>12}")
print("\nheld by the LoRA gate (kvgate_lora_held_total by reason; hold seconds sum/count):")
for label in ("round_robin", "blind_predicted_ttft", "ungated_predicted_ttft", "priced_predicted_ttft", "predicted_ttft"):
    held = {}
    if not os.path.exists(f"{out}/{label}.json"):
        continue
    try:
        for line in open(f"{out}/{label}.metrics"):
            if line.startswith("kvgate_lora_held_total{"):
                held[line.split('"')[1]] = float(line.split()[-1])
            elif line.startswith("kvgate_lora_hold_seconds_sum") or line.startswith("kvgate_lora_hold_seconds_count"):
                held[line.split()[0].rsplit("_", 1)[-1]] = float(line.split()[-1])
    except FileNotFoundError:
        pass
    print(f"{label:36} {held}")
PY
