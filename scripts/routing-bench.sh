#!/usr/bin/env bash
# Capacity of routing policies through the gateway, on four emulated engines in real time
# (time-scale 1), under the failure modes of `kvgate sim` (crates/sim/README.md): for each
# policy a fresh fleet and gateway, then `kvgate bench --sweep` of the scenario's workload. The
# SLO is the sim's: TTFT within 1 s (3 s for fanout-long) for 95% of requests (`--capacity-attainment 0.95`), a failed
# request counting as a miss. Prints one table; JSON per policy in the output directory.
#
#   scripts/routing-bench.sh SCENARIO [--policies a,b,...] [--sweep A:B:STEP] [--duration S]
#                            [--out DIR] [--seed N] [--kill-at S] [--no-kill] [--engines N]
#                            [--config FILE] [--restart-after S] [--after-random RATE:S]
#
# SCENARIO: fanout (3 shared 4,000-token prompts in bursts of 16 calls; rates in bursts/s),
# fanout-long (the same over an 8,000-token parent context, SLO 3 s; the sim's
# `--set context_tokens=8000 --set slo_ttft_ms=3000`), heterogeneous (agentic sessions; engines 3 and 4 run 2.5x slower; rates in sessions/s), mix
# (agentic sessions on four equal engines), tenants (32 tenants with 6,000-token system prompts
# on engines of 4,096 blocks, a quarter of the others': together the prompts fill three
# engines' caches; a run's sessions are cut at --duration, so the session rates are higher than
# the sim's for the same request rate), replica-loss (mix's sessions; engine 4 is killed, SIGKILL, --kill-at seconds
# into each rate), shared-prefix (32 shared 2,048-token prompts, a fresh 128-token question
# each, 256 tokens out; rates in req/s) and random (1,024 tokens in, 128 out, nothing shared;
# rates in req/s). Each rate runs --duration seconds of arrivals, then waits for the last
# answers. Latency CDFs and the sweep curves go to DIR/SCENARIO-POLICY.svg, every request's record
# to DIR/SCENARIO-POLICY.jsonl.
# replica-loss runs each rate on a fresh fleet and gateway (every rate loses its engine) and
# adds, per rate, the requests that failed before and after their first token, and the TTFT
# P95 over the 30 s before the kill and the 30 s after it (DIR/replica-loss-POLICY-RATE.*), and the
# first turn after the kill of each session whose last turn ended on the killed engine (how many,
# their TTFT P50/P95 and median cached share: the recomputes, from the records' session and
# endpoint).
# --engines N runs N engines instead of four (the first N; replica-loss kills the last), and
# --no-kill keeps them all: `replica-loss --engines 3 --no-kill` is the fleet the kill leaves,
# without the kill, over the same windows (the P95 a fleet of three gets at that load).
# --restart-after S starts the killed engine again S seconds after the kill, at the same address
# with an empty cache (a crashed engine brought back by its supervisor).
# --after-random RATE:S first sends S seconds of the random workload at RATE req/s through each
# fresh gateway, unmeasured (DIR/SCENARIO-POLICY.before.txt): engines and index full of one-off
# prompts, as after other traffic, before the sweep.
# --config gives every gateway a configuration file (`kvgate serve --config`; the engines are
# added to its endpoints), e.g. to compare a setting.
# A policy named sglang:POLICY, vllm-router:POLICY or litellm:STRATEGY runs that project's own
# router (the pinned PyPI releases scripts/install-peers.sh installs; PEERS_VENV points
# elsewhere) with its defaults and that policy instead of `kvgate serve`, e.g. `--policies
# predicted_ttft,sglang:cache_aware,vllm-router:cache_aware,litellm:simple-shuffle`: the peers
# themselves, on the same engines and workload. Their router's log goes to DIR/SCENARIO-NAME.router.log
# (appended to, one start per fresh fleet); --config applies to kvgate only and is refused with them.
# KVGATE=path/to/kvgate skips the release build. Takes (rates x duration + drain) per policy: ~15 min per
# scenario with the defaults, ~22 min for tenants.
set -euo pipefail
cd "$(dirname "$0")/.."

scenario=${1:?usage: scripts/routing-bench.sh fanout|fanout-long|heterogeneous|mix|tenants|replica-loss|shared-prefix|random [flags]}
shift
policies=predicted_ttft,cache_aware,consistent_hash,prefix_hash,least_outstanding
out=target/routing-bench
seed=1
sweep=
duration=
kill_at=
kill=1
restart_after=
after_random=
engines=4
config=()
while [[ $# -gt 0 ]]; do
    case "$1" in
    --policies) policies="$2"; shift 2 ;;
    --sweep) sweep="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --kill-at) kill_at="$2"; shift 2 ;;
    --no-kill) kill=0; shift ;;
    --engines) engines="$2"; shift 2 ;;
    --config) config=(--config "$2"); shift 2 ;;
    --restart-after) restart_after="$2"; shift 2 ;;
    --after-random) after_random="$2"; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
    esac
done

[[ $engines =~ ^[1-4]$ ]] || { echo "--engines takes 1 to 4" >&2; exit 2; }
[[ -z $after_random || $after_random =~ ^[0-9.]+:[0-9]+$ ]] ||
    { echo "--after-random takes RATE:SECONDS, e.g. 15:120" >&2; exit 2; }
[[ -z $after_random || $scenario != replica-loss ]] ||
    { echo "--after-random does not apply to replica-loss (a fresh fleet per rate)" >&2; exit 2; }
scales=(1 1 1 1)
kv_blocks=16384
random_workload=(--workload random --random-input-len 1024 --random-output-len 128
    --random-range-ratio 0.5)
slo_ms=1000
case "$scenario" in
fanout)
    workload=(--workload fanout)
    sweep=${sweep:-0.5:1.25:0.25}
    duration=${duration:-40}
    ;;
fanout-long)
    workload=(--workload fanout --fanout-context-len 8000)
    slo_ms=3000
    sweep=${sweep:-0.3:0.9:0.2}
    duration=${duration:-60}
    ;;
heterogeneous)
    workload=(--workload agentic --agentic-max-context 16000)
    scales=(1 1 2.5 2.5)
    sweep=${sweep:-5:8:1.5}
    duration=${duration:-60}
    ;;
mix)
    workload=(--workload agentic --agentic-max-context 16000)
    sweep=${sweep:-8:12:2}
    duration=${duration:-60}
    ;;
tenants)
    # The sim's `tenants` scenario (crates/sim/src/scenario/failure_modes.rs).
    workload=(--workload agentic --agentic-tenants 32 --agentic-system-len 6000
        --agentic-turns 4 --agentic-max-context 12000)
    kv_blocks=4096
    # Five minutes per rate: a rate's sessions all start within it, so its request rate
    # climbs for minutes and 60 s rates measure a transient (docs/routing.md, Through the
    # gateway).
    sweep=${sweep:-1:1.75:0.25}
    duration=${duration:-300}
    ;;
shared-prefix)
    # The classic shared-prefix benchmark (SGLang's generated-shared-prefix shape): 32 system
    # prompts of 2,048 tokens, each request one of them plus a fresh 128-token question, Poisson
    # arrivals, 256 tokens out; rates in req/s. Every prompt fits in each engine's cache.
    workload=(--workload prefix-repetition --prefix-repetition-num-prefixes 32
        --prefix-repetition-prefix-len 2048 --prefix-repetition-suffix-len 128
        --prefix-repetition-output-len 256)
    sweep=${sweep:-25:40:5}
    duration=${duration:-60}
    ;;
random)
    # No prefix to share (ShareGPT-like lengths drawn uniformly): 1,024 tokens in and 128 out,
    # each +-50%; rates in req/s. Locality is worth nothing; only balance counts.
    workload=("${random_workload[@]}")
    sweep=${sweep:-14:23:3}
    duration=${duration:-60}
    ;;
replica-loss)
    # Sessions last about a minute and the load grows until ~100 s, so the kill at 120 s puts
    # both 30 s windows in steady load; above ~4.5 sessions/s three emulated engines cannot
    # carry it at all (docs/routing.md, What the windows measured).
    workload=(--workload agentic --agentic-max-context 16000)
    sweep=${sweep:-3:4.5:1.5}
    duration=${duration:-150}
    kill_at=${kill_at:-120}
    ;;
*) echo "unknown scenario $scenario" >&2; exit 2 ;;
esac

mkdir -p "$out"
source scripts/lib.sh
kvgate_binary
kvgate=$KVGATE
peers=${PEERS_VENV:-target/peers}

IFS=, read -r -a names <<<"$policies"

# Engine $1 at address $2 (127.0.0.1:0 for a free port): sets $url.
start_engine() {
    # The sim's failure-mode fleet: 128 slots, blocks of 16 tokens, chunked prefill.
    start "$kvgate" engine --listen "$2" --id "engine-$1" --seed "$1" \
        --time-scale "${scales[$1]}" --max-num-seqs 128 --kv-blocks "$kv_blocks"
}

# A fresh fleet and a gateway with policy $1 in front of it: sets $gateway, $engine_pids and
# $engine_urls.
fleet_and_gateway() {
    local endpoints=() i
    engine_pids=()
    engine_urls=()
    for ((i = 0; i < engines; i++)); do
        start_engine "$i" 127.0.0.1:0
        endpoints+=(--endpoint "$url")
        engine_pids+=("${pids[-1]}")
        engine_urls+=("$url")
    done
    if [[ "$1" == *:* ]]; then
        start_peer "$1"
    else
        start "$kvgate" serve --listen 127.0.0.1:0 "${config[@]}" "${endpoints[@]}" --policy "$1"
        gateway=$url
    fi
}

# A peer's router with its defaults but the policy, in front of $engine_urls
# (scripts/install-peers.sh installs them): `sglang:POLICY` and `vllm-router:POLICY` take
# SGLang's and vLLM's `--policy`, `litellm:STRATEGY` LiteLLM's proxy with the four engines as
# deployments of one model and that `routing_strategy`. Sets $gateway.
start_peer() {
    local peer=${1%%:*} policy=${1#*:} port metrics log cmd u cfg
    read -r port metrics < <(python3 -c "import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(('127.0.0.1', 0))
print(*[x.getsockname()[1] for x in s])")
    local workers=(--host 127.0.0.1 --port "$port" --prometheus-port "$metrics"
        --worker-urls "${engine_urls[@]}" --policy "$policy")
    case "$peer" in
    sglang) cmd=("$peers/bin/python" -m sglang_router.launch_router "${workers[@]}") ;;
    vllm-router) cmd=("$peers/bin/vllm-router" "${workers[@]}") ;;
    litellm)
        cfg="$out/$scenario-$1.litellm.yaml"
        {
            echo "model_list:"
            for u in "${engine_urls[@]}"; do
                printf '  - model_name: kvgate-emulated\n    litellm_params:\n'
                printf '      model: hosted_vllm/kvgate-emulated\n      api_base: %s/v1\n' "$u"
            done
            printf 'router_settings:\n  routing_strategy: %s\n' "$policy"
            # Loopback only and nothing to protect: no master key.
            printf 'general_settings:\n  dangerously_permit_weak_or_unset_master_key: true\n'
        } >"$cfg"
        # The model cost map ships with the package; fetching it is all the network it wants.
        cmd=(env LITELLM_LOCAL_MODEL_COST_MAP=True "$peers/bin/litellm" --config "$cfg"
            --host 127.0.0.1 --port "$port")
        ;;
    *) echo "unknown peer router $peer (sglang, vllm-router or litellm)" >&2; exit 2 ;;
    esac
    [[ -x "$peers/bin/python" ]] || { echo "no peers in $peers: run scripts/install-peers.sh" >&2; exit 2; }
    ((${#config[@]} == 0)) || { echo "--config is kvgate's; $1 would run without it" >&2; exit 2; }
    log="$out/$scenario-$1.router.log"
    "${cmd[@]}" >>"$log" 2>&1 &
    pids+=($!)
    gateway=http://127.0.0.1:$port
    for _ in $(seq 1 1200); do
        http GET "$gateway/v1/models" 2>/dev/null | head -1 | grep -q ' 200' && return 0
        kill -0 "${pids[-1]}" 2>/dev/null || break
        sleep 0.05
    done
    echo "$peer did not start (see $log)" >&2
    exit 1
}

# The model is named: SGLang's router lists `unknown` at /v1/models when its workers lack
# SGLang's /model_info, and would pass that name on.
bench_flags=(--model kvgate-emulated --ignore-eos --slo-ttft-ms "$slo_ms" --capacity-attainment 0.95 --timeout-s 120
    --seed "$seed" --no-progress)

for policy in "${names[@]}"; do
    if [[ "$scenario" != replica-loss ]]; then
        fleet_and_gateway "$policy"
        echo "== $scenario: $policy (gateway $gateway)"
        if [[ -n $after_random ]]; then
            "$kvgate" bench --url "$gateway" "${random_workload[@]}" --rate "${after_random%:*}" \
                --duration "${after_random#*:}" "${bench_flags[@]}" >"$out/$scenario-$policy.before.txt"
            echo "after the random workload at ${after_random%:*} req/s for ${after_random#*:} s:"
            tail -n 2 "$out/$scenario-$policy.before.txt"
        fi
        "$kvgate" bench --url "$gateway" "${workload[@]}" --sweep "$sweep" --duration "$duration" \
            "${bench_flags[@]}" --json "$out/$scenario-$policy.json" \
            --records "$out/$scenario-$policy.jsonl" \
            --plot "$out/$scenario-$policy.svg" >"$out/$scenario-$policy.txt"
        tail -n 3 "$out/$scenario-$policy.txt"
        stop_all
        continue
    fi
    IFS=: read -r from to step <<<"$sweep"
    for rate in $(python3 -c "import sys; a,b,s=map(float,sys.argv[1:]); n=int(round((b-a)/s))
print(' '.join(f'{a+i*s:g}' for i in range(n+1)))" "$from" "$to" "$step"); do
        fleet_and_gateway "$policy"
        if ((kill)); then
            echo "== $scenario: $policy at $rate sessions/s (gateway $gateway), engine $engines killed at ${kill_at}s"
        else
            echo "== $scenario: $policy at $rate sessions/s (gateway $gateway), $engines engines, none killed"
        fi
        name="$out/$scenario-$policy-$rate"
        "$kvgate" bench --url "$gateway" "${workload[@]}" --rate "$rate" --duration "$duration" \
            "${bench_flags[@]}" --json "$name.json" --records "$name.jsonl" >"$name.txt" &
        bench=$!
        sleep "$kill_at"
        if ((kill)); then
            kill -KILL "${engine_pids[-1]}"
            if [[ -n "$restart_after" ]]; then
                sleep "$restart_after"
                start_engine $((engines - 1)) "${engine_urls[-1]#http://}"
                echo "engine $engines restarted ${restart_after}s after the kill"
            fi
        fi
        wait "$bench" || echo "bench exited with $?" >&2
        stop_all
    done
done

if [[ "$scenario" == replica-loss ]]; then
    python3 - "$out" "$slo_ms" "$kill_at" "$kill" "$engines" "$kvgate" "${names[@]}" <<'EOF'
import glob, json, re, subprocess, sys
out, slo_ms, kill_at, names = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[7:]
kvgate = sys.argv[6]
what = (f"engine {sys.argv[5]} killed {kill_at:g} s into each rate" if sys.argv[4] == "1"
        else f"{sys.argv[5]} engines, none killed (windows split at {kill_at:g} s)")

def median(values):
    """The median by `kvgate stats`, the one definition of a percentile."""
    done = subprocess.run([kvgate, "stats", "--json"], input="".join(f"{v}\n" for v in values),
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["p50"]

def summarise(records_path, *flags):
    """The bench's reports of a records file (kvgate's percentile, attainment and capacity)."""
    json_path = records_path + ".summary.json"
    subprocess.run([kvgate, "bench", "--from-records", records_path, "--slo-ttft-ms", str(slo_ms),
                    "--capacity-attainment", "0.95", "--quiet", "--json", json_path, *flags],
                   check=True)
    return json.load(open(json_path))

def window_p95(path, lo, hi):
    """TTFT P95 of the requests sent in [lo, hi) s (successful ones; None without any)."""
    results = summarise(path, f"--window={lo}:{hi}")["results"]
    return results[0]["ttft_ms"]["p95"] if results else None

def displaced(recs):
    """The first turn after the kill, within 30 s, of each session whose last turn before it
    ended on the killed engine (the one the gateway named before the kill and not after it):
    the turn that recomputes the session's context. Needs the records' session and endpoint."""
    seen = lambda lo, hi: {x["endpoint"] for x in recs if x.get("endpoint") and lo <= x["sent_s"] < hi}
    lost = seen(0, kill_at) - seen(kill_at + 2, kill_at + 30)
    last, first = {}, {}
    for x in sorted(recs, key=lambda x: x["sent_s"]):
        s = x.get("session")
        if s is None:
            continue
        if x["sent_s"] + x["e2e_ms"] / 1000 < kill_at:
            last[s] = x["endpoint"]
        elif kill_at <= x["sent_s"] < kill_at + 30:
            first.setdefault(s, x)
    return [first[s] for s, e in last.items() if e in lost and s in first]

def recomputes(path, recs):
    turns = displaced(recs)
    cached = [x["cached_tokens"] / x["prompt_tokens"] for x in turns
              if x["prompt_tokens"] and x.get("cached_tokens") is not None]
    if not turns or not cached:
        return "displaced n/a"
    turns_path = path[:-6] + ".displaced.jsonl"
    with open(turns_path, "w") as f:
        f.writelines(json.dumps(x) + "\n" for x in turns)
    ttft = summarise(turns_path)["results"][0]["ttft_ms"]
    if ttft["p50"] is None:
        return "displaced n/a"
    return (f"displaced {len(turns)}: {ttft['p50']:.0f}/{ttft['p95']:.0f} ms, "
            f"{100 * median(cached):.0f}% cached")

print(f"\nreplica-loss: {what}; capacity at TTFT <= {slo_ms / 1000:g} s"
      " for 95% of requests. Per rate: sessions/s: req/s achieved, SLO%, failed before / after the"
      " first token, TTFT P95 ms over the 30 s before / after the kill"
      + ("; the displaced sessions' first turns after it (sessions whose last turn ended on the"
         " killed engine): how many, TTFT P50/P95, median share of the prompt cached"
         if sys.argv[4] == "1" else ""))
for name in names:
    rows = []
    files = glob.glob(f"{out}/replica-loss-{name}-*.json")
    files = [f for f in files if re.search(r"-[0-9.]+\.json$", f)]
    files.sort(key=lambda f: float(re.search(r"-([0-9.]+)\.json$", f).group(1)))
    for f in files:
        r = json.load(open(f))["results"][0]
        path = f[:-5] + ".jsonl"
        recs = [json.loads(l) for l in open(path)]
        before_token = sum(1 for x in recs if x["error"] and x["ttft_ms"] is None)
        after_token = sum(1 for x in recs if x["error"] and x["ttft_ms"] is not None)
        pre, post = window_p95(path, kill_at - 30, kill_at), window_p95(path, kill_at, kill_at + 30)
        ratio = f"{post / pre:.2f}x" if pre and post else "n/a"
        att = r["slo_attainment"]
        row = (f"{r['offered_rate']:g}: {r['achieved_rate']:.1f} "
               + ("-" if att is None else f"{100 * att:.1f}%") + " "
               f"{before_token}/{after_token} {pre or float('nan'):.0f}/{post or float('nan'):.0f} ({ratio})")
        rows.append(row + (f"; {recomputes(path, recs)}" if sys.argv[4] == "1" else ""))
    # Capacity over the rates' separate runs: the bench's, over all their records at once. Each
    # rate ran on its own gateway and the bench counts capacity per target, so the records are
    # put under one target first.
    cap = None
    if files:
        every = f"{out}/replica-loss-{name}.all.jsonl"
        with open(every, "w") as dst:
            for f in files:
                for line in open(f[:-5] + ".jsonl"):
                    rec = json.loads(line)
                    rec["target"] = f"replica-loss {name}"
                    dst.write(json.dumps(rec) + "\n")
        cap = summarise(every)["capacity"][0]["rate"]
    print(f"{name:<20} capacity {cap!s:>5} | " + " | ".join(rows))
EOF
    exit 0
fi

python3 - "$out" "$scenario" "$slo_ms" "${names[@]}" <<'EOF'
import json, sys
out, scenario, slo_ms, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
print(f"\n{scenario}: capacity at TTFT <= {slo_ms / 1000:g} s for 95% of requests (req/s offered per rate; sessions or bursts per rate)")
print(f"{'policy':<20} {'capacity':>9} " + " ".join(f"{'rate':>5} {'req/s':>6} {'SLO%':>5} {'p95 ms':>7} {'hit':>5}" for _ in range(1)))
for name in names:
    d = json.load(open(f"{out}/{scenario}-{name}.json"))
    cap = d["capacity"][0]["rate"] if d["capacity"] else None
    rows = []
    for r in d["results"]:
        hit = r.get("cache_hit_ratio")
        att = r["slo_attainment"]
        rows.append(f"{r['offered_rate']:>5g} {r['achieved_rate']:>6.1f} {'-' if att is None else f'{100 * att:.1f}':>5} "
                    f"{r['ttft_ms']['p95'] or float('nan'):>7.0f} {hit if hit is None else round(hit, 3)!s:>5}")
    print(f"{name:<20} {cap!s:>9} " + " | ".join(rows))
EOF
