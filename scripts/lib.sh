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

# Starts a process that prints "... listening on http(s)://ADDR ..."; sets $url, or returns 1
# (saying why) if it exits or stays silent for 20 s.
start() {
    local log
    log=$(mktemp)
    "$@" >"$log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 400); do
        url=$(grep -o 'https\?://127\.0\.0\.1:[0-9]*' "$log" | head -1 || true)
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

# A private CA and a certificate for 127.0.0.1 signed by it, in DIR (ca.pem, cert.pem, key.pem):
# what a gateway's `ca_file` trusts and a TLS listener serves. (A self-signed certificate is a
# CA certificate, which rustls refuses as a server's own.)
tls_pki() {
    local dir=$1 curve=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    openssl req -x509 "${curve[@]}" -days 2 -subj "/CN=kvgate test CA" \
        -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
    openssl req "${curve[@]}" -subj "/CN=127.0.0.1" -keyout "$dir/key.pem" -out "$dir/req.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' >"$dir/ext.cnf"
    openssl x509 -req -in "$dir/req.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
        -days 2 -extfile "$dir/ext.cnf" -out "$dir/cert.pem" 2>/dev/null
}
