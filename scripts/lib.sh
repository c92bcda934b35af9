# Shared by the measurement scripts: start processes that announce their address, stop them all.
# Source it; it sets an EXIT trap that stops everything started.

pids=()

stop_all() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    pids=()
}
trap stop_all EXIT

# Sets KVGATE to the kvgate binary: as given when set, else a fresh release build.
kvgate_binary() {
    if [[ -z "${KVGATE:-}" ]]; then
        cargo build --release -q -p kvgate
        KVGATE="${CARGO_TARGET_DIR:-target}"/release/kvgate
    fi
}

# Starts a process that prints "... listening on http://ADDR ..."; sets $url, or returns 1
# (saying why) if it exits or stays silent for 20 s.
start() {
    local log
    log=$(mktemp)
    "$@" >"$log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 400); do
        url=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$log" | head -1 || true)
        [[ -n "$url" ]] && return 0
        kill -0 "${pids[-1]}" 2>/dev/null || break
        sleep 0.05
    done
    echo "did not start: $* ($(head -3 "$log"))" >&2
    return 1
}

# A plain HTTP/1.1 request over bash's /dev/tcp (no curl needed): http METHOD URL [BODY].
http() {
    local method=$1 url=$2 body=${3:-} hostport path
    hostport=${url#http://}
    path=/${hostport#*/}
    hostport=${hostport%%/*}
    exec 3<>"/dev/tcp/${hostport%:*}/${hostport#*:}"
    printf '%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
        "$method" "$path" "$hostport" "${#body}" "$body" >&3
    cat <&3 || true
    exec 3<&-
}
