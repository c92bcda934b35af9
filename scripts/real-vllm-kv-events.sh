#!/bin/bash
# Predicted against reported cached tokens on real vLLM CPU engines (scripts/real-vllm/README.md):
# two engines with small KV pools publish KV events to the gateway (`kv_events: bind:...`), which
# tokenizes prompts with the engines' own tokenizer directory and chat template. Multi-turn
# conversations, interleaved so that the pools evict, are sent through the gateway; for every
# request the script prints the engine's cached_tokens beside the gateway's prediction (from the
# access log), then the share that matched exactly, and the same with KV events off.
#
# usage: scripts/real-vllm-kv-events.sh      (from the repository root; ~4 min after the install)
# env:   VLLM_RECIPE, ENGINE_DIR, KVGATE as for real-vllm-e2e.sh; BLOCKS (default 96 blocks of 32 tokens,
#        with VLLM_ARGS=--max-model-len 2048)
#        CONVERSATIONS (10), TURNS (6), POLICY (consistent_hash)
set -euo pipefail
export BLOCKS=${BLOCKS:-96} VLLM_ARGS=${VLLM_ARGS:---max-model-len 2048}
. "$(dirname "$0")/real-vllm-lib.sh"
CONVERSATIONS=${CONVERSATIONS:-10} TURNS=${TURNS:-6} POLICY=${POLICY:-consistent_hash}

run_phase() {  # tag events(true|false)
  local config="$ENGINE_DIR/logs/gateway-kv-$1.yaml" log="$ENGINE_DIR/logs/gateway-kv-$1.access.log"
  rm -f "$log"
  {
    echo "tokenizers: {'*': '$ENGINE_DIR/small-llama'}"
    echo "policy: {name: $POLICY}"
    echo "observability: {access_log: '$log'}"
    echo "endpoints:"
    if [ "$2" = true ]; then
      echo "  - {url: 'http://127.0.0.1:$P0', kv_events: 'bind:tcp://127.0.0.1:$KV0'}"
      echo "  - {url: 'http://127.0.0.1:$P1', kv_events: 'bind:tcp://127.0.0.1:$KV1'}"
    else
      echo "  - {url: 'http://127.0.0.1:$P0'}"
      echo "  - {url: 'http://127.0.0.1:$P1'}"
    fi
  } > "$config"
  "$KVGATE" serve --listen 127.0.0.1:$GW --config "$config" --scrape-interval-ms 200 \
    > "$ENGINE_DIR/logs/gateway-kv-$1.log" 2>&1 &
  local gw=$!; pids+=("$gw")
  for _ in $(seq 1 200); do curl -sf 127.0.0.1:$GW/ready >/dev/null && break; sleep 0.1; done
  # vLLM's publisher reconnects on its own; wait until both engines are connected.
  if [ "$2" = true ]; then
    for _ in $(seq 1 300); do
      [ "$(curl -sf 127.0.0.1:$GW/metrics | grep -c '^kvgate_kv_event_connections_total')" -ge 2 ] && break
      sleep 0.1
    done
  fi
  "$PY" - "$1" $GW "$log" "$CONVERSATIONS" "$TURNS" <<'PY'
import json, sys, time, urllib.request
tag, gw, log, conversations, turns = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
words = "the cache router replica prefix token engine queue latency block request answer".split()
def text(c, t, n):
    return " ".join(words[(c * 7 + t * 3 + i * (c + 1)) % len(words)] for i in range(n))
histories = [[{"role": "system", "content": f"{tag} assistant {c}. " + text(c, 99, 150)}] for c in range(conversations)]
sent = []
for t in range(turns):
    for c in range(conversations):
        h = histories[c]
        h.append({"role": "user", "content": f"question {t}: " + text(c, t, 60 + 20 * (t % 3))})
        rid = f"{tag}-{c}-{t}"
        body = json.dumps({"model": "tiny", "messages": h, "max_tokens": 8}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{gw}/v1/chat/completions", body,
                                     {"content-type": "application/json", "x-request-id": rid,
                                      "x-kvgate-session": f"{tag}-{c}"})
        with urllib.request.urlopen(req, timeout=120) as r:
            out = json.loads(r.read())
        h.append({"role": "assistant", "content": out["choices"][0]["message"]["content"] or ""})
        sent.append(rid)
time.sleep(1.5)  # the access log is written in the background
lines = {}
for l in open(log):
    d = json.loads(l)
    lines[d.get("client_request_id")] = d
print(f"\n== KV events {'on' if tag == 'events' else 'off'} ({tag}) ==")
print(f"{'request':<16} {'endpoint':<17} {'prompt':>6} {'cached':>6} {'predicted':>9}")
exact = 0
for rid in sent:
    d = lines.get(rid, {})
    cached, predicted = d.get("cached_tokens"), d.get("predicted_cached_tokens")
    exact += cached is not None and cached == predicted
    print(f"{rid:<16} {d.get('endpoint', '?'):<17} {d.get('prompt_tokens', '?')!s:>6} {cached!s:>6} {predicted!s:>9}")
hit = sum(lines[r].get("cached_tokens") or 0 for r in sent if r in lines) / max(1, sum(lines[r].get("prompt_tokens") or 0 for r in sent if r in lines))
print(f"{tag}: predicted == reported cached_tokens for {exact} of {len(sent)} requests ({exact / len(sent):.1%}); engine-reported hit ratio {hit:.3f}")
PY
  curl -sf 127.0.0.1:$GW/metrics | grep -E '^kvgate_(cache_prediction_total|kv_event_incidents_total|kv_events_trusted|tokenized_prompts_total)' || true
  kill "$gw"; wait "$gw" 2>/dev/null || true
}
run_phase events true
# Empty the engines' caches between the phases (vLLM's /reset_prefix_cache, when served).
for p in $P0 $P1; do curl -sf -X POST 127.0.0.1:$p/reset_prefix_cache >/dev/null || true; done
run_phase approx false
