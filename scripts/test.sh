#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need (outside the repo),
# then runs `cargo test --workspace --release`. Extra arguments go to cargo test.
set -euo pipefail
cd "$(dirname "$0")/.."

# Set-up steps (model fetch, NVRTC venv) register themselves in scripts/setup.d/, one file each,
# run in name order; each is idempotent and exports what the tests need into the environment.
if [ -d scripts/setup.d ]; then
  for step in scripts/setup.d/*.sh; do
    [ -e "$step" ] || continue
    echo "== set-up: $step"
    # shellcheck disable=SC1090
    source "$step"
  done
fi

echo "== cargo test --workspace --release $*"
cargo test --workspace --release "$@"
