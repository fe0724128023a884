//! Model-based tests of the paged KV cache: random interleavings of create / fork / reserve +
//! write / commit / rewind / free, checked after every step against a plain `Vec` model.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::error::KernelError;
use crate::tree::TreeTopology;

const LAYERS: usize = 2;
const HEADS: usize = 2;
const DIM: usize = 2;
const BLOCK: usize = 4;

/// The K/V value of `(token, layer, part, head, d)`: unique per token id and exact in f32.
fn value(token: u64, layer: usize, part: KvPart, head: usize, d: usize) -> f32 {
    (token * 1000 + (layer * 100 + part as usize * 50 + head * 10 + d) as u64) as f32
}

/// `[n][HEADS][DIM]` keys or values of `tokens` for one layer.
fn token_rows(tokens: &[u64], layer: usize, part: KvPart) -> Vec<f32> {
    let mut rows = Vec::new();
    for &t in tokens {
        for head in 0..HEADS {
            for d in 0..DIM {
                rows.push(value(t, layer, part, head, d));
            }
        }
    }
    rows
}

/// Reserves and writes `tokens` as new pending slots of `seq`, layer by layer.
fn append(cache: &mut PagedKvCache, seq: SeqId, tokens: &[u64]) -> crate::Result<()> {
    let first = cache.reserve(seq, tokens.len())?;
    for layer in 0..LAYERS {
        let keys = token_rows(tokens, layer, KvPart::Key);
        let values = token_rows(tokens, layer, KvPart::Value);
        cache.write_kv(seq, layer, first, &keys, &values)?;
    }
    Ok(())
}

#[derive(Debug, Default, Clone)]
struct ModelSeq {
    committed: Vec<u64>,
    pending: Vec<u64>,
}

#[derive(Debug, Clone)]
enum Op {
    Create,
    Fork(usize),
    Append(usize, usize),
    /// seq pick, tree seeds, accepted-node pick, accept nothing, corrupt the path order.
    Commit(usize, Vec<u32>, usize, bool, bool),
    Rewind(usize, usize),
    Free(usize),
    UseFreed(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => Just(Op::Create),
        2 => any::<usize>().prop_map(Op::Fork),
        5 => (any::<usize>(), 0..=13usize).prop_map(|(s, n)| Op::Append(s, n)),
        4 => (
            any::<usize>(),
            prop::collection::vec(any::<u32>(), 32),
            any::<usize>(),
            prop::bool::weighted(0.1),
            prop::bool::weighted(0.1)
        )
            .prop_map(|(s, seeds, pick, none, bad)| Op::Commit(s, seeds, pick, none, bad)),
        2 => (any::<usize>(), 0..=10usize).prop_map(|(s, n)| Op::Rewind(s, n)),
        1 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::UseFreed),
    ]
}

/// A random tree of `n` nodes (often chain-like, so block remaps happen) and an accepted path.
fn tree_and_path(n: usize, seeds: &[u32], pick: usize) -> (TreeTopology, Vec<usize>) {
    let parents: Vec<Option<usize>> = (0..n)
        .map(|i| {
            (i > 0).then(|| {
                let seed = seeds[i % seeds.len()] as usize;
                if !seed.is_multiple_of(3) {
                    i - 1
                } else {
                    seed / 3 % i
                }
            })
        })
        .collect();
    let tree = TreeTopology::from_parents(&parents).unwrap();
    let path = if n == 0 {
        Vec::new()
    } else {
        tree.path_to(pick % n)
    };
    (tree, path)
}

/// Checks contents, block-table sizes, reference counts and speculative-slot ownership.
fn check(cache: &PagedKvCache, model: &BTreeMap<SeqId, ModelSeq>) -> Result<(), TestCaseError> {
    let layout = *cache.layout();
    let dtype = cache.dtype();
    let live: Vec<SeqId> = cache.sequences().collect();
    prop_assert_eq!(live, model.keys().copied().collect::<Vec<_>>());
    let mut refs = vec![0u32; cache.allocator().num_blocks()];
    for (&seq, m) in model {
        prop_assert_eq!(cache.len(seq).unwrap(), m.committed.len());
        prop_assert_eq!(cache.pending(seq).unwrap(), m.pending.len());
        let table = cache.block_table(seq).unwrap();
        let total = m.committed.len() + m.pending.len();
        prop_assert_eq!(table.len(), layout.blocks_for(total));
        for &b in table {
            refs[b as usize] += 1;
        }
        for (pos, &token) in m.committed.iter().chain(&m.pending).enumerate() {
            for layer in 0..LAYERS {
                for head in 0..HEADS {
                    for part in [KvPart::Key, KvPart::Value] {
                        let row = cache.token_row(seq, pos, layer, part, head).unwrap();
                        for (d, &x) in row.iter().enumerate() {
                            // a 16-bit pool holds the rounded value
                            prop_assert_eq!(
                                x,
                                dtype.round(value(token, layer, part, head, d)),
                                "seq {} pos {} layer {} head {} {:?}",
                                seq,
                                pos,
                                layer,
                                head,
                                part
                            );
                        }
                    }
                }
            }
        }
        // Speculative slots live only in blocks this sequence owns alone.
        for pos in m.committed.len()..total {
            let block = table[pos / BLOCK];
            prop_assert_eq!(cache.allocator().ref_count(block).unwrap(), 1);
        }
    }
    let mut free = 0;
    for (block, &count) in refs.iter().enumerate() {
        prop_assert_eq!(
            cache.allocator().ref_count(block as BlockId).unwrap(),
            count
        );
        free += usize::from(count == 0);
    }
    prop_assert_eq!(cache.allocator().free_blocks(), free);
    Ok(())
}

fn run_ops(num_blocks: usize, ops: Vec<Op>, dtype: KvDtype) -> Result<(), TestCaseError> {
    let layout = KvLayout::new(LAYERS, HEADS, DIM, BLOCK).unwrap();
    let mut cache = PagedKvCache::with_dtype(layout, num_blocks, dtype).unwrap();
    prop_assert_eq!(cache.dtype(), dtype);
    let mut model: BTreeMap<SeqId, ModelSeq> = BTreeMap::new();
    let mut freed: Vec<SeqId> = Vec::new();
    let mut next_token = 1u64;
    for op in ops {
        let live: Vec<SeqId> = model.keys().copied().collect();
        let pick = |i: usize| (!live.is_empty()).then(|| live[i % live.len()]);
        match op {
            Op::Create => {
                let seq = cache.create_sequence();
                prop_assert!(model.insert(seq, ModelSeq::default()).is_none());
            }
            Op::Fork(i) => {
                let Some(src) = pick(i) else { continue };
                let m = model[&src].clone();
                match cache.fork(src) {
                    Ok(child) => {
                        prop_assert!(m.pending.is_empty());
                        model.insert(child, m);
                    }
                    Err(err) => {
                        prop_assert!(!m.pending.is_empty());
                        let is_pending = matches!(err, KernelError::PendingTokens { .. });
                        prop_assert!(is_pending, "{}", err);
                    }
                }
            }
            Op::Append(i, n) => {
                let Some(seq) = pick(i) else { continue };
                let tokens: Vec<u64> = (next_token..next_token + n as u64).collect();
                next_token += n as u64;
                let m = &model[&seq];
                let end = m.committed.len() + m.pending.len();
                let lower = layout.blocks_for(end + n) - layout.blocks_for(end);
                let free_before = cache.allocator().free_blocks();
                match append(&mut cache, seq, &tokens) {
                    Ok(()) => {
                        let taken = free_before - cache.allocator().free_blocks();
                        prop_assert!(taken == lower || taken == lower + 1, "took {}", taken);
                        model.get_mut(&seq).unwrap().pending.extend(tokens);
                    }
                    Err(KernelError::OutOfBlocks { needed, free }) => {
                        prop_assert_eq!(free, free_before);
                        prop_assert!(needed > free && needed >= lower && needed <= lower + 1);
                    }
                    Err(other) => prop_assert!(false, "append failed: {}", other),
                }
            }
            Op::Commit(i, seeds, node, accept_none, corrupt) => {
                let Some(seq) = pick(i) else { continue };
                let n = model[&seq].pending.len();
                let (_tree, mut path) = tree_and_path(n, &seeds, node);
                if accept_none {
                    path.clear();
                }
                if corrupt && path.len() >= 2 {
                    path.reverse();
                    let err = cache.commit(seq, &path).unwrap_err();
                    let is_path = matches!(err, KernelError::InvalidAcceptedPath { .. });
                    prop_assert!(is_path, "{}", err);
                } else {
                    let stats = cache.commit(seq, &path).unwrap();
                    prop_assert_eq!(stats.accepted, path.len());
                    let m = model.get_mut(&seq).unwrap();
                    let kept: Vec<u64> = path.iter().map(|&p| m.pending[p]).collect();
                    m.committed.extend(kept);
                    m.pending.clear();
                }
            }
            Op::Rewind(i, n) => {
                let Some(seq) = pick(i) else { continue };
                let m = model.get_mut(&seq).unwrap();
                match cache.rewind(seq, n) {
                    Ok(_) => {
                        prop_assert!(n <= m.committed.len());
                        m.committed.truncate(m.committed.len() - n);
                        m.pending.clear();
                    }
                    Err(KernelError::RewindPastStart { requested, len, .. }) => {
                        prop_assert!(n > m.committed.len());
                        prop_assert_eq!((requested, len), (n, m.committed.len()));
                    }
                    Err(other) => prop_assert!(false, "rewind failed: {}", other),
                }
            }
            Op::Free(i) => {
                let Some(seq) = pick(i) else { continue };
                cache.free_sequence(seq).unwrap();
                model.remove(&seq);
                freed.push(seq);
            }
            Op::UseFreed(i) => {
                let seq = if freed.is_empty() {
                    SeqId(u64::MAX)
                } else {
                    freed[i % freed.len()]
                };
                let unknown = KernelError::UnknownSequence { seq: seq.0 };
                prop_assert_eq!(cache.len(seq), Err(unknown.clone()));
                prop_assert_eq!(cache.reserve(seq, 1), Err(unknown.clone()));
                prop_assert_eq!(cache.rewind(seq, 0), Err(unknown.clone()));
                prop_assert_eq!(cache.fork(seq), Err(unknown.clone()));
                prop_assert_eq!(cache.free_sequence(seq), Err(unknown));
            }
        }
        check(&cache, &model)?;
    }
    for seq in model.keys() {
        cache.free_sequence(*seq).unwrap();
    }
    prop_assert_eq!(cache.allocator().free_blocks(), num_blocks, "blocks leaked");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn random_life_cycles_match_a_vec_model(
        num_blocks in 6..40usize,
        ops in prop::collection::vec(op(), 1..120),
        dtype in prop::sample::select(KvDtype::ALL.to_vec()),
    ) {
        run_ops(num_blocks, ops, dtype)?;
    }
}

fn small_cache(num_blocks: usize) -> PagedKvCache {
    PagedKvCache::new(
        KvLayout::new(LAYERS, HEADS, DIM, BLOCK).unwrap(),
        num_blocks,
    )
    .unwrap()
}

#[test]
fn commit_remaps_whole_blocks_and_copies_the_rest() {
    let mut cache = small_cache(8);
    let seq = cache.create_sequence();
    append(&mut cache, seq, &[1, 2, 3, 4]).unwrap();
    cache.commit(seq, &[0, 1, 2, 3]).unwrap();
    // 13 pending nodes: 0..=3 a chain, 4..=7 a dead branch under 3, 8..=11 a chain under 3, 12.
    append(&mut cache, seq, &(10..23).collect::<Vec<u64>>()).unwrap();
    let before = cache.block_table(seq).unwrap().to_vec();
    let stats = cache.commit(seq, &[0, 1, 2, 3, 8, 9, 10, 11, 12]).unwrap();
    assert_eq!(stats.blocks_remapped, 1, "{stats:?}");
    assert_eq!(
        stats.slots_copied, 1,
        "node 12 moves to position 12 by a copy"
    );
    assert_eq!(cache.len(seq).unwrap(), 4 + 9);
    let after = cache.block_table(seq).unwrap();
    assert_eq!(
        after[2], before[3],
        "the block of nodes 8..=11 now holds positions 8..12"
    );
    let expected = [1, 2, 3, 4, 10, 11, 12, 13, 18, 19, 20, 21, 22];
    for (pos, &token) in expected.iter().enumerate() {
        let row = cache.token_row(seq, pos, 1, KvPart::Value, 1).unwrap();
        assert_eq!(
            row,
            &[
                value(token, 1, KvPart::Value, 1, 0),
                value(token, 1, KvPart::Value, 1, 1)
            ]
        );
    }
    assert_eq!(cache.allocator().used_blocks(), 4);
}

#[test]
fn bookkeeping_moves_no_data_and_its_moves_finish_the_commit() {
    // The same fork / copy-on-write / tree commit on two caches: one with `reserve` / `commit`,
    // one with the bookkeeping halves, whose data is checked before and after its moves.
    let (mut whole, mut split) = (small_cache(8), small_cache(8));
    for cache in [&mut whole, &mut split] {
        let seq = cache.create_sequence();
        append(cache, seq, &[1, 2, 3, 4, 5, 6]).unwrap();
        cache.commit(seq, &[0, 1, 2, 3, 4, 5]).unwrap();
    }
    let parent = SeqId(0);
    let (a, b) = (whole.fork(parent).unwrap(), split.fork(parent).unwrap());
    whole.reserve(a, 7).unwrap();
    let (first, cow) = split.reserve_blocks(b, 7).unwrap();
    assert_eq!(
        (first, cow.len()),
        (0, BLOCK),
        "the shared half block, slot by slot"
    );
    let unmoved = split.token_row(b, 5, 1, KvPart::Key, 0).unwrap();
    assert_eq!(unmoved, [0.0; DIM], "the copy's data waits for the moves");
    split.move_slots(&cow).unwrap();
    assert_eq!(
        split.token_row(b, 5, 1, KvPart::Key, 0).unwrap(),
        [
            value(6, 1, KvPart::Key, 0, 0),
            value(6, 1, KvPart::Key, 0, 1)
        ]
    );
    let tokens: Vec<u64> = (10..17).collect();
    for (cache, seq) in [(&mut whole, a), (&mut split, b)] {
        for layer in 0..LAYERS {
            let k = token_rows(&tokens, layer, KvPart::Key);
            let v = token_rows(&tokens, layer, KvPart::Value);
            cache.write_kv(seq, layer, 0, &k, &v).unwrap();
        }
    }
    // nodes 1 and 5 lie in the copied block and the next one: 5 moves by a copy
    let path = [0, 1, 5];
    let stats = whole.commit(a, &path).unwrap();
    let (split_stats, moves) = split.commit_blocks(b, &path).unwrap();
    assert_eq!(stats, split_stats);
    assert_eq!(moves.len(), stats.slots_copied);
    assert!(!moves.is_empty());
    let stale = split.token_row(b, 8, 0, KvPart::Value, 1).unwrap();
    assert_ne!(stale[0], value(15, 0, KvPart::Value, 1, 0));
    split.move_slots(&moves).unwrap();
    assert_eq!(whole.block_table(a).unwrap(), split.block_table(b).unwrap());
    assert_eq!(
        whole.pages().data(),
        split.pages().data(),
        "the pools hold the same data"
    );
    assert_eq!(
        split.token_row(b, 8, 0, KvPart::Value, 1).unwrap(),
        [
            value(15, 0, KvPart::Value, 1, 0),
            value(15, 0, KvPart::Value, 1, 1)
        ]
    );
    let outside = SlotMoves {
        src: vec![0],
        dst: vec![split.slot_capacity() as u32],
    };
    assert!(split.move_slots(&outside).is_err());
}

#[test]
fn a_chain_commits_in_place() {
    let mut cache = small_cache(8);
    let seq = cache.create_sequence();
    append(&mut cache, seq, &(1..=10).collect::<Vec<u64>>()).unwrap();
    let stats = cache.commit(seq, &[0, 1, 2, 3, 4, 5]).unwrap();
    assert_eq!(
        stats,
        CommitStats {
            accepted: 6,
            blocks_remapped: 0,
            slots_copied: 0,
            blocks_freed: 1
        }
    );
}

#[test]
fn fork_shares_then_copies_on_write() {
    let mut cache = small_cache(8);
    let parent = cache.create_sequence();
    append(&mut cache, parent, &[1, 2, 3, 4, 5, 6]).unwrap();
    cache.commit(parent, &[0, 1, 2, 3, 4, 5]).unwrap();
    let child = cache.fork(parent).unwrap();
    assert_eq!(
        cache.block_table(child).unwrap(),
        cache.block_table(parent).unwrap()
    );
    assert_eq!(cache.allocator().used_blocks(), 2);
    assert_eq!(
        cache.blocks_needed(child, 1).unwrap(),
        1,
        "the shared half block is copied"
    );
    append(&mut cache, child, &[7]).unwrap();
    let (p, c) = (
        cache.block_table(parent).unwrap(),
        cache.block_table(child).unwrap(),
    );
    assert_eq!(p[0], c[0], "the full block stays shared");
    assert_ne!(p[1], c[1], "the written block was copied");
    assert_eq!(cache.allocator().ref_count(p[0]).unwrap(), 2);
    assert!(
        cache.fork(child).is_err(),
        "a sequence with pending slots is not forked"
    );
    assert_eq!(cache.pending(parent).unwrap(), 0);
}

#[test]
fn errors_are_reported_not_panics() {
    let mut cache = small_cache(2);
    let seq = cache.create_sequence();
    assert_eq!(
        cache.reserve(seq, 9),
        Err(KernelError::OutOfBlocks { needed: 3, free: 2 })
    );
    assert_eq!(cache.pending(seq).unwrap(), 0);
    cache.reserve(seq, 2).unwrap();
    assert!(matches!(
        cache.write_kv(seq, 0, 1, &[0.0; 8], &[0.0; 8]),
        Err(KernelError::OutOfRange { .. })
    ));
    assert!(matches!(
        cache.write_kv(seq, 2, 0, &[0.0; 4], &[0.0; 4]),
        Err(KernelError::OutOfRange { .. })
    ));
    assert!(matches!(
        cache.write_kv(seq, 0, 0, &[0.0; 3], &[0.0; 3]),
        Err(KernelError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        cache.write_kv(seq, 0, 0, &[0.0; 4], &[0.0; 8]),
        Err(KernelError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        cache.commit(seq, &[2]),
        Err(KernelError::InvalidAcceptedPath { entry: 0, .. })
    ));
    assert!(matches!(
        cache.rewind(seq, 1),
        Err(KernelError::RewindPastStart {
            requested: 1,
            len: 0,
            ..
        })
    ));
    assert!(matches!(
        cache.token_row(seq, 2, 0, KvPart::Key, 0),
        Err(KernelError::OutOfRange { .. })
    ));
    assert!(KvLayout::new(1, 0, 2, 4).is_err());
}
