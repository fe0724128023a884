#!/usr/bin/env bash
# A long prompt through `specdec generate` (CPU unless --device is given): prefill tokens/s,
# decode tokens/s and peak memory (max RSS). Not part of CI.
#
#   scripts/long-context-bench.sh qwen2.5-coder-0.5b 5000 --method plain   # ~5k-token prompt
#   scripts/long-context-bench.sh qwen2.5-coder-1.5b 13000 --method ngram --kv-dtype bf16
#
# The prompt is HumanEval prompts concatenated until about the asked length (whole prompts),
# ending in "Summarise the functions above." One run of 1 + DECODE_TOKENS (default 64) tokens;
# prints one markdown table row: model, flags, prompt tokens, prefill tokens/s, decode tokens/s
# (after the first token), tau, peak RSS (MiB) and wall seconds. Extra arguments go to
# `specdec generate` (e.g. --kv-dtype bf16, --kv-memory 2GiB, --method ngram, --draft NAME).
set -euo pipefail
cd "$(dirname "$0")/.."

model="${1:-}"
tokens="${2:-}"
if [ -z "$model" ] || [ -z "$tokens" ]; then
  sed -n 2,12p "$0"
  exit 2
fi
shift 2
decode="${DECODE_TOKENS:-64}"
bin=target/release/specdec
[ -x "$bin" ] || cargo build --release --bin specdec
humaneval="${SPECDEC_CACHE:-$HOME/.cache/specdec}/HumanEval.jsonl"
[ -f "$humaneval" ] || { echo "long-context-bench: $humaneval missing (scripts/fetch-models.sh humaneval)" >&2; exit 1; }

prompt_file=$(mktemp)
trap 'rm -f "$prompt_file" "$prompt_file".*' EXIT
# ~3.3 characters per token for code with these tokenizers; the runs print the exact count
python3 - "$humaneval" "$tokens" >"$prompt_file" <<'EOF'
import json, sys
path, tokens = sys.argv[1], int(sys.argv[2])
prompts = [json.loads(line)["prompt"] for line in open(path)]
out, i = [], 0
while sum(map(len, out)) < tokens * 3.3:
    out.append(prompts[i % len(prompts)])
    i += 1
sys.stdout.write("\n".join(out) + "\n# Summarise the functions above.\n")
EOF

# one run: generate --json gives the prompt's length, its prefill time and the decode rate
/usr/bin/time -f "%e %M" -o "$prompt_file.time" \
  "$bin" generate --target "$model" --file "$prompt_file" --max-tokens "$((1 + decode))" \
  --json "$@" >"$prompt_file.json" 2>"$prompt_file.err" || { cat "$prompt_file.err" >&2; exit 1; }
python3 - "$prompt_file.json" "$prompt_file.time" "$model" "$*" <<'EOF'
import json, sys
summary = json.load(open(sys.argv[1]))
wall, rss_kib = open(sys.argv[2]).read().split()[-2:]
tokens, prefill = summary["prompt_tokens"], summary["prefill_s"]
decode = summary.get("decode_tokens_per_s") or 0.0
print(f"| {sys.argv[3]} | {sys.argv[4] or '--method plain'} | {tokens} | {tokens / prefill:.1f} "
      f"| {decode:.2f} | {summary['tau']:.2f} | {int(rss_kib) / 1024:.0f} | {float(wall):.0f} |")
EOF
