#!/usr/bin/env python3
"""Tables of a trained-heads benchmark from `specdec run` results folders.

    scripts/heads-table.py results/heads-smollm2-mtbench-t0 [more folders...]

For each folder (one model, one prompt source, one temperature; methods interleaved in one run)
it prints, per method: acceptance by draft depth, mean accepted length tau, decode tokens/s
(generated tokens over the time after the prompt prefill, which the engine books as the first
step's overhead) and speedup against plain decoding's decode tokens/s in the same run, the draft
cost per depth step relative to one plain target forward, and how many prompts reproduce plain
decoding's text; then tau and speedup per prompt category (MT-Bench categories; HumanEval is one).
"""
import collections
import json
import os
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def category(prompt_id):
    parts = prompt_id.split("/")
    return parts[1] if parts[0] == "mtbench" and len(parts) > 2 else parts[0]


def table(folder):
    requests = load(os.path.join(folder, "requests.jsonl"))
    steps = load(os.path.join(folder, "steps.jsonl"))
    methods = list(dict.fromkeys(r["method"] for r in requests))
    baseline = methods[0]
    plain_text = {r["request"]: r["text"] for r in requests if r["method"] == baseline}
    plain_steps = [s for s in steps if s["method"] == baseline and s["step"] > 0]
    plain_forward_s = sum(s["target_s"] for s in plain_steps) / max(1, len(plain_steps))
    by = collections.defaultdict(list)
    for r in requests:
        by[r["method"]].append(r)
    steps_by = collections.defaultdict(list)
    for s in steps:
        steps_by[s["method"]].append(s)

    def decode_rate(rs):
        tokens = sum(r["generated_tokens"] for r in rs)
        # the prefill: its own field since the records split it out (overhead before)
        seconds = sum(r["elapsed_s"] - r.get("prefill_s", r["overhead_s"]) for r in rs)
        return tokens / seconds if seconds > 0 else float("nan")

    base_rate = decode_rate(by[baseline])
    out = [f"### {os.path.basename(folder.rstrip('/'))}", ""]
    out.append("| method | acceptance by depth 1, 2, 3, 4 | τ | decode tokens/s | speedup | "
               "draft cost / depth step | = plain |")
    out.append("|---|---|---:|---:|---:|---:|---:|")
    for m in methods:
        rs, ss = by[m], steps_by[m]
        passes = sum(r["target_passes"] for r in rs)
        accepted = sum(r["accepted"] for r in rs)
        tau = (accepted + passes) / passes if passes else float("nan")
        depth = []
        for d in range(1, 5):
            tried = sum(1 for s in ss if s["draft_depth"] >= d)
            hit = sum(1 for s in ss if s["draft_depth"] >= d and s["accepted"] >= d)
            depth.append(f"{hit / tried:.2f}" if tried else "–")
        drafted = [s for s in ss if s["draft_depth"] > 0]
        depth_steps = sum(s["draft_depth"] for s in drafted)
        cost = (sum(s["draft_s"] for s in drafted) / depth_steps / plain_forward_s
                if depth_steps and plain_forward_s > 0 else float("nan"))
        rate = decode_rate(rs)
        same = sum(1 for r in rs if r["text"] == plain_text.get(r["request"]))
        out.append(f"| {m} | {' / '.join(depth)} | {tau:.2f} | {rate:.1f} | "
                   f"{rate / base_rate:.2f}× | {cost:.3f} | {same}/{len(rs)} |")
    categories = list(dict.fromkeys(category(r["prompt_id"]) for r in by[baseline]))
    if len(categories) > 1:
        out += ["", "Per category: τ / speedup (decode tokens/s over plain's on the same prompts).", ""]
        out.append("| method | " + " | ".join(categories) + " |")
        out.append("|---|" + "---:|" * len(categories))
        for m in methods:
            cells = []
            for c in categories:
                rs = [r for r in by[m] if category(r["prompt_id"]) == c]
                base = [r for r in by[baseline] if category(r["prompt_id"]) == c]
                passes = sum(r["target_passes"] for r in rs)
                tau = (sum(r["accepted"] for r in rs) + passes) / passes
                cells.append(f"{tau:.2f} / {decode_rate(rs) / decode_rate(base):.2f}×")
            out.append(f"| {m} | " + " | ".join(cells) + " |")
    out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for folder in sys.argv[1:]:
        print(table(folder))
