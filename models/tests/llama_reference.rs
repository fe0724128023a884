//! The runner's logits against an outside reference (../shared/MODELS.md: transformers on the
//! GGUF dequantised to f32, confirmed by an independent numpy implementation to 1e-4).

mod common;

use common::{gguf, load, prefill, top_k};

/// Max |ours − reference| / |reference| allowed on the top-5 logits. The weights are the same
/// quantised values (dequantised exactly) and both sides accumulate in f32, so the only
/// differences are summation order and transcendental rounding; measured here: see the
/// assertion messages (≈1e-5 relative), bound set ~20× above.
const REL_TOL: f32 = 2e-4;

fn check_top5(name: &str, prompt: &[u32], ids: [u32; 5], logits: [f32; 5]) {
    let Some(file) = gguf(name) else { return };
    let mut model = load(&file);
    let out = prefill(&mut model, prompt);
    let top = top_k(out.row(out.rows() - 1), 5);
    let got_ids: Vec<u32> = top.iter().map(|t| t.0).collect();
    assert_eq!(got_ids, ids, "{name}: top-5 ids {top:?}");
    let mut worst = 0.0f32;
    for ((_, got), want) in top.iter().zip(logits) {
        // The reference is printed to 3 decimals: allow that rounding too.
        let err = ((got - want).abs() - 5e-4).max(0.0) / want.abs();
        worst = worst.max(err);
    }
    eprintln!("{name}: top-5 {top:?}, worst relative error beyond print rounding {worst:.2e}");
    assert!(
        worst <= REL_TOL,
        "{name}: relative error {worst:e} > {REL_TOL:e}: {top:?}"
    );
}

#[test]
fn smollm2_next_token_top5_matches_reference() {
    check_top5(
        "smollm2-135m",
        &[1604, 3987, 46477, 24, 94, 727],
        [472, 198, 3805, 1004, 16390],
        [30.843, 26.799, 26.103, 25.793, 25.609],
    );
}

#[test]
fn qwen_05b_next_token_top5_matches_reference() {
    check_top5(
        "qwen2.5-coder-0.5b",
        &[750, 75698, 1445, 1648],
        [198, 715, 220, 2529, 201],
        [17.589, 16.528, 15.764, 15.041, 14.393],
    );
}
