"""Offline candidates for predicted_ttft's point prediction on real vLLM engines.

usage: python ttft_candidates.py DUMP...   (files written by real-vllm-ttft-prediction.sh with DUMP=FILE)

Every figure is the share of requests whose measured TTFT is within 20% of the candidate's
prediction, on the second half of each run (held out). Candidates use what the router knows at
the pick: the requests it sent to that endpoint before, which of them have a first token or
have finished, their predicted uncached tokens, the decodes there and their max_tokens. The
rows marked "engine counts" replace the index's predicted cached tokens by the engine's (an
upper bound for a perfect index), and the hindsight rows know even the future: they bound
what any forward model of that kind could do on the run.

Needs numpy and scipy (pip install into the engines' venv).
"""
import json
import math
import sys
from datetime import datetime

import numpy as np
from scipy.optimize import minimize

BUDGET = 2048  # vLLM CPU 0.32: max_num_batched_tokens by default for its OpenAI server


def load(path):
    """One dict per streamed first attempt with a prediction, in pick order."""
    reqs = []
    for line in open(path):
        d = json.loads(line)
        c, dec, a = d["client"], d["decision"], d["access"]
        if not dec or not a or a.get("attempts") != 1 or not a.get("ttft_ms"):
            continue
        if dec["reason"]["kind"] != "predicted_ttft":
            continue
        end = datetime.fromisoformat(a["ts"].replace("Z", "+00:00")).timestamp()
        arrive = end - a["e2e_ms"] / 1e3
        P, C = a.get("prompt_tokens") or 0, a.get("cached_tokens") or 0
        reqs.append(dict(
            ep=dec["endpoint"], pick=datetime.fromisoformat(dec["at"].replace("Z", "+00:00")).timestamp(),
            end=end, ttft=a["ttft_ms"] / 1e3, first=arrive + a["ttft_ms"] / 1e3, P=P, U=max(P - C, 1),
            pred=dec["reason"]["ttft_ms"] / 1e3, pcached=dec["reason"].get("cached_tokens") or 0,
            est=dec["prompt_tokens"], chunks=c["chunks"], max_tokens=c["max_tokens"]))
    reqs.sort(key=lambda r: r["pick"])
    prepare(reqs)
    return reqs


def prepare(reqs):
    """What the router knew at each pick."""
    ratio = 1.0
    for i, r in enumerate(reqs):
        seen = [s["P"] / s["est"] for s in reqs[max(0, i - 40):i] if s["est"] and s["end"] < r["pick"]]
        ratio = float(np.median(seen)) if seen else ratio
        r["Pr"] = r["est"] * ratio  # the prompt estimate scaled by the engine's reported ratio
        r["Ur"] = max(r["Pr"] - r["pcached"], 1.0)  # the router's uncached tokens
    for r in reqs:
        same = [s for s in reqs if s["ep"] == r["ep"] and s["pick"] < r["pick"]]
        r["ahead"] = [s for s in same if s["first"] > r["pick"]]
        r["decs"] = [s for s in same if s["first"] <= r["pick"] < s["end"]]
        # The other engines' work then: on one machine they share its cores.
        other = [s for s in reqs if s["ep"] != r["ep"] and s["pick"] < r["pick"] < s["end"]]
        r["other_prefill"] = sum(s["Ur"] for s in other if s["first"] > r["pick"])
        r["other_decodes"] = sum(1 for s in other if s["first"] <= r["pick"])


def within(ratios):
    ratios = list(ratios)
    return sum(0.8 <= x <= 1.2 for x in ratios) / max(len(ratios), 1)


def features(r, engine):
    U, P = (r["U"], r["P"]) if engine else (r["Ur"], r["Pr"])
    ahead = sum(s["U"] if engine else s["Ur"] for s in r["ahead"])
    d = len(r["decs"])
    return dict(one=1.0, P=P / 1e3, own=(U + ahead) / 1e3, ownonly=U / 1e3, ahead=ahead / 1e3,
                dec=d, owndec=(U + ahead) * d / 1e3, oprefill=r["other_prefill"] / 1e3,
                odec=r["other_decodes"])


LINEAR = {
    "A the current form: 1, own+queued, decodes, (own+queued)*decodes": ["one", "own", "dec", "owndec"],
    "B A + prompt tokens (the front end's per-token work)": ["one", "own", "dec", "owndec", "P"],
    "C 1, own+queued, prompt tokens": ["one", "own", "P"],
    "E 1, own, queued, prompt tokens, decodes": ["one", "ownonly", "ahead", "P", "dec"],
    "F B + the other engines' prefill and decodes (a shared machine's)": ["one", "own", "dec", "owndec", "P",
                                                                           "oprefill", "odec"],
}


def online_linear(reqs, feats, engine, tau=20.0):
    """Each prediction from a fit on the requests finished before its pick, weighted by
    recency and by 1/TTFT (relative error), the worst tenth trimmed. Samples carry the
    engine's counts, as the gateway's calibration learns from usage."""
    out = []
    for r in reqs:
        known = [s for s in reqs if s["end"] < r["pick"]]
        if len(known) < len(feats) + 5:
            out.append(None)
            continue
        A = np.array([[features(s, True)[k] for k in feats] for s in known])
        y = np.array([s["ttft"] for s in known])
        w = np.exp(-(r["pick"] - np.array([s["end"] for s in known])) / tau) / y
        th = np.linalg.lstsq(A * w[:, None], y * w, rcond=None)[0]
        keep = np.abs(A @ th / y - 1) <= np.quantile(np.abs(A @ th / y - 1), 0.9)
        th = np.linalg.lstsq((A * w[:, None])[keep], (y * w)[keep], rcond=None)[0]
        out.append(max(float(np.dot(th, [features(r, engine)[k] for k in feats])), 1e-4))
    return out


def replay(r, th, engine, jobs=None):
    """vLLM v1's scheduler run forward on one endpoint: FCFS waiting queue, a token budget per
    step, running sequences first (one token per decode, then the next chunk of each prefill),
    step time a + b*tokens + c*attention work (tokens x context) + d*decodes; a request reaches
    the engine h + k*prompt tokens after the pick (the API server's templating and tokenizing)."""
    h, k, a, b, c, d = th
    U = (lambda s: s["U"]) if engine else (lambda s: s["Ur"])
    P = (lambda s: s["P"]) if engine else (lambda s: s["Pr"])
    jobs = sorted((jobs if jobs is not None else r["ahead"]) + [r], key=lambda s: s["pick"])
    t0 = jobs[0]["pick"]
    dec = [max(s["max_tokens"] - max(sum(x <= t0 for x in s["chunks"]) - 2, 0), 1) for s in r["decs"]]
    waiting = [[j["pick"] + h + k * P(j) / 1e3, U(j), P(j), j is r] for j in jobs]
    running, t = [], t0 + h
    for _ in range(5000):
        arrived = [w for w in waiting if w[0] <= t]
        if not running and not arrived and not dec:
            t = min(w[0] for w in waiting)
            continue
        for w in arrived:
            waiting.remove(w)
            running.append(w[1:])
        budget, tokens, work, done, left = BUDGET - len(dec), 0.0, 0.0, False, []
        for p in running:
            take = min(p[0], max(budget, 0))
            budget, tokens, work, p[0] = budget - take, tokens + take, work + take * p[1] / 1e3, p[0] - take
            if p[0] > 0:
                left.append(p)
            elif p[2]:
                done = True
            else:
                dec.append(1e9)
        running = left
        t += a + b * tokens / 1e3 + c * work / 1e3 + d * len(dec)
        dec = [x - 1 for x in dec if x > 1]
        if done:
            break
    return t - r["pick"]


def fit(train, f):
    """Nelder-Mead on a clipped squared log error, non-negative constants."""
    def loss(th):
        if min(th) < 0:
            return 1e9
        e = np.array([math.log(max(f(r, th), 1e-6) / r["ttft"]) for r in train])
        return float(np.mean(np.minimum(e * e, 0.04 + 0.4 * (np.abs(e) - 0.2).clip(0))))
    x0 = [0.008, 0.002, 0.005, 0.05, 0.01, 0.0005]
    return minimize(loss, x0, method="Nelder-Mead", options=dict(maxiter=3000, xatol=1e-7, fatol=1e-9)).x


def hindsight(reqs):
    """In-sample ceilings on the warm three quarters, with the engine's counts: a linear fit on
    the requests alone on their engine from pick to first token, and the replay knowing every
    request sent there before the first token, later ones included."""
    warm = reqs[len(reqs) // 4:]
    alone = [r for r in warm if not any(s is not r and s["ep"] == r["ep"] and s["pick"] < r["first"]
                                        and s["end"] > r["pick"] for s in reqs)]
    y = np.array([r["ttft"] for r in alone])
    A = np.array([[1, r["U"] / 1e3, r["P"] / 1e3, r["U"] * r["P"] / 1e6] for r in alone])
    th = np.linalg.lstsq(A / y[:, None], np.ones_like(y), rcond=None)[0]

    def known(r):
        return [s for s in reqs if s["ep"] == r["ep"] and s is not r and s["pick"] < r["first"]
                and s["first"] > r["pick"]]
    th2 = fit(warm, lambda r, th: replay(r, th, True, known(r)))
    return len(alone), within(y / (A @ th)), within(r["ttft"] / replay(r, th2, True, known(r)) for r in warm)


def main(paths):
    runs = [load(p) for p in paths]
    rows = [("current prediction (the gateway's)", [within(r["ttft"] / r["pred"] for r in rs[len(rs) // 2:])
                                                    for rs in runs])]
    for engine in (False, True):
        tag = " [engine counts]" if engine else ""
        for name, feats in LINEAR.items():
            figs = []
            for rs in runs:
                half = len(rs) // 2
                pr = online_linear(rs, feats, engine)
                figs.append(within(r["ttft"] / p for r, p in zip(rs[half:], pr[half:]) if p))
            rows.append((f"online {name}{tag}", figs))
        figs = []
        for rs in runs:
            n = len(rs)
            th = fit(rs[n // 4:n // 2], lambda r, th: replay(r, th, engine))
            figs.append(within(r["ttft"] / max(replay(r, th, engine), 1e-6) for r in rs[n // 2:]))
        rows.append((f"scheduler replay, fitted on requests 25-50%{tag}", figs))
    ceilings = [hindsight(rs) for rs in runs]
    rows.append(("hindsight: linear, requests alone on their engine (in-sample)", [c[1] for c in ceilings]))
    rows.append(("hindsight: replay knowing the future (in-sample)", [c[2] for c in ceilings]))
    print("held-out second half of each run, share within 20%:", ", ".join(paths))
    for name, figs in rows:
        print(f"  {name:78s} " + " ".join(f"{x:4.0%}" for x in figs))
    print("  requests alone on their engine:", [c[0] for c in ceilings])


if __name__ == "__main__":
    main(sys.argv[1:])
