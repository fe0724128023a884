#!/usr/bin/env python3
"""Reference logits for the runner's tests, from an independent implementation.

Reads a GGUF file with the `gguf` package (llama.cpp's own Python reader and dequantiser),
dequantises every weight to float32, and runs the Llama / Qwen2 decoder in numpy with float64
activations (RMSNorm, RoPE — interleaved pairs for llama-arch GGUF, half-split for qwen2 —, GQA
causal attention, SwiGLU, tied or separate head). Writes, for each prompt (token ids), the top-k
ids and logits at every position as JSON: the fixture models/tests/fixtures/reference_logits.json.

Usage (in a venv with `pip install numpy gguf`):
  scripts/reference-logits.py OUT.json MODEL.gguf NAME [MODEL.gguf NAME ...]
Prompts are fixed below (ids from specdec's tokenizer; the text is recorded for readers).
No network: the GGUF files come from scripts/fetch-models.sh.
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

PROMPTS = {
    "smollm2-135m": [
        ("def fibonacci(n):", [1604, 3987, 46477, 24, 94, 727]),
        ("The capital of France is", [504, 3575, 282, 4649, 314]),
        ("for i in range(10):\n    print(", [1710, 2056, 281, 1845, 24, 33, 32, 727, 472, 1628, 24]),
    ],
    "qwen2.5-coder-0.5b": [
        ("def fibonacci(n):", [750, 75698, 1445, 1648]),
        ("The capital of France is", [785, 6722, 315, 9625, 374]),
        ("for i in range(10):\n    print(", [1958, 600, 304, 2088, 7, 16, 15, 982, 262, 1173, 7]),
    ],
}
TOP_K = 5


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.parts[f.data[0]].tolist()[0]


class Model:
    def __init__(self, path):
        r = GGUFReader(path)
        arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
        self.arch = arch
        self.n_layers = field(r, f"{arch}.block_count")
        self.hidden = field(r, f"{arch}.embedding_length")
        self.n_heads = field(r, f"{arch}.attention.head_count")
        self.n_kv = field(r, f"{arch}.attention.head_count_kv")
        self.head_dim = field(r, f"{arch}.attention.key_length", self.hidden // self.n_heads)
        self.eps = field(r, f"{arch}.attention.layer_norm_rms_epsilon")
        self.base = field(r, f"{arch}.rope.freq_base", 10000.0)
        self.t = {}
        for t in r.tensors:
            w = dequantize(t.data, t.tensor_type).astype(np.float32)
            shape = [int(d) for d in reversed(t.shape)]  # rows-major: [rows, cols]
            self.t[t.name] = w.reshape(shape)
        if "output.weight" not in self.t:
            self.t["output.weight"] = self.t["token_embd.weight"]

    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, n):
        d = self.head_dim
        half = d // 2
        inv = self.base ** (-np.arange(half, dtype=np.float64) * 2 / d)
        ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]  # [n, half]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x = x.copy()
        if self.arch == "llama":
            a, b = x[..., 0::2].copy(), x[..., 1::2].copy()
            x[..., 0::2], x[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        else:
            a, b = x[..., :half].copy(), x[..., half:].copy()
            x[..., :half], x[..., half:] = a * cos - b * sin, a * sin + b * cos
        return x

    def logits(self, ids):
        n, d, hd = len(ids), self.hidden, self.head_dim
        g = self.n_heads // self.n_kv
        x = self.t["token_embd.weight"][ids].astype(np.float64)
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for l in range(self.n_layers):
            p = lambda s: self.t[f"blk.{l}.{s}"]
            h = self.rms(x, p("attn_norm.weight"))
            q, k, v = (h @ p(f"attn_{s}.weight").T for s in "qkv")
            if self.arch == "qwen2":
                q, k, v = q + p("attn_q.bias"), k + p("attn_k.bias"), v + p("attn_v.bias")
            q = self.rope(q.reshape(n, self.n_heads, hd), n)
            k = self.rope(k.reshape(n, self.n_kv, hd), n)
            v = v.reshape(n, self.n_kv, hd)
            out = np.empty((n, self.n_heads, hd))
            for head in range(self.n_heads):
                s = q[:, head] @ k[:, head // g].T / np.sqrt(hd) + mask
                s = np.exp(s - s.max(axis=-1, keepdims=True))
                out[:, head] = (s / s.sum(axis=-1, keepdims=True)) @ v[:, head // g]
            x = x + out.reshape(n, -1) @ p("attn_output.weight").T
            h = self.rms(x, p("ffn_norm.weight"))
            gate, up = h @ p("ffn_gate.weight").T, h @ p("ffn_up.weight").T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ p("ffn_down.weight").T
        return self.rms(x, self.t["output_norm.weight"]) @ self.t["output.weight"].T


def main():
    out_path, pairs = sys.argv[1], sys.argv[2:]
    fixture = {"top_k": TOP_K, "models": {}}
    for path, name in zip(pairs[0::2], pairs[1::2]):
        model = Model(path)
        prompts = []
        for text, ids in PROMPTS[name]:
            logits = model.logits(ids)
            rows = []
            for pos in range(len(ids)):
                top = np.argsort(-logits[pos], kind="stable")[:TOP_K]
                rows.append({"ids": [int(i) for i in top],
                             "logits": [round(float(logits[pos, i]), 5) for i in top]})
            prompts.append({"text": text, "ids": ids, "top": rows})
            print(f"{name} {text!r}: next {rows[-1]}", file=sys.stderr)
        fixture["models"][name] = prompts
    with open(out_path, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
