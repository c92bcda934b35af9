#!/usr/bin/env bash
# Fuzzes every parser that reads bytes from outside the gateway (crates/gateway/src/fuzz/):
# mutants of inputs captured from vLLM and of realistic requests, TOTAL_CASES over all
# properties, split by how cheap each property's cases are.
#
# Usage: scripts/fuzz.sh [TOTAL_CASES]     (default 10000000)
#
# Runs in release with overflow checks and debug assertions on, so that an arithmetic overflow
# fails here as it would in a debug build instead of wrapping silently. Each run draws a new
# seed; a failure prints its shrunk input, and PROPTEST_RNG_SEED=N replays a run. Failures are
# not persisted: each finding becomes a regression test beside its parser. CARGO_TARGET_DIR is
# honoured. A plain `cargo test -p kvgate-gateway` runs the same properties with a small count.
set -euo pipefail
cd "$(dirname "$0")/.."

total="${1:-10000000}"
if ! [[ "$total" =~ ^[0-9]+$ ]] || ((total == 0)); then
    echo "usage: $0 [TOTAL_CASES]" >&2
    exit 2
fi

export KVGATE_FUZZ_CASES="$total"
export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true
export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
export RUST_BACKTRACE="${RUST_BACKTRACE:-0}"

cargo test --release -p kvgate-gateway --lib --no-run

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
start=$(date +%s)
status=0
cargo test --release -p kvgate-gateway --lib fuzz -- --nocapture 2>&1 | tee "$log" || status=$?
seconds=$(($(date +%s) - start))

# Lines of concurrent tests interleave; each property reports "fuzz NAME: N cases in S s".
grep -ao 'fuzz [a-z_]*: [0-9]* cases' "$log" | awk -v secs="$seconds" '
    { n += $3; k += 1 }
    END { printf "fuzz: %d cases over %d properties in %d s (wall time, build excluded)\n", n, k, secs }'
if ((status != 0)); then
    echo "fuzz: FAILED (the shrunk input is above)" >&2
fi
exit "$status"
