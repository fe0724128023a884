//! [`FixedPolicy`]: the same budget every step.

use crate::policy::{Budget, SpeculationPolicy, StepOutcome};

/// Returns the same budget every step (fixed K, a fixed tree size, or a fixed tree shape).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedPolicy {
    budget: Budget,
}

impl FixedPolicy {
    /// Always `budget`.
    pub fn new(budget: Budget) -> Self {
        Self { budget }
    }

    /// Always a chain of `k` drafts (`k = 0`: always plain decoding).
    pub fn chain(k: usize) -> Self {
        Self::new(Budget::chain(k))
    }
}

impl SpeculationPolicy for FixedPolicy {
    fn name(&self) -> String {
        match &self.budget {
            Budget::Plain => "fixed(plain)".to_string(),
            Budget::Chain(k) => format!("fixed(K={k})"),
            Budget::TreeNodes(n) => format!("fixed(tree≤{n})"),
            Budget::Tree(shape) => format!("fixed(tree {} nodes)", shape.drafts()),
        }
    }

    fn next_budget(&mut self) -> Budget {
        self.budget.clone()
    }

    fn observe(&mut self, _outcome: &StepOutcome) {}

    fn fork(&self) -> Box<dyn SpeculationPolicy> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_never_changes() {
        let mut p = FixedPolicy::chain(4);
        for accepted in [0, 4, 2] {
            assert_eq!(p.next_budget(), Budget::Chain(4));
            p.observe(&StepOutcome::chain(4, accepted).unwrap());
        }
        assert_eq!(p.name(), "fixed(K=4)");
        assert_eq!(FixedPolicy::chain(0).next_budget(), Budget::Plain);
        let mut forked = p.fork();
        assert_eq!(forked.next_budget(), Budget::Chain(4));
    }
}
