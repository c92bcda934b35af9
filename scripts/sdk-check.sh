#!/usr/bin/env bash
# Runs the official OpenAI Python SDK against `kvgate engine`, then against `kvgate serve` over
# TLS in front of it: creates .venv-sdk (pip install openai trustme), builds and starts the
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
GATEWAY_PID=""
TLS=$(mktemp -d)
trap 'kill $ENGINE_PID $GATEWAY_PID 2>/dev/null || true; rm -rf "$LOG" "$TLS"' EXIT
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
echo "OpenAI SDK: engine and gateway over TLS passed"
