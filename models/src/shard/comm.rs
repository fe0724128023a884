//! Collective communication between tensor-parallel ranks.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use specdec_kernels::ops::sum_ranks;

use crate::error::{ModelError, Result};

/// Collective operations among the `world_size()` ranks of a tensor-parallel group.
///
/// Every rank calls the same collectives in the same order (SPMD). Reductions are
/// **deterministic**: every rank receives the same bits, summed in rank order `0, 1, …`, so
/// all ranks stay in lock-step and a run is reproducible.
pub trait Communicator: Send + Sync {
    /// This rank, in `0..world_size()`.
    fn rank(&self) -> usize;

    /// Number of ranks in the group.
    fn world_size(&self) -> usize;

    /// Replaces `buf` on every rank by the element-wise sum of all ranks' `buf`s (rank order).
    ///
    /// # Errors
    /// [`ModelError::Communicator`] when the ranks' lengths differ or the group was aborted.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()>;

    /// Every rank's `local` buffer, in rank order (lengths may differ between ranks).
    ///
    /// # Errors
    /// [`ModelError::Communicator`] when the group was aborted.
    fn all_gather(&self, local: &[f32]) -> Result<Vec<Vec<f32>>>;

    /// Replaces `buf` on every rank by rank `root`'s `buf`.
    ///
    /// # Errors
    /// [`ModelError::Communicator`] when `root` is not a rank or the group was aborted.
    fn broadcast(&self, buf: &mut Vec<f32>, root: usize) -> Result<()>;

    /// Returns once every rank has called it.
    ///
    /// # Errors
    /// [`ModelError::Communicator`] when the group was aborted.
    fn barrier(&self) -> Result<()>;

    /// Fails every pending and future collective of the whole group, so that the other ranks
    /// stop waiting for one that failed. A group that cannot be aborted does nothing (the
    /// default).
    fn abort(&self) {}
}

/// The group of one rank: every collective is the identity.
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleRank;

impl Communicator for SingleRank {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    fn all_reduce_sum(&self, _buf: &mut [f32]) -> Result<()> {
        Ok(())
    }

    fn all_gather(&self, local: &[f32]) -> Result<Vec<Vec<f32>>> {
        Ok(vec![local.to_vec()])
    }

    fn broadcast(&self, _buf: &mut Vec<f32>, root: usize) -> Result<()> {
        if root != 0 {
            return Err(ModelError::Communicator(format!(
                "broadcast root {root} in a group of 1"
            )));
        }
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        Ok(())
    }
}

struct State {
    slots: Vec<Vec<f32>>,
    arrived: usize,
    generation: u64,
    aborted: bool,
}

struct Shared {
    world: usize,
    state: Mutex<State>,
    turn: Condvar,
}

/// An in-process group whose ranks are threads sharing memory: each collective is a deposit
/// into a per-rank slot, a barrier, a read of all slots, and a second barrier.
///
/// If a rank dies (panics) the others would wait forever; call [`ThreadCommunicator::abort`]
/// (e.g. from a drop guard) to make every pending and later collective of the group fail with
/// [`ModelError::Communicator`]. An aborted group cannot be revived.
#[derive(Clone)]
pub struct ThreadCommunicator {
    rank: usize,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ThreadCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ThreadCommunicator({}/{})", self.rank, self.shared.world)
    }
}

impl ThreadCommunicator {
    /// The `world` communicators of a new group, rank `r` at index `r`. Give each to one thread.
    ///
    /// # Errors
    /// [`ModelError::Communicator`] when `world` is zero.
    pub fn group(world: usize) -> Result<Vec<Self>> {
        if world == 0 {
            return Err(ModelError::Communicator(
                "a group needs at least one rank".into(),
            ));
        }
        let shared = Arc::new(Shared {
            world,
            state: Mutex::new(State {
                slots: vec![Vec::new(); world],
                arrived: 0,
                generation: 0,
                aborted: false,
            }),
            turn: Condvar::new(),
        });
        Ok((0..world)
            .map(|rank| Self {
                rank,
                shared: Arc::clone(&shared),
            })
            .collect())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A rank that panicked while holding the lock leaves consistent data (plain vectors);
        // the abort flag, not poisoning, reports its death.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn aborted() -> ModelError {
        ModelError::Communicator("the group was aborted (a rank failed)".into())
    }

    /// Waits until every rank has arrived, releasing `state` while waiting.
    fn wait_all<'a>(&'a self, mut state: MutexGuard<'a, State>) -> Result<MutexGuard<'a, State>> {
        if state.aborted {
            return Err(Self::aborted());
        }
        state.arrived += 1;
        if state.arrived == self.shared.world {
            state.arrived = 0;
            state.generation += 1;
            self.shared.turn.notify_all();
            return Ok(state);
        }
        let generation = state.generation;
        while state.generation == generation && !state.aborted {
            state = self
                .shared
                .turn
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        if state.generation == generation {
            return Err(Self::aborted());
        }
        Ok(state)
    }

    /// Deposits `local`, waits for all ranks, applies `read` to all slots, waits again (so no
    /// rank overwrites a slot another is still reading).
    fn exchange<T>(&self, local: &[f32], read: impl FnOnce(&[Vec<f32>]) -> T) -> Result<T> {
        let mut state = self.lock();
        state.slots[self.rank].clear();
        state.slots[self.rank].extend_from_slice(local);
        let state = self.wait_all(state)?;
        let out = read(&state.slots);
        drop(self.wait_all(state)?);
        Ok(out)
    }
}

impl Communicator for ThreadCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        let n = buf.len();
        let gathered = self.exchange(buf, |slots| {
            if let Some(bad) = slots.iter().position(|s| s.len() != n) {
                return Err(ModelError::Communicator(format!(
                    "all-reduce of {n} values, but rank {bad} gave {}",
                    slots[bad].len()
                )));
            }
            Ok(slots.concat())
        })??;
        Ok(sum_ranks(&gathered, self.shared.world, buf)?)
    }

    fn all_gather(&self, local: &[f32]) -> Result<Vec<Vec<f32>>> {
        self.exchange(local, |slots| slots.to_vec())
    }

    fn broadcast(&self, buf: &mut Vec<f32>, root: usize) -> Result<()> {
        if root >= self.shared.world {
            return Err(ModelError::Communicator(format!(
                "broadcast root {root} in a group of {}",
                self.shared.world
            )));
        }
        *buf = self.exchange(buf, |slots| slots[root].clone())?;
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        let state = self.lock();
        self.wait_all(state).map(drop)
    }

    fn abort(&self) {
        let mut state = self.lock();
        state.aborted = true;
        self.shared.turn.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Send>(world: usize, f: impl Fn(ThreadCommunicator) -> T + Sync) -> Vec<T> {
        let comms = ThreadCommunicator::group(world).unwrap();
        std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|c| {
                    let f = &f;
                    s.spawn(move || f(c))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn collectives_agree_across_ranks() {
        let out = run(3, |c| {
            let r = c.rank() as f32;
            let mut sum = vec![r, 10.0 * r];
            c.all_reduce_sum(&mut sum).unwrap();
            let gathered = c.all_gather(&vec![r; c.rank() + 1]).unwrap();
            let mut b = vec![r; 2];
            c.broadcast(&mut b, 2).unwrap();
            c.barrier().unwrap();
            (sum, gathered, b)
        });
        for (sum, gathered, b) in out {
            assert_eq!(sum, vec![3.0, 30.0]);
            assert_eq!(gathered, vec![vec![0.0], vec![1.0; 2], vec![2.0; 3]]);
            assert_eq!(b, vec![2.0, 2.0]);
        }
    }

    #[test]
    fn mismatched_lengths_and_abort_are_errors() {
        let out = run(2, |c| {
            let mut buf = vec![0.0; 1 + c.rank()];
            c.all_reduce_sum(&mut buf).unwrap_err().to_string()
        });
        assert!(out[0].contains("rank 1 gave 2"), "{}", out[0]);
        let out = run(2, |c| {
            if c.rank() == 1 {
                c.abort();
                return String::new();
            }
            c.barrier().unwrap_err().to_string()
        });
        assert!(out[0].contains("aborted"), "{}", out[0]);
        assert!(ThreadCommunicator::group(0).is_err());
        let mut v = vec![1.0];
        assert!(SingleRank.broadcast(&mut v, 1).is_err());
    }
}
