//! Where a CPU forward's time goes, op by op: the forward marks the end of each op
//! ([`super::forward::DeviceBackend::mark`]) and an [`OpClock`] adds the time since the previous
//! mark to that op's total. A parallel op ends when all its threads have finished, so the totals
//! add up to the forward's wall time, hand-offs between threads and load imbalance included.
//! Off unless asked for ([`super::LlamaModel::time_ops`]).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The total wall time and number of calls of one op of the forward.
#[derive(Debug, Clone, PartialEq)]
pub struct OpTime {
    /// The op's name ("qkv", "attention", "lm_head", ...), in the order ops first ran.
    pub op: &'static str,
    /// Wall time of all its calls together.
    pub total: Duration,
    /// Calls (one per layer for a block's ops).
    pub calls: u64,
}

/// The op totals since the clock was last reset, and the time of the last mark.
#[derive(Debug, Default)]
struct ClockState {
    last: Option<Instant>,
    ops: Vec<OpTime>,
}

/// Totals of the time between marks, per op name.
#[derive(Debug, Default)]
pub(crate) struct OpClock {
    state: Mutex<ClockState>,
}

impl OpClock {
    /// Starts timing from now (a forward begins); totals are kept.
    pub(crate) fn start(&self) {
        self.with_state(|state| state.last = Some(Instant::now()));
    }

    /// Adds the time since the previous mark (or [`OpClock::start`]) to `op`'s total.
    pub(crate) fn mark(&self, op: &'static str) {
        let now = Instant::now();
        self.with_state(|state| {
            let Some(last) = state.last.replace(now) else {
                return;
            };
            let elapsed = now - last;
            match state.ops.iter_mut().find(|t| t.op == op) {
                Some(t) => {
                    t.total += elapsed;
                    t.calls += 1;
                }
                None => state.ops.push(OpTime {
                    op,
                    total: elapsed,
                    calls: 1,
                }),
            }
        });
    }

    /// The totals so far, in the order the ops first ran.
    pub(crate) fn times(&self) -> Vec<OpTime> {
        self.with_state(|state| state.ops.clone())
    }

    /// Clears the totals.
    pub(crate) fn reset(&self) {
        self.with_state(|state| *state = ClockState::default());
    }

    fn with_state<R>(&self, f: impl FnOnce(&mut ClockState) -> R) -> R {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_add_the_time_since_the_previous_one_to_their_op() {
        let clock = OpClock::default();
        clock.mark("before any start"); // ignored: nothing started
        assert!(clock.times().is_empty());
        clock.start();
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(2));
            clock.mark("slow");
            clock.mark("fast");
        }
        let times = clock.times();
        assert_eq!(
            times.iter().map(|t| (t.op, t.calls)).collect::<Vec<_>>(),
            [("slow", 3), ("fast", 3)]
        );
        assert!(times[0].total >= Duration::from_millis(6), "{times:?}");
        clock.reset();
        assert!(clock.times().is_empty());
        clock.mark("after a reset"); // ignored until the next start
        assert!(clock.times().is_empty());
    }
}
