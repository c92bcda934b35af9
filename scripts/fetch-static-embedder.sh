#!/usr/bin/env bash
# Fetches the static embedding model of WordLlama (MIT licence) from PyPI for the semantic
# cache's `embedder: {type: static, dir: DIR}`: its 256-dimension token-embedding matrix
# (safetensors, 16 MB) and its Hugging Face tokenizer, extracted from the pinned wheel into DIR
# as embeddings.safetensors and tokenizer.json, and checked against their pinned SHA-256.
# The weights are never committed.
#
#   scripts/fetch-static-embedder.sh DIR
set -euo pipefail

VERSION=0.3.9
WEIGHTS=wordllama/weights/l2_supercat_256.safetensors
TOKENIZER=wordllama/tokenizers/l2_supercat_tokenizer_config.json
WEIGHTS_SHA256=64b47a2dc493cb8e85944076601189739852d7b64e0e1eedcb1937a251cd9fd5
TOKENIZER_SHA256=bf467c9e0f536bda271283c6ef85eb1a943e3196b621c8a912d64953b205df83

dir=${1:?usage: $0 DIR}
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Any platform's wheel carries the same model files: ask for one, whatever Python runs this.
pip download "wordllama==$VERSION" --no-deps --only-binary=:all: \
    --python-version 3.11 --platform manylinux2014_x86_64 -d "$work" >&2
wheel=$(ls "$work"/wordllama-"$VERSION"-*.whl)
python3 - "$wheel" "$dir" "$WEIGHTS" "$TOKENIZER" <<'PY'
import shutil, sys, zipfile
wheel, out, weights, tokenizer = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    for member, name in ((weights, "embeddings.safetensors"), (tokenizer, "tokenizer.json")):
        with z.open(member) as src, open(f"{out}/{name}", "wb") as dst:
            shutil.copyfileobj(src, dst)
PY
echo "$WEIGHTS_SHA256  $dir/embeddings.safetensors" | sha256sum -c - >&2
echo "$TOKENIZER_SHA256  $dir/tokenizer.json" | sha256sum -c - >&2
echo "$dir"
