#!/bin/bash
# An engine restart against two real vLLM CPU engines (see scripts/real-vllm/README.md): a
# session's first turn goes through the gateway, the script kills the engine that answered it
# (SIGKILL, its engine-core process too, while idle) and starts it again on the same port with an empty cache. Checks what
# the gateway makes of it with its defaults: the failed scrapes re-home the session (a one-token
# warm-up of its last turn to the other engine), the new process is seen in a scrape
# (`process_start_time_seconds` changed: `kvgate_endpoint_restarts_total`), and the session's
# next turn goes to the other engine and finds its context cached there. Prints the gateway's
# counters and the next turn's endpoint and cached tokens; exits non-zero when a check fails.
#
# usage: scripts/real-vllm-restart.sh            (from the repository root; ~2 min after the install)
# env:   VLLM_RECIPE (default scripts/real-vllm), ENGINE_DIR (default .real-vllm), KVGATE (default: cargo build)
set -euo pipefail
. "$(dirname "$0")/real-vllm-lib.sh"

cat > "$ENGINE_DIR/restart.yaml" <<EOF
scrape: {interval_ms: 200}
endpoints:
  - {url: "http://127.0.0.1:$P0", name: e0}
  - {url: "http://127.0.0.1:$P1", name: e1}
EOF
"$KVGATE" serve --listen 127.0.0.1:$GW --config "$ENGINE_DIR/restart.yaml" > "$ENGINE_DIR/logs/gateway-restart.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 200); do curl -sf 127.0.0.1:$GW/ready >/dev/null && break; sleep 0.1; done

# The engine's start command, as real-vllm-lib.sh ran it: PORT KV_PORT.
restart_engine() {
  "$VLLM_RECIPE/start_engine.sh" small-llama "$1" "$2" --block-size 32 --num-gpu-blocks-override "$BLOCKS" --enforce-eager ${VLLM_ARGS:-}
}
export -f restart_engine
export VLLM_RECIPE BLOCKS VLLM_ARGS="${VLLM_ARGS:-}"

"$PY" - $GW $P0 $P1 $KV0 $KV1 "$ENGINE_DIR" <<'PY'
import json, os, re, signal, subprocess, sys, time, urllib.request
gw, p0, p1, kv0, kv1, engine_dir = sys.argv[1:7]
ports = {"e0": (p0, kv0), "e1": (p1, kv1)}
system = "You are a careful agent that keeps notes about everything it reads. " * 24
messages = [{"role": "system", "content": system},
            {"role": "user", "content": "Summarise the notes so far."}]

def turn(msgs):
    body = {"model": "tiny", "messages": msgs, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(f"http://127.0.0.1:{gw}/v1/chat/completions",
                                 json.dumps(body).encode(),
                                 {"content-type": "application/json", "x-session-id": "s1"})
    with urllib.request.urlopen(req, timeout=300) as r:
        v = json.load(r)
        return r.headers.get("x-kvgate-endpoint"), v

def metrics():
    with urllib.request.urlopen(f"http://127.0.0.1:{gw}/metrics", timeout=10) as r:
        return r.read().decode()

def value(text, prefix):
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return None

def wait(what, check, limit=120):
    deadline = time.time() + limit
    while time.time() < deadline:
        m = metrics()
        if check(m):
            return m
        time.sleep(0.2)
    sys.exit(f"FAIL: timed out waiting for {what}")

home, first = turn(messages)
other = "e1" if home == "e0" else "e0"
print(f"turn 1 on {home}: {first['usage']['prompt_tokens']} prompt tokens")
port, kv = ports[home]
pid = int(open(f"{engine_dir}/logs/{port}.pid").read())
# The API server and its engine-core process go together, as in a crashed pod.
subprocess.run(["pkill", "-KILL", "-P", str(pid)], check=False)
os.kill(pid, signal.SIGKILL)
t0 = time.time()
sent = 'kvgate_rehome_warmups_total{reason="sent"}'
wait("the warm-up", lambda m: value(m, sent) == 1.0)
print(f"{home} killed; warm-up sent to {other} after {time.time() - t0:.1f} s")
subprocess.run(["bash", "-c", f"restart_engine {port} {kv}"], check=True)
restarts = f'kvgate_endpoint_restarts_total{{endpoint="{home}"}}'
m = wait("the restart", lambda m: value(m, restarts) == 1.0)
print(f"{home} restarted after {time.time() - t0:.1f} s; the gateway saw a new process")
messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
             {"role": "user", "content": "And what should we read next?"}]
went, second = turn(messages)
usage = second["usage"]
cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
print(f"turn 2 on {went}: {cached} of {usage['prompt_tokens']} prompt tokens cached")
m = metrics()
for line in m.splitlines():
    if re.match(r"kvgate_(rehome_|endpoint_restarts|cache_prediction)", line):
        print("  " + line)
ok = went == other and cached > 0.8 * usage["prompt_tokens"]
print("OK" if ok else "FAIL: the next turn did not find its context re-homed")
sys.exit(0 if ok else 1)
PY
