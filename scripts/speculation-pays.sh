#!/usr/bin/env bash
# The point-7 benchmark ("speculation must pay, or step aside"): every drafter, with fixed budgets
# and under the cost-model policy (auto-*), against plain decoding measured in the same run, on
# HumanEval and on the committed prose prompts (experiments/prompts/prose.txt), for SmolLM2-135M
# drafting for itself and for the Qwen2.5-Coder pair. Prints each run's summary table and a last
# verdict per run: the slowest auto-* method (the bar: ≥ 0.95× plain) and the fastest method.
#
#   scripts/speculation-pays.sh            # SmolLM2 and the Qwen pair, both prompt sets
#   scripts/speculation-pays.sh --small    # SmolLM2 only
#   scripts/speculation-pays.sh --out DIR  # results under DIR (default results/speculation-pays)
#
# Times are wall-clock: on a shared machine repeat the run and compare within one run only.
set -euo pipefail
cd "$(dirname "$0")/.."

small=0
out=results/speculation-pays
while [ $# -gt 0 ]; do
  case "$1" in
    --small) small=1 ;;
    --out) out="$2"; shift ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    *) echo "speculation-pays: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done

configs=(experiments/speculation-pays/smollm2-humaneval.toml experiments/speculation-pays/smollm2-prose.toml)
fetch=(smollm2 humaneval)
if [ "$small" = 0 ]; then
  configs+=(experiments/speculation-pays/qwen-humaneval.toml experiments/speculation-pays/qwen-prose.toml)
  fetch+=(qwen-0.5b qwen-1.5b)
fi

scripts/fetch-models.sh "${fetch[@]}"
cargo build --release --bin specdec
bin="${CARGO_TARGET_DIR:-target}/release/specdec"

for config in "${configs[@]}"; do
  name="$(basename "$config" .toml)"
  echo "== $name"
  "$bin" run "$config" --out "$out/$name"
  sed -n '/^| method/,/^$/p' "$out/$name/summary.md"
  python3 - "$out/$name/summary.jsonl" <<'PY' || true
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
auto = [r for r in rows if r["method"].startswith("auto")]
best = max(rows, key=lambda r: r["speedup"])
if auto:
    worst = min(auto, key=lambda r: r["speedup"])
    verdict = "ok" if worst["speedup"] >= 0.95 else "BELOW 0.95x"
    print(f"slowest auto: {worst['method']} {worst['speedup']:.2f}x ({verdict}); "
          f"fastest: {best['method']} {best['speedup']:.2f}x")
PY
done
