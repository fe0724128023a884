//! The paged KV cache: a pool of blocks, per-sequence block tables, and the speculative life
//! cycle (reserve → write → commit the accepted path / rewind).
//!
//! Every sequence holds `len` **committed** tokens at logical positions `0..len` followed by
//! `pending` **speculative** slots at positions `len..len + pending`. The pending slots hold this
//! step's new tokens in node order: node `i` of the step's tree (or chain, or prefill chunk) is at
//! position `len + i`, whatever its depth. Attention treats `0..len` as the prefix
//! (`prefix_len = len`); [`PagedKvCache::commit`] keeps the accepted nodes, moved to positions
//! `len..len + accepted.len()`, and drops the rest.
//!
//! Each operation that moves data is split into its **bookkeeping**
//! ([`PagedKvCache::reserve_blocks`], [`PagedKvCache::commit_blocks`]: block tables, lengths,
//! allocation; the same code for every device) and the **data move** it implies, a
//! [`SlotMoves`] list the pool applies ([`PagedKvCache::move_slots`] here,
//! `kv::cuda::move_slots` on a GPU pool). [`PagedKvCache::reserve`] and [`PagedKvCache::commit`]
//! do both on this host pool. Rewind, fork and free move no data: they are bookkeeping only.
//!
//! Blocks are reference counted. [`PagedKvCache::fork`] shares all of a sequence's blocks with a
//! new sequence; a shared block is copied (copy-on-write) by the first [`PagedKvCache::reserve`]
//! that would place new slots in it. Speculative slots always live in blocks owned by one sequence
//! (fork refuses a sequence with pending slots), so writes and commits never touch what another
//! sequence sees, and never allocate.

use std::collections::BTreeMap;
use std::fmt;

use crate::error::{KernelError, Result};
use crate::kv::allocator::BlockAllocator;
use crate::kv::dtype::{KvDtype, KvStore};
use crate::kv::layout::{BlockId, KvLayout, KvPages, KvPart};
use crate::kv::moves::SlotMoves;

/// Identifies a sequence of a [`PagedKvCache`]. Ids are handed out by the cache and never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What a [`PagedKvCache::commit`] did: useful for metrics and to check the remap path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Tokens committed (length of the accepted path).
    pub accepted: usize,
    /// Whole blocks moved into place by swapping block-table entries (no data copied).
    pub blocks_remapped: usize,
    /// Token slots copied (each slot is every layer's K and V for every KV head).
    pub slots_copied: usize,
    /// Blocks whose last reference this sequence dropped (now free).
    pub blocks_freed: usize,
}

#[derive(Debug, Clone)]
struct Sequence {
    /// Physical block of each logical block; always `blocks_for(len + pending)` entries.
    block_table: Vec<BlockId>,
    len: usize,
    pending: usize,
}

/// A pool of KV blocks (f32, bf16 or f16: [`KvDtype`]; layout in [`crate::kv::layout`]) with
/// per-sequence block tables.
#[derive(Debug, Clone)]
pub struct PagedKvCache {
    layout: KvLayout,
    data: KvStore,
    allocator: BlockAllocator,
    sequences: BTreeMap<u64, Sequence>,
    next_id: u64,
}

impl PagedKvCache {
    /// A cache of `num_blocks` zeroed f32 blocks of `layout`.
    ///
    /// # Errors
    /// [`KernelError::InvalidConfig`] if the pool does not fit in memory addressing, or its slots
    /// in 32-bit slot ids (the ids of [`SlotMoves`]).
    pub fn new(layout: KvLayout, num_blocks: usize) -> Result<Self> {
        Self::with_dtype(layout, num_blocks, KvDtype::F32)
    }

    /// A cache of `num_blocks` zeroed blocks of `layout` whose elements are `dtype`.
    ///
    /// # Errors
    /// As [`PagedKvCache::new`].
    pub fn with_dtype(layout: KvLayout, num_blocks: usize, dtype: KvDtype) -> Result<Self> {
        if num_blocks
            .checked_mul(layout.block_size())
            .is_none_or(|slots| slots > u32::MAX as usize)
        {
            return Err(KernelError::InvalidConfig {
                reason: format!(
                    "{num_blocks} KV blocks of {} slots exceed 2^32 slots",
                    layout.block_size()
                ),
            });
        }
        let allocator = BlockAllocator::new(num_blocks)?;
        let elems = num_blocks
            .checked_mul(layout.block_elems())
            .ok_or_else(|| KernelError::InvalidConfig {
                reason: format!("{num_blocks} KV blocks overflow the address space"),
            })?;
        Ok(Self {
            layout,
            data: KvStore::zeroed(dtype, elems),
            allocator,
            sequences: BTreeMap::new(),
            next_id: 0,
        })
    }

    /// The layout of every block.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// The element type of the pool.
    pub fn dtype(&self) -> KvDtype {
        self.data.view().dtype()
    }

    /// Read-only view of the block pool, for attention.
    pub fn pages(&self) -> KvPages<'_> {
        KvPages::of(self.layout, self.data.view()).expect("the pool is a whole number of blocks")
    }

    /// Token slots of the pool (`num_blocks * block_size`, at most `u32::MAX`): the bound of the
    /// physical slot ids in [`SlotMoves`].
    pub fn slot_capacity(&self) -> usize {
        self.data.view().len() / self.layout.block_elems() * self.layout.block_size()
    }

    /// Allocation state: free / used blocks and reference counts.
    pub fn allocator(&self) -> &BlockAllocator {
        &self.allocator
    }

    /// Live sequences, in increasing id order.
    pub fn sequences(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.sequences.keys().map(|&id| SeqId(id))
    }

    /// Starts an empty sequence (no blocks yet).
    pub fn create_sequence(&mut self) -> SeqId {
        let id = self.next_id;
        self.next_id += 1;
        self.sequences.insert(
            id,
            Sequence {
                block_table: Vec::new(),
                len: 0,
                pending: 0,
            },
        );
        SeqId(id)
    }

    /// Starts a sequence sharing all committed tokens of `source` (its blocks gain a reference).
    ///
    /// # Errors
    /// [`KernelError::UnknownSequence`]; [`KernelError::PendingTokens`] if `source` has
    /// speculative slots (commit or rewind first: speculative slots are never shared).
    pub fn fork(&mut self, source: SeqId) -> Result<SeqId> {
        let src = self.sequence(source)?;
        if src.pending > 0 {
            return Err(KernelError::PendingTokens {
                seq: source.0,
                pending: src.pending,
                operation: "fork".to_string(),
            });
        }
        let child = src.clone();
        for &block in &child.block_table {
            self.allocator.retain(block)?;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.sequences.insert(id, child);
        Ok(SeqId(id))
    }

    /// Ends a sequence, dropping its references to its blocks. Returns the blocks freed.
    ///
    /// # Errors
    /// [`KernelError::UnknownSequence`].
    pub fn free_sequence(&mut self, seq: SeqId) -> Result<usize> {
        let state = self
            .sequences
            .remove(&seq.0)
            .ok_or(KernelError::UnknownSequence { seq: seq.0 })?;
        self.release_all(&state.block_table)
    }

    /// Committed tokens of `seq`: the `prefix_len` attention sees before this step's new tokens.
    ///
    /// # Errors
    /// [`KernelError::UnknownSequence`].
    pub fn len(&self, seq: SeqId) -> Result<usize> {
        Ok(self.sequence(seq)?.len)
    }

    /// Speculative (reserved, not yet committed) slots of `seq`.
    ///
    /// # Errors
    /// [`KernelError::UnknownSequence`].
    pub fn pending(&self, seq: SeqId) -> Result<usize> {
        Ok(self.sequence(seq)?.pending)
    }

    /// Block table of `seq`: `ceil((len + pending) / block_size)` physical block ids.
    ///
    /// # Errors
    /// [`KernelError::UnknownSequence`].
    pub fn block_table(&self, seq: SeqId) -> Result<&[BlockId]> {
        Ok(&self.sequence(seq)?.block_table)
    }

    /// Free blocks a [`reserve`](Self::reserve) of `n` slots on `seq` would take now (new blocks,
    /// plus one if a shared partly-filled block must be copied first).
    ///
    /// # Errors
    /// [`KernelError::UnknownSequence`].
    pub fn blocks_needed(&self, seq: SeqId, n: usize) -> Result<usize> {
        let state = self.sequence(seq)?;
        Ok(self.reserve_plan(state, n)?.0)
    }

    /// Reserves `n` speculative slots after the existing ones (for a prefill chunk, a chain or a
    /// tree of `n` nodes) and returns the pending index of the first: the new slots are pending
    /// indices `first..first + n`, at logical positions `len + first..`.
    ///
    /// # Errors
    /// [`KernelError::UnknownSequence`]; [`KernelError::OutOfBlocks`] (nothing changed).
    pub fn reserve(&mut self, seq: SeqId, n: usize) -> Result<usize> {
        let (first, moves) = self.reserve_blocks(seq, n)?;
        self.move_slots(&moves)?;
        Ok(first)
    }

    /// The bookkeeping of [`reserve`](Self::reserve), moving no data: returns the first pending
    /// index and the moves of a copy-on-write (every slot of a shared, partly filled last block
    /// to the same slot of its private copy; empty otherwise), which the pool holding the data
    /// must apply before the new slots are written ([`move_slots`](Self::move_slots) for this
    /// host pool).
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve) (nothing changed).
    pub fn reserve_blocks(&mut self, seq: SeqId, n: usize) -> Result<(usize, SlotMoves)> {
        let state = self.sequence(seq)?;
        let first = state.pending;
        let mut moves = SlotMoves::default();
        if n == 0 {
            return Ok((first, moves));
        }
        let (needed, copy_block) = self.reserve_plan(state, n)?;
        let mut fresh = self.allocator.allocate(needed)?;
        if let Some(logical) = copy_block {
            let copy = fresh.pop().expect("one block was allocated for the copy");
            let old = self.sequences[&seq.0].block_table[logical];
            for slot in 0..self.layout.block_size() {
                moves.push(self.slot_id(old, slot), self.slot_id(copy, slot));
            }
            self.allocator.release(old)?;
            self.sequences
                .get_mut(&seq.0)
                .expect("checked above")
                .block_table[logical] = copy;
        }
        let state = self.sequences.get_mut(&seq.0).expect("checked above");
        state.block_table.extend(fresh);
        state.pending += n;
        Ok((first, moves))
    }

    /// Writes one layer's K and V (after RoPE) for pending slots `first..first + n`, where
    /// `keys` and `values` are `[n][num_kv_heads][head_dim]` row-major.
    ///
    /// # Errors
    /// [`KernelError::UnknownSequence`]; [`KernelError::OutOfRange`] for a bad layer or slots
    /// beyond the reserved ones; [`KernelError::ShapeMismatch`] if the buffers are not whole
    /// tokens or differ in length.
    pub fn write_kv(
        &mut self,
        seq: SeqId,
        layer: usize,
        first: usize,
        keys: &[f32],
        values: &[f32],
    ) -> Result<()> {
        let layout = self.layout;
        let row = layout.head_dim();
        let token = layout.num_kv_heads() * row;
        if layer >= layout.num_layers() {
            return Err(KernelError::OutOfRange {
                what: "layer".to_string(),
                index: layer,
                limit: layout.num_layers(),
            });
        }
        if !keys.len().is_multiple_of(token) {
            return Err(KernelError::ShapeMismatch {
                what: "keys [n, num_kv_heads, head_dim]".to_string(),
                expected: keys.len().div_ceil(token) * token,
                actual: keys.len(),
            });
        }
        if values.len() != keys.len() {
            return Err(KernelError::ShapeMismatch {
                what: "values (same shape as keys)".to_string(),
                expected: keys.len(),
                actual: values.len(),
            });
        }
        let n = keys.len() / token;
        // Field borrows (not `self.sequence`) so `self.data` can be written below.
        let state = self
            .sequences
            .get(&seq.0)
            .ok_or(KernelError::UnknownSequence { seq: seq.0 })?;
        if first + n > state.pending {
            return Err(KernelError::OutOfRange {
                what: format!("pending slot (writing {n} from {first})"),
                index: first + n - 1,
                limit: state.pending,
            });
        }
        let base = state.len + first;
        for t in 0..n {
            let pos = base + t;
            let block = state.block_table[pos / layout.block_size()];
            debug_assert_eq!(self.allocator.ref_count(block), Ok(1));
            let slot = pos % layout.block_size();
            for head in 0..layout.num_kv_heads() {
                let src = t * token + head * row;
                for (part, buf) in [(KvPart::Key, keys), (KvPart::Value, values)] {
                    let dst = layout.row_offset(block, layer, part, head, slot);
                    self.data.write(dst, &buf[src..src + row]);
                }
            }
        }
        Ok(())
    }

    /// Commits the accepted nodes of this step — pending indices, strictly increasing (a
    /// root-to-leaf path of the step's tree, in root-to-leaf order) — as the next committed
    /// tokens, and drops every other pending slot. Node `accepted[i]` moves to position `len + i`:
    /// by swapping whole blocks in the block table where a block-aligned run of `block_size`
    /// consecutive nodes lands block-aligned, by copying slots otherwise. Blocks left empty are
    /// released.
    ///
    /// # Errors
    /// [`KernelError::UnknownSequence`]; [`KernelError::InvalidAcceptedPath`] if an index is not
    /// pending or the list is not strictly increasing (nothing changed).
    pub fn commit(&mut self, seq: SeqId, accepted: &[usize]) -> Result<CommitStats> {
        let (stats, moves) = self.commit_blocks(seq, accepted)?;
        self.move_slots(&moves)?;
        Ok(stats)
    }

    /// The bookkeeping of [`commit`](Self::commit), moving no data: updates the block table
    /// (whole-block remaps included) and the lengths, releases emptied blocks, and returns the
    /// slot copies the data must undergo, which the pool holding the data must apply before any
    /// later reserve can hand a released block out again ([`move_slots`](Self::move_slots) for
    /// this host pool). The copies read only accepted nodes' slots and write only positions
    /// `len..len + accepted.len()`, so applying them in order or all reads first is the same.
    ///
    /// # Errors
    /// As [`commit`](Self::commit) (nothing changed).
    pub fn commit_blocks(
        &mut self,
        seq: SeqId,
        accepted: &[usize],
    ) -> Result<(CommitStats, SlotMoves)> {
        let state = self.sequence(seq)?;
        for (entry, &node) in accepted.iter().enumerate() {
            if node >= state.pending {
                return Err(KernelError::InvalidAcceptedPath {
                    entry,
                    reason: format!("node {node} is not one of {} pending", state.pending),
                });
            }
            if entry > 0 && node <= accepted[entry - 1] {
                return Err(KernelError::InvalidAcceptedPath {
                    entry,
                    reason: format!(
                        "node {node} does not follow node {} (root-to-leaf order)",
                        accepted[entry - 1]
                    ),
                });
            }
        }
        let bs = self.layout.block_size();
        let len = state.len;
        let mut table = std::mem::take(
            &mut self
                .sequences
                .get_mut(&seq.0)
                .expect("checked above")
                .block_table,
        );
        let mut stats = CommitStats {
            accepted: accepted.len(),
            ..CommitStats::default()
        };
        let mut moves = SlotMoves::default();
        let mut i = 0;
        while i < accepted.len() {
            let (dst, src) = (len + i, len + accepted[i]);
            if dst == src {
                i += 1;
                continue;
            }
            let whole_block = dst % bs == 0
                && src % bs == 0
                && i + bs <= accepted.len()
                && accepted[i + bs - 1] == accepted[i] + bs - 1;
            if whole_block {
                // Later sources lie beyond this run and later destinations beyond this block, so
                // the block swapped out to the source position holds nothing still to be read.
                table.swap(dst / bs, src / bs);
                stats.blocks_remapped += 1;
                i += bs;
            } else {
                moves.push(
                    self.slot_id(table[src / bs], src % bs),
                    self.slot_id(table[dst / bs], dst % bs),
                );
                stats.slots_copied += 1;
                i += 1;
            }
        }
        let new_len = len + accepted.len();
        let keep = self.layout.blocks_for(new_len);
        stats.blocks_freed = self.release_all(&table[keep..])?;
        table.truncate(keep);
        let state = self.sequences.get_mut(&seq.0).expect("checked above");
        state.block_table = table;
        state.len = new_len;
        state.pending = 0;
        Ok((stats, moves))
    }

    /// Applies slot moves to this pool's data (every layer's K and V rows, all heads, of each
    /// slot), all reads before all writes: the data half of [`reserve`](Self::reserve) and
    /// [`commit`](Self::commit), and the host twin of `kv::cuda::move_slots`.
    ///
    /// # Errors
    /// As [`SlotMoves::check`] against [`slot_capacity`](Self::slot_capacity) (nothing moved).
    pub fn move_slots(&mut self, moves: &SlotMoves) -> Result<()> {
        moves.check(self.slot_capacity())?;
        if moves.is_empty() {
            return Ok(());
        }
        let layout = self.layout;
        let bs = layout.block_size();
        let (mut src, mut dst) = (Vec::new(), Vec::new());
        for (&from, &to) in moves.src.iter().zip(&moves.dst).filter(|(s, d)| s != d) {
            let (from, to) = (from as usize, to as usize);
            for layer in 0..layout.num_layers() {
                for part in [KvPart::Key, KvPart::Value] {
                    for head in 0..layout.num_kv_heads() {
                        let at = |slot: usize| {
                            layout.row_offset((slot / bs) as BlockId, layer, part, head, slot % bs)
                        };
                        src.push(at(from));
                        dst.push(at(to));
                    }
                }
            }
        }
        self.data.move_runs(&src, &dst, layout.head_dim());
        Ok(())
    }

    /// Drops every pending slot and the last `n` committed tokens of `seq`, releasing blocks
    /// left empty. Returns the blocks freed. `rewind(seq, 0)` just discards the pending slots.
    ///
    /// # Errors
    /// [`KernelError::UnknownSequence`]; [`KernelError::RewindPastStart`] if `n > len`
    /// (nothing changed).
    pub fn rewind(&mut self, seq: SeqId, n: usize) -> Result<usize> {
        let state = self.sequence(seq)?;
        if n > state.len {
            return Err(KernelError::RewindPastStart {
                seq: seq.0,
                requested: n,
                len: state.len,
            });
        }
        let new_len = state.len - n;
        let keep = self.layout.blocks_for(new_len);
        let dropped = state.block_table[keep..].to_vec();
        let freed = self.release_all(&dropped)?;
        let state = self.sequences.get_mut(&seq.0).expect("checked above");
        state.block_table.truncate(keep);
        state.len = new_len;
        state.pending = 0;
        Ok(freed)
    }

    /// The `head_dim` row of `(layer, part, kv_head)` for the token at logical position `pos` of
    /// `seq` (committed or pending), as f32 (a 16-bit pool's values widened exactly).
    ///
    /// # Errors
    /// [`KernelError::UnknownSequence`]; [`KernelError::OutOfRange`] for any index out of range.
    pub fn token_row(
        &self,
        seq: SeqId,
        pos: usize,
        layer: usize,
        part: KvPart,
        kv_head: usize,
    ) -> Result<Vec<f32>> {
        let state = self.sequence(seq)?;
        for (what, index, limit) in [
            ("token position", pos, state.len + state.pending),
            ("layer", layer, self.layout.num_layers()),
            ("kv head", kv_head, self.layout.num_kv_heads()),
        ] {
            if index >= limit {
                return Err(KernelError::OutOfRange {
                    what: what.to_string(),
                    index,
                    limit,
                });
            }
        }
        let bs = self.layout.block_size();
        let offset =
            self.layout
                .row_offset(state.block_table[pos / bs], layer, part, kv_head, pos % bs);
        let mut row = vec![0.0; self.layout.head_dim()];
        self.data.view().widen_into(offset, &mut row);
        Ok(row)
    }

    fn sequence(&self, seq: SeqId) -> Result<&Sequence> {
        self.sequences
            .get(&seq.0)
            .ok_or(KernelError::UnknownSequence { seq: seq.0 })
    }

    /// Blocks a reserve of `n` slots takes, and the logical block to copy first if the slot after
    /// the last one lies in a shared block.
    fn reserve_plan(&self, state: &Sequence, n: usize) -> Result<(usize, Option<usize>)> {
        if n == 0 {
            return Ok((0, None));
        }
        let start = state.len + state.pending;
        let fresh = self.layout.blocks_for(start + n) - state.block_table.len();
        let bs = self.layout.block_size();
        let copy_block = if !start.is_multiple_of(bs) {
            let logical = start / bs;
            (self.allocator.ref_count(state.block_table[logical])? > 1).then_some(logical)
        } else {
            None
        };
        Ok((fresh + usize::from(copy_block.is_some()), copy_block))
    }

    fn release_all(&mut self, blocks: &[BlockId]) -> Result<usize> {
        let mut freed = 0;
        for &block in blocks {
            freed += usize::from(self.allocator.release(block)?);
        }
        Ok(freed)
    }

    /// The physical slot id of `slot` of `block` (fits `u32`: checked at construction).
    fn slot_id(&self, block: BlockId, slot: usize) -> u32 {
        (block as usize * self.layout.block_size() + slot) as u32
    }
}
