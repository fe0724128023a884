#!/usr/bin/env bash
# A long prompt through `specdec generate` (CPU unless --device is given): prefill tokens/s,
# decode tokens/s and peak memory (max RSS). Not part of CI.
#
#   scripts/long-context-bench.sh qwen2.5-coder-0.5b 5000          # ~5k-token prompt, plain
#   scripts/long-context-bench.sh qwen2.5-coder-1.5b 16000 --method linear --draft qwen2.5-coder-0.5b
#
# The prompt is HumanEval prompts concatenated until the target's tokenizer counts the asked
# length (approximately: whole prompts). Two runs: --max-tokens 1 times the prefill (plus one
# step), --max-tokens 1 + N the same plus N decode tokens; decode tokens/s = N / the difference.
# Extra arguments go to both `specdec generate` runs (e.g. --kv-memory 2GiB, --method, --draft).
set -euo pipefail
cd "$(dirname "$0")/.."

model="${1:-}"
tokens="${2:-}"
if [ -z "$model" ] || [ -z "$tokens" ]; then
  sed -n 2,11p "$0"
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

run() {
  local max="$1"
  shift
  /usr/bin/time -f "%e s wall, %M KiB max RSS" -o "$prompt_file.time" \
    "$bin" generate --target "$model" --prompt "$(cat "$prompt_file")" --max-tokens "$max" \
    --method plain "$@" >/dev/null 2>"$prompt_file.err" || { cat "$prompt_file.err" >&2; exit 1; }
  summary=$(grep "tokens in" "$prompt_file.err" | tail -1)
  seconds=$(echo "$summary" | sed -E 's/.* tokens in ([0-9.]+) s.*/\1/')
  echo "max_tokens $max: $summary; $(cat "$prompt_file.time")" >&2
  echo "$seconds"
}

# the exact prompt length, from generate's refusal of a max_tokens past the context (no compute)
prompt_tokens=$("$bin" generate --target "$model" --prompt "$(cat "$prompt_file")" \
  --max-tokens 1000000 2>&1 | sed -nE 's/.*the prompt has ([0-9]+) tokens.*/\1/p' | head -1 || true)
echo "prompt: ${prompt_tokens:-?} tokens" >&2
t1=$(run 1 "$@")
tn=$(run $((1 + decode)) "$@")
python3 - "$t1" "$tn" "$decode" "${prompt_tokens:-$tokens}" <<'EOF'
import sys
t1, tn, n, tokens = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print(f"prefill {tokens / t1:.0f} tokens/s ({t1:.1f} s for the prompt and one token)")
if tn > t1:
    print(f"decode {n / (tn - t1):.1f} tokens/s over {n} tokens")
else:
    print("decode: not measurable, the longer run took less time (a loaded machine: rerun)")
EOF
