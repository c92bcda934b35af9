#!/usr/bin/env bash
# Runs kvgate's whole test suite: unit, property, integration and doc tests of every crate, then
# prints one closing line with the totals. Installs Debian's nats-server when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# The scale-out tests start Debian's nats-server on a loopback port.
if ! command -v nats-server >/dev/null && ! [[ -x /usr/sbin/nats-server ]]; then
  sudo=$([[ $(id -u) -eq 0 ]] || echo sudo)
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nats-server >/dev/null
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --all-targets 2>&1 | tee -a "$log"
cargo test --workspace --doc 2>&1 | tee -a "$log"
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "%d passed, %d failed, %d skipped\n", p, f, s }' "$log"
