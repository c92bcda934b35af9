#!/bin/bash
# Mid-stream continuation against two real vLLM CPU engines (see scripts/real-vllm/README.md):
# the gateway sends a streamed chat to the first (tier 0), the script kills that engine with
# SIGKILL after 20 content chunks, and the gateway continues the answer on the second engine
# with `continue_final_message`. Checks that the client's stream is one well-formed SSE stream
# (one id, one role delta, one finish_reason, usage, [DONE], no error event) and prints its text
# beside the second engine's own greedy answer to the same request (both engines load the same
# weights, so with temperature 0 they differ only where re-tokenizing the text so far gives
# other token ids than the ones generated).
#
# With STAGE_TOKENS=N the continuation is staged (`resume.stage_tokens`): its prompt's heads go
# to the second engine first as one-token warm-ups, and the script also prints how many ended
# warmed and the second engine's prefix-cache hits (the heads, and the continuation, find the
# heads before them cached).
#
# usage: scripts/real-vllm-resume.sh            (from the repository root; ~2 min after the install)
# env:   VLLM_RECIPE (default scripts/real-vllm), ENGINE_DIR (default .real-vllm), KVGATE (default: cargo build),
#        STAGE_TOKENS (default 0: not staged; 32 cuts this script's ~250-token prompt in heads)
set -euo pipefail
. "$(dirname "$0")/real-vllm-lib.sh"

cat > "$ENGINE_DIR/resume.yaml" <<EOF
scrape: {interval_ms: 200}
endpoints:
  - {url: "http://127.0.0.1:$P0", name: first}
  - {url: "http://127.0.0.1:$P1", name: second, tier: 1}
resume: {stage_tokens: ${STAGE_TOKENS:-0}}
EOF
"$KVGATE" serve --listen 127.0.0.1:$GW --config "$ENGINE_DIR/resume.yaml" > "$ENGINE_DIR/logs/gateway-resume.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 200); do curl -sf 127.0.0.1:$GW/ready >/dev/null && break; sleep 0.1; done

"$PY" - $GW $P1 "$(cat "$ENGINE_DIR/logs/$P0.pid")" "${STAGE_TOKENS:-0}" <<'PY'
import json, os, signal, sys, urllib.request
gw, second, victim, staged = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) > 0
messages = [{"role": "system", "content": "You answer at length. " * 20},
            {"role": "user", "content": "Tell me everything about prefix caches."}]
request = {"model": "tiny", "messages": messages, "max_tokens": 160, "temperature": 0,
           "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}

def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 json.dumps(body).encode(), {"content-type": "application/json"})
    return urllib.request.urlopen(req, timeout=300)

events, content_chunks, killed, at_break = [], 0, False, 0
with post(gw, request) as r:
    served_by = r.headers.get("x-kvgate-endpoint")
    for line in r:
        line = line.decode().rstrip("\n")
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        events.append(data)
        if data != "[DONE]":
            chunk = json.loads(data)
            if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                content_chunks += 1
                if not killed:
                    at_break += len(chunk["choices"][0]["delta"]["content"])
        if content_chunks == 20 and not killed:
            os.kill(victim, signal.SIGKILL)
            killed = True

assert events and events[-1] == "[DONE]" and events.count("[DONE]") == 1, events[-3:]
chunks = [json.loads(e) for e in events[:-1]]
assert not any("error" in c for c in chunks), [c for c in chunks if "error" in c]
ids = {c["id"] for c in chunks}
roles = sum(1 for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"])
finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
usage = chunks[-1]["usage"]
text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
print(f"served first by {served_by}; killed it after 20 content chunks ({at_break} chars): {killed}")
print(f"ids {len(ids)}, role deltas {roles}, finish_reason {finishes}, usage {usage}")
assert len(ids) == 1 and roles == 1 and finishes == ["length"], (ids, roles, finishes)
assert usage["completion_tokens"] == 160, usage

greedy = dict(request, stream=False)
greedy.pop("stream_options")
with post(second, greedy) as r:
    alone = json.load(r)["choices"][0]["message"]["content"]
common = next((i for i, (a, b) in enumerate(zip(text, alone)) if a != b), min(len(text), len(alone)))
print(f"client text {len(text)} chars; the second engine's own greedy answer {len(alone)} chars; "
      f"identical for the first {common} chars{' (all of it)' if text == alone else ''}")
metrics = urllib.request.urlopen(f"http://127.0.0.1:{gw}/metrics", timeout=10).read().decode()
print("\n".join(l for l in metrics.splitlines() if l.startswith("kvgate_stream_resume")
                and not l.startswith("kvgate_stream_resume_wait_seconds_bucket")))
engine = urllib.request.urlopen(f"http://127.0.0.1:{second}/metrics", timeout=10).read().decode()
hits = sum(float(l.rsplit(" ", 1)[1]) for l in engine.splitlines()
           if l.startswith("vllm:prefix_cache_hits_total"))
print(f"the second engine's prefix-cache hits: {hits:.0f} tokens")
if staged:
    heads = next(float(l.rsplit(" ", 1)[1]) for l in metrics.splitlines()
                 if l.startswith("kvgate_stream_resume_heads_total"))
    assert heads > 0 and hits > 0, (heads, hits)
PY
