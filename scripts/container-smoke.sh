#!/usr/bin/env bash
# Builds kvgate's container image from the Dockerfile and smoke tests it: reports the image's
# and the binary's size, runs the default command (`kvgate serve` with two emulated engines
# in-process) with a read-only root filesystem and a published port, waits for /ready, sends a
# chat completion and a streamed one with curl and checks the JSON and the SSE, checks the
# process runs as uid 65532, runs the image's HEALTHCHECK and `kvgate probe` inside, stops the
# container with SIGTERM (exit 0), removes it. Keeps the image. Not run by CI (no container
# engine there).
#
#   scripts/container-smoke.sh [--full | --prebuilt]
#
# Build paths:
#   --full      the Dockerfile as it is: the Rust builder image compiles kvgate, the runtime
#               image receives the binary. Needs both base images (pulled or present).
#   --prebuilt  where the builder image cannot be had (no registry): builds the binary here
#               with the Dockerfile's command (cargo build --release --locked -p kvgate) and
#               hands it to the Dockerfile in place of its `build` stage (--build-context
#               build=DIR; Podman >= 4.3, BuildKit); the runtime stage is the Dockerfile's, as is.
#               The binary is glibc-linked: build it on a system no newer than the runtime
#               image's Debian 12.
#   (neither)   --full if the builder image is present or can be pulled, else --prebuilt.
# The script says which it took.
#
# Environment:
#   CONTAINER            the engine command (default: docker if its daemon answers, else podman),
#                        with any global flags: CONTAINER="podman --runtime runc"
#   CONTAINER_BUILD_FLAGS, CONTAINER_RUN_FLAGS
#                        extra `build` and `run` flags, e.g. resource limits a sandbox needs
#   RUNTIME_IMAGE        the runtime base image (default: the Dockerfile's, distroless cc). When
#                        unset and that image cannot be had, a Debian 12 minbase image with CA
#                        certificates is made with debootstrap (localhost/debian-minbase:bookworm)
#                        and used instead, and the script says so.
#   BUILDER_IMAGE        the Rust builder image (default: the Dockerfile's)
#   IMAGE                the tag to build (default localhost/kvgate:smoke)
set -euo pipefail
cd "$(dirname "$0")/.."

mode=auto
case ${1:-} in
    --full) mode=full ;;
    --prebuilt) mode=prebuilt ;;
    "") ;;
    *) echo "usage: $0 [--full | --prebuilt]" >&2; exit 2 ;;
esac
IMAGE=${IMAGE:-localhost/kvgate:smoke}
name=kvgate-smoke-$$
work=$(mktemp -d)
started=""

cleanup() {
    if [[ -n "$started" ]]; then $CONTAINER rm -f "$name" >/dev/null 2>&1 || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

fail() {
    echo "FAIL: $*" >&2
    if [[ -n "$started" ]]; then
        echo "--- container log (last 30 lines)" >&2
        $CONTAINER logs "$name" 2>&1 | tail -30 >&2
    fi
    exit 1
}

if [[ -z "${CONTAINER:-}" ]]; then
    if docker info >/dev/null 2>&1; then
        CONTAINER=docker
    elif podman info >/dev/null 2>&1; then
        CONTAINER=podman
    else
        echo "no container engine answers (docker info, podman info); set CONTAINER" >&2
        exit 1
    fi
fi
engine=$(basename "${CONTAINER%% *}")

# The Dockerfile's default for ARG NAME.
dockerfile_default() { sed -n "s/^ARG $1=//p" Dockerfile; }

# Whether IMAGE is present, or can be pulled.
have_image() {
    $CONTAINER image inspect "$1" >/dev/null 2>&1 || $CONTAINER pull -q "$1" >/dev/null 2>&1
}

# localhost/debian-minbase:bookworm, made with debootstrap unless present: Debian 12 (the
# distroless image's release) with ca-certificates, for offline builds.
local_runtime_base() {
    local base=localhost/debian-minbase:bookworm
    if ! $CONTAINER image inspect "$base" >/dev/null 2>&1; then
        command -v debootstrap >/dev/null || fail "no runtime image and no debootstrap to make one"
        echo "making $base with debootstrap (minbase, ca-certificates)" >&2
        debootstrap --variant=minbase --include=ca-certificates bookworm "$work/rootfs" >&2
        tar -C "$work/rootfs" -c . | $CONTAINER import - "$base" >/dev/null
    fi
    echo "$base"
}

build_args=()
builder=${BUILDER_IMAGE:-$(dockerfile_default BUILDER_IMAGE)}
[[ -n "${BUILDER_IMAGE:-}" ]] && build_args+=(--build-arg "BUILDER_IMAGE=$BUILDER_IMAGE")
runtime=${RUNTIME_IMAGE:-$(dockerfile_default RUNTIME_IMAGE)}
runtime_note="the Dockerfile's default"
if [[ -n "${RUNTIME_IMAGE:-}" ]]; then
    runtime_note="RUNTIME_IMAGE"
elif ! have_image "$runtime"; then
    echo "the runtime image $runtime cannot be had here" >&2
    runtime=$(local_runtime_base)
    runtime_note="substitute: $runtime_note cannot be pulled here"
fi
[[ "$runtime_note" != "the Dockerfile's default" ]] && build_args+=(--build-arg "RUNTIME_IMAGE=$runtime")

if [[ $mode == auto ]]; then
    if have_image "$builder"; then mode=full; else mode=prebuilt; fi
fi
if [[ $mode == prebuilt ]]; then
    echo "build path: PREBUILT: binary built here by cargo build --release --locked -p kvgate," \
        "given to the Dockerfile as its build stage (--build-context build=DIR);" \
        "$builder not used" >&2
    cargo build --release --locked -q -p kvgate
    mkdir -p "$work/build/out"
    cp "${CARGO_TARGET_DIR:-target}/release/kvgate" "$work/build/out/kvgate"
    build_args+=(--build-context "build=$work/build")
else
    echo "build path: FULL: the Dockerfile's build stage ($builder) compiles kvgate" >&2
fi
echo "runtime image: $runtime ($runtime_note)" >&2
[[ $engine == podman ]] && build_args+=(--format docker) # OCI images drop HEALTHCHECK

start=$(date +%s)
# shellcheck disable=SC2086 # CONTAINER_BUILD_FLAGS is a list of flags
$CONTAINER build ${CONTAINER_BUILD_FLAGS:-} "${build_args[@]}" -t "$IMAGE" . >"$work/build.log" 2>&1 ||
    { tail -40 "$work/build.log" >&2; fail "image build failed"; }
build_secs=$(($(date +%s) - start))

image_bytes=$($CONTAINER image inspect --format '{{.Size}}' "$IMAGE")
base_bytes=$($CONTAINER image inspect --format '{{.Size}}' "$runtime")
cid=$($CONTAINER create "$IMAGE")
$CONTAINER cp "$cid:/usr/local/bin/kvgate" "$work/kvgate-from-image" >/dev/null
$CONTAINER rm "$cid" >/dev/null 2>&1 || true
binary_bytes=$(stat -c %s "$work/kvgate-from-image")
if [[ $mode == prebuilt ]]; then
    cmp -s "$work/kvgate-from-image" "$work/build/out/kvgate" || fail "the image's binary is not the one built"
fi
user=$($CONTAINER image inspect --format '{{.Config.User}}' "$IMAGE")
health=$($CONTAINER image inspect --format '{{json .Config.Healthcheck}}' "$IMAGE")
[[ "$health" == *'"probe"'* ]] || fail "the image has no HEALTHCHECK with kvgate probe: $health"

# The default command, a read-only root filesystem (as deploy/kubernetes/ runs it: no writable
# /tmp either, which Podman would add), any port.
run_args=(--read-only -p 127.0.0.1::8080)
[[ $engine == podman ]] && run_args+=(--read-only-tmpfs=false)
# shellcheck disable=SC2086 # CONTAINER_RUN_FLAGS is a list of flags
$CONTAINER run -d --name "$name" "${run_args[@]}" ${CONTAINER_RUN_FLAGS:-} "$IMAGE" \
    >/dev/null 2>"$work/run.log" || { cat "$work/run.log" >&2; fail "the container did not start"; }
started=1
addr=$($CONTAINER port "$name" 8080 | head -1)
url="http://${addr/0.0.0.0/127.0.0.1}"
ready=""
for _ in $(seq 1 300); do
    if curl -fsS -m 2 "$url/ready" >/dev/null 2>&1; then ready=1; break; fi
    [[ $($CONTAINER inspect --format '{{.State.Running}}' "$name") == true ]] || fail "the container exited"
    sleep 0.2
done
[[ -n "$ready" ]] || fail "$url/ready never answered 200 in 60 s"

model=$(curl -fsS -m 5 "$url/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
request() {
    printf '{"model": "%s", "messages": [{"role": "user", "content": "Say something about caches."}], "max_tokens": 8, "ignore_eos": true%s}' "$model" "$1"
}
curl -fsS -m 60 "$url/v1/chat/completions" -H 'content-type: application/json' -d "$(request '')" >"$work/chat.json" ||
    fail "chat completion failed"
answer=$(python3 - "$work/chat.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["object"] == "chat.completion", r
text = r["choices"][0]["message"]["content"]
assert text and r["choices"][0]["finish_reason"] == "length", r
assert r["usage"]["completion_tokens"] == 8, r["usage"]
print(f"{text!r} ({r['usage']['prompt_tokens']} prompt, {r['usage']['completion_tokens']} completion tokens)")
PY
) || fail "unexpected chat completion: $(head -c 400 "$work/chat.json")"
curl -fsS -N -m 60 "$url/v1/chat/completions" -H 'content-type: application/json' \
    -d "$(request ', "stream": true, "stream_options": {"include_usage": true}')" >"$work/stream.txt" ||
    fail "streamed chat completion failed"
streamed=$(python3 - "$work/stream.txt" <<'PY'
import json, sys
events = [l[len("data: "):] for l in open(sys.argv[1]).read().splitlines() if l.startswith("data: ")]
assert events and events[-1] == "[DONE]", events[-3:]
chunks = [json.loads(e) for e in events[:-1]]
assert all(c["object"] == "chat.completion.chunk" for c in chunks)
assert len({c["id"] for c in chunks}) == 1
text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
assert text and chunks[-1]["usage"]["completion_tokens"] == 8, chunks[-1]
print(f"{text!r} ({len(chunks)} chunks, then [DONE])")
PY
) || fail "unexpected stream: $(head -c 400 "$work/stream.txt")"

# The effective uid of the container's process, from the kernel (no `id` or `ps` in the image;
# a rootful engine, no user namespace: the container's uid is the host's).
pid=$($CONTAINER inspect --format '{{.State.Pid}}' "$name")
uid=$(awk '/^Uid:/ {print $3}' "/proc/$pid/status" 2>/dev/null || true)
[[ "$uid" == 65532 ]] || fail "the process (pid $pid) runs as uid '${uid:-?}', not 65532"

if [[ $engine == podman ]]; then
    $CONTAINER healthcheck run "$name" >/dev/null 2>&1 || fail "podman healthcheck run: unhealthy"
    healthcheck="podman healthcheck run: healthy"
else
    for _ in $(seq 1 30); do
        status=$($CONTAINER inspect --format '{{.State.Health.Status}}' "$name")
        [[ $status == healthy ]] && break
        sleep 1
    done
    [[ $status == healthy ]] || fail "health status $status after 30 s"
    healthcheck="health status: healthy"
fi
probe=$($CONTAINER exec "$name" /usr/local/bin/kvgate probe http://127.0.0.1:8080/ready 2>&1) ||
    fail "kvgate probe /ready in the container: $probe"
if $CONTAINER exec "$name" /usr/local/bin/kvgate probe http://127.0.0.1:9/ >/dev/null 2>&1; then
    fail "kvgate probe passed on a port nobody listens on"
fi

start=$(date +%s)
$CONTAINER stop -t 30 "$name" >/dev/null 2>"$work/stop.log" || { cat "$work/stop.log" >&2; fail "stop failed"; }
stop_secs=$(($(date +%s) - start))
exit_code=$($CONTAINER inspect --format '{{.State.ExitCode}}' "$name")
[[ $exit_code == 0 ]] || fail "exit code $exit_code after SIGTERM"

mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB (%d bytes)", b / 1048576, b}'; }
cat <<EOF
container smoke test passed ($engine)
  build path:     $mode ($build_secs s)
  runtime image:  $runtime ($runtime_note), $(mib "$base_bytes")
  image:          $IMAGE, $(mib "$image_bytes")
  binary:         /usr/local/bin/kvgate, $(mib "$binary_bytes")
  user:           image USER $user, process uid $uid
  chat:           $answer
  stream:         $streamed
  health check:   $healthcheck; kvgate probe /ready: $probe
  stop:           SIGTERM, exit code $exit_code in $stop_secs s
EOF
