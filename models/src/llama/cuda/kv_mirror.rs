//! Host-side bookkeeping of the device KV pool: block tables, reference counts and the data
//! moves a reserve (copy-on-write) or a commit (tree-path compaction) implies, as slot pairs the
//! device then carries out.
//!
//! # Design
//! The pool's bookkeeping is [`PagedKvCache`]'s, reused as is: a **shadow** cache with the same
//! block size and block count, but one layer, one KV head and `head_dim = 1`, whose data is never
//! read. Block tables, allocation, fork, rewind and the commit's remap-or-copy decisions are
//! therefore exactly the CPU runner's: the shadow runs the bookkeeping halves
//! ([`PagedKvCache::reserve_blocks`], [`PagedKvCache::commit_blocks`]) that the CPU runner runs
//! on its own cache, and hands back their [`SlotMoves`] for the device pool to apply
//! (`KvPool::move_kv`, i.e. [`specdec_kernels::kv::cuda::move_slots`]). Rewind, fork and free
//! move no data.

pub use specdec_kernels::kv::SlotMoves;
use specdec_kernels::kv::{BlockId, KvLayout, PagedKvCache};

use crate::error::{ModelError, Result};
use crate::model::SeqId;

/// Physical slots of positions `start..start + n` of a sequence with `block_table`.
///
/// # Errors
/// [`ModelError::Shape`] when a position lies beyond the table.
pub fn physical_slots(
    block_table: &[BlockId],
    block_size: usize,
    start: usize,
    n: usize,
) -> Result<Vec<u32>> {
    (start..start + n)
        .map(|pos| {
            let block = block_table
                .get(pos / block_size)
                .ok_or_else(|| ModelError::Shape {
                    what: "KV block table".into(),
                    reason: format!(
                        "position {pos} needs block {} of {}",
                        pos / block_size,
                        block_table.len()
                    ),
                })?;
            Ok(*block * block_size as u32 + (pos % block_size) as u32)
        })
        .collect()
}

/// The block table of a paged pool kept on the host, telling the device which slots to move.
#[derive(Debug, Clone)]
pub struct KvMirror {
    shadow: PagedKvCache,
    block_size: usize,
}

impl KvMirror {
    /// Bookkeeping for `num_blocks` blocks of `block_size` slots.
    ///
    /// # Errors
    /// [`ModelError::Config`] when the pool has more than `u32::MAX` slots (slot ids are `u32` on
    /// the device) or a size is zero.
    pub fn new(block_size: usize, num_blocks: usize) -> Result<Self> {
        if num_blocks
            .checked_mul(block_size)
            .is_none_or(|slots| slots > u32::MAX as usize)
        {
            return Err(ModelError::Config(format!(
                "{num_blocks} KV blocks of {block_size} slots exceed 2^32 slots"
            )));
        }
        Ok(Self {
            shadow: PagedKvCache::new(KvLayout::new(1, 1, 1, block_size)?, num_blocks)?,
            block_size,
        })
    }

    /// The bookkeeping cache (block tables, lengths, allocator), read-only.
    pub fn cache(&self) -> &PagedKvCache {
        &self.shadow
    }

    /// As [`PagedKvCache::create_sequence`].
    pub fn create_sequence(&mut self) -> SeqId {
        self.shadow.create_sequence()
    }

    /// As [`PagedKvCache::fork`] (shares blocks: no data moves).
    ///
    /// # Errors
    /// As [`PagedKvCache::fork`].
    pub fn fork(&mut self, seq: SeqId) -> Result<SeqId> {
        Ok(self.shadow.fork(seq)?)
    }

    /// As [`PagedKvCache::free_sequence`].
    ///
    /// # Errors
    /// As [`PagedKvCache::free_sequence`].
    pub fn free_sequence(&mut self, seq: SeqId) -> Result<()> {
        self.shadow.free_sequence(seq)?;
        Ok(())
    }

    /// As [`PagedKvCache::rewind`] (no data moves).
    ///
    /// # Errors
    /// As [`PagedKvCache::rewind`].
    pub fn rewind(&mut self, seq: SeqId, n: usize) -> Result<()> {
        self.shadow.rewind(seq, n)?;
        Ok(())
    }

    /// Reserves `n` pending slots as [`PagedKvCache::reserve`]; returns the moves of a
    /// copy-on-write of a shared, partly filled last block (every slot of the old block to the
    /// same slot of its private copy), empty otherwise ([`PagedKvCache::reserve_blocks`]).
    ///
    /// # Errors
    /// As [`PagedKvCache::reserve`] (nothing changed).
    pub fn reserve(&mut self, seq: SeqId, n: usize) -> Result<SlotMoves> {
        Ok(self.shadow.reserve_blocks(seq, n)?.1)
    }

    /// Physical slots of the pending (speculative) positions of `seq`, in node order: where a
    /// forward writes its new tokens' K/V.
    ///
    /// # Errors
    /// An unknown sequence.
    pub fn pending_slots(&self, seq: SeqId) -> Result<Vec<u32>> {
        let (len, pending) = (self.shadow.len(seq)?, self.shadow.pending(seq)?);
        physical_slots(self.shadow.block_table(seq)?, self.block_size, len, pending)
    }

    /// Commits pending nodes `accepted` as [`PagedKvCache::commit`] and returns the slot moves
    /// that put the device data where the new block table expects it
    /// ([`PagedKvCache::commit_blocks`]).
    ///
    /// # Errors
    /// As [`PagedKvCache::commit`] (nothing changed).
    pub fn commit(&mut self, seq: SeqId, accepted: &[usize]) -> Result<SlotMoves> {
        Ok(self.shadow.commit_blocks(seq, accepted)?.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specdec_kernels::kv::KvPart;

    /// A host pool of real K/V data driven by a mirror, checked against the CPU cache doing the
    /// same operations on the same data.
    struct Twin {
        cpu: PagedKvCache,
        mirror: KvMirror,
        pool: Vec<f32>,
        layout: KvLayout,
        /// (slots copied, blocks remapped, copy-on-write reserves) over the run.
        seen: (usize, usize, usize),
    }

    impl Twin {
        fn new(layout: KvLayout, blocks: usize) -> Self {
            Self {
                cpu: PagedKvCache::new(layout, blocks).unwrap(),
                mirror: KvMirror::new(layout.block_size(), blocks).unwrap(),
                pool: vec![0.0; blocks * layout.block_elems()],
                layout,
                seen: (0, 0, 0),
            }
        }

        /// Offset of (slot, layer, part, head) in the flat pool.
        fn at(&self, slot: u32, layer: usize, part: KvPart, head: usize) -> usize {
            let bs = self.layout.block_size() as u32;
            self.layout
                .row_offset(slot / bs, layer, part, head, (slot % bs) as usize)
        }

        fn apply(&mut self, moves: &SlotMoves) {
            let before = self.pool.clone();
            let d = self.layout.head_dim();
            for (&s, &t) in moves.src.iter().zip(&moves.dst) {
                for layer in 0..self.layout.num_layers() {
                    for part in [KvPart::Key, KvPart::Value] {
                        for head in 0..self.layout.num_kv_heads() {
                            let (a, b) =
                                (self.at(s, layer, part, head), self.at(t, layer, part, head));
                            self.pool[b..b + d].copy_from_slice(&before[a..a + d]);
                        }
                    }
                }
            }
        }

        /// Reserves and writes `n` new tokens (values from `salt`) on both sides.
        fn step(&mut self, seq: SeqId, n: usize, salt: f32) {
            self.cpu.rewind(seq, 0).unwrap();
            self.mirror.rewind(seq, 0).unwrap();
            self.cpu.reserve(seq, n).unwrap();
            let moves = self.mirror.reserve(seq, n).unwrap();
            self.seen.2 += usize::from(!moves.is_empty());
            self.apply(&moves);
            let slots = self.mirror.pending_slots(seq).unwrap();
            assert_eq!(slots.len(), n);
            let row = self.layout.num_kv_heads() * self.layout.head_dim();
            for layer in 0..self.layout.num_layers() {
                let k: Vec<f32> = (0..n * row)
                    .map(|i| salt + i as f32 + 1000.0 * layer as f32)
                    .collect();
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                self.cpu.write_kv(seq, layer, 0, &k, &v).unwrap();
                for (t, &slot) in slots.iter().enumerate() {
                    for head in 0..self.layout.num_kv_heads() {
                        let d = self.layout.head_dim();
                        let src = t * row + head * d;
                        for (part, buf) in [(KvPart::Key, &k), (KvPart::Value, &v)] {
                            let o = self.at(slot, layer, part, head);
                            self.pool[o..o + d].copy_from_slice(&buf[src..src + d]);
                        }
                    }
                }
            }
        }

        fn commit(&mut self, seq: SeqId, accepted: &[usize]) {
            let stats = self.cpu.commit(seq, accepted).unwrap();
            self.seen.0 += stats.slots_copied;
            self.seen.1 += stats.blocks_remapped;
            let moves = self.mirror.commit(seq, accepted).unwrap();
            assert_eq!(
                moves.src.len(),
                stats.slots_copied,
                "one move per copied slot"
            );
            self.apply(&moves);
        }

        /// Every committed row of every sequence equal on both sides, tables equal.
        fn check(&self) {
            for seq in self.cpu.sequences() {
                let table = self.cpu.block_table(seq).unwrap();
                assert_eq!(table, self.mirror.cache().block_table(seq).unwrap());
                let len = self.cpu.len(seq).unwrap();
                assert_eq!(len, self.mirror.cache().len(seq).unwrap());
                let slots = physical_slots(table, self.layout.block_size(), 0, len).unwrap();
                for (pos, &slot) in slots.iter().enumerate() {
                    for layer in 0..self.layout.num_layers() {
                        for part in [KvPart::Key, KvPart::Value] {
                            for head in 0..self.layout.num_kv_heads() {
                                let o = self.at(slot, layer, part, head);
                                assert_eq!(
                                    self.cpu.token_row(seq, pos, layer, part, head).unwrap(),
                                    &self.pool[o..o + self.layout.head_dim()],
                                    "seq {seq} pos {pos} layer {layer} {part:?} head {head}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn physical_slots_follow_the_block_table() {
        assert_eq!(
            physical_slots(&[3, 0, 7], 4, 2, 7).unwrap(),
            [14, 15, 0, 1, 2, 3, 28]
        );
        assert!(physical_slots(&[3], 4, 3, 2).is_err());
        assert!(
            KvMirror::new(1 << 16, 1 << 16).is_err(),
            "2^32 slots refused"
        );
    }

    #[test]
    fn mirrored_moves_reproduce_the_cpu_cache() {
        let layout = KvLayout::new(2, 2, 3, 4).unwrap();
        let mut t = Twin::new(layout, 40);
        let a = t.cpu.create_sequence();
        assert_eq!(a, t.mirror.create_sequence());
        // Prefill 6, commit all.
        t.step(a, 6, 0.5);
        t.commit(a, &(0..6).collect::<Vec<_>>());
        t.check();
        // A tree of 11 nodes; accept a path that needs slot copies and a whole-block remap
        // (nodes 2..=5 land block-aligned? len 6: positions 6.. — copies), then another step.
        t.step(a, 11, 100.0);
        t.commit(a, &[0, 3, 4, 9]);
        t.check();
        // Block-aligned run: len 10 → pad to 12 with a chain of 2, then a tree whose accepted
        // nodes 4..8 form a whole block landing on a block boundary (remap, no copy).
        t.step(a, 2, 200.0);
        t.commit(a, &[0, 1]);
        t.step(a, 12, 300.0);
        t.commit(a, &[4, 5, 6, 7, 8]);
        t.check();
        // Fork mid-block, then both extend: copy-on-write of the shared last block.
        let b = t.cpu.fork(a).unwrap();
        assert_eq!(b, t.mirror.fork(a).unwrap());
        t.step(b, 3, 400.0);
        t.commit(b, &[0, 2]);
        t.step(a, 5, 500.0);
        t.commit(a, &[1, 3]);
        t.check();
        // Rewind into an earlier block, continue; discard a speculative step.
        t.cpu.rewind(a, 5).unwrap();
        t.mirror.rewind(a, 5).unwrap();
        t.step(a, 7, 600.0);
        t.commit(a, &[0, 1, 6]);
        t.step(b, 4, 700.0);
        t.check();
        t.cpu.rewind(b, 0).unwrap();
        t.mirror.rewind(b, 0).unwrap();
        t.cpu.free_sequence(a).unwrap();
        t.mirror.free_sequence(a).unwrap();
        t.check();
        assert_eq!(
            t.cpu.allocator().free_blocks(),
            t.mirror.cache().allocator().free_blocks()
        );
        let (copied, remapped, cow) = t.seen;
        assert!(
            copied > 0 && remapped > 0 && cow > 0,
            "exercised: {:?}",
            t.seen
        );
    }

    #[test]
    fn commit_of_a_chain_moves_nothing() {
        let mut m = KvMirror::new(4, 8).unwrap();
        let s = m.create_sequence();
        assert!(m.reserve(s, 9).unwrap().is_empty());
        assert!(m.commit(s, &(0..9).collect::<Vec<_>>()).unwrap().is_empty());
        m.reserve(s, 3).unwrap();
        let moves = m.commit(s, &[2]).unwrap();
        let slots = physical_slots(m.cache().block_table(s).unwrap(), 4, 9, 1).unwrap();
        assert_eq!(moves.dst, slots);
        assert_eq!(moves.src, vec![slots[0] + 2]);
    }
}
