#!/usr/bin/env python3
"""Reference logits for specdec's model tests, from an outside implementation.

    python3 scripts/reference-logits.py [--models smollm2-135m,qwen2.5-coder-0.5b]
                                        [--out models/tests/fixtures/reference_logits.json]

Loads each GGUF file from the specdec cache (scripts/fetch-models.sh fetches them) with
Hugging Face transformers, which dequantises every tensor to float32 and runs the model in
PyTorch on the CPU, and writes a small JSON fixture: for a few prompts, the input ids (from the
transformers tokenizer built from the same GGUF), the top-k next-token logits and the log-sum-exp
of the logits at every position, and a short greedy continuation.

The first run creates a virtual environment outside the repository
(${SPECDEC_CACHE:-~/.cache/specdec}/venv-reference, about 6 GB: the PyPI torch wheel pulls its
CUDA libraries even though only the CPU is used; about 3 minutes to install here) and re-runs
itself inside it.
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.expanduser(os.environ.get("SPECDEC_CACHE") or "~/.cache/specdec")
VENV = os.path.join(CACHE, "venv-reference")
PACKAGES = ["torch==2.15.0", "transformers==5.24.0", "gguf==0.19.0", "accelerate", "numpy"]
TOP_K = 5
GREEDY_TOKENS = 12


def ensure_venv():
    """Re-executes this script inside the reference venv, creating it on first use."""
    py = os.path.join(VENV, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    if not os.path.exists(py):
        print(f"== creating {VENV} and installing {' '.join(PACKAGES)}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", *PACKAGES], check=True)
    os.execv(py, [py, os.path.abspath(__file__), *sys.argv[1:]])


def registry():
    import tomllib

    with open(os.path.join(REPO, "models", "registry.toml"), "rb") as f:
        return {e["name"]: e for e in tomllib.load(f)["entry"]}


def prompts(tokenizer):
    """The prompts: (name, text). The chat prompt is rendered by the file's own template."""
    with open(os.path.join(CACHE, "HumanEval.jsonl"), "rb") as f:
        first = json.loads(f.readline())
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    return [
        ("fibonacci", "def fibonacci(n):"),
        ("chat_capital", chat),
        ("humaneval_0", first["prompt"]),
        ("digits_and_prose", "The quick brown fox jumps over the lazy dog 1234567890 times.\n"),
    ]


def compact_json(value, indent=0):
    """JSON with objects and lists of objects indented, and every list of scalars or flat
    object on one line: one position per line, small diffs."""
    pad = " " * indent
    flat = lambda v: not isinstance(v, (dict, list)) or (
        isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v))
    if isinstance(value, dict) and not all(flat(v) for v in value.values()):
        items = [f"{pad} {json.dumps(k)}: {compact_json(v, indent + 1).lstrip()}" for k, v in value.items()]
        return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and not flat(value):
        return pad + "[\n" + ",\n".join(compact_json(v, indent + 1) for v in value) + "\n" + pad + "]"
    return pad + json.dumps(value, ensure_ascii=False)


def main():
    ensure_venv()
    os.environ["TQDM_DISABLE"] = "1"  # quiet the GGUF dequantisation progress bars
    import numpy
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    ap.add_argument("--out", default=os.path.join(REPO, "models/tests/fixtures/reference_logits.json"))
    args = ap.parse_args()

    torch.manual_seed(0)
    transformers.utils.logging.disable_progress_bar()
    reg = registry()
    out = {
        "generator": "scripts/reference-logits.py",
        "reference": f"transformers {transformers.__version__} (GGUF dequantised to float32), "
        f"torch {torch.__version__} on the CPU",
        "top_k": TOP_K,
        "note": "per prompt: input ids (no BOS; transformers' tokenizer from the GGUF), and for "
        "every position p the top-k logits predicting token p+1 and the log-sum-exp of all "
        "logits at p; greedy_ids continue the prompt greedily",
        "models": {},
    }
    for name in args.models.split(","):
        entry = reg[name]
        path = os.path.join(CACHE, entry["file"])
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: run scripts/fetch-models.sh {entry['fetch']}")
        t0 = time.time()
        tok = AutoTokenizer.from_pretrained(CACHE, gguf_file=entry["file"])
        model = AutoModelForCausalLM.from_pretrained(CACHE, gguf_file=entry["file"], dtype=torch.float32)
        model.eval()
        print(f"== {name}: loaded in {time.time() - t0:.1f} s", flush=True)
        result = {"file": entry["file"], "sha256": entry["sha256"], "prompts": []}
        for pname, text in prompts(tok):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0].double()
                lse = torch.logsumexp(logits, dim=-1)
                top = torch.topk(logits, TOP_K, dim=-1)
                greedy = model.generate(
                    torch.tensor([ids]), max_new_tokens=GREEDY_TOKENS, do_sample=False,
                    pad_token_id=tok.eos_token_id,
                )[0, len(ids):].tolist()
            positions = [
                {
                    "top_ids": top.indices[p].tolist(),
                    "top_logits": [round(v, 4) for v in top.values[p].tolist()],
                    "logsumexp": round(lse[p].item(), 4),
                }
                for p in range(len(ids))
            ]
            result["prompts"].append({
                "name": pname, "text": text, "ids": ids, "positions": positions,
                "greedy_ids": greedy, "greedy_text": tok.decode(greedy),
            })
            last = positions[-1]
            print(f"   {pname}: {len(ids)} tokens, last top ids {last['top_ids']} logits "
                  f"{last['top_logits']}; greedy {tok.decode(greedy)!r}", flush=True)
        out["models"][name] = result
        print(f"== {name}: done in {time.time() - t0:.1f} s", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(compact_json(out) + "\n")
    print(f"== wrote {args.out} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
