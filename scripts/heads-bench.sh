#!/usr/bin/env bash
# Trained draft heads against every other drafter, on MT-Bench first turns (5 per category, 40,
# chat template) and 40 HumanEval prompts, 96 tokens, T = 0 and T = 1, methods interleaved with
# plain decoding in the same run (experiments/heads/*.toml); tables by scripts/heads-table.py.
#
#   scripts/heads-bench.sh smollm2        # SmolLM2-135M (heads trained here first if missing)
#   scripts/heads-bench.sh qwen           # Qwen2.5-Coder-1.5B (and its 0.5B draft)
#   scripts/heads-bench.sh qwen-short     # the same, 16 prompts, EAGLE head only (2-core sized)
#   scripts/heads-bench.sh smollm2 --train-minutes 25   # training budget of a missing head
#                                    (default: 25 minutes for SmolLM2, 120 for Qwen)
#
# A missing head is trained with `specdec train-head` (EAGLE: --w-ce 1 --w-feat 0.1 --lr 3e-3
# --train-lm-head --input-norms, Qwen also --ffn 2048, see experiments/heads/README.md; Medusa:
# the defaults)
# into the cache, where the eagle / medusa drafters look for it (an interrupted training of it,
# whose checkpoint is there, is resumed); an existing head is used as it is (delete it, or train
# with --resume, to change; one whose training stopped early is named as such).
set -euo pipefail
cd "$(dirname "$0")/.."

model="${1:-}"
shift || true
kinds=(eagle medusa)
minutes=""
while [ $# -gt 0 ]; do
  case "$1" in
    --train-minutes) minutes="$2"; shift 2 ;;
    *) echo "heads-bench: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
case "$model" in
  # eagle_extra: the EAGLE recipe (Qwen: an FFN of 2048, so a depth step stays cheap)
  smollm2) target=smollm2-135m; fetch=(smollm2 humaneval mtbench sharegpt); vocab=8192
    eagle_extra=(--lr 3e-3 --train-lm-head --input-norms); minutes="${minutes:-25}" ;;
  qwen|qwen-short) target=qwen2.5-coder-1.5b; fetch=(qwen-0.5b qwen-1.5b humaneval mtbench sharegpt)
    vocab=16384; eagle_extra=(--ffn 2048 --lr 3e-3 --train-lm-head --input-norms)
    minutes="${minutes:-120}"
    [ "$model" = qwen-short ] && kinds=(eagle) ;;
  -h|--help|"") sed -n 2,17p "$0"; exit 0 ;;
  *) echo "heads-bench: unknown model '$model' (smollm2, qwen or qwen-short)" >&2; exit 2 ;;
esac

scripts/fetch-models.sh "${fetch[@]}"
cargo build --release --bin specdec
bin="${CARGO_TARGET_DIR:-target}/release/specdec"
heads="${SPECDEC_CACHE:-$HOME/.cache/specdec}/heads"

for kind in "${kinds[@]}"; do
  if [ ! -f "$heads/$target-$kind.safetensors" ]; then
    echo "== training the $kind head for $target ($minutes minutes of steps)"
    extra=()
    [ "$kind" = eagle ] && extra=(--w-ce 1 --w-feat 0.1 "${eagle_extra[@]}")
    # an interrupted training of this head left its checkpoint: continue that run
    [ -f "$heads/$target-$kind.ckpt.safetensors" ] && extra+=(--resume)
    # --minutes without --steps: the schedule is sized to the budget on this machine (a few
    # timed probe steps), and the budget stops the run cleanly (with a checkpoint) if slower
    "$bin" train-head --target "$target" --kind "$kind" --draft-vocab "$vocab" \
      --minutes "$minutes" "${extra[@]}"
  else
    # a head whose training was stopped early (time budget, Ctrl-C, --pause-at) is usable but
    # not the planned run: say so, with the command that finishes it
    python3 - "$heads/$target-$kind.safetensors" <<'PY'
import json, struct, sys
path = sys.argv[1]
with open(path, "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
training = json.loads(header["__metadata__"]["specdec.head"])["training"]
stopped = training["extra"].get("stopped", "Finished")
if stopped != "Finished":
    print(f"note: {path} stopped early ({stopped}) at step {training['steps']} of "
          f"{training['extra'].get('steps_planned', '?')}; this benchmark uses it as it is "
          "(train-head ... --resume finishes it)")
PY
  fi
done

folders=()
for source in mtbench humaneval; do
  for t in 0 1; do
    name="heads-$model-$source-t$t"
    echo
    echo "== specdec run experiments/heads/$model-$source-t$t.toml"
    "$bin" run "experiments/heads/$model-$source-t$t.toml" --out "results/$name" --quiet
    folders+=("results/$name")
  done
done
echo
python3 scripts/heads-table.py "${folders[@]}"
