//! Reference-counted allocation of fixed-size KV blocks (host-side bookkeeping only; the block
//! contents live in [`crate::kv::PagedKvCache`]).

use crate::error::{KernelError, Result};
use crate::kv::layout::BlockId;

/// Hands out block ids `0..num_blocks` and counts references to them.
///
/// Invariants: a block is either free (reference count 0, on the free list exactly once) or in
/// use (count ≥ 1, not on the free list). `free_blocks() + used_blocks() == num_blocks()`.
#[derive(Debug, Clone)]
pub struct BlockAllocator {
    ref_counts: Vec<u32>,
    /// Free block ids; blocks are taken from the end (lowest ids first on a fresh pool).
    free: Vec<BlockId>,
}

impl BlockAllocator {
    /// A pool of `num_blocks` free blocks.
    ///
    /// # Errors
    /// [`KernelError::InvalidConfig`] if `num_blocks` does not fit a [`BlockId`].
    pub fn new(num_blocks: usize) -> Result<Self> {
        if num_blocks > BlockId::MAX as usize {
            return Err(KernelError::InvalidConfig {
                reason: format!("{num_blocks} blocks do not fit 32-bit block ids"),
            });
        }
        Ok(Self {
            ref_counts: vec![0; num_blocks],
            free: (0..num_blocks as BlockId).rev().collect(),
        })
    }

    /// Total blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks currently free.
    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Blocks currently referenced at least once.
    pub fn used_blocks(&self) -> usize {
        self.num_blocks() - self.free_blocks()
    }

    /// References to `block` (0 when free).
    ///
    /// # Errors
    /// [`KernelError::OutOfRange`] if `block` is not in the pool.
    pub fn ref_count(&self, block: BlockId) -> Result<u32> {
        self.ref_counts
            .get(block as usize)
            .copied()
            .ok_or_else(|| self.out_of_range(block))
    }

    /// Takes `n` free blocks, each with reference count 1, or none at all.
    ///
    /// # Errors
    /// [`KernelError::OutOfBlocks`] if fewer than `n` are free (nothing is taken).
    pub fn allocate(&mut self, n: usize) -> Result<Vec<BlockId>> {
        if n > self.free.len() {
            return Err(KernelError::OutOfBlocks {
                needed: n,
                free: self.free.len(),
            });
        }
        let taken = self.free.split_off(self.free.len() - n);
        for &block in &taken {
            self.ref_counts[block as usize] = 1;
        }
        Ok(taken)
    }

    /// Adds one reference to an in-use block (a fork sharing it).
    ///
    /// # Errors
    /// [`KernelError::OutOfRange`] if `block` is not in the pool or is free.
    pub fn retain(&mut self, block: BlockId) -> Result<()> {
        match self.ref_counts.get_mut(block as usize) {
            Some(count) if *count > 0 => {
                *count += 1;
                Ok(())
            }
            _ => Err(self.out_of_range(block)),
        }
    }

    /// Drops one reference; the block returns to the free list when none remain. Returns true if
    /// it was freed.
    ///
    /// # Errors
    /// [`KernelError::OutOfRange`] if `block` is not in the pool or already free (a double free).
    pub fn release(&mut self, block: BlockId) -> Result<bool> {
        match self.ref_counts.get_mut(block as usize) {
            Some(count) if *count > 0 => {
                *count -= 1;
                if *count == 0 {
                    self.free.push(block);
                    Ok(true)
                } else {
                    Ok(false)
                }
            }
            _ => Err(self.out_of_range(block)),
        }
    }

    fn out_of_range(&self, block: BlockId) -> KernelError {
        KernelError::OutOfRange {
            what: "in-use block id".to_string(),
            index: block as usize,
            limit: self.num_blocks(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_retain_release_round_trip() {
        let mut alloc = BlockAllocator::new(3).unwrap();
        let blocks = alloc.allocate(2).unwrap();
        assert_eq!(alloc.free_blocks(), 1);
        assert!(matches!(
            alloc.allocate(2),
            Err(KernelError::OutOfBlocks { needed: 2, free: 1 })
        ));
        assert_eq!(alloc.free_blocks(), 1, "a failed allocation takes nothing");
        alloc.retain(blocks[0]).unwrap();
        assert_eq!(alloc.ref_count(blocks[0]).unwrap(), 2);
        assert!(!alloc.release(blocks[0]).unwrap());
        assert!(alloc.release(blocks[0]).unwrap());
        assert!(alloc.release(blocks[0]).is_err(), "double free is refused");
        assert!(
            alloc.retain(blocks[0]).is_err(),
            "retaining a free block is refused"
        );
        assert!(alloc.release(blocks[1]).unwrap());
        assert_eq!(alloc.free_blocks(), 3);
        assert!(alloc.ref_count(7).is_err());
    }
}
