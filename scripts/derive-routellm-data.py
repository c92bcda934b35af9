#!/usr/bin/env python3
"""Derives test-data/routellm/routing-eval.jsonl from a checkout of lm-sys/RouteLLM.

Usage: scripts/derive-routellm-data.py ROUTELLM_GIT_DIR [COMMIT]

Reads, at COMMIT (default HEAD), routellm/evals/gsm8k/gsm8k_responses.csv and
routellm/evals/mmlu/responses/mmlu_*.csv, drops the prompts listed in each benchmark's
contaminated_prompts.jsonl (as RouteLLM's evals/benchmarks.py does), keeps every GSM8K row and
every MMLU_STRIDE-th row of each MMLU domain (domains in name order, rows in file order), and
writes one JSON object a line: source, prompt, and whether the weak (Mixtral-8x7B-Instruct)
and the strong (GPT-4-1106-preview) model answered correctly. The model answers are dropped.
"""
import csv
import io
import json
import subprocess
import sys

WEAK = "mistralai/Mixtral-8x7B-Instruct-v0.1"
STRONG = "gpt-4-1106-preview"
MMLU_STRIDE = 5


def show(repo, commit, path):
    return subprocess.run(
        ["git", "-C", repo, "show", f"{commit}:{path}"],
        check=True, capture_output=True, text=True,
    ).stdout


def contaminated(repo, commit, bench):
    text = show(repo, commit, f"routellm/evals/{bench}/contaminated_prompts.jsonl")
    return {json.loads(l)["eval_prompt"] for l in text.splitlines() if l.strip()}


def rows(text):
    for r in csv.DictReader(io.StringIO(text)):
        yield r["prompt"], r[WEAK] == "True", r[STRONG] == "True"


def main():
    repo = sys.argv[1]
    commit = sys.argv[2] if len(sys.argv) > 2 else "HEAD"
    out = []
    skip = contaminated(repo, commit, "gsm8k")
    for p, w, s in rows(show(repo, commit, "routellm/evals/gsm8k/gsm8k_responses.csv")):
        if p not in skip:
            out.append({"source": "gsm8k", "prompt": p, "weak": w, "strong": s})
    skip = contaminated(repo, commit, "mmlu")
    files = subprocess.run(
        ["git", "-C", repo, "ls-tree", "--name-only", commit, "routellm/evals/mmlu/responses/"],
        check=True, capture_output=True, text=True,
    ).stdout.split()
    for f in sorted(files):
        domain = f.rsplit("/", 1)[1][len("mmlu_"):-len(".csv")]
        kept = [r for r in rows(show(repo, commit, f)) if r[0] not in skip]
        for p, w, s in kept[::MMLU_STRIDE]:
            out.append({"source": f"mmlu/{domain}", "prompt": p, "weak": w, "strong": s})
    for o in out:
        print(json.dumps(o, ensure_ascii=False))


if __name__ == "__main__":
    main()
