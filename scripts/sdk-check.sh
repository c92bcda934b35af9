#!/usr/bin/env bash
# Runs the official OpenAI Python SDK against `kvgate engine`, then against `kvgate serve` over
# TLS in front of it, then through a gateway whose first engine breaks every stream after four
# tokens (the SDK must read the continued stream as one): creates .venv-sdk (pip install openai trustme), builds and starts the
# engine on a free port, runs scripts/openai_sdk_check.py, makes a test CA and certificate with
# trustme, starts the gateway with them and runs the check again over https, stops both. Needs
# python3 with venv and access to PyPI (or a prepared .venv-sdk).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv-sdk/bin/python ]; then
  python3 -m venv .venv-sdk
  .venv-sdk/bin/pip install --quiet openai
fi
.venv-sdk/bin/python -c "import trustme" 2>/dev/null || .venv-sdk/bin/pip install --quiet trustme
cargo build --quiet -p kvgate
LOG=$(mktemp)
"${CARGO_TARGET_DIR:-target}"/debug/kvgate engine --listen 127.0.0.1:0 --time-scale 0 --model sdk-model >"$LOG" 2>&1 &
ENGINE_PID=$!
GATEWAY_PID="" BROKEN_PID="" RESUME_PID=""
TLS=$(mktemp -d)
trap 'kill $ENGINE_PID $GATEWAY_PID $BROKEN_PID $RESUME_PID 2>/dev/null || true; rm -rf "$LOG" "$TLS"' EXIT
# Prints the SCHEME://ADDR a process announces in its LOG, waiting up to 10 s: address PID LOG SCHEME.
address() {
  local found=""
  for _ in $(seq 1 100); do
    found=$(grep -o "$3://[0-9.:]*" "$2" || true)
    [ -n "$found" ] && { echo "$found"; return; }
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  echo "did not start:" >&2; cat "$2" >&2; exit 1
}
URL=$(address $ENGINE_PID "$LOG" http)
.venv-sdk/bin/python scripts/openai_sdk_check.py "$URL" sdk-model

# The same through the gateway over TLS.
.venv-sdk/bin/python - "$TLS" <<'PY'
import sys, trustme
ca = trustme.CA()
cert = ca.issue_cert("127.0.0.1", "localhost")
ca.cert_pem.write_to_path(f"{sys.argv[1]}/ca.pem")
cert.private_key_pem.write_to_path(f"{sys.argv[1]}/key.pem")
cert.cert_chain_pems[0].write_to_path(f"{sys.argv[1]}/cert.pem")
PY
GLOG="$TLS/gateway.log"
"${CARGO_TARGET_DIR:-target}"/debug/kvgate serve --listen 127.0.0.1:0 --endpoint "$URL" \
  --tls-cert "$TLS/cert.pem" --tls-key "$TLS/key.pem" >"$GLOG" 2>&1 &
GATEWAY_PID=$!
GURL=$(address $GATEWAY_PID "$GLOG" https)
.venv-sdk/bin/python - "$GURL" "$TLS/ca.pem" <<'PY'
import ssl, sys, time, urllib.request
context = ssl.create_default_context(cafile=sys.argv[2])
for _ in range(200):
    try:
        if urllib.request.urlopen(f"{sys.argv[1]}/ready", context=context, timeout=2).status == 200:
            break
    except OSError:
        pass
    time.sleep(0.1)
else:
    sys.exit("gateway never became ready")
PY
.venv-sdk/bin/python scripts/openai_sdk_check.py "$GURL" sdk-model "$TLS/ca.pem"

# Mid-stream continuation: the first tier resets every stream after 4 tokens, the second
# (the engine above, same seed) continues it.
BLOG="$TLS/broken.log"
"${CARGO_TARGET_DIR:-target}"/debug/kvgate engine --listen 127.0.0.1:0 --time-scale 0 --model sdk-model \
  --fault disconnect_mid:after=4 >"$BLOG" 2>&1 &
BROKEN_PID=$!
BURL=$(address $BROKEN_PID "$BLOG" http)
printf 'endpoints:\n  - {url: "%s", name: broken}\n  - {url: "%s", name: healthy, tier: 1}\n' \
  "$BURL" "$URL" >"$TLS/resume.yaml"
RLOG="$TLS/resume.log"
"${CARGO_TARGET_DIR:-target}"/debug/kvgate serve --listen 127.0.0.1:0 --config "$TLS/resume.yaml" >"$RLOG" 2>&1 &
RESUME_PID=$!
RURL=$(address $RESUME_PID "$RLOG" http)
.venv-sdk/bin/python - "$RURL" <<'PY'
import sys, time, urllib.request
import openai
base = sys.argv[1]
for _ in range(200):
    try:
        if urllib.request.urlopen(f"{base}/ready", timeout=2).status == 200:
            break
    except OSError:
        pass
    time.sleep(0.1)
client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
messages = [{"role": "user", "content": "Say something about caches."}]
# The first tier cools down after the break, so only this request is continued.
chunks = list(client.chat.completions.create(model="sdk-model", messages=messages, max_tokens=12,
                                             stream=True, stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True}))
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert len(text.split()) == 12, text
assert len({c.id for c in chunks}) == 1, [c.id for c in chunks]
assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
assert chunks[-1].usage.completion_tokens == 12, chunks[-1]
metrics = urllib.request.urlopen(f"{base}/metrics", timeout=2).read().decode()
assert 'kvgate_stream_resumes_total{reason="resumed"} 1' in metrics, metrics
PY
echo "OpenAI SDK: engine, gateway over TLS and a continued stream passed"
