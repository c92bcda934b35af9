#!/usr/bin/env bash
# Validates the Kubernetes manifests in deploy/kubernetes/ offline, every document by its kind
# (scripts/validate-manifests/validate.py says against what), then breaks copies of them (a
# misspelled field, a value out of its enum or range, an unknown kind) and fails unless each is
# refused: a validator that cannot fail proves nothing. Exits non-zero on any error, naming the
# document and the field.
#
#   scripts/validate-manifests.sh [--crd FILE] [--kubernetes 1.31.0,1.37.0] [FILE...]
#
# Given FILEs, it validates those instead, without the self-test.
# --crd FILE also validates each InferencePool against that CRD's v1 openAPIV3Schema (the
# upstream CRD, when one is at hand; no package registry carries it).
# Needs python3 with venv and node with npm; installs pinned packages into .venv-k8s (PyPI:
# scripts/validate-manifests/requirements.txt) and scripts/validate-manifests/node_modules
# (npm, from its package-lock.json) when they are missing or out of date.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=scripts/validate-manifests

stamp=.venv-k8s/requirements.txt
if [[ ! -x .venv-k8s/bin/python ]] || ! cmp -s "$tools/requirements.txt" "$stamp"; then
    python3 -m venv .venv-k8s
    .venv-k8s/bin/pip install --quiet --disable-pip-version-check -r "$tools/requirements.txt"
    cp "$tools/requirements.txt" "$stamp"
fi
lock="$tools/node_modules/.package-lock.json"
if [[ ! -f "$lock" ]] || [[ "$tools/package-lock.json" -nt "$lock" ]]; then
    npm ci --prefix "$tools" --no-audit --no-fund --loglevel=error >/dev/null
fi

args=() files=()
while (($#)); do
    case $1 in
        --crd | --kubernetes) args+=("$1" "$2"); shift 2 ;;
        -*) echo "unknown option $1" >&2; exit 2 ;;
        *) files+=("$1"); shift ;;
    esac
done
if ((${#files[@]} == 0)); then
    files=(deploy/kubernetes/*.yaml)
    args+=(--self-test)
fi
.venv-k8s/bin/python "$tools/validate.py" "${args[@]}" "${files[@]}"
