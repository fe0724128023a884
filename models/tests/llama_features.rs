//! Feature taps (`LanguageModel::tap_features`): the hidden states a forward hands back next to
//! the logits are batch-invariant bit for bit, change no logit, and a prefill returns the same
//! rows as a forward. On both synthetic architectures (no model file needed).

mod common;

use common::{bits, forward_one, small_options};
use specdec_kernels::TreeTopology;
use specdec_models::llama::synthetic::synthetic;
use specdec_models::llama::{Architecture, LlamaModel, MatmulPath};
use specdec_models::{LanguageModel, SequenceStep};

const PROMPT: [u32; 6] = [5, 17, 42, 3, 9, 28];

fn model(arch: Architecture) -> LlamaModel {
    LlamaModel::from_gguf(&synthetic(arch, 7), small_options(MatmulPath::Int8)).unwrap()
}

/// The features of `tokens` forwarded as one chain on a fresh sequence (committed).
fn chain_features(model: &mut LlamaModel, tokens: &[u32]) -> Vec<u32> {
    let seq = model.new_sequence().unwrap();
    let logits = forward_one(model, seq, tokens, &TreeTopology::chain(tokens.len()));
    bits(logits.features().expect("tapped").as_slice())
}

#[test]
fn tapping_changes_no_logit_and_costs_no_rows_when_off() {
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let mut plain = model(arch);
        let mut tapped = model(arch);
        tapped.tap_features(&[0, 1]).unwrap();
        assert_eq!(tapped.tapped_features(), &[0, 1]);
        let seq = plain.new_sequence().unwrap();
        let a = forward_one(&mut plain, seq, &PROMPT, &TreeTopology::chain(PROMPT.len()));
        let seq = tapped.new_sequence().unwrap();
        let b = forward_one(
            &mut tapped,
            seq,
            &PROMPT,
            &TreeTopology::chain(PROMPT.len()),
        );
        assert_eq!(
            bits(a.as_slice()),
            bits(b.as_slice()),
            "{arch:?}: logits moved"
        );
        assert!(a.features().is_none());
        let f = b.features().unwrap();
        assert_eq!((f.rows(), f.dim()), (PROMPT.len(), 2 * 256));
        // The two taps are different blocks' outputs.
        assert_ne!(bits(&f.row(0)[..256]), bits(&f.row(0)[256..]));
        // Taps off again: no features.
        tapped.tap_features(&[]).unwrap();
        let seq = tapped.new_sequence().unwrap();
        let c = forward_one(
            &mut tapped,
            seq,
            &PROMPT,
            &TreeTopology::chain(PROMPT.len()),
        );
        assert!(c.features().is_none());
    }
}

#[test]
fn features_are_identical_alone_in_chain_tree_and_batch() {
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let mut m = model(arch);
        m.tap_features(&[1]).unwrap();
        let last = PROMPT.len() - 1;
        let reference = chain_features(&mut m, &PROMPT);
        let row = |all: &[u32], i: usize| all[i * 256..(i + 1) * 256].to_vec();
        // Alone after the committed prefix, as the root of a tree.
        let seq = m.new_sequence().unwrap();
        let prefill = m.prefill(seq, &PROMPT[..last]).unwrap().expect("tapped");
        assert_eq!(
            bits(prefill.as_slice()),
            reference[..last * 256].to_vec(),
            "{arch:?}: prefill rows vs forward rows"
        );
        let tree = TreeTopology::from_parents(&[None, Some(0), Some(0), Some(1)]).unwrap();
        let in_tree = forward_one(&mut m, seq, &[PROMPT[last], 11, 12, 13], &tree);
        let tree_rows = bits(in_tree.features().unwrap().as_slice());
        assert_eq!(row(&tree_rows, 0), row(&reference, last), "{arch:?}: tree");
        // In a batch between two other sequences.
        let (a, b, c) = (
            m.new_sequence().unwrap(),
            m.new_sequence().unwrap(),
            m.new_sequence().unwrap(),
        );
        let chain = TreeTopology::chain(PROMPT.len());
        let short = TreeTopology::chain(2);
        let out = m
            .forward(&[
                SequenceStep::chain(a, &[1, 2], &short),
                SequenceStep::chain(b, &PROMPT, &chain),
                SequenceStep::chain(c, &[3, 4], &short),
            ])
            .unwrap();
        let batch_rows = bits(out[1].features().unwrap().as_slice());
        assert_eq!(batch_rows, reference, "{arch:?}: batch");
        assert_eq!(out[0].features().unwrap().rows(), 2);
    }
}

#[test]
fn a_tap_outside_the_blocks_is_refused() {
    let mut m = model(Architecture::Llama);
    let err = m.tap_features(&[1, 2]).unwrap_err().to_string();
    assert!(err.contains("block 2"), "{err}");
    assert!(m.tapped_features().is_empty());
}
