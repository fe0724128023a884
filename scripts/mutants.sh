#!/usr/bin/env bash
# Mutation testing (issue 21): runs cargo-mutants over one module at a time, with that module's
# test suites as the tests, and adds up the results of separate runs. Not in CI (too slow: one
# incremental build and one test run per mutant).
#
#   scripts/mutants.sh MODULE [SHARD]       # SHARD is k/n (default 0/1: the whole module)
#   scripts/mutants.sh MODULE SHARD --iterate   # go on: skip what that shard's earlier runs
#                                             # caught or found unviable; extra arguments
#                                             # go to cargo mutants
#   scripts/mutants.sh MODULE SHARD --survivors # after adding tests: re-test only the
#                                             # mutants that shard's last run missed or
#                                             # timed out on (keeps the earlier catches)
#   scripts/mutants.sh --list MODULE        # the mutants of MODULE, nothing built
#   scripts/mutants.sh --summary            # caught / missed / timeout / unviable per module
#
# MODULE (files; tests run for every mutant):
#   verification  kernels/src/verification/**   specdec-kernels unit tests
#   sampling      kernels/src/sampling/**       specdec-kernels unit tests
#   tree          kernels/src/tree.rs           specdec-kernels unit tests
#   kv            kernels/src/kv/**             specdec-kernels unit tests (allocator, cache =
#                                               commit / rewind, layout)
#   drafters      algorithms/src/drafters/**    specdec-algorithms unit tests
# SUITE=exact (environment) adds the exact suites: specdec-algorithms' unit tests (the proof
# machinery: enumerator, oracle, composition) and its composition suite
# (algorithms/tests/compositions.rs). The facade's tests/exact.rs is not run per mutant: it
# links every crate of the workspace, minutes per mutant on 2 cores.
#
# GPU-only code is skipped: the CUDA launchers (cuda.rs), the .cu sources (not Rust) and the
# CUDA tests (#[ignore = "needs a GPU"]) cannot run without a GPU, so every mutant there would
# be "missed" for no reason.
#
# Outputs: results/mutants/<module>/shard-<k>-of-<n>/mutants.out (git-ignored). Shards of one
# module with the same n add up to the whole module; run them in any order, one at a time (they
# share the build directory). Each run stops after SPECDEC_MUTANTS_BUDGET seconds (default
# 1800), keeping what it finished; `--iterate` on the same shard then goes on from there.
# SPECDEC_MUTANTS_TIMEOUT (default 120) is the per-mutant test timeout in seconds.
#
# Builds go to target/mutants (or SPECDEC_MUTANTS_TARGET_DIR; kept between runs so third-party
# crates are built once) with the test profile at opt-level 1, no debug info, no overflow checks or debug
# assertions (the release profile's semantics, which the suites are written for), incremental:
# 3-40 s of build per mutant on 2 shared cores after the first build. cargo-mutants builds in a
# scratch copy of the tree, never in place.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

# Sets `package` and `files` (cargo-mutants file filters) for a module.
module_args() {
  case "$1" in
    verification) package=specdec-kernels files=(--file 'kernels/src/verification/**' --exclude cuda.rs) ;;
    sampling) package=specdec-kernels files=(--file 'kernels/src/sampling/**' --exclude cuda.rs) ;;
    tree) package=specdec-kernels files=(--file kernels/src/tree.rs) ;;
    kv) package=specdec-kernels files=(--file 'kernels/src/kv/**' --exclude cuda.rs --exclude kernels/src/kv/tests.rs) ;;
    drafters) package=specdec-algorithms files=(--file 'algorithms/src/drafters/**' --exclude algorithms/src/drafters/tests.rs) ;;
    *) echo "unknown module '$1' (verification, sampling, tree, kv, drafters)" >&2; return 1 ;;
  esac
}

summary() {
  local dir
  printf '%-14s %-14s %7s %7s %7s %9s %7s\n' module shard caught missed timeout unviable total
  for dir in results/mutants/*/shard-*/mutants.out; do
    [ -d "$dir" ] || continue
    local module shard
    module="$(basename "$(dirname "$(dirname "$dir")")")"
    shard="$(basename "$(dirname "$dir")")"
    python3 - "$dir" "$module" "$shard" <<'PY'
import os, sys
out, module, shard = sys.argv[1:]
def lines(name):
    path = os.path.join(out, name)
    return set(open(path).read().splitlines()) if os.path.exists(path) else set()
# --iterate folds earlier caught and unviable mutants into previously_caught.txt; the
# script keeps every unviable mutant it has seen in unviable-all.txt to tell them apart.
unviable = lines("unviable.txt") | (lines("../unviable-all.txt") & lines("previously_caught.txt"))
caught = (lines("caught.txt") | lines("previously_caught.txt")) - unviable
missed, timeout = lines("missed.txt"), lines("timeout.txt")
total = len(caught) + len(missed) + len(timeout) + len(unviable)
print(f"{module:<14} {shard:<14} {len(caught):>7} {len(missed):>7} {len(timeout):>7} {len(unviable):>9} {total:>7}")
PY
  done
}

case "${1:-}" in
  -h | --help | "") usage; exit 0 ;;
  --summary) summary; exit 0 ;;
  --list)
    module_args "${2:?--list needs a MODULE}"
    cargo mutants --list -p "$package" "${files[@]}"; exit 0 ;;
esac

command -v cargo-mutants >/dev/null || {
  echo "cargo-mutants is not installed: cargo install cargo-mutants --locked" >&2
  exit 1
}
module="$1"
module_args "$module"
shard="${2:-0/1}"
[[ "$shard" =~ ^[0-9]+/[1-9][0-9]*$ ]] || { echo "SHARD must be k/n, got '$shard'" >&2; exit 1; }
shift $(( $# >= 2 ? 2 : 1 ))
out="results/mutants/$module/shard-${shard%/*}-of-${shard#*/}"
mkdir -p "$out"

test_packages="$package"
test_args=(--lib)
if [ "${SUITE:-unit}" = exact ]; then
  [ "$package" = specdec-algorithms ] || test_packages="$package,specdec-algorithms"
  test_args=(--lib --tests)
fi

export CARGO_TARGET_DIR="${SPECDEC_MUTANTS_TARGET_DIR:-$root/target/mutants}"
export CARGO_PROFILE_DEV_OPT_LEVEL=1 CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_DEV_INCREMENTAL=true
export CARGO_PROFILE_DEV_OVERFLOW_CHECKS=false CARGO_PROFILE_DEV_DEBUG_ASSERTIONS=false
filters=()
if [ "${1:-}" = --survivors ]; then
  shift
  survivors="$(cat "$out/mutants.out/missed.txt" "$out/mutants.out/timeout.txt" 2>/dev/null || true)"
  [ -n "$survivors" ] || { echo "no missed or timed-out mutants in $out: nothing to re-test"; exit 0; }
  # One anchored, escaped name regex per survivor; --iterate keeps the earlier catches.
  mapfile -t filters < <(printf '%s\n' "$survivors" | python3 -c '
import sys
special = set("\\.+*?()|[]{}^$")
for name in sys.stdin.read().splitlines():
    print("--re"); print("^" + "".join("\\" + c if c in special else c for c in name) + "$")')
  filters+=(--iterate)
fi
budget="${SPECDEC_MUTANTS_BUDGET:-1800}"
echo "== cargo-mutants $(cargo mutants --version | awk '{print $2}'): $module shard $shard," \
  "suite ${SUITE:-unit}, budget ${budget}s -> $out"
status=0
timeout --signal=INT --kill-after=60 "$budget" \
  cargo mutants -p "$package" "${files[@]}" --test-package "$test_packages" --shard "$shard" --timeout "${SPECDEC_MUTANTS_TIMEOUT:-120}" \
  --jobs 1 --output "$out" "${filters[@]}" "$@" -- "${test_args[@]}" || status=$?
touch "$out/unviable-all.txt"
[ -f "$out/mutants.out/unviable.txt" ] && sort -u -o "$out/unviable-all.txt" \
  "$out/unviable-all.txt" "$out/mutants.out/unviable.txt"
summary | awk -v m="$module" 'NR == 1 || $1 == m'
# cargo-mutants exits 2 when mutants were missed, 3 on timeouts; 124/130 here: budget spent.
exit "$status"
