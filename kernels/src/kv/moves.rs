//! Slot moves: the data half of a KV bookkeeping operation.
//!
//! A commit (tree-path compaction) or a copy-on-write reserve is decided on the host by
//! [`crate::kv::PagedKvCache`]'s bookkeeping ([`PagedKvCache::commit_blocks`],
//! [`PagedKvCache::reserve_blocks`]), the same code for every device. What the device must then
//! copy is a [`SlotMoves`]: pairs of physical token slots (`block * block_size + slot_in_block`),
//! applied as if every read happened before every write. The host pool applies them with
//! [`PagedKvCache::move_slots`], a GPU pool with [`crate::kv::cuda::move_slots`]; both give the
//! same pool contents.
//!
//! [`PagedKvCache::commit_blocks`]: crate::kv::PagedKvCache::commit_blocks
//! [`PagedKvCache::reserve_blocks`]: crate::kv::PagedKvCache::reserve_blocks
//! [`PagedKvCache::move_slots`]: crate::kv::PagedKvCache::move_slots

use std::collections::HashSet;

use crate::error::{KernelError, Result};

/// Data moves between physical token slots, each slot being every layer's K and V for every KV
/// head. `src[i]` goes to `dst[i]`, all reads before all writes; `src` and `dst` have the same
/// length and no destination repeats ([`SlotMoves::check`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotMoves {
    /// Source slots.
    pub src: Vec<u32>,
    /// Destination slots, same length as `src`.
    pub dst: Vec<u32>,
}

impl SlotMoves {
    /// True when nothing moves.
    pub fn is_empty(&self) -> bool {
        self.src.is_empty()
    }

    /// Number of moves.
    pub fn len(&self) -> usize {
        self.src.len()
    }

    /// Adds the move `src → dst`.
    pub fn push(&mut self, src: u32, dst: u32) {
        self.src.push(src);
        self.dst.push(dst);
    }

    /// Appends `other`'s moves after these (the caller keeps destinations distinct).
    pub fn extend(&mut self, other: &SlotMoves) {
        self.src.extend_from_slice(&other.src);
        self.dst.extend_from_slice(&other.dst);
    }

    /// Checks the moves against a pool of `capacity` slots.
    ///
    /// # Errors
    /// [`KernelError::ShapeMismatch`] when `src` and `dst` differ in length;
    /// [`KernelError::InvalidParameter`] for a slot outside the pool or a destination written
    /// twice.
    pub fn check(&self, capacity: usize) -> Result<()> {
        check_moves(&self.src, &self.dst, capacity)
    }
}

/// [`SlotMoves::check`] of moves given as two slices (`src[i]` to `dst[i]`).
///
/// # Errors
/// As [`SlotMoves::check`].
pub(crate) fn check_moves(src: &[u32], dst: &[u32], capacity: usize) -> Result<()> {
    if src.len() != dst.len() {
        return Err(KernelError::ShapeMismatch {
            what: "move destinations".into(),
            expected: src.len(),
            actual: dst.len(),
        });
    }
    check_slots_inside(src, capacity)?;
    check_slots_inside(dst, capacity)?;
    let mut seen = HashSet::new();
    if let Some(d) = dst.iter().find(|d| !seen.insert(**d)) {
        return Err(KernelError::InvalidParameter {
            what: "move destinations",
            reason: format!("slot {d} is written twice"),
        });
    }
    Ok(())
}

/// Checks that every slot lies in a pool of `capacity` slots.
///
/// # Errors
/// [`KernelError::InvalidParameter`] naming the first slot outside.
pub(crate) fn check_slots_inside(slots: &[u32], capacity: usize) -> Result<()> {
    if let Some((i, &s)) = slots
        .iter()
        .enumerate()
        .find(|(_, &s)| s as usize >= capacity)
    {
        return Err(KernelError::InvalidParameter {
            what: "slot",
            reason: format!("entry {i}: physical slot {s} is outside the pool's {capacity} slots"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_refuses_ragged_lists_slots_outside_and_repeated_destinations() {
        let mut moves = SlotMoves::default();
        assert!(moves.is_empty());
        moves.push(3, 1);
        moves.push(1, 3);
        assert_eq!(moves.len(), 2);
        moves.check(4).unwrap();
        assert!(moves.check(3).unwrap_err().to_string().contains("slot 3"));
        let mut twice = moves.clone();
        twice.extend(&SlotMoves {
            src: vec![0],
            dst: vec![1],
        });
        assert!(twice.check(4).unwrap_err().to_string().contains("twice"));
        let ragged = SlotMoves {
            src: vec![0, 1],
            dst: vec![2],
        };
        assert!(matches!(
            ragged.check(4),
            Err(KernelError::ShapeMismatch { .. })
        ));
    }
}
