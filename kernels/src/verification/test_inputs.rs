//! Random verification inputs shared by the verification tests (CPU and GPU).

use crate::sampling::{mix64, SeededSequences};
use crate::tree::TreeTopology;
use crate::verification::{DraftKind, DraftTree, VerifyMethod, VerifySequence};

/// A deterministic pseudo-random distribution over `vocab` with some exact zeros, a few
/// heavy tokens, and the given one-hot / zero rules applied by the caller.
pub(crate) fn dist(vocab: usize, salt: u64) -> Vec<f32> {
    let mut w: Vec<f32> = (0..vocab)
        .map(|i| {
            let r = mix64(salt ^ (i as u64).wrapping_mul(0x9e37));
            if r.is_multiple_of(7) {
                0.0
            } else {
                ((r >> 40) as f32 + 1.0) * if r.is_multiple_of(97) { 50.0 } else { 1.0 }
            }
        })
        .collect();
    let s: f32 = w.iter().sum();
    w.iter_mut().for_each(|x| *x /= s);
    w
}

/// A random tree of `n` nodes (parents earlier), tokens drawn to often hit the argmax.
pub(crate) fn random_input(
    seq: u64,
    n: usize,
    vocab: usize,
    kind: DraftKind,
    chain: bool,
) -> (DraftTree<f32>, Vec<Vec<f32>>) {
    let parents: Vec<Option<usize>> = (0..n)
        .map(|i| {
            if i == 0 {
                None
            } else if chain {
                Some(i - 1)
            } else {
                Some((mix64(seq * 31 + i as u64) % i as u64) as usize)
            }
        })
        .collect();
    let topo = TreeTopology::from_parents(&parents).unwrap();
    let p: Vec<Vec<f32>> = (0..n).map(|i| dist(vocab, seq * 1000 + i as u64)).collect();
    let q: Vec<Option<Vec<f32>>> = (0..n)
        .map(|i| (!topo.children(i).is_empty()).then(|| dist(vocab, seq * 7777 + i as u64)))
        .collect();
    let mut tokens = vec![0u32; n];
    for node in 1..n {
        let parent = parents[node].unwrap();
        let r = mix64(seq ^ (node as u64 * 0x51));
        // Half the time the parent's most likely target token (accepts), else a random one.
        let best = p[parent]
            .iter()
            .enumerate()
            .fold(0, |b, (i, v)| if *v > p[parent][b] { i } else { b });
        tokens[node] = if r.is_multiple_of(2) {
            best as u32
        } else {
            (r >> 20) as u32 % vocab as u32
        };
    }
    if kind == DraftKind::WithoutReplacement {
        // Siblings must differ: make them distinct by offsetting repeats.
        for node in 0..n {
            let mut seen = std::collections::HashSet::new();
            for &c in topo.children(node) {
                while !seen.insert(tokens[c]) {
                    tokens[c] = (tokens[c] + 1) % vocab as u32;
                }
            }
        }
    }
    (DraftTree::new(topo, tokens, q, kind).unwrap(), p)
}

/// A batch of 24 random trees of 1 to 9 nodes over `vocab` and their target rows (for ids
/// 100.. at step 3 in the tests).
pub(crate) fn random_batch(
    kind: DraftKind,
    chain: bool,
    vocab: usize,
) -> (Vec<DraftTree<f32>>, Vec<Vec<Vec<f32>>>) {
    (0..24u64)
        .map(|s| random_input(s + 1, 1 + (mix64(s) % 9) as usize, vocab, kind, chain))
        .unzip()
}

/// Run seed 42 for sequences `100..100 + batch`; every third one (`100 + i`, `i % 3 == 0`)
/// seeded on its own with `1000 + i`.
pub(crate) fn mixed_seeds(batch: usize) -> SeededSequences {
    let mut seeds = SeededSequences::new(42);
    for i in (0..batch as u64).step_by(3) {
        seeds.seed_sequence(100 + i, Some(1000 + i));
    }
    seeds
}

/// The methods the GPU verifies, with the draft kind each is paired with and whether its trees
/// must be chains.
pub(crate) const GPU_METHODS: [(VerifyMethod, DraftKind, bool); 5] = [
    (VerifyMethod::Greedy, DraftKind::Deterministic, false),
    (VerifyMethod::TargetOnly, DraftKind::Deterministic, false),
    (VerifyMethod::ChainRejection, DraftKind::Iid, true),
    (VerifyMethod::MultiRound, DraftKind::Iid, false),
    (
        VerifyMethod::RecursiveRejection,
        DraftKind::WithoutReplacement,
        false,
    ),
];

/// `trees` as a batch of sequences `100..` at step 3, and `rows` flattened in batch order.
pub(crate) fn batch_of<'a>(
    trees: &'a [DraftTree<f32>],
    rows: &[Vec<Vec<f32>>],
) -> (Vec<VerifySequence<'a>>, Vec<f32>) {
    let batch = trees
        .iter()
        .enumerate()
        .map(|(i, tree)| VerifySequence {
            sequence: 100 + i as u64,
            step: 3,
            tree,
        })
        .collect();
    (batch, rows.iter().flatten().flatten().copied().collect())
}
