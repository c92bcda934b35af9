#!/usr/bin/env bash
# Checks the gateway's live page in a real headless Chromium: installs Debian's
# chromium-headless-shell when no Chromium is present, starts two emulated engines and the
# gateway with an admin token, and runs scripts/ui_check.py (the page loads, asks for the token,
# lists every endpoint, and shows each new request's decision within 2 s).
# usage: scripts/ui-check.sh [--screenshot docs/ui.png]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
shot=()
if [[ "${1:-}" == "--screenshot" ]]; then shot=("$2"); fi
chromium=$(command -v chromium-headless-shell || command -v chromium || true)
if [[ -z "$chromium" ]]; then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium-headless-shell >/dev/null
  chromium=$(command -v chromium-headless-shell)
fi
cargo build --quiet -p kvgate
bin="${CARGO_TARGET_DIR:-target}/debug/kvgate"
token=ui-check-token
config=$(mktemp)
trap 'stop_all; rm -f "$config"' EXIT
printf 'admin_token: %s\nendpoints:\n' "$token" >"$config"
for id in a b c; do
  start "$bin" engine --listen 127.0.0.1:0 --id "$id" --model test-model --time-scale 0.2
  printf '  - url: %s\n    name: engine-%s\n' "$url" "$id" >>"$config"
done
start "$bin" serve --listen 127.0.0.1:0 --scrape-interval-ms 200 --access-log off --config "$config"
python3 scripts/ui_check.py "$chromium" "$url" "$token" 3 "${shot[@]}"
