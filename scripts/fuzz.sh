#!/usr/bin/env bash
# The long fuzz run (issue 19): every proptest fuzz suite at 10^5 cases per property (or $1),
# pinned seeds. CI runs the same suites at their small default sizes inside scripts/test.sh.
#   scripts/fuzz.sh            # 100000 cases per property
#   scripts/fuzz.sh 20000      # fewer
# Suites: GGUF byte parser (models/tests/gguf.rs), model loader metadata -> hyperparameters ->
# tensor table -> forward, tokenizer construction (models/tests/fuzz.rs), experiment-config
# parser and validator (harness/tests/fuzz_config.rs). A failure prints the minimal case: make
# it a named regression test next to the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export SPECDEC_FUZZ_CASES="${1:-100000}"
echo "fuzzing with $SPECDEC_FUZZ_CASES cases per property"
cargo test --release -p specdec-harness --test fuzz_config
cargo test --release -p specdec-models --test gguf -- never_panic
cargo test --release -p specdec-models --test fuzz
