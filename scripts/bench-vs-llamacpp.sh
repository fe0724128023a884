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
#              with RAYON_NUM_THREADS=T (same measures, peak RSS from VmHWM); built with cargo
#              unless SPECDEC_BIN names a specdec binary to use.
# and prints one side-by-side table plus the ratio specdec / llama.cpp.
# Run it on an idle machine: with more runnable threads than cores, llama.cpp's spinning thread
# pool slows down far more than specdec's (see the CPU line of each specdec table and the
# "Percent of CPU" of each *.llamacpp.time file), and the ratios stop meaning anything.
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
        -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "bench-vs-llamacpp: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) MODELS+=("$1"); shift ;;
    esac
done
[ ${#MODELS[@]} -gt 0 ] || MODELS=(smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b)

LLAMA_VERSION=0.3.36
LLAMA_HOME=${SPECDEC_LLAMACPP:-$HOME/.cache/specdec/llamacpp}
SRC_DIR=$LLAMA_HOME/llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp
# ggml's x86 levels. `-march=native` (GGML_NATIVE) also builds its AMX kernels where the CPU
# advertises AMX, and on such a development VM (a Xeon listing amx_int8) llama-bench then died
# with SIGILL (signal 4) before its first result. There the levels are named one by one, from
# /proc/cpuinfo, without AMX, into their own build folder.
if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
    BUILD=build-noamx
    GGML_SIMD=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
    for level in avx512f:AVX512 avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 avx512vbmi:AVX512_VBMI; do
        if grep -qw "${level%%:*}" /proc/cpuinfo; then GGML_SIMD+=("-DGGML_${level##*:}=ON"); fi
    done
else
    BUILD=build
    GGML_SIMD=(-DGGML_NATIVE=ON)
fi
BIN_DIR=$SRC_DIR/$BUILD/bin
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
    log "building llama.cpp in $SRC_DIR/$BUILD (${GGML_SIMD[*]}; a few minutes on 2 cores)"
    (cd "$SRC_DIR" \
        && cmake -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${GGML_SIMD[@]}" -DLLAMA_OPENSSL=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >build-cmake.log 2>&1 \
        && cmake --build "$BUILD" -j2 --target "${targets[@]}" >build-ninja.log 2>&1) \
        || die "llama.cpp build failed; see $SRC_DIR/build-cmake.log and build-ninja.log"
    log "llama.cpp built"
}

build_llamacpp
[ $BUILD_ONLY = 0 ] || exit 0

# ---- measure -------------------------------------------------------------------------------
command -v python3 >/dev/null || die "python3 is needed to read the JSON results"
if [ ! -x /usr/bin/time ] || ! /usr/bin/time -v true >/dev/null 2>&1; then
    apt_install time || log "GNU time unavailable: llama.cpp peak memory will read n/a"
fi
mkdir -p "$OUT_DIR"
SPECDEC=$OUT_DIR/specdec
if [ -n "${SPECDEC_BIN:-}" ]; then
    cp "$SPECDEC_BIN" "$SPECDEC"
else
    log "building specdec (release)"
    cargo build --release -p specdec --quiet || die "cargo build -p specdec failed"
    # A private copy: a shared CARGO_TARGET_DIR may be rebuilt from another checkout meanwhile.
    cp "$CARGO_TARGET_DIR/release/specdec" "$SPECDEC"
fi
"$SPECDEC" bench --help >/dev/null 2>&1 || die "$SPECDEC has no 'bench' subcommand (built from another checkout?)"
KS=1,2,4,8,16
DEPTH=64
DEPTH_ARGS=(-d $DEPTH)
# The help text is read whole first: `grep -q` in a pipe stops reading at the first match, and
# under `pipefail` the writer's SIGPIPE would then read as "no -d" (it did, once in three runs).
LLAMA_BENCH_HELP=$("$BIN_DIR/llama-bench" --help 2>&1 || true)
grep -q -- '--n-depth' <<<"$LLAMA_BENCH_HELP" \
    || { DEPTH_ARGS=(); DEPTH=0; log "this llama-bench has no -d: K costs from an empty context"; }
mkdir -p "$OUT_DIR"
ROWS=()
for model in "${MODELS[@]}"; do
    gguf=$(python3 - "$model" <<'PY'
import os, sys, tomllib
name = sys.argv[1]
if os.path.exists(name):
    print(os.path.abspath(name)); sys.exit()
for e in tomllib.load(open("models/registry.toml", "rb"))["entry"]:
    if name in (e["name"], e["fetch"]):
        cache = os.path.expanduser(os.environ.get("SPECDEC_CACHE") or "~/.cache/specdec")
        print(os.path.join(cache, e["file"])); sys.exit()
sys.exit(f"unknown model {name}")
PY
) || die "cannot resolve model $model"
    [ -f "$gguf" ] || die "$gguf missing: run scripts/fetch-models.sh first"
    tag=$(basename "$gguf" .gguf)
    log "$model: llama.cpp pp/tg ($THREADS threads, $REPS reps)"
    /usr/bin/time -v -o "$OUT_DIR/$tag.llamacpp.time" \
        "$BIN_DIR/llama-bench" -m "$gguf" -p 64 -n 64 -t "$THREADS" -r "$REPS" -o json \
        >"$OUT_DIR/$tag.llamacpp.pptg.json" 2>"$OUT_DIR/$tag.llamacpp.pptg.log" \
        || die "llama-bench failed on $gguf; see $OUT_DIR/$tag.llamacpp.pptg.log"
    log "$model: llama.cpp K = $KS after $DEPTH tokens"
    "$BIN_DIR/llama-bench" -m "$gguf" -p "$KS" -n 0 "${DEPTH_ARGS[@]}" -t "$THREADS" -r "$REPS" -o json \
        >"$OUT_DIR/$tag.llamacpp.k.json" 2>"$OUT_DIR/$tag.llamacpp.k.log" \
        || die "llama-bench (K curve) failed on $gguf; see $OUT_DIR/$tag.llamacpp.k.log"
    log "$model: specdec"
    RAYON_NUM_THREADS=$THREADS "$SPECDEC" bench model "$gguf" --prompt-tokens 64 --decode-tokens 64 \
        --verify-prefix "$DEPTH" --ks "$KS" --reps "$REPS" --json "$OUT_DIR/$tag.specdec.json" \
        >"$OUT_DIR/$tag.specdec.txt" || die "specdec bench failed on $gguf"
    ROWS+=("$model=$tag")
done

python3 - "$OUT_DIR" "$THREADS" "$DEPTH" "${ROWS[@]}" <<'PY' | tee "$OUT_DIR/table.md"
import json, os, statistics, sys
out, threads, depth, rows = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
KS = [2, 4, 8, 16]

def llama(tag):
    tests = json.load(open(f"{out}/{tag}.llamacpp.pptg.json"))
    med_ts = lambda t: statistics.median(t["samples_ts"]) if t.get("samples_ts") else t["avg_ts"]
    pp = next(med_ts(t) for t in tests if t["n_prompt"] == 64 and t["n_gen"] == 0)
    tg = next(med_ts(t) for t in tests if t["n_gen"] == 64 and t["n_prompt"] == 0)
    peak = None
    for line in open(f"{out}/{tag}.llamacpp.time"):
        if "Maximum resident set size" in line:
            peak = int(line.split(":")[1]) / 1024
    ktests = json.load(open(f"{out}/{tag}.llamacpp.k.json"))
    med_ns = {t["n_prompt"]: statistics.median(t["samples_ns"]) if t.get("samples_ns") else t["avg_ns"]
              for t in ktests if t["n_gen"] == 0}
    cost = {k: med_ns[k] / med_ns[1] for k in KS if k in med_ns and 1 in med_ns}
    return pp, tg, peak, cost

def specdec(tag):
    r = json.load(open(f"{out}/{tag}.specdec.json"))
    res = r["result"]
    cost = {v["k"]: v["relative"] for v in res["verify"]}
    peak = r["peak_rss_bytes"] / 2**20 if r.get("peak_rss_bytes") else None
    return res["prompt_tokens_per_s"], res["decode_tokens_per_s"], peak, cost

fmt = lambda v, p=1: "n/a" if v is None else f"{v:.{p}f}"
ratio = lambda a, b: None if a is None or b is None or b == 0 else a / b
print(f"Threads {threads}; pp = one forward of 64 tokens, decode = 64 tokens one per forward; "
      f"cost(K) = one forward of K tokens after {depth} tokens, / cost(1); medians.")
print()
print("| model | engine | pp tok/s | decode tok/s | peak MiB | " + " | ".join(f"K={k}" for k in KS) + " |")
print("|---|---|---:|---:|---:|" + "---:|" * len(KS))
for row in rows:
    model, tag = row.split("=", 1)
    l, s = llama(tag), specdec(tag)
    for name, m in (("llama.cpp", l), ("specdec", s)):
        print(f"| {model} | {name} | {fmt(m[0])} | {fmt(m[1])} | {fmt(m[2], 0)} | "
              + " | ".join(fmt(m[3].get(k), 2) for k in KS) + " |")
    print(f"| {model} | specdec/llama.cpp | {fmt(ratio(s[0], l[0]), 2)} | {fmt(ratio(s[1], l[1]), 2)} | "
          f"{fmt(ratio(s[2], l[2]), 2)} | "
          + " | ".join(fmt(ratio(s[3].get(k), l[3].get(k)), 2) for k in KS) + " |")
PY
log "results in $OUT_DIR"
