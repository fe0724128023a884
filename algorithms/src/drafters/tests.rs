//! Structural tests of the drafters on small explicit tables (exact compositions with the
//! verifiers are in `algorithms/tests/compositions.rs`).

use std::collections::BTreeSet;
use std::sync::Arc;

use specdec_kernels::sampling::{Decisions, Replay};
use specdec_kernels::verification::DraftKind;

use super::*;
use crate::trees::TreeShape;

/// Order-1 table over 4 tokens: row `t` is the distribution after token `t`.
const TABLE: [[f64; 4]; 4] = [
    [0.5, 0.25, 0.125, 0.125],
    [0.0, 0.0, 0.75, 0.25],
    [0.25, 0.5, 0.0, 0.25],
    [0.0, 0.0, 0.0, 1.0],
];

fn table_model() -> FnModel<impl FnMut(&[u32]) -> Vec<f64>> {
    FnModel::new(4, |ctx: &[u32]| {
        TABLE[*ctx.last().unwrap() as usize].to_vec()
    })
}

fn request<'a>(context: &'a [u32], budget: &'a Budget) -> DraftRequest<'a> {
    DraftRequest {
        sequence: 3,
        step: 1,
        context,
        budget,
    }
}

fn production() -> specdec_kernels::sampling::Production {
    Replay::production(42)
}

#[test]
fn chain_argmax_follows_the_table() {
    let mut d = ChainDrafter::new(table_model(), ChainMode::Argmax);
    let tree: DraftTree<f64> = d
        .propose(&request(&[0], &Budget::Chain(3)), &mut production())
        .unwrap();
    assert_eq!(tree.tokens(), &[0, 0, 0, 0]);
    let tree: DraftTree<f64> = d
        .propose(&request(&[1], &Budget::Chain(3)), &mut production())
        .unwrap();
    assert_eq!(tree.tokens(), &[1, 2, 1, 2]);
    assert_eq!(tree.kind(), DraftKind::Deterministic);
    assert_eq!(tree.draft_probs(0), Some(&TABLE[1][..]));
    assert_eq!(tree.draft_probs(3), None, "leaves carry no q");
    let plain: DraftTree<f64> = d
        .propose(&request(&[1], &Budget::Plain), &mut production())
        .unwrap();
    assert_eq!(plain.len(), 1);
    assert!(d
        .propose(&request(&[], &Budget::Chain(1)), &mut production())
        .is_err());
}

#[test]
fn a_chain_stops_once_the_drafts_probability_of_it_falls_below_the_minimum_confidence() {
    let mut d = ChainDrafter::new(table_model(), ChainMode::Argmax)
        .with_min_confidence(0.3)
        .unwrap();
    let budget = Budget::Chain(4);
    // after [0]: q(0) = 1/2, then at best 1/4 < 0.3: the chain stops before that draw
    let tree: DraftTree<f64> = d
        .propose(&request(&[0], &budget), &mut production())
        .unwrap();
    assert_eq!(tree.tokens(), &[0, 0]);
    // after [1]: 3/4, 3/8, then at best 3/32
    let tree: DraftTree<f64> = d
        .propose(&request(&[1], &budget), &mut production())
        .unwrap();
    assert_eq!(tree.tokens(), &[1, 2, 1]);
    // after [3]: q(3) = 1 forever, so the budget stops it
    let tree: DraftTree<f64> = d
        .propose(&request(&[3], &budget), &mut production())
        .unwrap();
    assert_eq!(tree.draft_count(), 4);
    assert!(d.name().contains("min_confidence 0.3"), "{}", d.name());
    // where even the first draft's best token is below the minimum, the step drafts nothing
    let mut unsure = ChainDrafter::new(table_model(), ChainMode::Sample)
        .with_min_confidence(0.6)
        .unwrap();
    for seed in 0..10 {
        let tree: DraftTree<f64> = unsure
            .propose(&request(&[0], &budget), &mut Replay::production(seed))
            .unwrap();
        assert_eq!(
            tree.tokens(),
            &[0],
            "seed {seed}: max q after [0] is 1/2 < 0.6"
        );
    }
    // a sampled token that takes the chain below the minimum is kept, and ends the chain:
    // after [1] (0.6 ≤ 3/4), token 3 has q = 1/4, so the chain [1, 3] stops at 3/16
    let mut kept = BTreeSet::new();
    for seed in 0..40 {
        let tree: DraftTree<f64> = unsure
            .propose(&request(&[1], &budget), &mut Replay::production(seed))
            .unwrap();
        kept.insert(tree.tokens().to_vec());
    }
    assert!(kept.contains(&vec![1, 3]), "{kept:?}");
    assert!(
        kept.iter().all(|t| t == &[1, 3] || t == &[1, 2]),
        "{kept:?}"
    );
    // batched, each chain stops where it stops alone
    let contexts: [&[u32]; 3] = [&[0], &[1], &[3]];
    let budgets = [budget.clone(), budget.clone(), budget];
    for mode in [ChainMode::Sample, ChainMode::Argmax] {
        for seed in 0..10 {
            let requests = batch_requests(&contexts, &budgets, 7);
            let mut d = ChainDrafter::new(table_model(), mode)
                .with_min_confidence(0.3)
                .unwrap();
            let want: Vec<DraftTree<f64>> = requests
                .iter()
                .map(|r| d.propose(r, &mut Replay::production(seed)).unwrap())
                .collect();
            let got = d
                .propose_batch(&requests, &mut Replay::production(seed))
                .unwrap();
            assert_same_trees(&got, &want, &format!("{mode:?} seed {seed}"));
        }
    }
    for bad in [0.0, -0.5, 1.5, f64::NAN] {
        let err = ChainDrafter::new(table_model(), ChainMode::Argmax)
            .with_min_confidence(bad)
            .map(|_| ())
            .unwrap_err();
        assert!(err.to_string().contains("min_confidence"), "{err}");
    }
}

#[test]
fn chain_samples_stay_in_support() {
    let mut d = ChainDrafter::new(table_model(), ChainMode::Sample);
    for seed in 0..50 {
        let tree: DraftTree<f64> = d
            .propose(
                &request(&[1], &Budget::Chain(4)),
                &mut Replay::production(seed),
            )
            .unwrap();
        assert_eq!(tree.draft_count(), 4);
        assert_eq!(tree.kind(), DraftKind::Iid);
        for node in 1..tree.len() {
            let q = tree.draft_probs(node - 1).unwrap();
            assert!(q[tree.token(node) as usize] > 0.0);
            assert_eq!(q, &TABLE[tree.token(node - 1) as usize][..]);
        }
    }
}

#[test]
fn top_ranked_fill_and_budget_cut() {
    let mut d = ShapeDrafter::new(table_model(), TreeFill::TopRanked, TreeShape::k_ary(2, 2));
    let tree: DraftTree<f64> = d
        .propose(&request(&[2], &Budget::TreeNodes(6)), &mut production())
        .unwrap();
    // Root 2: top-2 are 1 (0.5) then 0 (0.25, tie with 3 goes to the lower id).
    // Under 1: 2 (0.75), 3 (0.25). Under 0: 0 (0.5), 1 (0.25).
    assert_eq!(tree.tokens(), &[2, 1, 0, 2, 3, 0, 1]);
    let cut: DraftTree<f64> = d
        .propose(&request(&[2], &Budget::TreeNodes(3)), &mut production())
        .unwrap();
    assert_eq!(cut.tokens(), &[2, 1, 0, 2]);
    // After token 3 only token 3 has mass: the rank-1 children are dropped with their subtrees.
    let narrow: DraftTree<f64> = d
        .propose(&request(&[3], &Budget::TreeNodes(6)), &mut production())
        .unwrap();
    assert_eq!(narrow.tokens(), &[3, 3, 3]);
    // An explicit shape wins over the default.
    let shape = Arc::new(TreeShape::from_choices(&[vec![0], vec![0, 0], vec![0, 0, 0]]).unwrap());
    let chain: DraftTree<f64> = d
        .propose(&request(&[1], &Budget::Tree(shape)), &mut production())
        .unwrap();
    assert_eq!(chain.tokens(), &[1, 2, 1, 2]);
}

#[test]
fn without_replacement_siblings_are_distinct() {
    let mut d = ShapeDrafter::new(
        table_model(),
        TreeFill::WithoutReplacement,
        TreeShape::k_ary(3, 1),
    );
    for seed in 0..30 {
        let tree: DraftTree<f64> = d
            .propose(
                &request(&[1], &Budget::TreeNodes(3)),
                &mut Replay::production(seed),
            )
            .unwrap();
        // Only tokens 2 and 3 have mass after 1: the third child is dropped.
        let children: BTreeSet<u32> = (1..tree.len()).map(|n| tree.token(n)).collect();
        assert_eq!(children, BTreeSet::from([2, 3]));
        assert_eq!(tree.kind(), DraftKind::WithoutReplacement);
    }
    let mut iid = ShapeDrafter::new(table_model(), TreeFill::Iid, TreeShape::k_ary(3, 1));
    let tree: DraftTree<f64> = iid
        .propose(&request(&[3], &Budget::TreeNodes(3)), &mut production())
        .unwrap();
    assert_eq!(tree.tokens(), &[3, 3, 3, 3], "i.i.d. children may repeat");
}

/// All token paths of depth ≤ `depth` with positive probability, with their probabilities.
fn all_paths(last: u32, depth: usize) -> Vec<(Vec<u32>, f64)> {
    let mut out = Vec::new();
    let mut stack = vec![(vec![], last, 1.0)];
    while let Some((path, tok, p)) = stack.pop() {
        if path.len() == depth {
            continue;
        }
        for t in 0..4u32 {
            let q = TABLE[tok as usize][t as usize];
            if q > 0.0 {
                let mut next = path.clone();
                next.push(t);
                out.push((next.clone(), p * q));
                stack.push((next, t, p * q));
            }
        }
    }
    out
}

#[test]
fn dynamic_tree_keeps_the_most_probable_paths() {
    // With full expansion the kept nodes are exactly the N most probable paths.
    let mut d = DynamicTreeDrafter::new(table_model(), 3, 64, 4).unwrap();
    for n in [1, 3, 5, 8] {
        let tree: DraftTree<f64> = d
            .propose(&request(&[2], &Budget::TreeNodes(n)), &mut production())
            .unwrap();
        assert_eq!(tree.draft_count(), n);
        let kept: Vec<f64> = (1..tree.len())
            .map(|node| {
                let mut prob = 1.0;
                let mut prev = 2;
                for &m in &tree.topology().path_to(node)[1..] {
                    prob *= TABLE[prev as usize][tree.token(m) as usize];
                    prev = tree.token(m);
                }
                prob
            })
            .collect();
        let mut best: Vec<f64> = all_paths(2, 3).into_iter().map(|(_, p)| p).collect();
        best.sort_by(|a, b| b.partial_cmp(a).unwrap());
        let mut kept_sorted = kept.clone();
        kept_sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
        assert_eq!(kept_sorted, best[..n].to_vec(), "n = {n}");
        for node in 0..tree.len() {
            assert_eq!(
                tree.draft_probs(node).is_some(),
                !tree.topology().children(node).is_empty()
            );
        }
    }
    assert!(DynamicTreeDrafter::new(table_model(), 0, 1, 1).is_err());
}

#[test]
fn ngram_drafter_budgets() {
    let mut d = NgramDrafter::new(NgramConfig::default(), 3).unwrap();
    let ctx = [5, 6, 7, 5, 6, 8, 5, 6];
    let chain: DraftTree<f64> = d
        .propose(&request(&ctx, &Budget::Chain(2)), &mut production())
        .unwrap();
    assert_eq!(chain.tokens(), &[6, 8, 5]);
    assert_eq!(chain.kind(), DraftKind::Deterministic);
    let tree: DraftTree<f64> = d
        .propose(&request(&ctx, &Budget::TreeNodes(4)), &mut production())
        .unwrap();
    assert_eq!(tree.topology().children(0).len(), 2);
    assert_eq!(tree.draft_count(), 4);
    assert!(NgramDrafter::new(NgramConfig::default(), 0).is_err());
}

/// A level-0 drafter proposing fixed tokens as a deterministic chain.
struct Fixed(Vec<u32>);

impl Drafter<f64> for Fixed {
    fn name(&self) -> String {
        "fixed".into()
    }
    fn kind(&self) -> DraftKind {
        DraftKind::Deterministic
    }
    fn propose(
        &mut self,
        request: &DraftRequest<'_>,
        _d: &mut dyn Decisions<f64>,
    ) -> Result<DraftTree<f64>> {
        let mut b = TreeBuilder::new(request.root()?);
        let mut node = 0;
        for &t in self.0.iter().take(request.budget.max_drafts()) {
            node = b.push(node, t);
        }
        b.finish(DraftKind::Deterministic)
    }
}

#[test]
fn staged_keeps_checked_tokens_and_extends_from_q1() {
    // Level 1 is deterministic after token 3 (always 3): a level-0 proposal of 3s is accepted,
    // a proposal of 0s is rejected at once and replaced by 3s.
    for proposal in [vec![3, 3], vec![0, 0]] {
        let mut d = StagedDrafter::new(Fixed(proposal), table_model());
        let tree: DraftTree<f64> = d
            .propose(&request(&[3], &Budget::Chain(4)), &mut production())
            .unwrap();
        assert_eq!(tree.tokens(), &[3, 3, 3, 3, 3]);
        assert_eq!(tree.kind(), DraftKind::Iid);
        for node in 0..4 {
            assert_eq!(tree.draft_probs(node), Some(&TABLE[3][..]));
        }
    }
    let mut d = StagedDrafter::new(Fixed(vec![1]), table_model());
    let plain: DraftTree<f64> = d
        .propose(&request(&[3], &Budget::Plain), &mut production())
        .unwrap();
    assert_eq!(plain.len(), 1);
}

/// The table model, counting its calls: `(next_probs calls, next_probs_paths calls)`.
struct CountingModel {
    single: usize,
    levels: usize,
}

impl DraftModel<f64> for CountingModel {
    fn vocab(&self) -> usize {
        4
    }

    fn next_probs(&mut self, _sequence: u64, tokens: &[u32]) -> Result<Vec<f64>> {
        self.single += 1;
        Ok(TABLE[*tokens.last().unwrap() as usize].to_vec())
    }

    fn next_probs_paths(
        &mut self,
        _sequence: u64,
        context: &[u32],
        paths: &[Vec<u32>],
    ) -> Result<Vec<Vec<f64>>> {
        self.levels += 1;
        Ok(paths
            .iter()
            .map(|path| TABLE[*path.last().or(context.last()).unwrap() as usize].to_vec())
            .collect())
    }
}

#[test]
fn tree_drafters_ask_for_one_depth_per_call() {
    // a 2 x 2 x 2 shape: three depths expanded, 1 + 2 + 4 nodes
    let mut shaped = ShapeDrafter::new(
        CountingModel {
            single: 0,
            levels: 0,
        },
        TreeFill::TopRanked,
        TreeShape::from_branching(&[2, 2, 2]),
    );
    let tree: DraftTree<f64> = shaped
        .propose(&request(&[0], &Budget::Chain(14)), &mut production())
        .unwrap();
    let per_call = ShapeDrafter::new(
        table_model(),
        TreeFill::TopRanked,
        TreeShape::from_branching(&[2, 2, 2]),
    )
    .propose(&request(&[0], &Budget::Chain(14)), &mut production())
    .unwrap();
    assert_eq!(tree.tokens(), per_call.tokens(), "the same tree either way");
    assert_eq!(tree.draft_count(), per_call.draft_count());
    assert_eq!((shaped.model().single, shaped.model().levels), (0, 3));

    let mut dynamic = DynamicTreeDrafter::new(
        CountingModel {
            single: 0,
            levels: 0,
        },
        3,
        2,
        2,
    )
    .unwrap();
    let _: DraftTree<f64> = dynamic
        .propose(&request(&[0], &Budget::Chain(6)), &mut production())
        .unwrap();
    assert_eq!((dynamic.model().single, dynamic.model().levels), (0, 3));
}

/// Counts the batched queries a drafter makes (and how many sequences each holds): chains'
/// ([`DraftModel::next_probs_batch`]) and trees' ([`DraftModel::next_probs_paths_batch`]).
struct BatchCounting<M> {
    inner: M,
    batches: Vec<usize>,
    tree_batches: Vec<usize>,
}

impl<M: DraftModel<f64>> DraftModel<f64> for BatchCounting<M> {
    fn vocab(&self) -> usize {
        self.inner.vocab()
    }

    fn next_probs(&mut self, sequence: u64, tokens: &[u32]) -> Result<Vec<f64>> {
        self.inner.next_probs(sequence, tokens)
    }

    fn next_probs_batch(&mut self, queries: &[(u64, &[u32])]) -> Result<Vec<Vec<f64>>> {
        self.batches.push(queries.len());
        self.inner.next_probs_batch(queries)
    }

    fn next_probs_paths_batch(&mut self, queries: &[PathsQuery<'_>]) -> Result<Vec<Vec<Vec<f64>>>> {
        self.tree_batches.push(queries.len());
        self.inner.next_probs_paths_batch(queries)
    }
}

/// A batch's requests at `step`: sequence `10 + i` drafts after `contexts[i]` within
/// `budgets[i]`.
fn batch_requests<'a>(
    contexts: &[&'a [u32]],
    budgets: &'a [Budget],
    step: u64,
) -> Vec<DraftRequest<'a>> {
    contexts
        .iter()
        .zip(budgets)
        .enumerate()
        .map(|(i, (context, budget))| DraftRequest {
            sequence: 10 + i as u64,
            step,
            context,
            budget,
        })
        .collect()
}

#[test]
fn a_batched_chain_draft_equals_each_request_drafted_alone() {
    let contexts: [&[u32]; 5] = [&[0], &[1], &[2, 2], &[3], &[1, 0, 1]];
    // a plain budget, short and long chains; context [3] drafts token 3 forever
    let budgets = [
        Budget::Chain(3),
        Budget::Plain,
        Budget::Chain(5),
        Budget::Chain(1),
        Budget::Chain(4),
    ];
    for mode in [ChainMode::Sample, ChainMode::Argmax] {
        for seed in 0..20 {
            let requests = batch_requests(&contexts, &budgets, 7);
            let mut alone = ChainDrafter::new(table_model(), mode);
            let want: Vec<DraftTree<f64>> = requests
                .iter()
                .map(|r| alone.propose(r, &mut Replay::production(seed)).unwrap())
                .collect();
            let counting = BatchCounting {
                inner: table_model(),
                batches: Vec::new(),
                tree_batches: Vec::new(),
            };
            let mut batched = ChainDrafter::new(counting, mode);
            let got = batched
                .propose_batch(&requests, &mut Replay::production(seed))
                .unwrap();
            assert_same_trees(&got, &want, &format!("{mode:?} seed {seed}"));
            // one query per depth, holding the chains still growing at that depth
            assert_eq!(batched.model_mut().batches, vec![4, 3, 3, 2, 1]);
        }
    }
    let twice = [
        request(&[0], &Budget::Chain(2)),
        request(&[1], &Budget::Chain(2)),
    ];
    let mut d = ChainDrafter::new(table_model(), ChainMode::Argmax);
    let err = d
        .propose_batch(&twice, &mut production())
        .map(|_: Vec<DraftTree<f64>>| ())
        .unwrap_err();
    assert!(
        err.to_string().contains("sequence 3 appears twice"),
        "{err}"
    );
}

/// Compares every tree of `got` with `want`: tokens, shape, kind and `q` at every node.
fn assert_same_trees(got: &[DraftTree<f64>], want: &[DraftTree<f64>], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.tokens(), w.tokens(), "{what}");
        assert_eq!(g.topology().parents(), w.topology().parents(), "{what}");
        assert_eq!(g.kind(), w.kind(), "{what}");
        for node in 0..g.len() {
            assert_eq!(g.draft_probs(node), w.draft_probs(node), "{what}");
        }
    }
}

#[test]
fn batched_tree_drafts_equal_each_request_drafted_alone() {
    let contexts: [&[u32]; 4] = [&[0], &[1], &[2, 2], &[3]];
    let budgets = [
        Budget::Chain(6),
        Budget::Plain,
        Budget::Chain(2),
        Budget::Chain(14),
    ];
    let requests = batch_requests(&contexts, &budgets, 3);
    let counting = || BatchCounting {
        inner: table_model(),
        batches: Vec::new(),
        tree_batches: Vec::new(),
    };
    for fill in [
        TreeFill::TopRanked,
        TreeFill::Iid,
        TreeFill::WithoutReplacement,
    ] {
        for seed in 0..10 {
            let shape = || TreeShape::from_branching(&[2, 2, 2]);
            let mut alone = ShapeDrafter::new(table_model(), fill, shape());
            let want: Vec<DraftTree<f64>> = requests
                .iter()
                .map(|r| alone.propose(r, &mut Replay::production(seed)).unwrap())
                .collect();
            let mut batched = ShapeDrafter::new(counting(), fill, shape());
            let got = batched
                .propose_batch(&requests, &mut Replay::production(seed))
                .unwrap();
            assert_same_trees(&got, &want, &format!("{fill:?} seed {seed}"));
            // a query per depth over the trees with nodes to expand (the plain budget has none)
            let depths = batched.model().tree_batches.len();
            assert!(
                (1..=3).contains(&depths),
                "{:?}",
                batched.model().tree_batches
            );
            assert!(batched.model().tree_batches.iter().all(|&n| n <= 3));
        }
    }
    let mut alone = DynamicTreeDrafter::new(table_model(), 3, 2, 2).unwrap();
    let want: Vec<DraftTree<f64>> = requests
        .iter()
        .map(|r| alone.propose(r, &mut production()).unwrap())
        .collect();
    let mut batched = DynamicTreeDrafter::new(counting(), 3, 2, 2).unwrap();
    let got = batched.propose_batch(&requests, &mut production()).unwrap();
    assert_same_trees(&got, &want, "dynamic tree");
    // three depths, each one query over the three trees with a budget
    assert_eq!(batched.model().tree_batches, vec![3, 3, 3]);

    let twice = [
        request(&[0], &Budget::Chain(2)),
        request(&[1], &Budget::Chain(2)),
    ];
    let err = batched
        .propose_batch(&twice, &mut production())
        .map(|_: Vec<DraftTree<f64>>| ())
        .unwrap_err();
    assert!(err.to_string().contains("appears twice"), "{err}");
}
