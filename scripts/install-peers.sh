#!/usr/bin/env bash
# Installs the peer routers kvgate is measured against, pinned, into a virtualenv (default
# target/peers; PEERS_VENV overrides): SGLang's router (`sglang-router`, the Rust gateway behind
# `python -m sglang_router.launch_router`), vLLM's (`vllm-router`) and LiteLLM's proxy
# (`litellm[proxy]`). All three come from PyPI; the two routers are wheels with the Rust
# compiled in. `scripts/routing-bench.sh` runs them as policies named `sglang:POLICY`,
# `vllm-router:POLICY` and `litellm:STRATEGY`. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${PEERS_VENV:-target/peers}
if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q 'sglang-router==0.3.2' 'vllm-router==0.1.17' 'litellm[proxy]==1.108.7'
"$venv/bin/pip" list 2>/dev/null | grep -E '^(sglang-router|vllm-router|litellm) '
