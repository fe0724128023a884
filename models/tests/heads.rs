//! Draft heads at inference ([`EagleHead`], [`MedusaHeads`]) on both synthetic targets: the
//! head's forward against an independent naive f64 reference written here from the head file
//! (the math the trainer must meet, `specdec_models::heads` module docs), batch invariance bit
//! for bit, commit and rewind, the 8-bit precision against BF16, and the refusals.

mod common;

use common::bits;
use specdec_kernels::quant::dequantize_row_to_vec;
use specdec_kernels::TreeTopology;
use specdec_models::heads::synthetic::random_head;
use specdec_models::heads::{
    DraftHead, EagleHead, HeadFile, HeadKind, HeadOptions, HeadOutput, HeadPrecision, HeadStep,
    MedusaHeads,
};
use specdec_models::llama::synthetic::synthetic;
use specdec_models::llama::{Architecture, LlamaModel, LlamaOptions, MatmulPath};
use specdec_models::{LanguageModel, SeqId};

const ARCHS: [Architecture; 2] = [Architecture::Llama, Architecture::Qwen2];
const PRECISIONS: [HeadPrecision; 3] = [
    HeadPrecision::Bf16,
    HeadPrecision::Int8,
    HeadPrecision::Int4,
];
/// The target's tokens: features of `PROMPT[j]` pair with `PROMPT[j + 1]`.
const PROMPT: [u32; 9] = [5, 17, 42, 3, 9, 28, 1, 2, 33];
const DRAFT_VOCAB: usize = 48;
const TARGET_NAME: &str = "synthetic.gguf";
const TARGET_SHA: &str = "5d41402abc4b2a76b9719d911017c592a1b2c3d4e5f60718293a4b5c6d7e8f90";

/// Bound on `max |head − reference| / max(1, max |reference|)` at [`HeadPrecision::Bf16`]: both
/// multiply the same bf16 weights; the head rounds every operation to f32 (products with 64
/// lanes of fused multiply-adds, online softmax), the reference computes in f64. Measured at
/// most 2.8e-7 (EAGLE, features and logits) and 2.0e-7 (Medusa) over both targets; bound 1e-5.
/// A RoPE mistake moves the logits by 6e-2 or more (a skipped position; asserted in
/// `eagle_matches_the_naive_reference_on_a_chain_then_a_tree`), numbering tree nodes by index
/// instead of depth by 7e-2.
const BF16_TOL: f64 = 1e-5;

/// Bound on the same relative gap between [`HeadPrecision::Int8`] and [`HeadPrecision::Bf16`]:
/// Q8_0 weights (each within half a step of 1/127 of its block's largest magnitude, plus the
/// f16 scale) and 8-bit activations per 32-block, through fc, one layer and the LM head.
/// Measured at most 1.4e-2 (EAGLE features), 1.5e-2 (EAGLE logits) and 9.1e-3 (Medusa logits)
/// over both targets; bound 5e-2.
const INT8_TOL: f64 = 5e-2;

/// Bound on the same gap for [`HeadPrecision::Int4`]: Q4_0 weights, each within half a step of
/// 1/8 of its block's largest magnitude (a whole step at the clamped extreme), sixteen times
/// coarser than Q8_0. Measured at most 1.2e-1 (EAGLE features), 1.7e-1 (EAGLE logits) and
/// 8.8e-2 (Medusa logits) over both targets; bound 0.5.
const INT4_TOL: f64 = 0.5;

/// The synthetic target of `arch`, tapping its last block (the heads' feature).
fn target(arch: Architecture) -> LlamaModel {
    let options = LlamaOptions {
        kv_capacity_tokens: 512,
        kv_block_size: 16,
        kv_dtype: specdec_kernels::kv::KvDtype::F32,
        matmul: MatmulPath::Int8,
    };
    let mut model = LlamaModel::from_gguf(&synthetic(arch, 7), options).unwrap();
    let last = model.config().n_layers - 1;
    model.tap_features(&[last]).unwrap();
    model
}

/// A synthetic head file of `kind` for `target`.
fn head_file(kind: HeadKind, target: &LlamaModel, seed: u64) -> HeadFile {
    random_head(
        kind,
        target.config(),
        TARGET_NAME,
        TARGET_SHA,
        DRAFT_VOCAB,
        seed,
    )
    .unwrap()
}

fn options(precision: HeadPrecision) -> HeadOptions {
    HeadOptions {
        precision,
        kv_capacity_tokens: 256,
        kv_block_size: 4,
        kv_dtype: specdec_kernels::kv::KvDtype::F32,
    }
}

fn eagle(target: &LlamaModel, precision: HeadPrecision) -> EagleHead {
    EagleHead::new(
        &head_file(HeadKind::Eagle, target, 11),
        target,
        options(precision),
    )
    .unwrap()
}

/// The synthetic target of `arch` and its features of `PROMPT` (one row per token, from a
/// prefill).
fn target_and_features(arch: Architecture) -> (LlamaModel, Vec<Vec<f32>>) {
    let mut target = target(arch);
    let seq = target.new_sequence().unwrap();
    let features = target.prefill(seq, &PROMPT).unwrap().expect("tapped");
    target.release(seq).unwrap();
    let rows = (0..features.rows())
        .map(|i| features.row(i).to_vec())
        .collect();
    (target, rows)
}

/// One head input: (feature row, the token after it).
type Pair = (Vec<f32>, u32);

/// The prompt's pairs (`f_j`, `t_{j+1}`), `j = 0..PROMPT.len() - 1`.
fn prompt_pairs(features: &[Vec<f32>]) -> Vec<Pair> {
    (0..PROMPT.len() - 1)
        .map(|j| (features[j].clone(), PROMPT[j + 1]))
        .collect()
}

/// The owned inputs of one [`HeadStep`].
struct StepInput {
    seq: SeqId,
    tokens: Vec<u32>,
    features: Vec<f32>,
    tree: TreeTopology,
}

impl StepInput {
    /// `pairs` on `seq`, shaped `tree` (a chain when `None`).
    fn new(seq: SeqId, pairs: &[Pair], tree: Option<&TreeTopology>) -> Self {
        Self {
            seq,
            tokens: pairs.iter().map(|p| p.1).collect(),
            features: pairs.iter().flat_map(|p| p.0.iter().copied()).collect(),
            tree: tree
                .cloned()
                .unwrap_or_else(|| TreeTopology::chain(pairs.len())),
        }
    }

    fn step(&self) -> HeadStep<'_> {
        HeadStep {
            seq: self.seq,
            tokens: &self.tokens,
            features: &self.features,
            tree: &self.tree,
        }
    }
}

/// One forward of the steps of `inputs`.
fn forward_batch(
    head: &mut EagleHead,
    inputs: &[StepInput],
) -> specdec_models::Result<Vec<HeadOutput>> {
    let steps: Vec<HeadStep<'_>> = inputs.iter().map(StepInput::step).collect();
    head.forward(&steps)
}

/// Forwards `pairs` as the only step of `seq`, shaped `tree` (a chain when `None`).
fn forward(
    head: &mut EagleHead,
    seq: SeqId,
    pairs: &[Pair],
    tree: Option<&TreeTopology>,
) -> HeadOutput {
    forward_batch(head, &[StepInput::new(seq, pairs, tree)])
        .unwrap()
        .remove(0)
}

/// Forwards `pairs` as a chain on `seq` and commits them all.
fn commit_chain(head: &mut EagleHead, seq: SeqId, pairs: &[Pair]) -> HeadOutput {
    let out = forward(head, seq, pairs, None);
    head.commit(seq, &(0..pairs.len()).collect::<Vec<_>>())
        .unwrap();
    out
}

/// Row `i` of `[rows, width]` values.
fn row<T>(values: &[T], width: usize, i: usize) -> &[T] {
    &values[i * width..(i + 1) * width]
}

/// `max |head − reference| / max(1, max |reference|)`.
fn gap(head: &[f32], reference: &[f64]) -> f64 {
    assert_eq!(head.len(), reference.len());
    let scale = reference.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let worst = head
        .iter()
        .zip(reference)
        .fold(0.0f64, |m, (&h, &r)| m.max((f64::from(h) - r).abs()));
    worst / scale
}

/// [`gap`] between two f32 outputs (`b` the reference).
fn gap32(a: &[f32], b: &[f32]) -> f64 {
    gap(a, &b.iter().map(|&v| f64::from(v)).collect::<Vec<_>>())
}

// ---------------------------------------------------------------------------------------------
// The naive reference: the module docs of `specdec_models::heads`, in f64, one pair at a time.
// ---------------------------------------------------------------------------------------------

/// A `[rows, cols]` matrix of the head file with every entry rounded to bfloat16 (the weights
/// [`HeadPrecision::Bf16`] multiplies), as f64.
struct Matrix {
    rows: usize,
    cols: usize,
    values: Vec<f64>,
}

impl Matrix {
    fn bf16(file: &HeadFile, name: &str) -> Self {
        let t = &file.tensors[name];
        Self {
            rows: t.shape[0],
            cols: t.shape[1],
            values: t
                .data
                .iter()
                .map(|&v| f64::from(half::bf16::from_f32(v).to_f32()))
                .collect(),
        }
    }

    /// `W · x`.
    fn apply(&self, x: &[f64]) -> Vec<f64> {
        assert_eq!(x.len(), self.cols);
        (0..self.rows)
            .map(|r| {
                let w = &self.values[r * self.cols..(r + 1) * self.cols];
                w.iter().zip(x).map(|(a, b)| a * b).sum()
            })
            .collect()
    }
}

/// A 1-D tensor of the head file, as stored.
fn vector(file: &HeadFile, name: &str) -> Vec<f64> {
    file.tensors[name]
        .data
        .iter()
        .map(|&v| f64::from(v))
        .collect()
}

fn to_f64(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&v| f64::from(v)).collect()
}

/// `v_i / sqrt(mean(v²) + eps) · g_i`.
fn rms_norm(v: &[f64], gain: &[f64], eps: f64) -> Vec<f64> {
    let mean_square = v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64;
    let scale = 1.0 / (mean_square + eps).sqrt();
    v.iter().zip(gain).map(|(x, g)| x * scale * g).collect()
}

fn silu(z: f64) -> f64 {
    z / (1.0 + (-z).exp())
}

/// `a + b` element-wise.
fn plus(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

/// Rotates one head in place for position `pos`: pair `i` by `pos · base^(−2i/d)`, the pair
/// being `(2i, 2i+1)` (`interleaved`) or `(i, i + d/2)` (`half_split`).
fn rope(head: &mut [f64], pos: usize, base: f64, layout: &str) {
    let d = head.len();
    for i in 0..d / 2 {
        let angle = pos as f64 * base.powf(-((2 * i) as f64) / d as f64);
        let (ia, ib) = match layout {
            "interleaved" => (2 * i, 2 * i + 1),
            "half_split" => (i, i + d / 2),
            other => panic!("unknown RoPE layout {other}"),
        };
        let (a, b) = (head[ia], head[ib]);
        head[ia] = a * angle.cos() - b * angle.sin();
        head[ib] = a * angle.sin() + b * angle.cos();
    }
}

/// The EAGLE head of a file, computed naively.
struct EagleReference {
    fc: Matrix,
    attn_norm: Vec<f64>,
    wq: Matrix,
    wk: Matrix,
    wv: Matrix,
    /// `(bq, bk, bv)` when the layer has QKV bias.
    bias: Option<(Vec<f64>, Vec<f64>, Vec<f64>)>,
    wo: Matrix,
    ffn_norm: Vec<f64>,
    w_gate: Matrix,
    w_up: Matrix,
    w_down: Matrix,
    lm_head: Matrix,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    rms_eps: f64,
    rope_base: f64,
    rope_layout: String,
    /// The target's token embedding, row per token, dequantised.
    embedding: Vec<Vec<f64>>,
    /// The target's final norm.
    output_norm: Vec<f64>,
    final_eps: f64,
}

impl EagleReference {
    fn new(file: &HeadFile, target: &LlamaModel) -> Self {
        let e = file.meta.eagle.as_ref().unwrap();
        let table = target.token_embedding();
        Self {
            fc: Matrix::bf16(file, "fc"),
            attn_norm: vector(file, "attn_norm"),
            wq: Matrix::bf16(file, "wq"),
            wk: Matrix::bf16(file, "wk"),
            wv: Matrix::bf16(file, "wv"),
            bias: e
                .qkv_bias
                .then(|| (vector(file, "bq"), vector(file, "bk"), vector(file, "bv"))),
            wo: Matrix::bf16(file, "wo"),
            ffn_norm: vector(file, "ffn_norm"),
            w_gate: Matrix::bf16(file, "w_gate"),
            w_up: Matrix::bf16(file, "w_up"),
            w_down: Matrix::bf16(file, "w_down"),
            lm_head: Matrix::bf16(file, "lm_head"),
            n_heads: e.n_heads,
            n_kv_heads: e.n_kv_heads,
            head_dim: e.head_dim,
            rms_eps: f64::from(e.rms_eps),
            rope_base: f64::from(e.rope_base),
            rope_layout: e.rope_layout.clone(),
            embedding: (0..table.rows())
                .map(|t| {
                    let values =
                        dequantize_row_to_vec(table.quant_type(), table.row(t), table.cols());
                    to_f64(&values.unwrap())
                })
                .collect(),
            output_norm: to_f64(target.output_norm()),
            final_eps: f64::from(target.config().rms_eps),
        }
    }

    /// `(f̂, logits)` of every pair of one sequence, pair `j` at position `positions[j]`, each
    /// attending to the pairs `0..=j`.
    fn run(&self, pairs: &[Pair], positions: &[usize]) -> Vec<(Vec<f64>, Vec<f64>)> {
        let d = self.head_dim;
        let group = self.n_heads / self.n_kv_heads;
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        let mut out = Vec::new();
        for ((feature, token), &pos) in pairs.iter().zip(positions) {
            // x = fc · [embed(token); feature]
            let mut input = self.embedding[*token as usize].clone();
            input.extend(to_f64(feature));
            let x = self.fc.apply(&input);
            // attention
            let a = rms_norm(&x, &self.attn_norm, self.rms_eps);
            let (mut q, mut k, mut v) = (self.wq.apply(&a), self.wk.apply(&a), self.wv.apply(&a));
            if let Some((bq, bk, bv)) = &self.bias {
                (q, k, v) = (plus(&q, bq), plus(&k, bk), plus(&v, bv));
            }
            for head in q.chunks_mut(d).chain(k.chunks_mut(d)) {
                rope(head, pos, self.rope_base, &self.rope_layout);
            }
            keys.push(k);
            values.push(v);
            let mut o = Vec::with_capacity(self.n_heads * d);
            for h in 0..self.n_heads {
                let kv = h / group;
                let qh = &q[h * d..(h + 1) * d];
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|k| {
                        let kh = &k[kv * d..(kv + 1) * d];
                        qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for i in 0..d {
                    o.push(
                        weights
                            .iter()
                            .zip(&values)
                            .map(|(w, v)| w * v[kv * d + i])
                            .sum::<f64>()
                            / total,
                    );
                }
            }
            let x = plus(&x, &self.wo.apply(&o));
            // SwiGLU
            let b = rms_norm(&x, &self.ffn_norm, self.rms_eps);
            let (gate, up) = (self.w_gate.apply(&b), self.w_up.apply(&b));
            let act: Vec<f64> = gate.iter().zip(&up).map(|(g, u)| silu(*g) * u).collect();
            let predicted = plus(&x, &self.w_down.apply(&act));
            // draft logits
            let normed = rms_norm(&predicted, &self.output_norm, self.final_eps);
            let logits = self.lm_head.apply(&normed);
            out.push((predicted, logits));
        }
        out
    }

    /// The outputs of the last of `pairs` (positions `0..pairs.len()`).
    fn last(&self, pairs: &[Pair]) -> (Vec<f64>, Vec<f64>) {
        let positions: Vec<usize> = (0..pairs.len()).collect();
        self.run(pairs, &positions).pop().unwrap()
    }
}

/// The Medusa heads of a file, computed naively: `[K]` logits rows for one feature.
fn medusa_reference(file: &HeadFile, target: &LlamaModel, feature: &[f32]) -> Vec<Vec<f64>> {
    let n = rms_norm(
        &to_f64(feature),
        &to_f64(target.output_norm()),
        f64::from(target.config().rms_eps),
    );
    let lm_head = Matrix::bf16(file, "lm_head");
    (0..file.meta.medusa_heads)
        .map(|k| {
            let w = Matrix::bf16(file, &format!("medusa.{k}.weight"));
            let b = vector(file, &format!("medusa.{k}.bias"));
            let projected = plus(&w.apply(&n), &b);
            let h: Vec<f64> = n
                .iter()
                .zip(&projected)
                .map(|(n, p)| n + silu(*p))
                .collect();
            lm_head.apply(&h)
        })
        .collect()
}

/// Asserts that the head's output for one node is the reference's within [`BF16_TOL`].
fn assert_close(head: (&[f32], &[f32]), reference: &(Vec<f64>, Vec<f64>), what: &str) -> f64 {
    let (features, logits) = (gap(head.0, &reference.0), gap(head.1, &reference.1));
    assert!(
        features <= BF16_TOL && logits <= BF16_TOL,
        "{what}: features gap {features:.2e}, logits gap {logits:.2e} (bound {BF16_TOL:e})"
    );
    features.max(logits)
}

// ---------------------------------------------------------------------------------------------

#[test]
fn eagle_matches_the_naive_reference_on_a_chain_then_a_tree() {
    for arch in ARCHS {
        let (target, features) = target_and_features(arch);
        let file = head_file(HeadKind::Eagle, &target, 11);
        let reference = EagleReference::new(&file, &target);
        let mut head = EagleHead::new(&file, &target, options(HeadPrecision::Bf16)).unwrap();
        let (hidden, vocab) = (head.hidden(), head.draft_vocab());
        assert_eq!((hidden, vocab, head.feature_dim()), (256, DRAFT_VOCAB, 256));
        assert_eq!((head.d2t(), head.meta()), (&file.d2t[..], &file.meta));

        // A chain of the prompt's 8 pairs.
        let pairs = prompt_pairs(&features);
        let seq = head.new_sequence().unwrap();
        let chain = commit_chain(&mut head, seq, &pairs);
        assert_eq!(head.seq_len(seq).unwrap(), pairs.len());
        let positions: Vec<usize> = (0..pairs.len()).collect();
        let expected = reference.run(&pairs, &positions);
        let mut worst = 0.0f64;
        for (j, want) in expected.iter().enumerate() {
            let got = (
                row(&chain.features, hidden, j),
                row(&chain.logits, vocab, j),
            );
            worst = worst.max(assert_close(got, want, &format!("{arch:?} chain pair {j}")));
        }
        // The bound is far below what a RoPE mistake costs: a skipped position, or the other
        // pairing of the dimensions.
        let skipped: Vec<usize> = (0..pairs.len()).map(|j| j + usize::from(j >= 4)).collect();
        let moved = reference.run(&pairs, &skipped);
        let swapped = EagleReference {
            rope_layout: match reference.rope_layout.as_str() {
                "interleaved" => "half_split".into(),
                _ => "interleaved".into(),
            },
            ..EagleReference::new(&file, &target)
        }
        .run(&pairs, &positions);
        for (wrong, what) in [
            (&moved, "a skipped position"),
            (&swapped, "the other RoPE layout"),
        ] {
            let last = pairs.len() - 1;
            let off = gap(row(&chain.logits, vocab, last), &wrong[last].1);
            eprintln!("{arch:?}: {what} moves the logits by {off:.2e}");
            assert!(
                off > 1e-2,
                "{arch:?}: {what} moves the logits by only {off:e}"
            );
        }

        // A tree after the committed chain, grown a depth at a time as a drafter does (each
        // forward feeds a node's predicted feature to its children).
        let root: Pair = (features[PROMPT.len() - 1].clone(), 11);
        let alone = forward(&mut head, seq, std::slice::from_ref(&root), None);
        let child = |parent: &HeadOutput, node: usize, token: u32| -> Pair {
            (row(&parent.features, hidden, node).to_vec(), token)
        };
        let (c1, c2) = (child(&alone, 0, 20), child(&alone, 0, 21));
        let two_levels = TreeTopology::from_parents(&[None, Some(0), Some(0)]).unwrap();
        let level2 = forward(
            &mut head,
            seq,
            &[root.clone(), c1.clone(), c2.clone()],
            Some(&two_levels),
        );
        let grandchild = child(&level2, 1, 22);
        let tree = TreeTopology::from_parents(&[None, Some(0), Some(0), Some(1)]).unwrap();
        let nodes = [root, c1, c2, grandchild];
        let out = forward(&mut head, seq, &nodes, Some(&tree));
        for node in 0..tree.len() {
            let mut path = pairs.clone();
            path.extend(tree.path_to(node).into_iter().map(|i| nodes[i].clone()));
            let got = (
                row(&out.features, hidden, node),
                row(&out.logits, vocab, node),
            );
            let what = format!("{arch:?} tree node {node}");
            worst = worst.max(assert_close(got, &reference.last(&path), &what));
        }
        eprintln!("{arch:?}: EAGLE BF16 vs reference, worst relative gap {worst:.2e}");
    }
}

#[test]
fn medusa_matches_the_naive_reference() {
    for arch in ARCHS {
        let (target, features) = target_and_features(arch);
        let file = head_file(HeadKind::Medusa, &target, 5);
        let medusa = MedusaHeads::new(&file, &target, HeadPrecision::Bf16).unwrap();
        let (k, vocab) = (medusa.heads(), medusa.draft_vocab());
        assert_eq!(
            (k, vocab, medusa.d2t(), medusa.hidden()),
            (3, DRAFT_VOCAB, &file.d2t[..], 256)
        );
        let flat: Vec<f32> = features.concat();
        let logits = medusa.forward(&flat, features.len()).unwrap();
        assert_eq!(logits.len(), features.len() * k * vocab);
        let mut worst = 0.0f64;
        for (r, feature) in features.iter().enumerate() {
            for (head, want) in medusa_reference(&file, &target, feature).iter().enumerate() {
                let got = row(&logits, vocab, r * k + head);
                let g = gap(got, want);
                assert!(g <= BF16_TOL, "{arch:?} row {r} head {head}: gap {g:.2e}");
                worst = worst.max(g);
            }
        }
        eprintln!("{arch:?}: Medusa BF16 vs reference, worst relative gap {worst:.2e}");
        assert!(medusa.forward(&[], 0).unwrap().is_empty());
    }
}

#[test]
fn eagle_outputs_are_bit_identical_alone_in_a_chain_a_tree_and_a_batch() {
    for arch in ARCHS {
        let (target, features) = target_and_features(arch);
        let pairs = prompt_pairs(&features);
        let last = pairs.len() - 1;
        for precision in PRECISIONS {
            let mut head = eagle(&target, precision);
            let (hidden, vocab) = (head.hidden(), head.draft_vocab());
            let what = format!("{arch:?} {precision:?}");
            let a = head.new_sequence().unwrap();
            let chain = forward(&mut head, a, &pairs, None);
            let chain_row = |i: usize| {
                (
                    bits(row(&chain.features, hidden, i)),
                    bits(row(&chain.logits, vocab, i)),
                )
            };
            let node_row = |out: &HeadOutput, i: usize| {
                (
                    bits(row(&out.features, hidden, i)),
                    bits(row(&out.logits, vocab, i)),
                )
            };

            // Alone: the prefix committed first.
            let b = head.new_sequence().unwrap();
            commit_chain(&mut head, b, &pairs[..last]);
            let alone = forward(&mut head, b, &pairs[last..], None);
            assert_eq!(
                node_row(&alone, 0),
                chain_row(last),
                "{what}: alone vs chain"
            );

            // In a tree, as its root; every node equals its path forwarded as a chain.
            let tree = TreeTopology::from_parents(&[None, Some(0), Some(0), Some(1)]).unwrap();
            let nodes = [
                pairs[last].clone(),
                (features[2].clone(), 30),
                (features[3].clone(), 31),
                (features[4].clone(), 32),
            ];
            let in_tree = forward(&mut head, b, &nodes, Some(&tree));
            assert_eq!(node_row(&in_tree, 0), chain_row(last), "{what}: tree root");
            for node in 1..tree.len() {
                let path: Vec<Pair> = tree
                    .path_to(node)
                    .into_iter()
                    .map(|i| nodes[i].clone())
                    .collect();
                let as_chain = forward(&mut head, b, &path, None);
                assert_eq!(
                    node_row(&in_tree, node),
                    node_row(&as_chain, path.len() - 1),
                    "{what}: tree node {node} vs its path as a chain"
                );
            }

            // In a batch, between two other sequences.
            let (c, d, e) = (
                head.new_sequence().unwrap(),
                head.new_sequence().unwrap(),
                head.new_sequence().unwrap(),
            );
            let other: Vec<Pair> = (0..3)
                .map(|i| (features[8 - i].clone(), 40 + i as u32))
                .collect();
            let outs = forward_batch(
                &mut head,
                &[
                    StepInput::new(c, &other, None),
                    StepInput::new(d, &pairs, None),
                    StepInput::new(e, &other[..2], None),
                ],
            )
            .unwrap();
            assert_eq!(outs.len(), 3);
            assert_eq!(
                (bits(&outs[1].features), bits(&outs[1].logits)),
                (bits(&chain.features), bits(&chain.logits)),
                "{what}: in a batch vs alone"
            );
            let c_alone = forward(&mut head, c, &other, None);
            assert_eq!(
                bits(&outs[0].logits),
                bits(&c_alone.logits),
                "{what}: neighbour"
            );
            assert_ne!(
                bits(&outs[0].logits[..vocab]),
                bits(&outs[1].logits[..vocab])
            );
            assert!(head.forward(&[]).unwrap().is_empty());
        }
    }
}

#[test]
fn commit_of_a_tree_path_equals_the_path_as_a_chain_and_rewind_undoes_it() {
    for arch in ARCHS {
        let (target, features) = target_and_features(arch);
        let pairs = prompt_pairs(&features);
        for precision in PRECISIONS {
            let mut head = eagle(&target, precision);
            let what = format!("{arch:?} {precision:?}");
            let (prefix, nodes) = (&pairs[..4], &pairs[4..]);
            let tree = TreeTopology::from_parents(&[None, Some(0), Some(0), Some(1)]).unwrap();
            let path = [0usize, 1, 3];
            let next: Pair = (features[8].clone(), 50);

            // Committed through a tree's path.
            let a = head.new_sequence().unwrap();
            commit_chain(&mut head, a, prefix);
            forward(&mut head, a, nodes, Some(&tree));
            head.commit(a, &path).unwrap();
            assert_eq!(head.seq_len(a).unwrap(), 7);
            let after_tree = forward(&mut head, a, std::slice::from_ref(&next), None);

            // Committed as a chain of the same pairs.
            let b = head.new_sequence().unwrap();
            commit_chain(&mut head, b, prefix);
            let on_path: Vec<Pair> = path.iter().map(|&i| nodes[i].clone()).collect();
            let path_chain = commit_chain(&mut head, b, &on_path);
            assert_eq!(head.seq_len(b).unwrap(), 7);
            let after_chain = forward(&mut head, b, std::slice::from_ref(&next), None);
            assert_eq!(
                bits(&after_tree.logits),
                bits(&after_chain.logits),
                "{what}: commit of a tree path vs the path as a chain"
            );
            assert_eq!(bits(&after_tree.features), bits(&after_chain.features));

            // Rewind two pairs, forward them again with the next one.
            head.rewind(a, 2).unwrap();
            assert_eq!(head.seq_len(a).unwrap(), 5);
            let mut again = on_path[1..].to_vec();
            again.push(next.clone());
            let redo = forward(&mut head, a, &again, None);
            let (hidden, vocab) = (head.hidden(), head.draft_vocab());
            assert_eq!(
                bits(row(&redo.logits, vocab, 2)),
                bits(&after_chain.logits),
                "{what}: rewind then re-forward"
            );
            assert_eq!(
                bits(&redo.features[..2 * hidden]),
                bits(&path_chain.features[hidden..]),
                "{what}: the re-forwarded pairs"
            );
            // An empty path keeps nothing; rewinding past the start is refused.
            head.commit(a, &[]).unwrap();
            assert_eq!(head.seq_len(a).unwrap(), 5);
            assert!(head.rewind(a, 6).is_err());
            assert_eq!(head.seq_len(a).unwrap(), 5);
            head.release(a).unwrap();
            assert!(head.seq_len(a).is_err());
        }
    }
}

#[test]
fn quantised_heads_are_close_to_bf16_and_finite() {
    for arch in ARCHS {
        let (target, features) = target_and_features(arch);
        let pairs = prompt_pairs(&features);
        let file = head_file(HeadKind::Medusa, &target, 5);
        let flat: Vec<f32> = features.concat();
        let eagle_run = |precision| {
            let mut head = eagle(&target, precision);
            let seq = head.new_sequence().unwrap();
            forward(&mut head, seq, &pairs, None)
        };
        let medusa_run = |precision| {
            MedusaHeads::new(&file, &target, precision)
                .unwrap()
                .forward(&flat, features.len())
                .unwrap()
        };
        let (eagle_exact, medusa_exact) = (
            eagle_run(HeadPrecision::Bf16),
            medusa_run(HeadPrecision::Bf16),
        );
        let mut logit_gaps = Vec::new();
        for (precision, tolerance) in [
            (HeadPrecision::Int8, INT8_TOL),
            (HeadPrecision::Int4, INT4_TOL),
        ] {
            let what = format!("{arch:?} {precision:?}");
            let fast = eagle_run(precision);
            assert!(
                fast.features
                    .iter()
                    .chain(&fast.logits)
                    .all(|v| v.is_finite()),
                "{what}"
            );
            let (f, l) = (
                gap32(&fast.features, &eagle_exact.features),
                gap32(&fast.logits, &eagle_exact.logits),
            );
            eprintln!("{what}: EAGLE gap to BF16: features {f:.2e}, logits {l:.2e}");
            assert!(f <= tolerance && l <= tolerance, "{what}: {f:e} {l:e}");
            assert!(l > 0.0, "{what}: the quantised path was not taken");
            logit_gaps.push(l);

            let fast = medusa_run(precision);
            assert!(fast.iter().all(|v| v.is_finite()), "{what}");
            let g = gap32(&fast, &medusa_exact);
            eprintln!("{what}: Medusa gap to BF16 {g:.2e}");
            assert!(g <= tolerance && g > 0.0, "{what}: {g:e}");
        }
        // 4-bit weights are coarser than 8-bit ones: a gap no larger would mean Q8_0 was used
        assert!(logit_gaps[1] > logit_gaps[0], "{arch:?}: {logit_gaps:?}");
    }
}

#[test]
fn medusa_rows_are_independent() {
    for arch in ARCHS {
        let (target, features) = target_and_features(arch);
        for precision in PRECISIONS {
            let medusa =
                MedusaHeads::new(&head_file(HeadKind::Medusa, &target, 5), &target, precision)
                    .unwrap();
            let width = medusa.heads() * medusa.draft_vocab();
            let all = medusa.forward(&features.concat(), features.len()).unwrap();
            for (r, feature) in features.iter().enumerate() {
                let alone = medusa.forward(feature, 1).unwrap();
                assert_eq!(
                    bits(&alone),
                    bits(row(&all, width, r)),
                    "{arch:?} {precision:?}: row {r} alone vs in a batch"
                );
            }
            let reversed: Vec<Vec<f32>> = features.iter().rev().cloned().collect();
            let backwards = medusa.forward(&reversed.concat(), features.len()).unwrap();
            assert_eq!(bits(row(&backwards, width, 0)), bits(row(&all, width, 8)));
            // the heads predict different things
            assert_ne!(
                bits(&all[..medusa.draft_vocab()]),
                bits(&all[medusa.draft_vocab()..width])
            );
        }
    }
}

/// Asserts that `result` is an error whose message holds every one of `needles`.
fn assert_refused<T: std::fmt::Debug>(result: specdec_models::Result<T>, needles: &[&str]) {
    let err = result.unwrap_err().to_string();
    for needle in needles {
        assert!(err.contains(needle), "`{needle}` is not in: {err}");
    }
}

#[test]
fn heads_for_another_target_or_of_the_other_kind_are_refused_naming_both() {
    let llama = target(Architecture::Llama);
    let qwen = target(Architecture::Qwen2);
    let (opts, bf16) = (options(HeadPrecision::Bf16), HeadPrecision::Bf16);
    let eagle_for = |t: &LlamaModel| head_file(HeadKind::Eagle, t, 1);
    let medusa_for = |t: &LlamaModel| head_file(HeadKind::Medusa, t, 1);

    // Another architecture (the same hidden size and vocabulary).
    assert_refused(
        EagleHead::new(&eagle_for(&qwen), &llama, opts),
        &["architecture qwen2", "architecture llama", TARGET_NAME],
    );
    assert_refused(
        MedusaHeads::new(&medusa_for(&llama), &qwen, bf16),
        &["architecture llama", "architecture qwen2"],
    );
    // Another hidden size, another vocabulary.
    let mut narrow = llama.config().clone();
    (narrow.hidden, narrow.n_heads, narrow.n_kv_heads) = (128, 2, 1);
    let file = random_head(HeadKind::Eagle, &narrow, "narrow.gguf", TARGET_SHA, 8, 1).unwrap();
    assert_refused(
        EagleHead::new(&file, &llama, opts),
        &["hidden size 128", "hidden size 256", "narrow.gguf"],
    );
    let mut wide = llama.config().clone();
    wide.vocab_size = 100;
    let file = random_head(HeadKind::Medusa, &wide, "wide.gguf", TARGET_SHA, 8, 1).unwrap();
    assert_refused(
        MedusaHeads::new(&file, &llama, HeadPrecision::Int8),
        &["vocabulary size 100", "vocabulary size 64"],
    );
    // The other kind of head file.
    assert_refused(
        EagleHead::new(&medusa_for(&llama), &llama, opts),
        &["medusa head file", "the kind asked for is eagle"],
    );
    assert_refused(
        MedusaHeads::new(&eagle_for(&llama), &llama, bf16),
        &["eagle head file", "the kind asked for is medusa"],
    );
    // An invalid file.
    let mut broken = eagle_for(&llama);
    broken.tensors.remove("wo");
    assert_refused(EagleHead::new(&broken, &llama, opts), &["`wo` is missing"]);
    // The matching ones are taken.
    assert!(EagleHead::new(&eagle_for(&llama), &llama, opts).is_ok());
    assert!(MedusaHeads::new(&medusa_for(&qwen), &qwen, bf16).is_ok());
}

#[test]
fn bad_steps_are_refused_naming_the_fault_and_change_nothing() {
    let llama = target(Architecture::Llama);
    let mut head = eagle(&llama, HeadPrecision::Bf16);
    let seq = head.new_sequence().unwrap();
    let committed: Vec<Pair> = (0..3).map(|i| (vec![0.1 * i as f32; 256], i)).collect();
    commit_chain(&mut head, seq, &committed);
    let feature = vec![0.5f32; head.feature_dim()];
    let input = |seq, tokens: &[u32], features: &[f32]| StepInput {
        seq,
        tokens: tokens.to_vec(),
        features: features.to_vec(),
        tree: TreeTopology::chain(1),
    };
    let mut nan = feature.clone();
    nan[7] = f32::NAN;
    let cases = [
        (
            vec![input(seq, &[3], &feature[1..])],
            "features: 255 values for 1 nodes of 256",
        ),
        (vec![input(seq, &[3], &nan)], "value 7 of node 0 is NaN"),
        (
            vec![input(seq, &[64], &feature)],
            "token id 64 is outside the vocabulary of 64",
        ),
        (
            vec![input(
                seq,
                &[3, 4],
                &[feature.clone(), feature.clone()].concat(),
            )],
            "2 tokens but the tree has 1 nodes",
        ),
        (
            vec![input(SeqId(999), &[3], &feature)],
            "unknown sequence 999",
        ),
        (
            vec![input(seq, &[3], &feature), input(seq, &[4], &feature)],
            "appears twice",
        ),
    ];
    let after = forward(&mut head, seq, &[(feature.clone(), 5)], None);
    for (inputs, fault) in &cases {
        assert_refused(forward_batch(&mut head, inputs), &[fault]);
        assert_eq!(
            head.seq_len(seq).unwrap(),
            3,
            "{fault}: nothing committed changed"
        );
    }
    // The committed pairs are intact: the same next forward.
    let again = forward(&mut head, seq, &[(feature.clone(), 5)], None);
    assert_eq!(bits(&again.logits), bits(&after.logits));
    // A commit path that is not one of the last tree; an unknown sequence.
    assert_refused(head.commit(seq, &[1]), &["not a root-to-node path"]);
    assert_refused(head.release(SeqId(999)), &["unknown sequence 999"]);
    assert_refused(head.rewind(seq, 4), &["rewind"]);

    // Medusa: a wrong feature length, a non-finite feature.
    let medusa = MedusaHeads::new(
        &head_file(HeadKind::Medusa, &llama, 1),
        &llama,
        HeadPrecision::Bf16,
    )
    .unwrap();
    assert_refused(
        medusa.forward(&feature, 2),
        &["256 values for 2 rows of 256"],
    );
    assert_refused(medusa.forward(&nan, 1), &["value 7 of row 0 is NaN"]);
}

/// A target that scales RoPE is refused by name: a head file carries the target's RoPE base and
/// layout but no scaling, so the head's angles would not be the target's.
#[test]
fn an_eagle_head_refuses_a_target_that_scales_rope() {
    use specdec_models::gguf::Value;
    use specdec_models::llama::synthetic::{synthetic_custom, SyntheticOptions};
    let options = SyntheticOptions {
        metadata: vec![
            ("llama.rope.scaling.type".to_string(), Value::from("linear")),
            ("llama.rope.scaling.factor".to_string(), Value::from(4.0f32)),
        ],
        ..SyntheticOptions::default()
    };
    let file = synthetic_custom(Architecture::Llama, 7, &options);
    let scaled = LlamaModel::from_gguf(&file, LlamaOptions::default()).unwrap();
    let head = head_file(HeadKind::Eagle, &scaled, 1);
    let err = match EagleHead::new(&head, &scaled, options_default()) {
        Ok(_) => panic!("a head for a scaled target was built"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("RoPE scaling") && err.contains("Linear"),
        "{err}"
    );
    // the same head shape on an unscaled target loads
    let plain = target(Architecture::Llama);
    assert!(EagleHead::new(
        &head_file(HeadKind::Eagle, &plain, 1),
        &plain,
        options_default()
    )
    .is_ok());
}

fn options_default() -> HeadOptions {
    options(HeadPrecision::Bf16)
}
