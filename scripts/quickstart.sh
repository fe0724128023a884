#!/usr/bin/env bash
# The main job, from a fresh machine: builds specdec and runs it. (Until the harness lands this is
# the exact proof table; the quickstart experiment replaces it.)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release --bin specdec -- prove
