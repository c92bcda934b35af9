#!/usr/bin/env bash
# Runs the official OpenAI Python SDK against `kvgate engine`: creates .venv-sdk (pip install
# openai), builds and starts the engine on a free port, runs scripts/openai_sdk_check.py, stops
# the engine. Needs python3 with venv and access to PyPI (or a prepared .venv-sdk).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv-sdk/bin/python ]; then
  python3 -m venv .venv-sdk
  .venv-sdk/bin/pip install --quiet openai
fi
cargo build --quiet -p kvgate
LOG=$(mktemp)
"${CARGO_TARGET_DIR:-target}"/debug/kvgate engine --listen 127.0.0.1:0 --time-scale 0 --model sdk-model >"$LOG" 2>&1 &
ENGINE_PID=$!
trap 'kill $ENGINE_PID 2>/dev/null || true; rm -f "$LOG"' EXIT
URL=""
for _ in $(seq 1 100); do
  URL=$(grep -o 'http://[0-9.:]*' "$LOG" || true)
  [ -n "$URL" ] && break
  kill -0 $ENGINE_PID 2>/dev/null || { cat "$LOG"; exit 1; }
  sleep 0.1
done
[ -n "$URL" ] || { echo "engine did not start"; cat "$LOG"; exit 1; }
.venv-sdk/bin/python scripts/openai_sdk_check.py "$URL" sdk-model
