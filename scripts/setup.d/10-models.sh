# Set-up step (sourced by scripts/test.sh): fetch the models and prompts the tests use into the
# specdec cache and export SPECDEC_CACHE for them. Idempotent: verified files are kept.
# Default selection: SmolLM2-135M, Qwen2.5-Coder-0.5B and -1.5B (the real-model tests run the
# pair) and HumanEval (measured here: about 32 s on a cold cache, under 2 s when cached).
# Override with SPECDEC_FETCH, e.g. SPECDEC_FETCH="smollm2 humaneval" (the Qwen tests then need
# SPECDEC_SKIP_MODEL_TESTS=1).
export SPECDEC_CACHE="${SPECDEC_CACHE:-$HOME/.cache/specdec}"
SPECDEC_FETCH="${SPECDEC_FETCH:-smollm2 qwen-0.5b qwen-1.5b humaneval}"
# shellcheck disable=SC2086
bash "$(dirname "${BASH_SOURCE[0]}")/../fetch-models.sh" $SPECDEC_FETCH
# Tests that need a model listed here fail (rather than skip) when it is missing.
export SPECDEC_REQUIRE_MODELS="$SPECDEC_FETCH"
