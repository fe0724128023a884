//! Paged KV cache with speculative commit / rewind (CPU reference; host-side bookkeeping).
//!
//! - [`layout`]: the element layout of a block (`[layer][K/V][kv_head][slot][head_dim]`)
//!   and [`KvPages`], the read-only view attention consumes;
//! - [`dtype`]: the element type of a pool (f32, bf16 or f16: rounded on write, widened
//!   exactly on read);
//! - [`allocator`]: reference-counted block allocation;
//! - [`cache`]: [`PagedKvCache`], per-sequence block tables and the life cycle
//!   `reserve → write_kv (per layer) → attention → commit(accepted path) | rewind(n)`,
//!   plus `fork` (prefix sharing with copy-on-write);
//! - [`moves`]: [`SlotMoves`], the data half of a commit or copy-on-write, which each device's
//!   pool applies (host: [`PagedKvCache::move_slots`]; GPU: [`cuda::move_slots`]).
//!
//! A step for one sequence, as the model runner drives it:
//!
//! ```
//! use specdec_kernels::kv::{KvLayout, PagedKvCache};
//! # fn main() -> specdec_kernels::Result<()> {
//! let layout = KvLayout::new(1, 1, 2, 4)?; // 1 layer, 1 KV head, head_dim 2, 4 slots/block
//! let mut cache = PagedKvCache::new(layout, 8)?;
//! let seq = cache.create_sequence();
//! let first = cache.reserve(seq, 3)?; // a tree of 3 nodes: pending slots 0..3
//! let k = [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]; // [3 tokens][1 head][2]
//! cache.write_kv(seq, 0, first, &k, &k)?;
//! // ... tree attention with prefix_len = cache.len(seq)? and cache.block_table(seq)? ...
//! cache.commit(seq, &[0, 2])?; // the root and node 2 were accepted
//! assert_eq!(cache.len(seq)?, 2);
//! cache.rewind(seq, 1)?;
//! assert_eq!(cache.len(seq)?, 1);
//! # Ok(()) }
//! ```

pub mod allocator;
pub mod cache;
pub mod cuda;
pub mod dtype;
pub mod layout;
pub mod moves;

#[cfg(test)]
mod tests;

pub use allocator::BlockAllocator;
pub use cache::{CommitStats, PagedKvCache, SeqId};
pub use dtype::{KvData, KvDtype};
pub use layout::{BlockId, KvLayout, KvPages, KvPart};
pub use moves::SlotMoves;
