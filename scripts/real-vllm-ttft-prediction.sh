#!/bin/bash
# How well predicted_ttft's calibrated model predicts real vLLM engines: kvgate serve
# (predicted_ttft, the default) in front of two real vLLM CPU engines (scripts/real-vllm/),
# streamed multi-turn sessions sharing system prompts, a few at a time; then each request's
# predicted TTFT (its decision record at /admin/decisions) is joined with its measured TTFT (the
# access log) by request id. Prints the share of requests predicted within 20% after a warm-up,
# and the ratio's spread. With DUMP=FILE it also writes one JSON line per request for offline
# study (scripts/real-vllm/ttft_candidates.py): the client's send time and the arrival time of
# every SSE chunk, its max_tokens, the decision record and the access-log row.
#
# usage: scripts/real-vllm-ttft-prediction.sh [REQUESTS]   (from the repository root, default 160)
# env:   VLLM_RECIPE (default scripts/real-vllm), ENGINE_DIR (default .real-vllm), KVGATE (default: cargo build),
#        DUMP (a file for the per-request lines), GATEWAY_ARGS (more `kvgate serve` flags, e.g. --config FILE)
set -euo pipefail
N=${1:-160}
. "$(dirname "$0")/real-vllm-lib.sh"

log="$ENGINE_DIR/logs/access-prediction.log"
rm -f "$log"
"$KVGATE" serve --listen 127.0.0.1:$GW --endpoint http://127.0.0.1:$P0 --endpoint http://127.0.0.1:$P1 \
  --admin-token pred --scrape-interval-ms 200 --access-log "$log" ${GATEWAY_ARGS:-} \
  > "$ENGINE_DIR/logs/gateway-prediction.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 200); do curl -sf 127.0.0.1:$GW/ready >/dev/null && break; sleep 0.1; done

ratios="$ENGINE_DIR/logs/ttft-ratios.txt"
diffs="$ENGINE_DIR/logs/cached-token-diffs.txt"
"$PY" - "$N" $GW "$log" "$ratios" "$diffs" "${DUMP:-}" <<'PY'
import json, random, re, sys, threading, time, urllib.error, urllib.request
n, gw, log, ratios_file, diffs_file, dump = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
rng = random.Random(7)
systems = [f"Team {t}. " + " ".join(f"policy{t}-{i} applies to every answer." for i in range(rng.randrange(40, 160)))
           for t in range(4)]
lock = threading.Lock()
sent = 0
client = {}  # request id -> what the client saw, for DUMP

def session(s):
    global sent
    messages = [{"role": "system", "content": systems[s % len(systems)]}]
    while True:
        with lock:
            if sent >= n:
                return
            sent += 1
        messages.append({"role": "user", "content": f"session {s} asks " + "why " * rng.randrange(5, 80)})
        max_tokens = rng.randrange(4, 24)
        body = json.dumps({"model": "tiny", "messages": messages, "max_tokens": max_tokens,
                           "stream": True, "stream_options": {"include_usage": True}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{gw}/v1/chat/completions", body,
                                     {"content-type": "application/json", "x-kvgate-session": f"s{s}"})
        sent_at = time.time()
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                chunks = [time.time() for line in r if line.startswith(b"data:")]
                with lock:
                    client[int(r.headers["x-kvgate-request-id"])] = {
                        "sent_at": sent_at, "chunks": chunks, "max_tokens": max_tokens}
        except urllib.error.HTTPError as e:
            print(f"session {s}: HTTP {e.code} {e.read()[:200]!r}")
            messages = messages[:1]
            continue
        messages.append({"role": "assistant", "content": "noted"})
        if len(messages) > 8:  # a new conversation on the same team prompt (within 4,096 tokens)
            messages = messages[:1]
        time.sleep(rng.uniform(0, 0.5))

threads = [threading.Thread(target=session, args=(s,)) for s in range(6)]
for t in threads: t.start()
for t in threads: t.join()
time.sleep(0.5)
req = urllib.request.Request(f"http://127.0.0.1:{gw}/admin/decisions?limit=100000",
                             headers={"Authorization": "Bearer pred"})
decisions = json.loads(urllib.request.urlopen(req).read())["decisions"]
rows = [json.loads(l) for l in open(log)]
if dump:
    first = {d["request"]: d for d in decisions if d["attempt"] == "first"}
    access = {r["request_id"]: r for r in rows}
    with open(dump, "w") as f:
        f.writelines(json.dumps({"request": i, "client": c, "decision": first.get(i), "access": access.get(i)}) + "\n"
                     for i, c in sorted(client.items()))
predicted = {d["request"]: d["reason"]["ttft_ms"] for d in decisions
             if d["attempt"] == "first" and d["reason"]["kind"] == "predicted_ttft"}
pairs = sorted((r["request_id"], r["ttft_ms"] / predicted[r["request_id"]]) for r in rows
               if r.get("ttft_ms") and r["request_id"] in predicted and r["attempts"] == 1)
warm = pairs[len(pairs) // 4:]
# Summarised by `kvgate stats` below, the one definition of a percentile.
open(ratios_file, "w").writelines(f"{x}\n" for _, x in warm)
print(f"requests {len(rows)}, streamed with a prediction {len(pairs)}, after a 25% warm-up {len(warm)}")
cached = [r for r in rows if r.get("cached_tokens")]
print(f"requests the engines served partly from cache: {len(cached)} of {len(rows)}")
# The index's own figure, scored by the gateway against every usage (exact = within a block).
metrics = urllib.request.urlopen(f"http://127.0.0.1:{gw}/metrics").read().decode()
scored = {m.group(1): float(m.group(2)) for m in re.finditer(
    r'^kvgate_cache_prediction_total\{result="(\w+)"\} (\S+)$', metrics, re.M)}
total = sum(scored.values())
if total:
    print("cached-token predictions: " + ", ".join(
        f"{k} {scored.get(k, 0) / total:.0%}" for k in ("exact", "over", "under")) + f" of {total:.0f}")
# The access log's figure, as the engine counts cached tokens (whole blocks, never the last token).
diffs = [r["predicted_cached_tokens"] - r["cached_tokens"] for r in rows
         if r.get("predicted_cached_tokens") is not None and r.get("cached_tokens") is not None]
open(diffs_file, "w").writelines(f"{d}\n" for d in diffs)
PY
echo "measured / predicted TTFT (after the warm-up; 'within' is the share within 20%):"
"$KVGATE" stats --percentiles 10 --within 0.8,1.2 "$ratios"
echo "access log predicted_cached_tokens - cached_tokens ('within' is the share equal):"
"$KVGATE" stats --percentiles 10 --within 0,0 "$diffs"
