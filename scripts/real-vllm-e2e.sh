#!/bin/bash
# kvgate serve in front of two real vLLM CPU engines (see scripts/real-vllm/README.md).
#
# Shows, from the engines' own answers and counters, that cache_aware keeps multi-turn
# conversations on the replica holding their prefix (usage.prompt_tokens_details.cached_tokens,
# vllm:prefix_cache_hits_total) while round_robin does not, and that the gateway parses the real
# engines' /metrics (the observations it reports through its admin API).
#
# usage: scripts/real-vllm-e2e.sh            (from the repository root; ~3 min after the install)
# env:   VLLM_RECIPE (default scripts/real-vllm), ENGINE_DIR (default .real-vllm), KVGATE (default: cargo build)
set -euo pipefail
. "$(dirname "$0")/real-vllm-lib.sh"

run_phase() {  # policy tag
  "$KVGATE" serve --listen 127.0.0.1:$GW --endpoint http://127.0.0.1:$P0 --endpoint http://127.0.0.1:$P1 \
    --policy "$1" --admin-token e2e --scrape-interval-ms 200 > "$ENGINE_DIR/logs/gateway-$1.log" 2>&1 &
  local gw=$!; pids+=("$gw")
  for _ in $(seq 1 200); do curl -sf 127.0.0.1:$GW/ready >/dev/null && break; sleep 0.1; done
  "$PY" - "$1" "$2" $GW $P0 $P1 <<'PY'
import json, sys, urllib.request
policy, tag, gw, p0, p1 = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
def get(url, token=None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    return urllib.request.urlopen(req, timeout=60).read().decode()
def metric(port, name):
    return sum(float(l.rsplit(" ", 1)[1]) for l in get(f"http://127.0.0.1:{port}/metrics").splitlines()
               if l.startswith(name + "{") or l.startswith(name + " "))
before = {p: (metric(p, "vllm:prefix_cache_hits_total"), metric(p, "vllm:prefix_cache_queries_total")) for p in (p0, p1)}
print(f"\n== policy {policy} ==")
print("conv turn endpoint          prompt_tokens cached_tokens")
stuck = 0
for c in range(4):
    system = f"{tag} conversation {c}. " + " ".join(f"rule{c}-{i} keep answers short." for i in range(120))
    messages = [{"role": "system", "content": system}]
    served = []
    for t in range(4):
        messages.append({"role": "user", "content": f"question {t} about topic {c}"})
        body = json.dumps({"model": "tiny", "messages": messages, "max_tokens": 8}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{gw}/v1/chat/completions", body, {"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            endpoint = r.headers["x-kvgate-endpoint"]
            out = json.loads(r.read())
        usage = out["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        served.append(endpoint)
        print(f"{c:4} {t:4} {endpoint:17} {usage['prompt_tokens']:13} {cached:13}")
        messages.append({"role": "assistant", "content": out["choices"][0]["message"]["content"] or ""})
    stuck += len(set(served)) == 1
after = {p: (metric(p, "vllm:prefix_cache_hits_total"), metric(p, "vllm:prefix_cache_queries_total")) for p in (p0, p1)}
for p in (p0, p1):
    hits, queries = after[p][0] - before[p][0], after[p][1] - before[p][1]
    print(f"engine :{p}: prefix cache hits {hits:.0f} of {queries:.0f} queried tokens ({hits / max(queries, 1):.0%})")
print(f"conversations kept on one replica: {stuck} of 4")
status = json.loads(get(f"http://127.0.0.1:{gw}/admin/endpoints", "e2e"))
for e in status["endpoints"]:
    print(f"gateway's view of {e['name']}: health {e['health']}, models {e['models']}, observation {e['observation']}")
PY
  kill "$gw"; wait "$gw" 2>/dev/null || true
}
run_phase cache_aware aware
run_phase round_robin rr
