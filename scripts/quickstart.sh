#!/usr/bin/env bash
# The main job, from a fresh machine: fetch the models and HumanEval, build specdec, run the
# quickstart experiments, and print their summary tables and where the plots are.
#
#   scripts/quickstart.sh          # SmolLM2 self-drafting + the Qwen2.5-Coder pair (~1.7 GB fetch)
#   scripts/quickstart.sh --small  # SmolLM2 only (~100 MB fetch)
#
# experiments/quickstart.toml: Qwen2.5-Coder-1.5B target, 0.5B draft: baseline, linear, tree,
# multi-level (n-gram → 0.5B), cost-model policy. experiments/quickstart-smollm2.toml: SmolLM2-135M
# drafting for itself: n-gram, layer skip, multi-level (n-gram → layer skip), cost-model policy.
# Both decode greedily, so every method reproduces the baseline's text (see requests.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."

small=0
for arg in "$@"; do
  case "$arg" in
    --small) small=1 ;;
    -h|--help) sed -n 2,11p "$0"; exit 0 ;;
    *) echo "quickstart: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

if [ "$small" = 1 ]; then
  fetch=(smollm2 humaneval)
  configs=(experiments/quickstart-smollm2.toml)
else
  fetch=(smollm2 qwen-0.5b qwen-1.5b humaneval)
  configs=(experiments/quickstart-smollm2.toml experiments/quickstart.toml)
fi

echo "== fetching ${fetch[*]} into ${SPECDEC_CACHE:-$HOME/.cache/specdec}"
scripts/fetch-models.sh "${fetch[@]}"

echo "== building specdec (release)"
cargo build --release --bin specdec
bin="${CARGO_TARGET_DIR:-target}/release/specdec"

for config in "${configs[@]}"; do
  name="$(basename "$config" .toml)"
  echo
  echo "== specdec run $config"
  "$bin" run "$config" --out "results/$name"
  echo "plots: results/$name/*.svg"
done
