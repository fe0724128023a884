//! The checks every Llama runner (CPU or CUDA) makes on a forward's steps and on a commit path,
//! so both refuse the same inputs with the same messages.

use std::collections::HashSet;

use specdec_kernels::TreeTopology;

use crate::error::{ModelError, Result};
use crate::model::{SeqId, SequenceStep};

/// Checks each step (shape, token ids below `vocab`), that no sequence repeats, and that the
/// deepest new token's position (`len_of(seq) + max_depth`) stays below `max_context`.
///
/// # Errors
/// [`ModelError::InvalidStep`] naming the sequence; `len_of`'s error for an unknown sequence.
pub(crate) fn check_steps(
    steps: &[SequenceStep<'_>],
    vocab: usize,
    max_context: usize,
    len_of: impl Fn(SeqId) -> Result<usize>,
) -> Result<()> {
    let mut seen = HashSet::new();
    for step in steps {
        step.validate(vocab)?;
        if !seen.insert(step.seq) {
            return Err(ModelError::InvalidStep {
                seq: step.seq.0,
                reason: "the sequence appears twice in one forward".into(),
            });
        }
        let needed = len_of(step.seq)? + step.tree.max_depth() + 1;
        if needed > max_context {
            return Err(ModelError::InvalidStep {
                seq: step.seq.0,
                reason: format!(
                    "position {} exceeds the context of {max_context}",
                    needed - 1
                ),
            });
        }
    }
    Ok(())
}

/// Checks that `path` is empty or a root-to-node path of `last`, the tree of the last forward
/// of `seq`.
///
/// # Errors
/// [`ModelError::InvalidStep`] naming the first bad entry (or that nothing was forwarded).
pub(crate) fn check_commit_path(
    seq: SeqId,
    path: &[usize],
    last: Option<&TreeTopology>,
) -> Result<()> {
    if path.is_empty() {
        return Ok(());
    }
    let bad = |reason: String| ModelError::InvalidStep { seq: seq.0, reason };
    let tree = last.ok_or_else(|| bad("commit of a path, but nothing was forwarded".into()))?;
    for (i, &node) in path.iter().enumerate() {
        let expected_parent = if i == 0 { None } else { Some(path[i - 1]) };
        if node >= tree.len() || tree.parent(node) != expected_parent {
            return Err(bad(format!(
                "commit path {path:?} is not a root-to-node path of the last tree (entry {i})"
            )));
        }
    }
    Ok(())
}
