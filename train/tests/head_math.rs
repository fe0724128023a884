//! The trainer's head math against the target runner: an EAGLE layer given the weights of the
//! target's last block (and `fc` passing the feature through) computes that block — RoPE
//! layout, GQA, QKV bias, norms and SwiGLU as the runner does them — and a Medusa head with
//! zero residual weights is the target's own LM head; with other weights it is
//! `n + silu(W·n + b)` computed by hand.

mod common;

use std::collections::BTreeMap;

use common::target;
use specdec_kernels::ops::rms_norm;
use specdec_kernels::TreeTopology;
use specdec_models::heads::{
    EagleShape, HeadFile, HeadKind, HeadMeta, HeadTensor, TrainingInfo, HEAD_FORMAT_VERSION,
};
use specdec_models::llama::{Architecture, LlamaModel, LlamaOptions, MatmulPath};
use specdec_models::LanguageModel;
use specdec_models::SequenceStep;
use specdec_train::{eagle_chain, medusa_logits, FrozenTarget};

const TOKENS: [u32; 7] = [5, 17, 42, 3, 9, 28, 61];

/// Max |a − b| relative to the largest |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// Features after blocks 0 and 1, and the logits, of `TOKENS` on the exact matmul path.
fn target_run(t: &FrozenTarget) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut model =
        LlamaModel::from_gguf(t.file(), LlamaOptions::with_matmul(MatmulPath::Exact)).unwrap();
    model.tap_features(&[0, 1]).unwrap();
    let seq = model.new_sequence().unwrap();
    let chain = TreeTopology::chain(TOKENS.len());
    let out = model
        .forward(&[SequenceStep::chain(seq, &TOKENS, &chain)])
        .unwrap();
    let f = out[0].features().unwrap();
    let h = t.config().hidden;
    let (mut b0, mut b1) = (Vec::new(), Vec::new());
    for i in 0..f.rows() {
        b0.extend_from_slice(&f.row(i)[..h]);
        b1.extend_from_slice(&f.row(i)[h..]);
    }
    (b0, b1, out[0].as_slice().to_vec())
}

fn meta(t: &FrozenTarget, kind: HeadKind) -> HeadMeta {
    HeadMeta {
        format_version: HEAD_FORMAT_VERSION,
        kind,
        target: t.identity().clone(),
        feature_blocks: vec![1],
        draft_vocab: t.config().vocab_size,
        eagle: (kind == HeadKind::Eagle)
            .then(|| EagleShape::for_target(t.config(), t.config().ffn)),
        medusa_heads: if kind == HeadKind::Medusa { 2 } else { 0 },
        training: TrainingInfo::default(),
    }
}

fn gguf_values(t: &FrozenTarget, name: &str) -> Vec<f32> {
    t.file().tensor(name).unwrap().to_f32_vec().unwrap()
}

#[test]
fn an_eagle_layer_with_the_last_blocks_weights_computes_that_block() {
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let t = target(arch, 7);
        let h = t.config().hidden;
        let (block0, block1, logits) = target_run(&t);
        let meta = meta(&t, HeadKind::Eagle);
        let d2t: Vec<u32> = (0..t.config().vocab_size as u32).collect();
        let mut tensors = BTreeMap::new();
        for (name, shape) in meta.tensor_shapes().unwrap() {
            let values = match name.as_str() {
                // x = fc · [embed; f] = f
                "fc" => (0..h)
                    .flat_map(|r| (0..2 * h).map(move |c| f32::from(c == h + r)))
                    .collect(),
                "lm_head" => t.lm_head_rows(&d2t).unwrap(),
                other => {
                    let gguf = match other {
                        "attn_norm" => "attn_norm.weight",
                        "ffn_norm" => "ffn_norm.weight",
                        "wq" => "attn_q.weight",
                        "wk" => "attn_k.weight",
                        "wv" => "attn_v.weight",
                        "bq" => "attn_q.bias",
                        "bk" => "attn_k.bias",
                        "bv" => "attn_v.bias",
                        "wo" => "attn_output.weight",
                        "w_gate" => "ffn_gate.weight",
                        "w_up" => "ffn_up.weight",
                        "w_down" => "ffn_down.weight",
                        _ => unreachable!("{other}"),
                    };
                    gguf_values(&t, &format!("blk.1.{gguf}"))
                }
            };
            tensors.insert(name, HeadTensor::new(shape, values).unwrap());
        }
        let head = HeadFile { meta, d2t, tensors };
        head.validate().unwrap();
        let out = eagle_chain(&head, &t, &block0, &TOKENS).unwrap();
        let (e_feat, e_logits) = (
            rel_err(&out.features, &block1),
            rel_err(&out.logits, &logits),
        );
        assert!(
            e_feat < 1e-4 && e_logits < 1e-4,
            "{arch:?}: features {e_feat}, logits {e_logits}"
        );
        // A wrong RoPE layout is caught: the test can fail.
        let mut wrong = head.clone();
        wrong.meta.eagle.as_mut().unwrap().rope_layout = match arch {
            Architecture::Llama => "half_split",
            Architecture::Qwen2 => "interleaved",
        }
        .into();
        let out = eagle_chain(&wrong, &t, &block0, &TOKENS).unwrap();
        assert!(
            rel_err(&out.features, &block1) > 1e-3,
            "{arch:?}: layout must matter"
        );
    }
}

#[test]
fn medusa_heads_are_the_residual_block_over_the_final_norm() {
    let t = target(Architecture::Qwen2, 7);
    let (h, vocab) = (t.config().hidden, t.config().vocab_size);
    let (_, block1, logits) = target_run(&t);
    let meta = meta(&t, HeadKind::Medusa);
    let d2t: Vec<u32> = (0..vocab as u32).collect();
    let lm_head = t.lm_head_rows(&d2t).unwrap();
    let w1: Vec<f32> = (0..h * h)
        .map(|i| ((i * 31 % 97) as f32 - 48.0) / 400.0)
        .collect();
    let b1: Vec<f32> = (0..h).map(|i| (i % 7) as f32 / 10.0 - 0.3).collect();
    let mut tensors = BTreeMap::new();
    for (name, shape) in meta.tensor_shapes().unwrap() {
        let values = match name.as_str() {
            "lm_head" => lm_head.clone(),
            "medusa.1.weight" => w1.clone(),
            "medusa.1.bias" => b1.clone(),
            _ => vec![0.0; shape.iter().product()],
        };
        tensors.insert(name, HeadTensor::new(shape, values).unwrap());
    }
    let head = HeadFile { meta, d2t, tensors };
    let out = medusa_logits(&head, &t, &block1).unwrap();
    assert_eq!(out.len(), 2);
    // Head 0 (zero residual) is the target's own next-token head.
    assert!(
        rel_err(&out[0], &logits) < 1e-4,
        "{}",
        rel_err(&out[0], &logits)
    );
    // Head 1 by hand.
    let mut want = Vec::new();
    for f in block1.chunks(h) {
        let mut n = vec![0.0; h];
        rms_norm(f, t.output_norm(), t.config().rms_eps, &mut n).unwrap();
        let hk: Vec<f32> = (0..h)
            .map(|r| {
                let z: f32 = (0..h).map(|c| w1[r * h + c] * n[c]).sum::<f32>() + b1[r];
                n[r] + z / (1.0 + (-z).exp())
            })
            .collect();
        want.extend(
            lm_head
                .chunks(h)
                .map(|row| row.iter().zip(&hk).map(|(a, b)| a * b).sum::<f32>()),
        );
    }
    assert!(
        rel_err(&out[1], &want) < 1e-4,
        "{}",
        rel_err(&out[1], &want)
    );
}

/// The trainer's forward equals the inference side's (`specdec_models::heads`) on the same head
/// file: EAGLE over a chain of pairs, with and without input norms, Medusa per feature (BF16
/// precision: the file's values, exact f32 products; the two differ only in summation order).
#[test]
fn the_trainers_forward_equals_the_inference_heads() {
    use specdec_models::heads::synthetic::{random_head, with_input_norms};
    use specdec_models::heads::{EagleHead, HeadOptions, HeadPrecision, HeadStep, MedusaHeads};
    for (arch, input_norms) in [
        (Architecture::Llama, false),
        (Architecture::Qwen2, false),
        (Architecture::Llama, true),
        (Architecture::Qwen2, true),
    ] {
        let t = target(arch, 7);
        let (_, features, _) = target_run(&t);
        let id = t.identity();
        let model = LlamaModel::from_gguf(t.file(), LlamaOptions::default()).unwrap();
        let mut eagle =
            random_head(HeadKind::Eagle, t.config(), &id.name, &id.sha256, 40, 3).unwrap();
        if input_norms {
            eagle = with_input_norms(eagle, 5).unwrap();
        }
        let mut inference = EagleHead::new(
            &eagle,
            &model,
            HeadOptions {
                precision: HeadPrecision::Bf16,
                ..HeadOptions::default()
            },
        )
        .unwrap();
        let seq = inference.new_sequence().unwrap();
        let chain = TreeTopology::chain(TOKENS.len());
        let theirs = inference
            .forward(&[HeadStep {
                seq,
                tokens: &TOKENS,
                features: &features,
                tree: &chain,
            }])
            .unwrap()
            .remove(0);
        let ours = eagle_chain(&eagle, &t, &features, &TOKENS).unwrap();
        let (e_feat, e_logits) = (
            rel_err(&ours.features, &theirs.features),
            rel_err(&ours.logits, &theirs.logits),
        );
        assert!(
            e_feat < 1e-4 && e_logits < 1e-4,
            "{arch:?} EAGLE (input norms {input_norms}): features {e_feat}, logits {e_logits}"
        );

        let medusa =
            random_head(HeadKind::Medusa, t.config(), &id.name, &id.sha256, 40, 4).unwrap();
        let heads = MedusaHeads::new(&medusa, &model, HeadPrecision::Bf16).unwrap();
        let rows = TOKENS.len();
        let theirs = heads.forward(&features, rows).unwrap();
        let ours = medusa_logits(&medusa, &t, &features).unwrap();
        let k_heads = heads.heads();
        for (k, ours_k) in ours.iter().enumerate() {
            let theirs_k: Vec<f32> = (0..rows)
                .flat_map(|r| {
                    let at = (r * k_heads + k) * 40;
                    theirs[at..at + 40].to_vec()
                })
                .collect();
            let e = rel_err(ours_k, &theirs_k);
            assert!(e < 1e-4, "{arch:?} Medusa head {k}: {e}");
        }
    }
}
