//! proptest strategies for toy models (enabled by the `proptest` feature of specdec-models).
//!
//! Rows are drawn from a mix that deliberately covers edge cases: random small integer weights
//! with zeros, one-hot rows, and uniform rows; pairs include the draft equal to the target.

use super::table::{ToyModel, ToyPair};
use proptest::prelude::*;

/// One row of integer weights over `vocab` tokens (at least one positive): random weights in
/// `0..=4` (zeros included), a one-hot row, or a uniform row.
pub fn weight_row(vocab: usize) -> BoxedStrategy<Vec<u32>> {
    prop_oneof![
        4 => proptest::collection::vec(0u32..=4, vocab).prop_map(|mut w| {
            if w.iter().all(|&x| x == 0) {
                w[0] = 1;
            }
            w
        }),
        1 => (0..vocab).prop_map(move |hot| (0..vocab).map(|t| u32::from(t == hot)).collect()),
        1 => Just(vec![1u32; vocab]),
    ]
    .boxed()
}

/// A random toy model of the given vocabulary and Markov order.
pub fn toy_model(vocab: usize, order: usize) -> BoxedStrategy<ToyModel> {
    let rows = vocab.pow(order as u32);
    proptest::collection::vec(weight_row(vocab), rows)
        .prop_map(move |weights| {
            ToyModel::from_weights(vocab, order, &weights).expect("strategy rows are valid")
        })
        .boxed()
}

/// A random target/draft pair; one time in four the draft equals the target.
pub fn toy_pair(vocab: usize, order: usize) -> BoxedStrategy<ToyPair> {
    prop_oneof![
        3 => (toy_model(vocab, order), toy_model(vocab, order)),
        1 => toy_model(vocab, order).prop_map(|m| (m.clone(), m)),
    ]
    .prop_map(|(target, draft)| ToyPair::new(target, draft).expect("same vocabulary"))
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use num_traits::One;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn strategy_models_are_distributions(pair in toy_pair(3, 1)) {
            for row in pair.target.rows().iter().chain(pair.draft.rows()) {
                let sum: num_rational::BigRational = row.iter().sum();
                prop_assert!(sum.is_one());
            }
        }
    }
}
