#!/usr/bin/env bash
# A semantic-cache flush under load: `kvgate serve` with the cache on and an admission cap, in
# front of two emulated engines (real time, 8 slots each; the first also serves the embeddings),
# offered an open-loop stream of repeated questions until the cache answers nearly all of them;
# then `DELETE /admin/cache` drops every entry at once. Every request's outcome, cache header
# and latency are recorded, and the gateway's requests in flight upstream
# (`kvgate_inflight_requests`) and admission queue (`kvgate_queue_depth`) are sampled every
# 20 ms. Prints a table per bin and the figures that matter: the most requests ever in flight
# upstream against the cap, refusals, and how long after the flush the hit ratio and the p95
# latency came back.
#
#   scripts/semcache-flush.sh [--rate R] [--duration S] [--flush-at S] [--cap N] [--queue N]
#                             [--questions N] [--out DIR]
#
# KVGATE=path/to/kvgate skips the release build. ~1 min plus --duration.
set -euo pipefail
cd "$(dirname "$0")/.."
rate=30
duration=60
flush_at=30
cap=6
queue=24
questions=40
out=target/semcache-flush
while [[ $# -gt 0 ]]; do
    case "$1" in
    --rate) rate="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --flush-at) flush_at="$2"; shift 2 ;;
    --cap) cap="$2"; shift 2 ;;
    --queue) queue="$2"; shift 2 ;;
    --questions) questions="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
source scripts/lib.sh
kvgate_binary
dir=$(mktemp -d)

for i in 0 1; do
    start "$KVGATE" engine --listen 127.0.0.1:0 --id "e$i" --seed "$i" --time-scale 1 \
        --max-num-seqs 8 --model test-model
    engines[$i]=$url
done
cat >"$dir/serve.yaml" <<YAML
admin_token: flush
admission: {max_concurrency: $cap, max_queue: $queue, queue_timeout_ms: 5000}
semantic_cache:
  enabled: true
  threshold: 0.95
  embedder: {type: openai, url: "${engines[0]}", model: test-model}
endpoints: [{url: "${engines[0]}"}, {url: "${engines[1]}"}]
YAML
start "$KVGATE" serve --listen 127.0.0.1:0 --config "$dir/serve.yaml"
gateway=$url
echo "== $rate req/s for ${duration}s over $questions questions; flush at ${flush_at}s;" \
    "admission cap $cap, queue $queue; gateway $gateway"

python3 - "$gateway" "$rate" "$duration" "$flush_at" "$cap" "$questions" "$out" <<'PY'
import json, random, re, sys, threading, time, urllib.error, urllib.request

gw, rate, duration, flush_at, cap, questions, out = sys.argv[1], float(sys.argv[2]), \
    float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
rng = random.Random(1)
topics = ["caching", "routing", "batching", "queues", "tokens", "replicas", "prefixes", "budgets",
          "streams", "retries"]
verbs = ["Explain", "Describe", "Summarise", "Compare"]
asks = [f"{verbs[i % 4]} {topics[i // 4 % 10]} for reader group {chr(65 + i // 40)}{i % 7}"
        for i in range(questions)]
records, samples, lock = [], [], threading.Lock()
start = time.monotonic()
stop = threading.Event()


def request(sent, question):
    body = json.dumps({"model": "test-model", "max_tokens": 32,
                       "messages": [{"role": "user", "content": question}]}).encode()
    req = urllib.request.Request(f"{gw}/v1/chat/completions", body,
                                 {"content-type": "application/json"})
    status, cache = 0, None
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()
            status, cache = r.status, r.headers.get("x-kvgate-cache")
    except urllib.error.HTTPError as e:
        status = e.code
    except Exception:
        status = -1
    with lock:
        records.append((sent, time.monotonic() - start - sent, status, cache))


def sampler():
    pattern = re.compile(r"^(kvgate_inflight_requests|kvgate_queue_depth)(\{[^}]*\})? (\S+)$")
    while not stop.is_set():
        t = time.monotonic() - start
        try:
            text = urllib.request.urlopen(f"{gw}/metrics", timeout=5).read().decode()
            got = {"kvgate_inflight_requests": 0.0, "kvgate_queue_depth": 0.0}
            for line in text.splitlines():
                m = pattern.match(line)
                if m:
                    got[m.group(1)] += float(m.group(3))
            samples.append((t, got["kvgate_inflight_requests"], got["kvgate_queue_depth"]))
        except Exception:
            pass
        time.sleep(0.02)


threading.Thread(target=sampler, daemon=True).start()
threads, flushed, t = [], None, 0.0
while t < duration:
    t += rng.expovariate(rate)
    delay = start + t - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    if flushed is None and t >= flush_at:
        req = urllib.request.Request(f"{gw}/admin/cache", method="DELETE",
                                     headers={"authorization": "Bearer flush"})
        flushed = json.loads(urllib.request.urlopen(req, timeout=10).read())["flushed"]
    th = threading.Thread(target=request, args=(t, rng.choice(asks)))
    th.start()
    threads.append(th)
for th in threads:
    th.join()
stop.set()


def p95(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.95 * len(xs)))] if xs else None


width = 3.0
bins = {}
for sent, latency, status, cache in records:
    bins.setdefault(int(sent // width), []).append((latency, status, cache))
print(f"flushed {flushed} entries at {flush_at:.0f} s")
print("| from s | sent | hit ratio | refused (429/503) | p95 latency ms | most in flight upstream "
      "| most queued |")
print("|---|---|---|---|---|---|---|")
rows = []
for b in sorted(bins):
    rs = bins[b]
    ok = [r for r in rs if r[1] == 200]
    hits = sum(1 for r in ok if r[2] == "hit")
    refused = sum(1 for r in rs if r[1] in (429, 503))
    window = [s for s in samples if b * width <= s[0] < (b + 1) * width]
    inflight = max((s[1] for s in window), default=None)
    queued = max((s[2] for s in window), default=None)
    ratio = hits / len(ok) if ok else None
    lat = p95([r[0] for r in ok])
    rows.append((b * width, ratio, lat))
    fmt = lambda x, f: "n/a" if x is None else f.format(x)
    print(f"| {b * width:.0f} | {len(rs)} | {fmt(ratio, '{:.2f}')} | {refused} | "
          f"{fmt(lat and lat * 1000, '{:.0f}')} | {fmt(inflight, '{:.0f}')} | {fmt(queued, '{:.0f}')} |")
before = [r for r in rows if flush_at - 12 <= r[0] < flush_at - width]
base_ratio = sum(r[1] for r in before if r[1] is not None) / max(1, len(before))
base_p95 = sorted(r[2] for r in before if r[2] is not None)
base_p95 = base_p95[len(base_p95) // 2] if base_p95 else None
after = [r for r in rows if r[0] >= flush_at]
back = next((r[0] + width - flush_at for r in after if r[1] is not None and r[1] >= 0.9 * base_ratio),
            None)
calm = next((r[0] + width - flush_at for r in after if base_p95 and r[2] is not None
             and r[2] <= 1.5 * base_p95), None)
most = max((s[1] for s in samples), default=None)
summary = {
    "requests": len(records), "ok": sum(1 for r in records if r[2] == 200),
    "refused": sum(1 for r in records if r[2] in (429, 503)),
    "failed": sum(1 for r in records if r[2] not in (200, 429, 503)),
    "admission_cap": cap, "most_in_flight_upstream": most, "samples": len(samples),
    "hit_ratio_before_flush": round(base_ratio, 3),
    "p95_before_flush_ms": base_p95 and round(base_p95 * 1000),
    "hit_ratio_back_within_s": back, "p95_back_within_1_5x_s": calm,
}
print(json.dumps(summary, indent=1))
json.dump({"summary": summary, "records": records, "samples": samples},
          open(f"{out}/flush.json", "w"))
if most is not None and most > cap:
    sys.exit(f"in flight upstream reached {most}, above the cap {cap}")
PY
