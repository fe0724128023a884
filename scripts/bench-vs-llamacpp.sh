#!/usr/bin/env bash
# Benchmark specdec against llama.cpp on the same GGUF files, thread count and prompt length.
#
#   scripts/bench-vs-llamacpp.sh [--threads T] [--reps R] [--build-only] [MODEL...]
#
# MODEL is a registry name (default: smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b); the
# files must be fetched first (scripts/fetch-models.sh).
#
# llama.cpp is built from the source package llama-cpp-python==0.3.36 (it vendors llama.cpp at
# commit 0c1e57098bba) with the flags in shared/TOOLCHAIN.md, into
# ${SPECDEC_LLAMACPP:-~/.cache/specdec/llamacpp} (outside the repository). The build is cached:
# a re-run whose binaries exist skips it. Installs cmake and ninja-build with apt-get when missing.
#
# Measures, per model:
#   llama.cpp: `llama-bench -p 64 -n 64 -t T -r R` (prompt processing and decode tokens/s),
#              `llama-bench -p K -n 0 -t T -r R` for K = 1, 2, 4, 8, 16 (cost of one pass over K
#              tokens), peak RSS of the pp/tg run via `/usr/bin/time -v` (GNU time; installed with
#              apt-get when missing, else reported as n/a);
#   specdec:   `specdec bench model MODEL --prompt-tokens 64 --decode-tokens 64 --json FILE`
#              with RAYON_NUM_THREADS=T (same measures, peak RSS from VmHWM).
# and prints one side-by-side table plus the ratio specdec / llama.cpp.
# Results (raw llama-bench JSON, specdec JSON, the table) go to ${OUT_DIR:-target/bench-vs-llamacpp}.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

THREADS=2
REPS=5
BUILD_ONLY=0
MODELS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --threads) THREADS=$2; shift 2 ;;
        --reps) REPS=$2; shift 2 ;;
        --build-only) BUILD_ONLY=1; shift ;;
        -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "bench-vs-llamacpp: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) MODELS+=("$1"); shift ;;
    esac
done
[ ${#MODELS[@]} -gt 0 ] || MODELS=(smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b)

LLAMA_VERSION=0.3.36
LLAMA_HOME=${SPECDEC_LLAMACPP:-$HOME/.cache/specdec/llamacpp}
SRC_DIR=$LLAMA_HOME/llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp
BIN_DIR=$SRC_DIR/build/bin
OUT_DIR=${OUT_DIR:-$REPO/target/bench-vs-llamacpp}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}

log() { echo "[bench-vs-llamacpp] $*" >&2; }
die() { echo "bench-vs-llamacpp: $*" >&2; exit 1; }

apt_install() {
    # apt_install PACKAGE...: install Debian packages, with sudo when not root.
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    command -v apt-get >/dev/null || die "$* missing and apt-get not available; install them by hand"
    log "installing $* with apt-get"
    $sudo apt-get install -y "$@" >/dev/null || { $sudo apt-get update >/dev/null && $sudo apt-get install -y "$@" >/dev/null; } \
        || die "apt-get install $* failed"
}

build_llamacpp() {
    local targets=(llama-bench llama-completion llama-speculative llama-speculative-simple)
    local missing=0 t
    for t in "${targets[@]}"; do [ -x "$BIN_DIR/$t" ] || missing=1; done
    if [ $missing = 0 ]; then
        log "llama.cpp already built in $BIN_DIR (delete it to rebuild)"
        return
    fi
    local need=()
    command -v cmake >/dev/null || need+=(cmake)
    command -v ninja >/dev/null || need+=(ninja-build)
    [ ${#need[@]} = 0 ] || apt_install "${need[@]}"
    mkdir -p "$LLAMA_HOME"
    if [ ! -d "$SRC_DIR" ]; then
        local venv=$LLAMA_HOME/venv
        [ -x "$venv/bin/pip" ] || python3 -m venv "$venv" || die "cannot create a venv in $venv"
        log "downloading llama-cpp-python==$LLAMA_VERSION (source package)"
        (cd "$LLAMA_HOME" && "$venv/bin/pip" download --quiet --no-deps --no-binary :all: \
            "llama-cpp-python==$LLAMA_VERSION" -d "$LLAMA_HOME") \
            || die "pip download llama-cpp-python==$LLAMA_VERSION failed (is the package index reachable?)"
        tar -xzf "$LLAMA_HOME/llama_cpp_python-$LLAMA_VERSION.tar.gz" -C "$LLAMA_HOME" \
            || die "cannot unpack $LLAMA_HOME/llama_cpp_python-$LLAMA_VERSION.tar.gz"
        [ -f "$SRC_DIR/CMakeLists.txt" ] || die "no vendor/llama.cpp in the source package"
    fi
    log "building llama.cpp in $SRC_DIR/build (a few minutes on 2 cores)"
    (cd "$SRC_DIR" \
        && cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >build-cmake.log 2>&1 \
        && cmake --build build -j2 --target "${targets[@]}" >build-ninja.log 2>&1) \
        || die "llama.cpp build failed; see $SRC_DIR/build-cmake.log and build-ninja.log"
    log "llama.cpp built"
}

build_llamacpp
[ $BUILD_ONLY = 0 ] || exit 0
