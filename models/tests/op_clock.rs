//! The op clock through the `LanguageModel` trait (`set_op_clock`, `take_op_times`): what a run
//! records per target forward. On a synthetic model (no model file needed).

mod common;

use common::{bits, forward_one, small_options};
use specdec_kernels::TreeTopology;
use specdec_models::llama::synthetic::synthetic;
use specdec_models::llama::{Architecture, LlamaModel, MatmulPath};
use specdec_models::toy::{ToyLanguageModel, ToyModel};
use specdec_models::LanguageModel;

#[test]
fn a_timed_forward_hands_over_its_ops_once_and_changes_no_logit() {
    let load = || {
        LlamaModel::from_gguf(
            &synthetic(Architecture::Qwen2, 7),
            small_options(MatmulPath::Int8),
        )
        .unwrap()
    };
    let (mut plain, mut timed) = (load(), load());
    assert!(timed.set_op_clock(true));
    assert!(timed.take_op_times().is_empty(), "no forward yet");
    let prompt = [5u32, 17, 42, 3];
    let chain = TreeTopology::chain(prompt.len());
    let seq = plain.new_sequence().unwrap();
    let want = forward_one(&mut plain, seq, &prompt, &chain);
    let seq = timed.new_sequence().unwrap();
    let got = forward_one(&mut timed, seq, &prompt, &chain);
    assert_eq!(
        bits(want.as_slice()),
        bits(got.as_slice()),
        "timing moved a logit"
    );
    let ops = timed.take_op_times();
    let names: Vec<&str> = ops.iter().map(|t| t.op).collect();
    for op in ["qkv", "attention", "gate_up", "down", "lm_head"] {
        assert!(names.contains(&op), "{op} missing from {names:?}");
    }
    let layers = timed.config().n_layers as u64;
    let attention = ops.iter().find(|t| t.op == "attention").unwrap();
    assert_eq!(attention.calls, layers, "one attention call per layer");
    assert!(timed.take_op_times().is_empty(), "handed over once");
    assert!(timed.set_op_clock(false));
    let seq = timed.new_sequence().unwrap();
    forward_one(&mut timed, seq, &prompt, &chain);
    assert!(timed.take_op_times().is_empty(), "not timing");
    // a model without an op clock says so and hands over nothing
    let mut toy = ToyLanguageModel::new(ToyModel::uniform(4, 1).unwrap(), 16, vec![]);
    assert!(!toy.set_op_clock(true));
    assert!(toy.take_op_times().is_empty());
}
