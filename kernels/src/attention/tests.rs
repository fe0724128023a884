//! Tree attention against a dense f64 reference with an explicit mask, and exact batch-invariance
//! checks (a node's output is bit-identical alone, in a chain, in a tree and in a batch).

use proptest::prelude::*;

use super::*;
use crate::error::KernelError;
use crate::kv::{BlockId, KvLayout, KvPages, KvPart, PagedKvCache};
use crate::quant::SimdLevel;
use crate::tree::TreeTopology;

/// The layer attention reads; the other layer of the pool is NaN, so a mis-indexed read shows.
const LAYER: usize = 1;

/// splitmix64: a small deterministic generator for test data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn vec(&mut self, n: usize, amplitude: f32) -> Vec<f32> {
        (0..n).map(|_| self.unit() * amplitude).collect()
    }
}

/// Logical K/V of one sequence for one layer: `[pos][kv_head][dim]`, positions
/// `0..prefix_len + n` (new node `i` at `prefix_len + i`).
#[derive(Clone)]
struct Logical {
    kv_heads: usize,
    dim: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl Logical {
    fn random(rng: &mut Rng, tokens: usize, kv_heads: usize, dim: usize) -> Self {
        Self {
            kv_heads,
            dim,
            keys: rng.vec(tokens * kv_heads * dim, 1.0),
            values: rng.vec(tokens * kv_heads * dim, 1.0),
        }
    }
    fn tokens(&self) -> usize {
        self.keys.len() / (self.kv_heads * self.dim)
    }
    fn row(&self, part: KvPart, pos: usize, head: usize) -> &[f32] {
        let at = (pos * self.kv_heads + head) * self.dim;
        let buf = if part == KvPart::Key {
            &self.keys
        } else {
            &self.values
        };
        &buf[at..at + self.dim]
    }
    /// The positions `positions` of `self`, in that order, as a new sequence.
    fn select(&self, positions: &[usize]) -> Self {
        let mut out = Self {
            kv_heads: self.kv_heads,
            dim: self.dim,
            keys: Vec::new(),
            values: Vec::new(),
        };
        for &pos in positions {
            for head in 0..self.kv_heads {
                out.keys.extend_from_slice(self.row(KvPart::Key, pos, head));
                out.values
                    .extend_from_slice(self.row(KvPart::Value, pos, head));
            }
        }
        out
    }
}

/// A pool (two layers; layer 0 and unused blocks NaN) holding `seqs` in shuffled blocks.
struct Pool {
    layout: KvLayout,
    data: Vec<f32>,
    tables: Vec<Vec<BlockId>>,
}

fn scatter(seqs: &[&Logical], block_size: usize, rng: &mut Rng) -> Pool {
    let (kv_heads, dim) = (seqs[0].kv_heads, seqs[0].dim);
    let layout = KvLayout::new(2, kv_heads, dim, block_size).unwrap();
    let needed: usize = seqs.iter().map(|s| layout.blocks_for(s.tokens())).sum();
    let num_blocks = needed + 3;
    let mut ids: Vec<BlockId> = (0..num_blocks as BlockId).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.below(i + 1));
    }
    let mut data = vec![f32::NAN; num_blocks * layout.block_elems()];
    let mut tables = Vec::new();
    let mut next = 0;
    for seq in seqs {
        let table: Vec<BlockId> = ids[next..next + layout.blocks_for(seq.tokens())].to_vec();
        next += table.len();
        for pos in 0..seq.tokens() {
            for head in 0..kv_heads {
                for part in [KvPart::Key, KvPart::Value] {
                    let at = layout.row_offset(
                        table[pos / block_size],
                        LAYER,
                        part,
                        head,
                        pos % block_size,
                    );
                    data[at..at + dim].copy_from_slice(seq.row(part, pos, head));
                }
            }
        }
        tables.push(table);
    }
    Pool {
        layout,
        data,
        tables,
    }
}

/// One sequence of a test batch.
#[derive(Clone)]
struct Case {
    kv: Logical,
    prefix_len: usize,
    tree: TreeTopology,
    queries: Vec<f32>,
}

fn random_tree(rng: &mut Rng, n: usize, shape: usize) -> TreeTopology {
    let parents: Vec<Option<usize>> = (0..n)
        .map(|i| {
            (i > 0).then(|| match shape {
                0 => i - 1,                       // chain
                1 => rng.below(i.min(3)),         // wide: children of the first nodes
                2 => i - 1 - rng.below(i.min(2)), // deep, with a few forks
                _ => rng.below(i),                // anything
            })
        })
        .collect();
    TreeTopology::from_parents(&parents).unwrap()
}

fn random_case(
    rng: &mut Rng,
    prefix_len: usize,
    tree: TreeTopology,
    kv_heads: usize,
    nq: usize,
    dim: usize,
) -> Case {
    let kv = Logical::random(rng, prefix_len + tree.len(), kv_heads, dim);
    // Amplitude 3 gives peaked softmaxes as well as flat ones.
    let queries = rng.vec(tree.len() * nq * dim, 3.0);
    Case {
        kv,
        prefix_len,
        tree,
        queries,
    }
}

fn params(nq: usize, dim: usize) -> AttentionParams {
    AttentionParams {
        layer: LAYER,
        num_q_heads: nq,
        scale: 1.0 / (dim as f32).sqrt(),
    }
}

/// Runs the kernel over `cases` laid out in shuffled blocks of `block_size`.
fn run(cases: &[&Case], nq: usize, block_size: usize, rng: &mut Rng) -> Vec<f32> {
    let logical: Vec<&Logical> = cases.iter().map(|c| &c.kv).collect();
    let pool = scatter(&logical, block_size, rng);
    let pages = KvPages::new(pool.layout, &pool.data).unwrap();
    attend(&pages, &pool.tables, cases, nq)
}

/// The kernel over `cases` whose K/V `pages` holds at blocks `tables`.
fn attend(pages: &KvPages<'_>, tables: &[Vec<BlockId>], cases: &[&Case], nq: usize) -> Vec<f32> {
    attend_at(SimdLevel::detect(), pages, tables, cases, nq)
}

/// [`attend`] with the inner loops at `level`.
fn attend_at(
    level: SimdLevel,
    pages: &KvPages<'_>,
    tables: &[Vec<BlockId>],
    cases: &[&Case],
    nq: usize,
) -> Vec<f32> {
    let batch: Vec<AttentionSeq<'_>> = cases
        .iter()
        .zip(tables)
        .map(|(c, table)| AttentionSeq {
            queries: &c.queries,
            block_table: table,
            prefix_len: c.prefix_len,
            tree: &c.tree,
        })
        .collect();
    let total = batch.iter().map(|s| s.queries.len()).sum();
    let mut out = vec![0.0; total];
    tree_attention_into_with(pages, &params(nq, cases[0].kv.dim), &batch, &mut out, level).unwrap();
    out
}

/// Dense f64 attention with an explicit `n × n` mask built by walking parents.
fn reference(case: &Case, nq: usize) -> Vec<f64> {
    let (dim, n, prefix) = (case.kv.dim, case.tree.len(), case.prefix_len);
    let group = nq / case.kv.kv_heads;
    let mut mask = vec![false; n * n];
    for i in 0..n {
        let mut cur = Some(i);
        while let Some(j) = cur {
            mask[i * n + j] = true;
            cur = case.tree.parents()[j];
        }
    }
    let scale = 1.0 / (dim as f64).sqrt();
    let mut out = Vec::with_capacity(n * nq * dim);
    for i in 0..n {
        let visible: Vec<usize> = (0..prefix)
            .chain((0..n).filter(|&j| mask[i * n + j]).map(|j| prefix + j))
            .collect();
        for h in 0..nq {
            let q = &case.queries[(i * nq + h) * dim..(i * nq + h + 1) * dim];
            let scores: Vec<f64> = visible
                .iter()
                .map(|&p| {
                    let k = case.kv.row(KvPart::Key, p, h / group);
                    q.iter()
                        .zip(k)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for d in 0..dim {
                let v: f64 = visible
                    .iter()
                    .zip(&weights)
                    .map(|(&p, w)| w * case.kv.row(KvPart::Value, p, h / group)[d] as f64)
                    .sum();
                out.push(v / total);
            }
        }
    }
    out
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (*g as f64 - w).abs() <= 2e-5 + 1e-5 * w.abs(),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20))]
    /// Ragged batches over shuffled blocks match the dense reference, and each sequence's output
    /// is bit-identical alone and in the batch.
    #[test]
    fn ragged_batches_match_dense_reference(
        seed in any::<u64>(),
        dim in prop::sample::select(vec![64usize, 128]),
        kv_heads in 1..=2usize,
        group in prop::sample::select(vec![1usize, 3]),
        block_size in prop::sample::select(vec![1usize, 3, 16]),
        seqs in prop::collection::vec((0..150usize, 1..80usize, 0..4usize), 1..=3),
    ) {
        let mut rng = Rng(seed);
        let nq = kv_heads * group;
        let cases: Vec<Case> = seqs
            .iter()
            .map(|&(prefix, n, shape)| {
                let tree = random_tree(&mut rng, n, shape);
                random_case(&mut rng, prefix, tree, kv_heads, nq, dim)
            })
            .collect();
        let refs: Vec<&Case> = cases.iter().collect();
        let batched = run(&refs, nq, block_size, &mut rng);
        let mut at = 0;
        for (index, case) in cases.iter().enumerate() {
            let len = case.tree.len() * nq * dim;
            let mine = &batched[at..at + len];
            at += len;
            assert_close(mine, &reference(case, nq), &format!("sequence {index}"));
            let alone = run(&[case], nq, block_size, &mut rng);
            prop_assert!(alone == mine, "sequence {} differs alone and in a batch", index);
        }
    }
}

#[test]
fn page_and_chunk_boundaries_match_reference() {
    let mut rng = Rng(7);
    for prefix in [0usize, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129] {
        for n in [1usize, 2, 64, 65] {
            let tree = random_tree(&mut rng, n, 3);
            let case = random_case(&mut rng, prefix, tree, 2, 4, 64);
            let got = run(&[&case], 4, 16, &mut rng);
            assert_close(
                &got,
                &reference(&case, 4),
                &format!("prefix {prefix}, {n} nodes"),
            );
        }
    }
}

/// Every node of a tree gets exactly the bits of (a) the last token of a causal chain made of
/// its root-to-node path and (b) a single new token whose path so far is committed prefix — with
/// other block sizes and other physical blocks each time.
#[test]
fn each_node_equals_causal_attention_over_its_path() {
    let mut rng = Rng(11);
    let (kv_heads, nq, dim) = (2, 12, 128);
    for (prefix, n, shape) in [
        (100usize, 70usize, 3usize),
        (37, 20, 1),
        (64, 90, 2),
        (0, 5, 3),
        (130, 1, 0),
    ] {
        let tree = random_tree(&mut rng, n, shape);
        let case = random_case(&mut rng, prefix, tree.clone(), kv_heads, nq, dim);
        let whole = run(&[&case], nq, 5, &mut rng);
        let row = nq * dim;
        for node in 0..n {
            let path = tree.path_to(node);
            let want = &whole[node * row..(node + 1) * row];
            let positions: Vec<usize> = (0..prefix)
                .chain(path.iter().map(|&p| prefix + p))
                .collect();
            let queries: Vec<f32> = path
                .iter()
                .flat_map(|&p| case.queries[p * row..(p + 1) * row].iter().copied())
                .collect();
            let chain = Case {
                kv: case.kv.select(&positions),
                prefix_len: prefix,
                tree: TreeTopology::chain(path.len()),
                queries: queries.clone(),
            };
            let got = run(&[&chain], nq, 16, &mut rng);
            assert!(
                got[(path.len() - 1) * row..] == *want,
                "node {node}: chain differs"
            );
            let alone = Case {
                kv: chain.kv.clone(),
                prefix_len: prefix + path.len() - 1,
                tree: TreeTopology::chain(1),
                queries: queries[(path.len() - 1) * row..].to_vec(),
            };
            let got = run(&[&alone], nq, 3, &mut rng);
            assert!(got == *want, "node {node}: alone differs");
        }
    }
}

/// The same property through the real cache: attend a tree, commit a path (slots copied), and
/// the path's leaf attended alone as the next step's single new token gives the same bits.
#[test]
fn committed_path_reproduces_tree_outputs() {
    let mut rng = Rng(5);
    let (kv_heads, nq, dim, bs) = (2, 4, 64, 4);
    let layout = KvLayout::new(2, kv_heads, dim, bs).unwrap();
    let mut cache = PagedKvCache::new(layout, 64).unwrap();
    let seq = cache.create_sequence();
    let prefix = 9;
    let tree =
        TreeTopology::from_parents(&[None, Some(0), Some(0), Some(2), Some(1), Some(3), Some(5)])
            .unwrap();
    let case = random_case(&mut rng, prefix, tree.clone(), kv_heads, nq, dim);
    let write = |cache: &mut PagedKvCache, positions: &[usize]| {
        let first = cache.reserve(seq, positions.len()).unwrap();
        let part = case.kv.select(positions);
        for layer in 0..2 {
            cache
                .write_kv(seq, layer, first, &part.keys, &part.values)
                .unwrap();
        }
    };
    write(&mut cache, &(0..prefix).collect::<Vec<_>>());
    cache.commit(seq, &(0..prefix).collect::<Vec<_>>()).unwrap();
    write(
        &mut cache,
        &(prefix..prefix + tree.len()).collect::<Vec<_>>(),
    );
    let attend = |cache: &PagedKvCache, tree: &TreeTopology, queries: &[f32]| {
        let batch = [AttentionSeq {
            queries,
            block_table: cache.block_table(seq).unwrap(),
            prefix_len: cache.len(seq).unwrap(),
            tree,
        }];
        tree_attention(&cache.pages(), &params(nq, dim), &batch).unwrap()
    };
    let whole = attend(&cache, &tree, &case.queries);
    let path = tree.path_to(6);
    assert_eq!(path, [0, 2, 3, 5, 6]);
    let stats = cache.commit(seq, &path).unwrap();
    assert!(stats.slots_copied > 0);
    cache.rewind(seq, 1).unwrap(); // the leaf becomes the next step's new token
    write(&mut cache, &[prefix + 6]);
    let row = nq * dim;
    let single = TreeTopology::chain(1);
    let got = attend(&cache, &single, &case.queries[6 * row..7 * row]);
    assert!(got == whole[6 * row..7 * row], "leaf differs after commit");
}

#[test]
fn bad_inputs_are_errors() {
    let mut rng = Rng(3);
    let case = random_case(&mut rng, 10, TreeTopology::chain(3), 2, 4, 64);
    let pool = scatter(&[&case.kv], 4, &mut rng);
    let pages = KvPages::new(pool.layout, &pool.data).unwrap();
    let seq = AttentionSeq {
        queries: &case.queries,
        block_table: &pool.tables[0],
        prefix_len: 10,
        tree: &case.tree,
    };
    let good = params(4, 64);
    assert!(tree_attention(&pages, &good, &[seq]).is_ok());
    let bad_heads = AttentionParams {
        num_q_heads: 3,
        ..good
    };
    assert!(matches!(
        tree_attention(&pages, &bad_heads, &[seq]),
        Err(KernelError::InvalidConfig { .. })
    ));
    let bad_layer = AttentionParams { layer: 2, ..good };
    assert!(matches!(
        tree_attention(&pages, &bad_layer, &[seq]),
        Err(KernelError::OutOfRange { .. })
    ));
    let short_queries = AttentionSeq {
        queries: &case.queries[1..],
        ..seq
    };
    assert!(matches!(
        tree_attention(&pages, &good, &[short_queries]),
        Err(KernelError::ShapeMismatch { .. })
    ));
    let short_table = AttentionSeq {
        block_table: &pool.tables[0][..3],
        ..seq
    };
    assert!(matches!(
        tree_attention(&pages, &good, &[short_table]),
        Err(KernelError::ShapeMismatch { .. })
    ));
    let foreign = vec![99; 4];
    let foreign_table = AttentionSeq {
        block_table: &foreign,
        ..seq
    };
    assert!(matches!(
        tree_attention(&pages, &good, &[foreign_table]),
        Err(KernelError::OutOfRange { index: 99, .. })
    ));
    let mut out = vec![0.0; 5];
    assert!(matches!(
        tree_attention_into(&pages, &good, &[seq], &mut out),
        Err(KernelError::ShapeMismatch { .. })
    ));
    assert_eq!(
        tree_attention(&pages, &good, &[]).unwrap(),
        Vec::<f32>::new()
    );
}

/// A bf16 or f16 pool gives, bit for bit, the f32 results of its rounded values (attention
/// widens each row exactly, then runs the f32 arithmetic), so it inherits batch invariance.
#[test]
fn a_16_bit_pool_gives_the_f32_results_of_its_rounded_values() {
    use crate::kv::{KvData, KvDtype};
    use crate::quant::float16::{f32_to_bf16, f32_to_f16};
    let mut rng = Rng(23);
    let (nq, kv_heads, dim) = (4, 2, 64);
    let cases: Vec<Case> = [
        (0usize, 5usize, 0usize),
        (130, 9, 3),
        (64, 1, 0),
        (200, 17, 1),
    ]
    .iter()
    .map(|&(prefix, n, shape)| {
        let tree = random_tree(&mut rng, n, shape);
        random_case(&mut rng, prefix, tree, kv_heads, nq, dim)
    })
    .collect();
    for (dtype, to_bits) in [
        (KvDtype::Bf16, f32_to_bf16 as fn(f32) -> u16),
        (KvDtype::F16, f32_to_f16),
    ] {
        let rounded: Vec<Case> = cases
            .iter()
            .map(|c| {
                let mut c = c.clone();
                for v in c.kv.keys.iter_mut().chain(c.kv.values.iter_mut()) {
                    *v = dtype.round(*v);
                }
                c
            })
            .collect();
        let refs: Vec<&Case> = rounded.iter().collect();
        let logical: Vec<&Logical> = refs.iter().map(|c| &c.kv).collect();
        let pool = scatter(&logical, 16, &mut rng);
        let f32_pages = KvPages::new(pool.layout, &pool.data).unwrap();
        let want = attend(&f32_pages, &pool.tables, &refs, nq);
        // the same pool stored in 16 bits (the unrounded values round to the same bits)
        let bits: Vec<u16> = pool.data.iter().map(|&v| to_bits(v)).collect();
        let pages = KvPages::of(pool.layout, KvData::Half(dtype, &bits)).unwrap();
        assert_eq!(pages.dtype(), dtype);
        let got = attend(&pages, &pool.tables, &refs, nq);
        assert!(
            got.iter()
                .map(|v| v.to_bits())
                .eq(want.iter().map(|v| v.to_bits())),
            "{dtype}: 16-bit pool differs from f32 over rounded values"
        );
        // alone as in the batch
        let last = refs.len() - 1;
        let alone = attend(&pages, &pool.tables[last..], &refs[last..], nq);
        assert_eq!(alone[..], got[got.len() - alone.len()..], "{dtype}");
        // and close to the unrounded f32 reference
        let mut at = 0;
        for case in &cases {
            let len = case.tree.len() * nq * dim;
            let worst = got[at..at + len]
                .iter()
                .zip(reference(case, nq))
                .map(|(g, w)| (f64::from(*g) - w).abs())
                .fold(0.0, f64::max);
            assert!(worst < 0.05, "{dtype}: {worst}");
            at += len;
        }
    }
}

/// The task split changes with the thread count (`row_tile`), the results do not: a batch of
/// three KV heads (SmolLM2's shape, where the split shrinks its tiles) gives the same bits on
/// one, two and three threads.
#[test]
fn results_do_not_depend_on_the_threads_or_the_task_split() {
    let mut rng = Rng(29);
    let cases: Vec<Case> = [(300usize, 1usize), (40, 4), (7, 9)]
        .iter()
        .map(|&(prefix, n)| {
            let tree = random_tree(&mut rng, n, 2);
            random_case(&mut rng, prefix, tree, 3, 9, 64)
        })
        .collect();
    let refs: Vec<&Case> = cases.iter().collect();
    let logical: Vec<&Logical> = refs.iter().map(|c| &c.kv).collect();
    let pool = scatter(&logical, 16, &mut rng);
    let pages = KvPages::new(pool.layout, &pool.data).unwrap();
    let on = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| attend(&pages, &pool.tables, &refs, 9))
    };
    let one = on(1);
    for threads in [2, 3] {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&on(threads)), bits(&one), "{threads} threads");
    }
}

#[test]
fn the_row_tile_shrinks_only_for_batches_the_threads_would_share_unevenly() {
    // two KV heads of 7 rows on two threads: already even
    assert_eq!(cpu::row_tile([7].into_iter(), 2, 2), cpu::ROW_TILE);
    // SmolLM2's decode step: 3 KV heads of 3 rows, 9 rows, on two threads
    assert_eq!(cpu::row_tile([3].into_iter(), 3, 2), 2);
    // never zero, never above cpu::ROW_TILE
    assert_eq!(cpu::row_tile([0].into_iter(), 3, 2), cpu::ROW_TILE);
    assert_eq!(cpu::row_tile([1].into_iter(), 1, 64), 1);
    assert_eq!(cpu::row_tile([1].into_iter(), 3, 64), 1);
    assert_eq!(cpu::row_tile([1000].into_iter(), 3, 2), cpu::ROW_TILE);
}

/// Every instruction set this CPU has gives the portable code's bits: head dims that fill whole
/// 32-lane blocks (64: SmolLM2; 128: Qwen2.5; 96: a span of 64 then 32) and one that does not
/// (40), chains and trees, prefixes across chunk boundaries.
#[test]
fn every_simd_level_gives_the_portable_bits() {
    let levels: Vec<SimdLevel> = [SimdLevel::Avx2, SimdLevel::Avx512]
        .into_iter()
        .filter(|l| l.is_available())
        .collect();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut rng = Rng(31);
    for (dim, kv_heads, nq) in [
        (64usize, 3usize, 9usize),
        (128, 2, 12),
        (96, 1, 2),
        (40, 2, 4),
    ] {
        let cases: Vec<Case> = [(300usize, 1usize), (65, 5), (7, 9)]
            .iter()
            .map(|&(prefix, n)| {
                let tree = random_tree(&mut rng, n, 2);
                random_case(&mut rng, prefix, tree, kv_heads, nq, dim)
            })
            .collect();
        let refs: Vec<&Case> = cases.iter().collect();
        let logical: Vec<&Logical> = refs.iter().map(|c| &c.kv).collect();
        let pool = scatter(&logical, 16, &mut rng);
        let pages = KvPages::new(pool.layout, &pool.data).unwrap();
        let portable = attend_at(SimdLevel::Portable, &pages, &pool.tables, &refs, nq);
        for &level in &levels {
            let got = attend_at(level, &pages, &pool.tables, &refs, nq);
            assert_eq!(bits(&got), bits(&portable), "{level:?}, head dim {dim}");
        }
    }
}
