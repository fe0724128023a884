//! Path-dependent logit processors: repetition, frequency and presence penalties.
//!
//! A penalty depends on the tokens generated before the position being scored. In a draft tree
//! every node has its own history — the output so far plus the drafted tokens on the path from
//! the root to that node — so the engine applies the processor at each node with that node's
//! own history, never with a sibling's tokens. Scoring a node in a tree therefore gives exactly
//! what plain decoding would compute after the same tokens (tested exactly in the engine tests).
//! Drafters apply the same penalties to their own logits (`q`), each row with its own history,
//! so a draft close to the target stays close under penalties; a draft vocabulary's logits go
//! through [`Penalties::apply_mapped`].
//!
//! Definitions (as in common serving systems), over the history's token counts `c[t]`:
//! - repetition `r > 0` (1 = off): a seen token's logit `l` becomes `l / r` if `l > 0`, else `l * r`;
//! - frequency `f`: `l -= f * c[t]`;
//! - presence `a`: `l -= a` if `c[t] > 0`.

use std::collections::HashMap;

use crate::error::{KernelError, Result};

/// Repetition / frequency / presence penalties (all off by default).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Penalties {
    /// Repetition penalty `r > 0`; 1 is off.
    pub repetition: f32,
    /// Frequency penalty per occurrence; 0 is off.
    pub frequency: f32,
    /// Presence penalty; 0 is off.
    pub presence: f32,
}

impl Default for Penalties {
    fn default() -> Self {
        Self {
            repetition: 1.0,
            frequency: 0.0,
            presence: 0.0,
        }
    }
}

impl Penalties {
    /// True when every penalty is off (the processor is then skipped).
    pub fn is_off(&self) -> bool {
        *self == Self::default()
    }

    /// Checks the values are finite and the repetition penalty is positive.
    ///
    /// # Errors
    /// [`KernelError::InvalidParameter`] naming the value.
    pub fn validate(&self) -> Result<()> {
        let finite =
            self.repetition.is_finite() && self.frequency.is_finite() && self.presence.is_finite();
        if !finite || self.repetition <= 0.0 {
            return Err(KernelError::InvalidParameter {
                what: "penalties",
                reason: format!("they must be finite with repetition > 0, got {self:?}"),
            });
        }
        Ok(())
    }

    /// Applies the penalties for a position whose preceding generated tokens are `history`
    /// (`logits` indexed by token id).
    pub fn apply(&self, history: &[u32], logits: &mut [f32]) {
        self.apply_mapped(history.iter().copied(), logits, |token| {
            Some(token as usize)
        });
    }

    /// [`Penalties::apply`] for logits over a subset of the vocabulary: `index(token)` is the
    /// token's row in `logits`, `None` for a token the logits do not cover (left alone).
    pub fn apply_mapped(
        &self,
        history: impl IntoIterator<Item = u32>,
        logits: &mut [f32],
        index: impl Fn(u32) -> Option<usize>,
    ) {
        if self.is_off() {
            return;
        }
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for token in history {
            *counts.entry(token).or_default() += 1;
        }
        for (&token, &count) in &counts {
            let Some(logit) = index(token).and_then(|i| logits.get_mut(i)) else {
                continue;
            };
            if self.repetition != 1.0 {
                *logit = if *logit > 0.0 {
                    *logit / self.repetition
                } else {
                    *logit * self.repetition
                };
            }
            *logit -= self.frequency * count as f32 + self.presence;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalties_follow_their_definitions() {
        let penalties = Penalties {
            repetition: 2.0,
            frequency: 0.5,
            presence: 0.25,
        };
        let mut logits = vec![4.0, -4.0, 1.0];
        penalties.apply(&[0, 1, 1], &mut logits);
        assert_eq!(logits, vec![4.0 / 2.0 - 0.5 - 0.25, -8.0 - 1.0 - 0.25, 1.0]);
        let mut untouched = vec![1.0, 2.0];
        Penalties::default().apply(&[0, 1], &mut untouched);
        assert_eq!(untouched, vec![1.0, 2.0]);
        // Over a draft vocabulary [7, 3] (rows 0, 1): token 3 seen twice, 7 once, 5 not covered.
        let mut draft_rows = vec![4.0, -4.0];
        let draft_ids = [7u32, 3];
        penalties.apply_mapped([3, 5, 3, 7], &mut draft_rows, |t| {
            draft_ids.iter().position(|&d| d == t)
        });
        assert_eq!(draft_rows, vec![4.0 / 2.0 - 0.5 - 0.25, -8.0 - 1.0 - 0.25]);
        assert!(Penalties {
            repetition: 0.0,
            ..Penalties::default()
        }
        .validate()
        .is_err());
    }

    #[test]
    fn off_means_every_penalty_at_its_neutral_value() {
        assert!(Penalties::default().is_off());
        for on in [
            Penalties {
                repetition: 1.5,
                ..Penalties::default()
            },
            Penalties {
                frequency: 0.1,
                ..Penalties::default()
            },
            Penalties {
                presence: -0.1,
                ..Penalties::default()
            },
        ] {
            assert!(!on.is_off(), "{on:?}");
        }
    }

    #[test]
    fn validate_accepts_finite_values_and_refuses_each_bad_one() {
        assert!(Penalties::default().validate().is_ok());
        assert!(Penalties {
            repetition: 0.5,
            frequency: -2.0,
            presence: 3.0
        }
        .validate()
        .is_ok());
        for bad in [
            Penalties {
                repetition: f32::INFINITY,
                ..Penalties::default()
            },
            Penalties {
                frequency: f32::NAN,
                ..Penalties::default()
            },
            Penalties {
                presence: f32::NEG_INFINITY,
                ..Penalties::default()
            },
            Penalties {
                repetition: -1.0,
                ..Penalties::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
