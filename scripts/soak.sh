#!/usr/bin/env bash
# The soak: an hour of agentic traffic through `kvgate serve` in front of three real-time
# emulated engines, with a fault every minute (5xx bursts, stalls before the first token,
# draining, an engine killed and replaced by a config reload, a policy switch by reload). Every
# 10 s it samples the gateway's resident memory, open descriptors, connections and pending
# requests; afterwards it adds each 10 s window's TTFT p95 and errors from the bench's records,
# plots everything (`kvgate plot`) and fails if memory or descriptors grew: the median of the
# last minute must stay within 10% of the median of the minute after warm-up (the first 10% of
# the run, at least 60 s).
#
#   scripts/soak.sh [--duration S] [--rate SESSIONS_PER_S] [--out DIR] [--plot FILE]
#
# Defaults: 3600 s, 0.8 sessions/s, target/soak, the picture in DIR/soak.svg.
# KVGATE=path/to/kvgate skips the release build.
set -euo pipefail
cd "$(dirname "$0")/.."

duration=3600 rate=0.8 out=target/soak plot=
while [[ $# -gt 0 ]]; do
    case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --plot) plot="$2"; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
    esac
done
plot=${plot:-$out/soak.svg}
mkdir -p "$out"
source scripts/lib.sh
kvgate_binary

engine_urls=() engine_pids=()
# Engines started by the fault loop (a subshell) are recorded here and stopped at exit.
: >"$out/engines.pids"
trap 'stop_all; xargs -r kill <"$out/engines.pids" 2>/dev/null || true' EXIT
start_engine() { # slot
    start "$KVGATE" engine --listen 127.0.0.1:0 --id "engine-$1" --seed "$1" --model soak-model \
        --max-num-seqs 128 --kv-blocks 16384
    engine_urls[$1]=$url
    engine_pids[$1]=${pids[-1]}
    echo "${pids[-1]}" >>"$out/engines.pids"
}
write_config() { # policy
    { printf 'policy: {name: %s}\nendpoints:\n' "$1"
      printf '  - url: %s\n' "${engine_urls[@]}"; } >"$out/serve.yaml.new"
    mv "$out/serve.yaml.new" "$out/serve.yaml"
}
for i in 0 1 2; do start_engine "$i"; done
write_config predicted_ttft
start "$KVGATE" serve --listen 127.0.0.1:0 --config "$out/serve.yaml" --scrape-interval-ms 500
gateway=$url gateway_pid=${pids[-1]}

"$KVGATE" bench --url "$gateway" --workload agentic --agentic-max-context 16000 --rate "$rate" \
    --duration "$duration" --ignore-eos --timeout-s 120 --seed 1 --no-progress --quiet \
    --records "$out/records.jsonl" --json "$out/bench.json" >"$out/bench.txt" 2>&1 &
bench=$!
started=$(date +%s)

faults_loop() {
    local cycle=0 e spec
    while sleep 45; do
        e=$((cycle % 3))
        case $((cycle % 5)) in
        0) spec='"500:p=0.3"' ;;
        1) spec='"stall_first:ms=1000,p=0.2"' ;;
        2) spec='"drain"' ;;
        3) spec=kill ;;
        4) spec=reload ;;
        esac
        case "$spec" in
        kill)
            kill -9 "${engine_pids[$e]}" 2>/dev/null || true
            start_engine "$e"
            write_config predicted_ttft
            ;;
        reload)
            write_config least_outstanding
            sleep 15
            write_config predicted_ttft
            ;;
        *)
            http POST "${engine_urls[$e]}/admin/faults" "{\"faults\": [$spec]}" >/dev/null || true
            sleep 15
            http DELETE "${engine_urls[$e]}/admin/faults" >/dev/null || true
            ;;
        esac
        cycle=$((cycle + 1))
    done
}
faults_loop &
faulter=$!
pids+=("$faulter")

samples="$out/samples.jsonl"
: >"$samples"
while kill -0 "$bench" 2>/dev/null; do
    now=$(($(date +%s) - started))
    rss_kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$gateway_pid/status")
    fds=$(find "/proc/$gateway_pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    metrics=$(http GET "$gateway/metrics" | tr -d '\r')
    gauge() { awk -v n="$1" '$1 == n {print $2; exit}' <<<"$metrics"; }
    printf '{"t_s": %d, "rss_mb": %s, "open_fds": %d, "connections_open": %s, "pending_requests": %s}\n' \
        "$now" "$(awk -v k="$rss_kb" 'BEGIN {printf "%.1f", k / 1024}')" "$fds" \
        "$(gauge kvgate_connections_open)" "$(gauge kvgate_pending_requests)" >>"$samples"
    sleep 10
done
wait "$bench" || true
kill "$faulter" 2>/dev/null || true

status=0
python3 - "$samples" "$out/records.jsonl" "$out/samples-full.jsonl" "$duration" "$KVGATE" "$out/windows.json" <<'PY' || status=$?
import json, subprocess, sys
samples_path, records_path, full_path, duration = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
kvgate, windows_path = sys.argv[5], sys.argv[6]

def median(values):
    """The median by `kvgate stats`, the one definition of a percentile."""
    done = subprocess.run([kvgate, "stats", "--json"], input="".join(f"{v}\n" for v in values),
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["p50"]
samples = [json.loads(l) for l in open(samples_path) if l.strip()]
records = [json.loads(l) for l in open(records_path) if l.strip()]
# Each sample's 10 s window before it, summarised by the bench itself (kvgate's percentile).
flags = [f"--window={s['t_s'] - 10}:{s['t_s']}" for s in samples]
windows = {}
if flags:
    subprocess.run([kvgate, "bench", "--from-records", records_path, *flags, "--quiet",
                    "--json", windows_path], check=True)
    windows = {r["window_s"][1]: r for r in json.load(open(windows_path))["results"]}
with open(full_path, "w") as out:
    for s in samples:
        w = windows.get(s["t_s"])
        if w is not None and w["ttft_ms"]["p95"] is not None:
            s["ttft_p95_ms"] = round(w["ttft_ms"]["p95"], 1)
        s["errors_per_10s"] = w["failed"] if w is not None else 0
        out.write(json.dumps(s) + "\n")
warmup = max(60.0, duration * 0.1)
def level(key, lo, hi):
    v = [s[key] for s in samples if lo <= s["t_s"] < hi]
    return median(v) if v else None
end = samples[-1]["t_s"] if samples else 0
broken = []
for key in ("rss_mb", "open_fds"):
    after_warmup = level(key, warmup, warmup + 60)
    last = level(key, end - 60, end + 1)
    growth = None if not after_warmup else last / after_warmup - 1
    print(f"{key}: {after_warmup} after warm-up, {last} in the last minute"
          + ("" if growth is None else f" ({growth:+.1%})"))
    if growth is None or growth > 0.10:
        broken.append(key)
failed = sum(1 for r in records if r["error"])
print(f"requests {len(records)}, failed {failed} "
      f"(before the first token {sum(1 for r in records if r['error'] and r['ttft_ms'] is None)})")
if broken:
    print("GREW beyond 10%:", ", ".join(broken))
    sys.exit(1)
PY
"$KVGATE" plot --input "$out/samples-full.jsonl" --out "$plot"
echo "plot: $plot"
exit $status
