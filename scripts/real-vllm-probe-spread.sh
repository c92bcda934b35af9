#!/bin/bash
# How repeatable a real vLLM CPU engine's TTFT is, and what the machine's other engine does to it:
# identical serial probes (one shape: a cached ~3,000-token system prompt and a fresh ~440-token
# question, 2 tokens out) straight to the engine on $P0, first with nothing else running, then
# while kvgate sends the streamed multi-turn sessions of real-vllm-ttft-prediction.sh to the
# engine on $P1 alone. Prints each phase's share of probes within 20% of the phase's median TTFT:
# no router can predict a request more closely than the engine repeats it.
#
# usage: scripts/real-vllm-probe-spread.sh [PROBES]   (from the repository root, default 150)
# env:   as real-vllm-ttft-prediction.sh
set -euo pipefail
N=${1:-150}
. "$(dirname "$0")/real-vllm-lib.sh"

probe() {  # label
  "$PY" - "$P0" "$N" "$1" "$KVGATE" <<'PY'
import json, random, subprocess, sys, time, urllib.request
port, n, label, kvgate = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
rng = random.Random(1)
system = "Team 9. " + " ".join(f"policy9-{i} applies to every answer." for i in range(150))
def one(i):
    words = " ".join(f"w{rng.randrange(10**6)}" for _ in range(60))
    body = json.dumps({"model": "tiny", "max_tokens": 2, "stream": True,
                       "messages": [{"role": "system", "content": system},
                                    {"role": "user", "content": f"probe {i} {words}"}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                 {"content-type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req) as r:
        first = next(time.time() for line in r if line.startswith(b"data:"))
        r.read()
    return first - t0
def stats(values, *flags):
    """`kvgate stats`, the one definition of a percentile."""
    done = subprocess.run([kvgate, "stats", "--json", *flags], input="".join(f"{v}\n" for v in values),
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)
ttfts = [one(i) * 1e3 for i in range(n + 5)][5:]  # the first few warm the prefix cache
m = stats(ttfts)["p50"]
s = stats(ttfts, "--percentiles", "10", "--within", f"{0.8 * m},{1.2 * m}")
print(f"{label}: {n} probes, median {m:.1f} ms, p10 {s['p10']:.1f}, p90 {s['p90']:.1f}, "
      f"within 20% of the median {s['within']:.0%}")
PY
}

probe "engine $P1 idle"
"$KVGATE" serve --listen 127.0.0.1:$GW --endpoint http://127.0.0.1:$P1 \
  > "$ENGINE_DIR/logs/gateway-probe-spread.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 200); do curl -sf 127.0.0.1:$GW/ready >/dev/null && break; sleep 0.1; done
"$PY" - $GW <<'PY' &
# The prediction script's sessions, until the probes are done (killed on exit).
import json, random, sys, threading, time, urllib.request
gw = int(sys.argv[1])
rng = random.Random(7)
systems = [f"Team {t}. " + " ".join(f"policy{t}-{i} applies to every answer." for i in range(rng.randrange(40, 160)))
           for t in range(4)]
def session(s):
    messages = [{"role": "system", "content": systems[s % len(systems)]}]
    while True:
        messages.append({"role": "user", "content": f"session {s} asks " + "why " * rng.randrange(5, 80)})
        body = json.dumps({"model": "tiny", "messages": messages, "max_tokens": rng.randrange(4, 24),
                           "stream": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{gw}/v1/chat/completions", body,
                                     {"content-type": "application/json", "x-kvgate-session": f"s{s}"})
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()
        messages.append({"role": "assistant", "content": "noted"})
        if len(messages) > 8:
            messages = messages[:1]
        time.sleep(rng.uniform(0, 0.5))
for s in range(6):
    threading.Thread(target=session, args=(s,), daemon=True).start()
time.sleep(3600)
PY
pids+=($!)
sleep 2
probe "engine $P1 serving six sessions"
