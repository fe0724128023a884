//! Randomness as decisions: the one trait through which all sampling code draws.
//!
//! Sampling code never holds a random number generator. It asks a [`Decisions`] for the three
//! kinds of decisions speculative decoding makes, each named by a [`DrawKey`]:
//!
//! - [`Decisions::accept`]: a Bernoulli with probability `min(1, p / q)` (`q = 0` → reject);
//! - [`Decisions::categorical`]: a token drawn in proportion to (unnormalised) weights;
//! - [`Decisions::uniform`]: a raw uniform in `[0, 1)`, only where a number is really needed.
//!
//! Three implementations answer the same calls: the production/replay decisions
//! ([`crate::sampling::Replay`], over a counter-based generator or over given uniforms), which
//! make exactly the decisions the CUDA kernels make, and the exhaustive enumerator of
//! `specdec-algorithms::proof`, which runs the code once per branch with exact probabilities.
//! Code written against this trait is therefore proven exactly and run in production unchanged.
//!
//! # Key scheme (the one place it is written down)
//!
//! Every decision reads one random word named by its [`DrawKey`]
//! `(sequence, step, node, purpose, draw)`; **no two decisions of one step may share a key**
//! (they would read the same word and not be independent). The exact enumerator of
//! `specdec-algorithms::proof` checks this on every enumerated path and fails otherwise. Who
//! uses which key:
//!
//! | decision | node | purpose | draw |
//! |---|---|---|---|
//! | a drafter draws the token of a new node | the new node's index | [`Purpose::Draft`] | 0 |
//! | a verifier accepts / rejects a drafted node | the drafted (child) node | [`Purpose::Accept`] | 0 |
//! | the correction after every child of a node was rejected | that node | [`Purpose::Residual`] | 0 |
//! | the bonus at an accepted leaf | the leaf | [`Purpose::Bonus`] | 0 |
//! | a draw from the target (target-only, typical's fallback, plain decoding) | the node | [`Purpose::Sample`] | 0 |
//!
//! A fallback draw after "no mass" (e.g. residual → `p`) reuses its key: the first draw read no
//! word. Several stages that decide about the same node in the same step (a staged drafter's
//! level 0 and level 1, and the target's verifier) are kept apart by a **namespace** in bits
//! 20..24 of `draw` (`specdec-algorithms::drafters::Namespaced`: the target's verifier is
//! namespace 0, a staged drafter's level 0 namespace 1, its level 1 namespace 2); bits 0..20 of
//! `draw` are free for several draws of one stage. `sequence` is the request's stable id (not
//! its batch slot) and `step` its own round counter, so decisions never depend on batch order;
//! the word for a key is [`crate::sampling::CounterRng::word`] of the run's seed.

/// Why a decision is drawn. Part of the [`DrawKey`]; the discriminants are part of the
/// counter-based generator's contract (see [`crate::sampling::CounterRng`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Purpose {
    /// Drawing a draft token (the drafter, keyed by the new node's index).
    Draft = 1,
    /// Accepting or rejecting a drafted node (keyed by the drafted node).
    Accept = 2,
    /// Sampling from the residual after every child of a node was rejected (keyed by the node).
    Residual = 3,
    /// Sampling the bonus token from `p` at an accepted leaf (keyed by the leaf).
    Bonus = 4,
    /// Sampling from the target directly (target-only verification, plain decoding).
    Sample = 5,
}

/// The name of one decision: which sequence, which decoding step of it, which tree node, why,
/// and which draw among several with the same other fields (0 when there is one).
///
/// Keys make decisions independent of batch order: a sequence's decisions depend on its own key
/// fields only, never on which other sequences share the batch or in which order they come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DrawKey {
    /// A stable identifier of the sequence (request), not its position in a batch.
    pub sequence: u64,
    /// The sequence's decoding step (round) number.
    pub step: u64,
    /// The tree node the decision is about.
    pub node: u32,
    /// Why the decision is drawn.
    pub purpose: Purpose,
    /// Distinguishes several draws with equal other fields; must be `< 2^24`.
    pub draw: u32,
}

impl DrawKey {
    /// The key for `purpose` at `node` of `sequence`'s step `step`, first draw.
    pub fn new(sequence: u64, step: u64, node: usize, purpose: Purpose) -> Self {
        Self {
            sequence,
            step,
            node: node as u32,
            purpose,
            draw: 0,
        }
    }

    /// The same key for another node and purpose (same sequence and step).
    pub fn at(self, node: usize, purpose: Purpose) -> Self {
        Self {
            node: node as u32,
            purpose,
            draw: 0,
            ..self
        }
    }
}

/// The source of every random decision sampling code makes, generic over its number type `N`.
pub trait Decisions<N> {
    /// True with probability `min(1, p_target / q_draft)`; always false when `q_draft` is not
    /// positive (a token the draft could not have drawn is never accepted).
    fn accept(&mut self, key: DrawKey, p_target: &N, q_draft: &N) -> bool;

    /// Index `i` drawn with probability `weights[i] / Σ weights`; `None` iff the weights have no
    /// mass (as this implementation measures it: exactly for the enumerator, in fixed point for
    /// the replay decisions). Weights are non-negative and at most 1 each. A `None` is the
    /// caller's cue for its documented fallback (e.g. residual → sample from `p`).
    fn categorical(&mut self, key: DrawKey, weights: &[N]) -> Option<usize>;

    /// A raw uniform in `[0, 1)`. Implementations that cannot supply one (the exact enumerator)
    /// record the misuse and return 0; such code cannot be proven by enumeration.
    fn uniform(&mut self, key: DrawKey) -> f64;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_keeps_sequence_and_step_and_resets_the_draw() {
        let key = DrawKey {
            draw: 5,
            ..DrawKey::new(3, 4, 1, Purpose::Draft)
        };
        let moved = key.at(7, Purpose::Residual);
        let expected = DrawKey {
            sequence: 3,
            step: 4,
            node: 7,
            purpose: Purpose::Residual,
            draw: 0,
        };
        assert_eq!(moved, expected);
        assert_eq!(DrawKey::new(3, 4, 7, Purpose::Residual), expected);
    }
}
