#!/usr/bin/env bash
# Runs kvgate's whole test suite: unit, property and integration tests of every crate.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets
cargo test --workspace --doc
