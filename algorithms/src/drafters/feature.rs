//! Drafting from the target's own hidden features (EAGLE-style heads): [`FeatureDraftModel`].
//!
//! A feature head reads pairs: head position `j` is (the target's feature `f_j`, the token
//! `t_{j+1}`), and its output is a predicted feature `f̂_{j+1}` with the draft distribution of
//! `t_{j+2}`. Drafting deeper feeds the head its own outputs: (`f̂_{j+1}`, drafted `t_{j+2}`) at
//! position `j + 1`, and so on. [`FeatureDraftModel`] turns any [`FeatureHead`] into a
//! [`DraftModel`], so the chain, tree and dynamic-tree drafters draft with it unchanged:
//!
//! - **after every verdict** ([`DraftModel::observe`]) it keeps the target's true features of
//!   the tokens the target committed, and drops the head's K/V of drafted positions (they were
//!   computed from predicted features);
//! - **the first query of a step** forwards the pending pairs — the committed tokens' true
//!   features with the next tokens — through the head in one chain (the catch-up), whose last
//!   row is the depth-1 distribution;
//! - **a chain** then costs one head pass per draft: each extends the last (its K/V kept until
//!   the verdict);
//! - **a batch** ([`DraftModel::next_probs_batch`], one depth of several sequences' chains)
//!   costs one head pass for all their catch-ups and one for all their chain extensions;
//! - **a tree depth** ([`DraftModel::next_probs_paths`]) is one head pass over the token trie of
//!   the paths below the root pair (the last true pair, recomputed uncommitted; every node's
//!   input feature is its parent's output from the pass before; shared prefixes once).
//!
//! The draft distribution `q` is the head's distribution over its draft vocabulary placed at
//! those target ids, zero at every other id (exact verification is unaffected). Every kept row
//! goes through [`FeatureHead::penalise`] with its own generated history, so a head with the
//! target's penalties re-prepares it from its logits.

use std::collections::HashMap;

use specdec_kernels::sampling::Prob;
use specdec_kernels::TreeTopology;
use specdec_models::heads::HeadStep;
use specdec_models::SeqId;

use crate::drafters::{check_distinct, DraftFeedback, DraftModel};
use crate::error::{AlgorithmError, Result};

/// What a head pass gives for one node.
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureOutput<N> {
    /// The predicted next feature `f̂`, `feature_dim` values.
    pub feature: Vec<f32>,
    /// The draft distribution over the draft vocabulary (prepared: temperature, top-k, top-p),
    /// one entry per [`FeatureHead::draft_ids`] entry.
    pub q: Vec<N>,
    /// The head's raw logits over its draft vocabulary, kept only for a head that penalises
    /// ([`FeatureHead::penalise`]); empty otherwise.
    pub logits: Vec<f32>,
}

/// A head drafting from features, with its own KV cache of pairs (the life cycle of
/// `specdec_models::LanguageModel`: speculative entries are kept only by `commit`).
pub trait FeatureHead<N> {
    /// The width of an input feature, which is also the width of a predicted one.
    fn feature_dim(&self) -> usize;
    /// The target vocabulary size (the length of `q` after placing it).
    fn target_vocab(&self) -> usize;
    /// Draft id → target id.
    fn draft_ids(&self) -> &[u32];
    /// Opens an empty head sequence.
    ///
    /// # Errors
    /// A full KV cache.
    fn new_sequence(&mut self) -> Result<SeqId>;
    /// Frees a head sequence.
    ///
    /// # Errors
    /// An unknown sequence.
    fn release(&mut self, seq: SeqId) -> Result<()>;
    /// Forwards the steps (each sequence at most once) and returns one output per node, per step.
    ///
    /// # Errors
    /// Shapes, unknown sequences, a full cache.
    fn forward(&mut self, steps: &[HeadStep<'_>]) -> Result<Vec<Vec<FeatureOutput<N>>>>;
    /// Keeps the nodes on `path` (root first) of the last forward of `seq`.
    ///
    /// # Errors
    /// A path that is not a root-to-node path of that forward.
    fn commit(&mut self, seq: SeqId, path: &[usize]) -> Result<()>;
    /// Drops the last `n` committed pairs of `seq`.
    ///
    /// # Errors
    /// Fewer than `n` committed pairs.
    fn rewind(&mut self, seq: SeqId, n: usize) -> Result<()>;
    /// Re-prepares `out.q` with the head's penalties for a row whose generated history is
    /// `generated ++ path`. Default: `q` unchanged (a head without penalties, or whose `q` does
    /// not come from logits).
    ///
    /// # Errors
    /// As the head's preparation of `q`.
    fn penalise(&self, out: &mut FeatureOutput<N>, generated: &[u32], path: &[u32]) -> Result<()> {
        let _ = (out, generated, path);
        Ok(())
    }
}

/// What the model keeps for one drafted-for sequence.
struct SequenceState<N> {
    seq: SeqId,
    /// The context after the last verdict (the root last).
    context: Vec<u32>,
    /// Tokens of `context` that are the prompt (the penalties' history starts after them).
    prompt_len: usize,
    /// Pairs with true features committed in the head's cache: positions `0..held`.
    held: usize,
    /// True features of positions `held..context.len() - 1`, row-major, awaiting the catch-up.
    pending: Vec<f32>,
    /// Drafted tokens whose pairs follow the held ones in the head's cache (a chain in progress).
    chain: Vec<u32>,
    /// The true feature of the last committed position: the root pair's input.
    root_feature: Vec<f32>,
    /// This step's outputs by draft path (after the context): the empty path is the catch-up's.
    outputs: HashMap<Vec<u32>, FeatureOutput<N>>,
}

/// A [`FeatureHead`] as a [`DraftModel`] (see the module docs).
pub struct FeatureDraftModel<N, H> {
    head: H,
    sequences: HashMap<u64, SequenceState<N>>,
}

impl<N: Prob, H: FeatureHead<N>> FeatureDraftModel<N, H> {
    /// Wraps `head`.
    pub fn new(head: H) -> Self {
        Self {
            head,
            sequences: HashMap::new(),
        }
    }

    /// The head.
    pub fn head(&self) -> &H {
        &self.head
    }

    /// The state of `sequence`, and the draft path `tokens` asks about (after its context).
    fn path_of<'t>(&self, sequence: u64, tokens: &'t [u32]) -> Result<&'t [u32]> {
        let state = self.sequences.get(&sequence).ok_or_else(|| {
            invalid(format!(
                "sequence {sequence}: no verdict heard yet (the engine reports the prompt first)"
            ))
        })?;
        let n = state.context.len();
        if tokens.len() < n || tokens[..n] != state.context[..] {
            return Err(invalid(format!(
                "sequence {sequence}: the query does not extend the context of the last verdict"
            )));
        }
        Ok(&tokens[n..])
    }

    /// For every sequence of `sequences` whose empty path has no output yet: forwards its pending
    /// true pairs (positions `held..committed`) as one chain, commits them, and records the last
    /// row as the empty path's output; all the chains in one head pass. A sequence without any
    /// pair (a one-token prompt) gets an empty output: `q` has no mass, so nothing is drafted.
    fn catch_up(&mut self, sequences: &[u64]) -> Result<()> {
        let dim = self.head.feature_dim();
        let draft_len = self.head.draft_ids().len();
        let mut todo: Vec<u64> = Vec::new();
        for sequence in sequences {
            let state = self
                .sequences
                .get_mut(sequence)
                .expect("checked by path_of");
            if state.outputs.contains_key(&Vec::new()) {
                continue;
            }
            if state.context.len() - 1 == state.held {
                state
                    .outputs
                    .insert(Vec::new(), empty_output(dim, draft_len));
            } else {
                todo.push(*sequence);
            }
        }
        if todo.is_empty() {
            return Ok(());
        }
        let states: Vec<&SequenceState<N>> = todo.iter().map(|s| &self.sequences[s]).collect();
        let trees: Vec<TreeTopology> = states
            .iter()
            .map(|state| TreeTopology::chain(state.context.len() - 1 - state.held))
            .collect();
        let steps: Vec<HeadStep<'_>> = states
            .iter()
            .zip(&trees)
            .map(|(state, tree)| HeadStep {
                seq: state.seq,
                tokens: &state.context[state.held + 1..],
                features: &state.pending,
                tree,
            })
            .collect();
        let outputs = self.head.forward(&steps)?;
        let pairs: Vec<usize> = trees.iter().map(TreeTopology::len).collect();
        check_row_counts(&outputs, &pairs)?;
        for (sequence, mut out) in todo.iter().zip(outputs) {
            let state = self.sequences.get_mut(sequence).expect("in todo");
            let committed = state.context.len() - 1;
            let rows = committed - state.held;
            self.head
                .commit(state.seq, &(0..rows).collect::<Vec<_>>())?;
            state.root_feature = state.pending[(rows - 1) * dim..].to_vec();
            state.held = committed;
            state.pending.clear();
            let mut last = out
                .pop()
                .ok_or_else(|| invalid("the head returned no rows".into()))?;
            self.head.penalise(&mut last, generated(state), &[])?;
            state.outputs.insert(Vec::new(), last);
        }
        Ok(())
    }

    /// Extends the chains kept in the head's cache by one pair, for every `(sequence, path)`
    /// whose path has no output yet and is its sequence's chain plus one token (the root pair
    /// committed, at least one pair held): all in one head pass, each pair kept until the
    /// verdict. Returns how many paths it computed.
    fn extend_chains(&mut self, queries: &[(u64, &[u32])]) -> Result<usize> {
        let mut todo: Vec<(u64, &[u32])> = Vec::new();
        for &(sequence, path) in queries {
            let state = &self.sequences[&sequence];
            let committed = state.context.len() - 1;
            let chain = &state.chain;
            let extends = path.len() == chain.len() + 1 && path[..chain.len()] == chain[..];
            if committed > 0
                && state.held == committed
                && extends
                && !state.outputs.contains_key(path)
                && state.outputs.contains_key(&path[..chain.len()])
            {
                todo.push((sequence, path));
            }
        }
        if todo.is_empty() {
            return Ok(0);
        }
        let tree = TreeTopology::chain(1);
        let steps: Vec<HeadStep<'_>> = todo
            .iter()
            .map(|&(sequence, path)| {
                let state = &self.sequences[&sequence];
                let (parent, token) = path.split_at(path.len() - 1);
                HeadStep {
                    seq: state.seq,
                    tokens: token,
                    features: &state.outputs[parent].feature,
                    tree: &tree,
                }
            })
            .collect();
        let outputs = self.head.forward(&steps)?;
        check_row_counts(&outputs, &vec![1; todo.len()])?;
        for (&(sequence, path), rows) in todo.iter().zip(outputs) {
            let state = self.sequences.get_mut(&sequence).expect("in todo");
            self.head.commit(state.seq, &[0])?;
            state.chain.push(path[path.len() - 1]);
            let mut row = rows
                .into_iter()
                .next()
                .ok_or_else(|| invalid("the head returned no rows".into()))?;
            self.head.penalise(&mut row, generated(state), path)?;
            state.outputs.insert(path.to_vec(), row);
        }
        Ok(todo.len())
    }

    /// The outputs after `paths` (each below the context of `sequence`), computing what is
    /// missing: a path one token past the chain kept in the head's cache costs one pair;
    /// otherwise one pass over the token trie of every path whose parent's output is known
    /// (below the root pair, recomputed uncommitted), repeated until all are known.
    fn outputs_for(&mut self, sequence: u64, paths: &[&[u32]]) -> Result<Vec<FeatureOutput<N>>> {
        self.catch_up(&[sequence])?;
        loop {
            let state = &self.sequences[&sequence];
            let committed = state.context.len() - 1;
            let missing: Vec<&[u32]> = paths
                .iter()
                .copied()
                .filter(|p| !state.outputs.contains_key(*p))
                .collect();
            if missing.is_empty() || committed == 0 {
                break;
            }
            if let [path] = missing[..] {
                if self.extend_chains(&[(sequence, path)])? == 1 {
                    continue;
                }
            }
            let state = self
                .sequences
                .get_mut(&sequence)
                .expect("checked by path_of");
            let root_held = state.held == committed;
            // The nodes whose parent's output is known, and their ancestors: one tree below
            // the root pair (the last true pair, recomputed uncommitted), parents first.
            let mut nodes: Vec<Vec<u32>> = Vec::new();
            for path in &missing {
                let ready = (1..=path.len())
                    .map(|end| &path[..end])
                    .find(|p| !state.outputs.contains_key(*p))
                    .expect("a missing path has a missing prefix");
                for end in 1..=ready.len() {
                    nodes.push(ready[..end].to_vec());
                }
            }
            nodes.sort_by(|a, b| a.len().cmp(&b.len()).then(a.cmp(b)));
            nodes.dedup();
            let index: HashMap<&[u32], usize> = nodes
                .iter()
                .enumerate()
                .map(|(i, p)| (p.as_slice(), i + 1))
                .collect();
            let mut tokens = vec![state.context[committed]];
            let mut parents = vec![None];
            let mut features = state.root_feature.clone();
            for node in &nodes {
                let parent = &node[..node.len() - 1];
                tokens.push(node[node.len() - 1]);
                parents.push(Some(index.get(parent).copied().unwrap_or(0)));
                features.extend_from_slice(&state.outputs[parent].feature);
            }
            if root_held {
                // uncover the root pair: it is the tree's root now
                self.head.rewind(state.seq, state.chain.len() + 1)?;
                state.chain.clear();
                state.held = committed - 1;
                state.pending = state.root_feature.clone();
            }
            let tree = TreeTopology::from_parents(&parents)?;
            let step = HeadStep {
                seq: state.seq,
                tokens: &tokens,
                features: &features,
                tree: &tree,
            };
            let mut outputs = self.head.forward(&[step])?;
            check_row_counts(&outputs, &[tokens.len()])?;
            let rows = outputs.pop().expect("one step checked");
            for (node, mut row) in nodes.into_iter().zip(rows.into_iter().skip(1)) {
                if state.outputs.contains_key(&node) {
                    continue;
                }
                self.head.penalise(&mut row, generated(state), &node)?;
                state.outputs.insert(node, row);
            }
        }
        let state = &self.sequences[&sequence];
        let (dim, draft_len) = (self.head.feature_dim(), self.head.draft_ids().len());
        Ok(paths
            .iter()
            .map(|p| {
                state
                    .outputs
                    .get(*p)
                    .cloned()
                    .unwrap_or_else(|| empty_output(dim, draft_len))
            })
            .collect())
    }

    /// `q` over the target vocabulary from the head's distribution over its draft ids.
    fn place(&self, q: &[N]) -> Vec<N> {
        let mut full = vec![N::zero(); self.head.target_vocab()];
        for (&id, p) in self.head.draft_ids().iter().zip(q) {
            full[id as usize] = p.clone();
        }
        full
    }
}

/// An error unless the head returned, for each step, one output per pair: `pairs[i]` for step
/// `i`.
fn check_row_counts<N>(outputs: &[Vec<FeatureOutput<N>>], pairs: &[usize]) -> Result<()> {
    if outputs.len() != pairs.len() {
        return Err(invalid(format!(
            "the head returned outputs for {} steps of {}",
            outputs.len(),
            pairs.len()
        )));
    }
    for (rows, &pairs) in outputs.iter().zip(pairs) {
        if rows.len() != pairs {
            return Err(invalid(format!(
                "the head returned {} rows for {pairs} pairs",
                rows.len()
            )));
        }
    }
    Ok(())
}

/// An output with no draft mass (what a sequence without pairs drafts from), for a head of
/// features of `dim` values and `draft_len` draft ids.
fn empty_output<N: Prob>(dim: usize, draft_len: usize) -> FeatureOutput<N> {
    FeatureOutput {
        feature: vec![0.0; dim],
        q: vec![N::zero(); draft_len],
        logits: Vec::new(),
    }
}

/// The generated part of a sequence's context: the tokens past its prompt.
fn generated<N>(state: &SequenceState<N>) -> &[u32] {
    &state.context[state.prompt_len.min(state.context.len())..]
}

fn invalid(reason: String) -> AlgorithmError {
    AlgorithmError::InvalidParameter {
        name: "feature head",
        reason,
    }
}

impl<N: Prob, H: FeatureHead<N>> DraftModel<N> for FeatureDraftModel<N, H> {
    fn vocab(&self) -> usize {
        self.head.target_vocab()
    }

    fn next_probs(&mut self, sequence: u64, tokens: &[u32]) -> Result<Vec<N>> {
        let path = self.path_of(sequence, tokens)?.to_vec();
        let out = self.outputs_for(sequence, &[&path])?;
        Ok(self.place(&out[0].q))
    }

    /// Catch-ups of every sequence in one head pass, then every chain extension in one more;
    /// what is left (tree paths) as [`DraftModel::next_probs`] answers it. Rows equal
    /// `next_probs`'s for a head whose rows do not depend on what else is in its pass.
    fn next_probs_batch(&mut self, queries: &[(u64, &[u32])]) -> Result<Vec<Vec<N>>> {
        check_distinct(queries.iter().map(|(sequence, _)| *sequence))?;
        let paths: Vec<(u64, Vec<u32>)> = queries
            .iter()
            .map(|&(sequence, tokens)| Ok((sequence, self.path_of(sequence, tokens)?.to_vec())))
            .collect::<Result<_>>()?;
        let sequences: Vec<u64> = paths.iter().map(|(sequence, _)| *sequence).collect();
        self.catch_up(&sequences)?;
        let extensions: Vec<(u64, &[u32])> =
            paths.iter().map(|(s, p)| (*s, p.as_slice())).collect();
        self.extend_chains(&extensions)?;
        paths
            .iter()
            .map(|(sequence, path)| {
                let out = self.outputs_for(*sequence, &[path])?;
                Ok(self.place(&out[0].q))
            })
            .collect()
    }

    /// One head pass over the paths' trie at most (see the module docs).
    fn next_probs_paths(
        &mut self,
        sequence: u64,
        context: &[u32],
        paths: &[Vec<u32>],
    ) -> Result<Vec<Vec<N>>> {
        let below = self.path_of(sequence, context)?.to_vec();
        let full: Vec<Vec<u32>> = paths
            .iter()
            .map(|p| below.iter().chain(p).copied().collect())
            .collect();
        let refs: Vec<&[u32]> = full.iter().map(Vec::as_slice).collect();
        let out = self.outputs_for(sequence, &refs)?;
        Ok(out.iter().map(|o| self.place(&o.q)).collect())
    }

    /// Keeps the true features of the newly committed tokens and drops the head's K/V of
    /// drafted positions; the first verdict of a sequence (its admission) opens it.
    ///
    /// # Errors
    /// Features missing, of the wrong width, or not following the ones held.
    fn observe(&mut self, feedback: &DraftFeedback<'_>) -> Result<()> {
        let dim = self.head.feature_dim();
        let features = feedback.features.ok_or_else(|| {
            invalid(format!(
                "sequence {}: the verdict carries no target features",
                feedback.sequence
            ))
        })?;
        if features.dim() != dim {
            return Err(invalid(format!(
                "the target's features have {} values per token, the head reads {dim}",
                features.dim()
            )));
        }
        if !self.sequences.contains_key(&feedback.sequence) {
            let seq = self.head.new_sequence()?;
            self.sequences.insert(
                feedback.sequence,
                SequenceState {
                    seq,
                    context: Vec::new(),
                    prompt_len: 0,
                    held: 0,
                    pending: Vec::new(),
                    chain: Vec::new(),
                    root_feature: Vec::new(),
                    outputs: HashMap::new(),
                },
            );
        }
        let state = self
            .sequences
            .get_mut(&feedback.sequence)
            .expect("inserted above");
        if !state.chain.is_empty() {
            self.head.rewind(state.seq, state.chain.len())?;
            state.chain.clear();
        }
        let known = state.held + state.pending.len() / dim;
        if feedback.committed != known + features.rows() {
            return Err(invalid(format!(
                "sequence {}: features of {} new tokens, but {} were committed after the {known} \
                 the head knows",
                feedback.sequence,
                features.rows(),
                feedback.committed
            )));
        }
        state.pending.extend_from_slice(features.as_slice());
        state.context = feedback.context.to_vec();
        state.prompt_len = feedback.prompt_len;
        state.outputs.clear();
        Ok(())
    }

    fn release(&mut self, sequence: u64) -> Result<()> {
        match self.sequences.remove(&sequence) {
            Some(state) => self.head.release(state.seq),
            None => Ok(()),
        }
    }

    fn wants_features(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use specdec_kernels::sampling::BigRational;
    use specdec_models::toy::{ToyModel, ToyStyle};

    use super::*;
    use crate::proof::{toy_features, ToyFeatureHead};

    type Q = BigRational;

    fn head() -> ToyFeatureHead {
        ToyFeatureHead::new(
            ToyModel::seeded(5, 4, 3, ToyStyle::DENSE).unwrap(),
            vec![3, 0, 1],
        )
    }

    /// Tells `model` that `context` is committed but its last token (features of every
    /// position after `from`).
    fn tell<H: FeatureHead<Q>>(model: &mut FeatureDraftModel<Q, H>, context: &[u32], from: usize) {
        tell_sequence(model, 7, context, from);
    }

    /// [`tell`] for drafted-for sequence `sequence`.
    fn tell_sequence<H: FeatureHead<Q>>(
        model: &mut FeatureDraftModel<Q, H>,
        sequence: u64,
        context: &[u32],
        from: usize,
    ) {
        let committed = context.len() - 1;
        let features = toy_features(context, from..committed);
        model
            .observe(&DraftFeedback {
                sequence,
                context,
                prompt_len: 0,
                committed,
                accepted: 0,
                features: Some(&features),
            })
            .unwrap();
    }

    /// `q` after `context ++ path` from a model that saw only this context, in one admission.
    fn fresh(context: &[u32], path: &[u32]) -> Vec<Q> {
        let mut model = FeatureDraftModel::new(head());
        tell(&mut model, context, 0);
        let mut tokens = context.to_vec();
        let mut q = model.next_probs(7, &tokens).unwrap();
        for &t in path {
            tokens.push(t);
            q = model.next_probs(7, &tokens).unwrap();
        }
        q
    }

    #[test]
    fn incremental_drafting_equals_drafting_from_scratch() {
        let mut model = FeatureDraftModel::new(head());
        let mut context = vec![1u32, 2, 0];
        tell(&mut model, &context, 0);
        for step in 0..4u32 {
            // a chain of three drafts, then a verdict that keeps the first and adds a bonus
            let mut tokens = context.clone();
            let mut drafts = Vec::new();
            for depth in 0..3usize {
                let q = model.next_probs(7, &tokens).unwrap();
                assert_eq!(q, fresh(&context, &drafts), "step {step} depth {depth}");
                assert_eq!(q.len(), 4);
                assert_eq!(
                    q[2],
                    Q::from_integer(0.into()),
                    "id 2 is outside the draft vocabulary"
                );
                let token = (step + depth as u32) % 4;
                drafts.push(token);
                tokens.push(token);
            }
            let old = context.len() - 1;
            context.push(drafts[0]);
            context.push((drafts[0] + 1) % 4);
            tell(&mut model, &context, old);
        }
    }

    /// A toy head that counts its passes.
    struct Counting {
        head: ToyFeatureHead,
        passes: usize,
    }

    impl FeatureHead<Q> for Counting {
        fn feature_dim(&self) -> usize {
            FeatureHead::<Q>::feature_dim(&self.head)
        }
        fn target_vocab(&self) -> usize {
            FeatureHead::<Q>::target_vocab(&self.head)
        }
        fn draft_ids(&self) -> &[u32] {
            FeatureHead::<Q>::draft_ids(&self.head)
        }
        fn new_sequence(&mut self) -> Result<SeqId> {
            FeatureHead::<Q>::new_sequence(&mut self.head)
        }
        fn release(&mut self, seq: SeqId) -> Result<()> {
            FeatureHead::<Q>::release(&mut self.head, seq)
        }
        fn forward(&mut self, steps: &[HeadStep<'_>]) -> Result<Vec<Vec<FeatureOutput<Q>>>> {
            self.passes += 1;
            self.head.forward(steps)
        }
        fn commit(&mut self, seq: SeqId, path: &[usize]) -> Result<()> {
            FeatureHead::<Q>::commit(&mut self.head, seq, path)
        }
        fn rewind(&mut self, seq: SeqId, n: usize) -> Result<()> {
            FeatureHead::<Q>::rewind(&mut self.head, seq, n)
        }
    }

    /// Chains drafted for several sequences at once, one depth of all of them per query: the
    /// rows are the ones each sequence gets alone, the catch-ups take one head pass and every
    /// further depth one more, and after a verdict the next step starts the same way.
    #[test]
    fn a_batched_query_is_one_head_pass_per_depth_with_each_sequences_rows() {
        let mut model = FeatureDraftModel::new(Counting {
            head: head(),
            passes: 0,
        });
        // a one-token prompt (no pair: nothing to draft), a short and a longer context
        let mut contexts: Vec<(u64, Vec<u32>)> =
            vec![(1, vec![3]), (2, vec![1, 2, 0]), (3, vec![2, 3, 1, 1, 0])];
        for (sequence, context) in &contexts {
            tell_sequence(&mut model, *sequence, context, 0);
        }
        for step in 0..3u32 {
            let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); contexts.len()];
            for depth in 0..3u32 {
                let tokens: Vec<Vec<u32>> = contexts
                    .iter()
                    .zip(&drafts)
                    .map(|((_, c), d)| c.iter().chain(d).copied().collect())
                    .collect();
                let queries: Vec<(u64, &[u32])> = contexts
                    .iter()
                    .zip(&tokens)
                    .map(|((s, _), t)| (*s, t.as_slice()))
                    .collect();
                let before = model.head().passes;
                let rows = model.next_probs_batch(&queries).unwrap();
                assert_eq!(model.head().passes, before + 1, "step {step} depth {depth}");
                for (i, row) in rows.iter().enumerate() {
                    let (_, context) = &contexts[i];
                    assert_eq!(
                        row,
                        &fresh(context, &drafts[i]),
                        "step {step} depth {depth} #{i}"
                    );
                }
                for (i, d) in drafts.iter_mut().enumerate() {
                    d.push((step + depth + i as u32) % 4);
                }
            }
            // verdicts: the first sequence takes a bonus token only, the others keep one draft
            for (i, (sequence, context)) in contexts.iter_mut().enumerate() {
                let old = context.len() - 1;
                if i > 0 {
                    context.push(drafts[i][0]);
                }
                context.push((step + 2) % 4);
                tell_sequence(&mut model, *sequence, context, old);
            }
        }
        let err = model
            .next_probs_batch(&[(2, &contexts[1].1), (2, &contexts[1].1)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("appears twice"), "{err}");
    }

    #[test]
    fn a_tree_depth_gives_the_rows_of_its_paths_as_chains() {
        let context = [2u32, 3, 1, 1];
        let mut model = FeatureDraftModel::new(head());
        tell(&mut model, &context, 0);
        let depth1: Vec<Vec<u32>> = vec![vec![0], vec![3]];
        let rows = model.next_probs_paths(7, &context, &depth1).unwrap();
        let depth2: Vec<Vec<u32>> = vec![vec![0, 1], vec![0, 3], vec![3, 3]];
        let deeper = model.next_probs_paths(7, &context, &depth2).unwrap();
        for (path, row) in depth1.iter().chain(&depth2).zip(rows.iter().chain(&deeper)) {
            assert_eq!(row, &fresh(&context, path), "path {path:?}");
        }
        // a chain query after the tree still reads the right K/V
        let mut tokens = context.to_vec();
        tokens.extend([3, 3, 0]);
        assert_eq!(
            model.next_probs(7, &tokens).unwrap(),
            fresh(&context, &[3, 3, 0])
        );
    }

    #[test]
    fn queries_and_verdicts_out_of_step_are_refused() {
        let mut model = FeatureDraftModel::new(head());
        let err = model.next_probs(7, &[1, 2]).unwrap_err().to_string();
        assert!(err.contains("no verdict"), "{err}");
        tell(&mut model, &[1, 2, 3], 0);
        let err = model.next_probs(7, &[1, 0, 3]).unwrap_err().to_string();
        assert!(err.contains("does not extend"), "{err}");
        // features of one token where two were committed
        let features = toy_features(&[1, 2, 3, 0, 1], 3..4);
        let err = model
            .observe(&DraftFeedback {
                sequence: 7,
                context: &[1, 2, 3, 0, 1],
                prompt_len: 0,
                committed: 4,
                accepted: 1,
                features: Some(&features),
            })
            .unwrap_err()
            .to_string();
        assert!(err.contains("features of 1 new tokens"), "{err}");
        model.release(7).unwrap();
        assert!(model.next_probs(7, &[1, 2, 3]).is_err());
    }
}
