#!/usr/bin/env bash
# Builds the GPU bundle here (no GPU needed) and says how to run it on a GPU machine.
#
# The bundle (gpu-bundle/, ignored by git) holds stripped release binaries — every test binary of
# specdec-kernels (the kernel GPU tests), specdec-models' library tests (the NCCL communicator's
# GPU test and the CUDA Llama/Qwen2 runner's tests on synthetic GGUF models), specdec-harness's
# engine_on_device test (the engine loop end to end on the GPU) and the event-timed benchmark
# runner — plus the kernel sources for reference, and
# run.sh. On a GPU machine without Rust or network, `bash gpu-bundle/run.sh` runs every test with
# --include-ignored and SPECDEC_REQUIRE_GPU=1 (a missing GPU fails), then the benchmark runner,
# which measures copy bandwidth and the cuBLAS bf16 rate first and prints one table: kernel,
# shape, median time, GB/s or TFLOP/s, % of the ceiling measured in the same run.
# Kernels are compiled at first use by that machine's own libnvrtc (CUDA 13.0 toolkit there);
# nothing path-dependent is baked into the binaries (sources are embedded with include_str!).
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu-bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/kernels"

echo "== building release test binaries and the benchmark runner"
# The GPU tests live in specdec-kernels (all its test binaries and the gpu_bench example) and in
# specdec-models' library tests (the NCCL communicator and the CUDA runner, run filtered to
# shard::nccl and llama::cuda). A shared CARGO_TARGET_DIR can be rewritten by a concurrent build of
# another checkout of this workspace (same artifact names), so a failed build is retried once.
build() {
  { cargo test -p specdec-kernels --release --no-run --lib --tests --message-format=json &&
    cargo test -p specdec-models --release --no-run --lib --message-format=json &&
    cargo test -p specdec-harness --release --no-run --test engine_on_device --message-format=json &&
    cargo build -p specdec-kernels --release --example gpu_bench --message-format=json; } \
    2>"$out/build.log" | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    if "example" in m["target"]["kind"]:
        print("example " + m["executable"])
    elif m.get("profile", {}).get("test") and m["target"]["name"] == "specdec_models":
        print("models " + m["executable"])
    elif m.get("profile", {}).get("test") and m["target"]["name"] == "engine_on_device":
        print("engine " + m["executable"])
    elif m.get("profile", {}).get("test"):
        print("test " + m["executable"])
' >"$out/artifacts.list"
}
build || build || { cat "$out/build.log" >&2; echo "build failed" >&2; exit 1; }
rm -f "$out/build.log"
while read -r kind exe; do
  if [ "$kind" = example ]; then
    cp "$exe" "$out/bin/$(basename "$exe")"
  elif [ "$kind" = models ]; then
    cp "$exe" "$out/bin/nccl-$(basename "$exe")"
  elif [ "$kind" = engine ]; then
    cp "$exe" "$out/bin/engine-$(basename "$exe")"
  else
    cp "$exe" "$out/bin/test-$(basename "$exe")"
  fi
done <"$out/artifacts.list"
rm "$out/artifacts.list"
[ -x "$out/bin/gpu_bench" ] || { echo "gpu_bench was not built" >&2; exit 1; }
strip "$out"/bin/* 2>/dev/null || true
find kernels/src -name '*.cu' -o -name '*.cuh' | while read -r f; do
  mkdir -p "$out/$(dirname "$f")"; cp "$f" "$out/$f"
done

cat >"$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs on the GPU machine: every test (GPU tests included), then the benchmark table.
# Needs libcuda, libnvrtc and libcublas (CUDA 13.0) on the loader path; tries the usual places.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
# pip-installed CUDA (e.g. next to PyTorch) as a fallback
for d in $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in os.listdir(p)))' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
export SPECDEC_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
fail=0
for t in "$here"/bin/test-*; do
  echo "== $(basename "$t")"
  if ! "$t" --include-ignored --test-threads=1 2>&1 | tail -n 25; then fail=1; fi  # pipefail: the test's status
done
# specdec-models' GPU tests: the NCCL communicator and the CUDA Llama/Qwen2 runner (synthetic
# GGUF models built in memory; its other tests need the model files)
for t in "$here"/bin/nccl-*; do
  echo "== $(basename "$t") (shard::nccl and llama::cuda only)"
  if ! "$t" shard::nccl llama::cuda --include-ignored --test-threads=1 2>&1 | tail -n 40; then fail=1; fi
done
# the engine loop end to end on the GPU (synthetic Qwen2, no model file)
for t in "$here"/bin/engine-*; do
  echo "== $(basename "$t")"
  if ! "$t" --include-ignored --test-threads=1 2>&1 | tail -n 25; then fail=1; fi
done
echo "== benchmarks"
"$here/bin/gpu_bench" || fail=1
echo "== run.sh finished: $([ $fail -eq 0 ] && echo ALL PASSED || echo FAILURES ABOVE)"
exit $fail
RUN
chmod +x "$out/run.sh"
du -sh "$out"
size=$(du -sb "$out" | cut -f1)
if [ "$size" -gt $((48 * 1024 * 1024)) ]; then
  echo "bundle is $size bytes: too large for a 64 MiB transfer" >&2
  exit 1
fi
echo "bundle ready: copy $out/ to the GPU machine and run: bash $out/run.sh"
