#!/usr/bin/env bash
# Seeds one realistic lossy bug at a time into a scratch copy of the working tree and runs
# `specdec prove` on it: every bug must make prove fail (a failed row, or an enumeration error
# such as two decisions sharing a random key). Not in CI: one release build per bug.
#
#   scripts/prove-catches-bugs.sh [BUG_NAME ...]     # default: every bug below
#
# The scratch copy builds into this tree's target directory (CARGO_TARGET_DIR, default
# ./target): third-party crates are reused, the workspace crates are built again for the copy,
# and target/release/specdec is left as the last mutant's: rebuild afterwards. Prints one line
# per bug: name, caught or MISSED, and prove's verdict line.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
scratch="$(mktemp -d /tmp/specdec-prove-bugs.XXXXXX)"
trap 'rm -rf "$scratch"' EXIT
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
export CARGO_INCREMENTAL=1

(cd "$root" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -C "$scratch" -xf -

python3 -u - "$scratch" "$@" <<'PY'
import os, subprocess, sys

scratch, wanted = sys.argv[1], sys.argv[2:]
target = os.environ["CARGO_TARGET_DIR"]
# (name, file, text to find exactly once, replacement)
BUGS = [
    ("accept-ignores-q", "kernels/src/sampling/rules.rs",
     "u.scaled_below(q_draft, p_target)", "u.scaled_below(&N::one(), p_target)"),
    ("accept-swapped", "kernels/src/sampling/rules.rs",
     "u.scaled_below(q_draft, p_target)", "u.scaled_below(p_target, q_draft)"),
    ("categorical-drops-last-mass", "kernels/src/sampling/rules.rs",
     "let total = masses.iter().fold(", "let total = masses[..masses.len() - 1].iter().fold("),
    ("residual-swapped", "kernels/src/sampling/rejection.rs",
     "if *a > *b {\n                a.clone() - b.clone()",
     "if *b > *a {\n                b.clone() - a.clone()"),
    ("siblings-share-accept-key", "kernels/src/verification/multi_round.rs",
     "input.key(child, Purpose::Accept)", "input.key(node, Purpose::Accept)"),
    ("chain-draws-share-a-key", "algorithms/src/drafters/chain.rs",
     "DrawKey::new(request.sequence, request.step, tree.len(), Purpose::Draft)",
     "DrawKey::new(request.sequence, request.step, 1, Purpose::Draft)"),
    ("staged-level1-in-target-namespace", "algorithms/src/drafters/staged.rs",
     "pub const LEVEL1_NAMESPACE: u32 = 2;", "pub const LEVEL1_NAMESPACE: u32 = 0;"),
    ("staged-forwards-unchecked-token", "algorithms/src/drafters/staged.rs",
     "node = chain.push(node, verdict.next_token);",
     "node = chain.push(node, proposal.token((prev + 1).min(proposal.len() - 1)));"),
    ("bonus-from-draft", "kernels/src/verification/multi_round.rs",
     "let bonus = sample_bonus(decisions, input.key(node, Purpose::Bonus), p);",
     "let bonus = sample_bonus(decisions, input.key(node, Purpose::Bonus), "
     "tree.draft_probs(node).unwrap_or(&p[..]));"),
    ("removed-not-renormalised", "kernels/src/verification/multi_round.rs",
     "if let Some(renormalized) = normalize(&s) {\n                    s = renormalized;\n"
     "                }", ""),
    ("rejected-token-not-removed", "kernels/src/verification/multi_round.rs",
     "s[x] = N::zero();", ""),
    ("top-p-strict-threshold", "kernels/src/sampling/prepare.rs",
     "if mass >= threshold {", "if mass > threshold {"),
    ("top-k-ties-to-higher-id", "kernels/src/sampling/prepare.rs",
     ".unwrap_or(std::cmp::Ordering::Equal)\n        });",
     ".unwrap_or(std::cmp::Ordering::Equal)\n                .then(b.cmp(&a))\n        });"),
    ("temperature-power-off-by-one", "kernels/src/sampling/prepare.rs",
     "Some(k) => probs.iter().map(|p| p.pow_u32(k)).collect(),",
     "Some(k) => probs.iter().map(|p| p.pow_u32(k - 1)).collect(),"),
]
missed = 0
for name, file, find, replace in BUGS:
    if wanted and name not in wanted:
        continue
    path = os.path.join(scratch, file)
    original = open(path).read()
    if original.count(find) != 1:
        print(f"{name}: the text to replace occurs {original.count(find)} times in {file}")
        missed += 1
        continue
    open(path, "w").write(original.replace(find, replace))
    build = subprocess.run(["cargo", "build", "--release", "--bin", "specdec"], cwd=scratch,
                           capture_output=True, text=True)
    if build.returncode != 0:
        print(f"{name}: BUILD FAILED\n{build.stderr[-2000:]}")
        missed += 1
    else:
        run = subprocess.run([os.path.join(target, "release", "specdec"), "prove"], cwd=scratch,
                             capture_output=True, text=True)
        lines = (run.stdout + run.stderr).splitlines()
        verdict = next((l for l in lines if " failed." in l or l.startswith("Error")),
                       lines[-1] if lines else "")
        caught = run.returncode != 0
        missed += not caught
        print(f"{name}: {'caught' if caught else 'MISSED'} — {verdict}", flush=True)
    open(path, "w").write(original)
sys.exit(1 if missed else 0)
PY
