//! Batch invariance of the runner on a real model (SmolLM2-135M): a token's logits are
//! bit-identical alone, in a chain, in a tree, or in a batch of sequences, and a tree forward
//! equals forwarding each root-to-node path as a plain chain.

mod common;

use common::{
    assert_token_logits_invariant, assert_tree_rows_equal_chains, bits, forward_one, gguf, load,
};
use specdec_kernels::TreeTopology;
use specdec_models::{LanguageModel, SequenceStep};

const PROMPT: [u32; 6] = [1604, 3987, 46477, 24, 94, 727];
const OTHER: [u32; 4] = [19556, 905, 30, 198];

#[test]
fn tree_forward_equals_each_root_to_node_path() {
    let Some(file) = gguf("smollm2-135m") else {
        return;
    };
    let mut model = load(&file);
    let seq = model.new_sequence().unwrap();
    let prefix = &PROMPT[..4];
    forward_one(&mut model, seq, prefix, &TreeTopology::chain(4));
    model.commit(seq, &[0, 1, 2, 3]).unwrap();
    // Root = the next prompt token; a branching tree of 8 nodes, depth up to 3.
    let parents = [
        None,
        Some(0),
        Some(0),
        Some(1),
        Some(1),
        Some(2),
        Some(3),
        Some(0),
    ];
    let tokens = [PROMPT[4], PROMPT[5], 472, 198, 3805, 1004, 16390, 28];
    let tree = TreeTopology::from_parents(&parents).unwrap();
    assert_tree_rows_equal_chains(&mut model, seq, &tokens, &tree);
}

#[test]
fn token_logits_are_identical_alone_in_chain_tree_and_batch() {
    let Some(file) = gguf("smollm2-135m") else {
        return;
    };
    assert_token_logits_invariant(&mut load(&file), &PROMPT, [472, 198, 3805], &OTHER);
}

#[test]
fn commit_rewind_and_fork_keep_logits_exact() {
    let Some(file) = gguf("smollm2-135m") else {
        return;
    };
    let mut model = load(&file);
    let last = PROMPT.len() - 1;
    let a = model.new_sequence().unwrap();
    let full = forward_one(&mut model, a, &PROMPT, &TreeTopology::chain(PROMPT.len()));
    // Commit a tree path, then rewind it and take the real continuation.
    let b = model.new_sequence().unwrap();
    forward_one(&mut model, b, &PROMPT[..3], &TreeTopology::chain(3));
    model.commit(b, &[0, 1, 2]).unwrap();
    let tree = TreeTopology::from_parents(&[None, Some(0), Some(0), Some(2)]).unwrap();
    forward_one(&mut model, b, &[PROMPT[3], 11, PROMPT[4], PROMPT[5]], &tree);
    model.commit(b, &[0, 2, 3]).unwrap();
    assert_eq!(model.seq_len(b).unwrap(), PROMPT.len());
    model.rewind(b, 1).unwrap();
    let again = forward_one(&mut model, b, &PROMPT[last..], &TreeTopology::chain(1));
    assert_eq!(
        bits(again.row(0)),
        bits(full.row(last)),
        "after commit of a tree path + rewind"
    );
    // A fork shares the committed prefix.
    model.rewind(b, 0).unwrap();
    let f = model.fork(b).unwrap();
    let forked = forward_one(&mut model, f, &PROMPT[last..], &TreeTopology::chain(1));
    assert_eq!(bits(forked.row(0)), bits(full.row(last)), "forked sequence");
    // Bad commit paths and steps are refused with the reason.
    let err = model.commit(f, &[1]).unwrap_err().to_string();
    assert!(err.contains("root-to-node"), "{err}");
    let err = model
        .forward(&[SequenceStep {
            seq: f,
            tokens: &[70_000],
            tree: &TreeTopology::chain(1),
        }])
        .unwrap_err()
        .to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
}
