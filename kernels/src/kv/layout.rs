//! The element layout of one KV block, and a read-only view over a pool of blocks.
//!
//! A **block** holds K and V for `block_size` consecutive token slots of one sequence, for every
//! layer and every KV head. Its `block_elems()` elements (f32, bf16 or f16: [`KvDtype`]) are
//! laid out row-major as
//!
//! ```text
//! [layer][part: 0 = K, 1 = V][kv_head][slot][head_dim]
//! ```
//!
//! so the K (or V) rows of one layer and one head inside a block are contiguous
//! `[block_size][head_dim]` tiles. Block `b` of a pool starts at element `b * block_elems()`.
//! A token at logical position `pos` of a sequence lives in block `block_table[pos / block_size]`,
//! slot `pos % block_size`. The CUDA twin uses the same layout, element for element.

use crate::error::{KernelError, Result};
use crate::kv::dtype::{KvData, KvDtype};

/// Index of a physical block in a pool (`0..num_blocks`). `u32` so block tables can be copied
/// verbatim into device memory as `uint32_t`.
pub type BlockId = u32;

/// Which half of a KV row: the key or the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvPart {
    /// The key (after RoPE).
    Key = 0,
    /// The value.
    Value = 1,
}

/// Shape of the KV cache: layers, KV heads, head dimension and slots per block. Validated on
/// construction (every dimension at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvLayout {
    num_layers: usize,
    num_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
}

impl KvLayout {
    /// A layout of `num_layers` layers, `num_kv_heads` KV heads of `head_dim` f32 each, and
    /// `block_size` token slots per block.
    ///
    /// # Errors
    /// [`KernelError::InvalidConfig`] if any dimension is zero or a block would exceed `u32` /
    /// `usize` addressing.
    pub fn new(
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
        block_size: usize,
    ) -> Result<Self> {
        for (name, value) in [
            ("num_layers", num_layers),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
            ("block_size", block_size),
        ] {
            if value == 0 {
                return Err(KernelError::InvalidConfig {
                    reason: format!("KV layout: {name} must be at least 1"),
                });
            }
        }
        let elems = num_layers
            .checked_mul(2)
            .and_then(|x| x.checked_mul(num_kv_heads))
            .and_then(|x| x.checked_mul(head_dim))
            .and_then(|x| x.checked_mul(block_size));
        if elems.is_none_or(|e| e > u32::MAX as usize) {
            return Err(KernelError::InvalidConfig {
                reason: "KV layout: one block would exceed 2^32 elements".to_string(),
            });
        }
        Ok(Self {
            num_layers,
            num_kv_heads,
            head_dim,
            block_size,
        })
    }

    /// Number of transformer layers stored per block.
    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// Number of KV heads per layer.
    pub fn num_kv_heads(&self) -> usize {
        self.num_kv_heads
    }

    /// f32 elements per head row.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// f32 elements in one block: `num_layers * 2 * num_kv_heads * block_size * head_dim`.
    pub fn block_elems(&self) -> usize {
        self.num_layers * 2 * self.num_kv_heads * self.block_size * self.head_dim
    }

    /// f32 elements of one token (all layers, K and V, all heads): `block_elems / block_size`.
    pub fn token_elems(&self) -> usize {
        self.num_layers * 2 * self.num_kv_heads * self.head_dim
    }

    /// Offset, inside one block, of the `[block_size][head_dim]` tile of `(layer, part, kv_head)`.
    /// Arguments must be in range (debug-asserted; callers validate).
    pub fn tile_offset(&self, layer: usize, part: KvPart, kv_head: usize) -> usize {
        debug_assert!(layer < self.num_layers && kv_head < self.num_kv_heads);
        ((layer * 2 + part as usize) * self.num_kv_heads + kv_head)
            * self.block_size
            * self.head_dim
    }

    /// Offset in a pool of the `head_dim` row of `(block, layer, part, kv_head, slot)`.
    pub fn row_offset(
        &self,
        block: BlockId,
        layer: usize,
        part: KvPart,
        kv_head: usize,
        slot: usize,
    ) -> usize {
        debug_assert!(slot < self.block_size);
        block as usize * self.block_elems()
            + self.tile_offset(layer, part, kv_head)
            + slot * self.head_dim
    }

    /// Number of blocks that hold `tokens` slots: `ceil(tokens / block_size)`.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Checks that `block_table` names blocks of a pool of `num_blocks` blocks and covers
    /// `tokens` slots (the CPU pages and the CUDA pool share this check).
    ///
    /// # Errors
    /// [`KernelError::ShapeMismatch`] if the table is too short; [`KernelError::OutOfRange`]
    /// naming the first block id outside the pool.
    pub fn check_block_table(
        &self,
        num_blocks: usize,
        block_table: &[BlockId],
        tokens: usize,
    ) -> Result<()> {
        let needed = self.blocks_for(tokens);
        if block_table.len() < needed {
            return Err(KernelError::ShapeMismatch {
                what: format!("block table for {tokens} tokens"),
                expected: needed,
                actual: block_table.len(),
            });
        }
        if let Some(&bad) = block_table[..needed]
            .iter()
            .find(|&&b| b as usize >= num_blocks)
        {
            return Err(KernelError::OutOfRange {
                what: "block id in block table".to_string(),
                index: bad as usize,
                limit: num_blocks,
            });
        }
        Ok(())
    }
}

/// A read-only view over a pool of KV blocks: `data.len() == num_blocks * layout.block_elems()`,
/// elements of any [`KvDtype`]. What attention reads; obtained from
/// [`crate::kv::PagedKvCache::pages`] or built over any buffer in the documented layout (tests
/// do this to scatter blocks at will).
#[derive(Debug, Clone, Copy)]
pub struct KvPages<'a> {
    layout: KvLayout,
    data: KvData<'a>,
}

impl<'a> KvPages<'a> {
    /// Wraps f32 `data` as a pool of blocks of `layout`.
    ///
    /// # Errors
    /// [`KernelError::ShapeMismatch`] if `data.len()` is not a whole number of blocks.
    pub fn new(layout: KvLayout, data: &'a [f32]) -> Result<Self> {
        Self::of(layout, KvData::F32(data))
    }

    /// Wraps `data` of any element type as a pool of blocks of `layout`.
    ///
    /// # Errors
    /// As [`KvPages::new`].
    pub fn of(layout: KvLayout, data: KvData<'a>) -> Result<Self> {
        let block = layout.block_elems();
        if !data.len().is_multiple_of(block) {
            return Err(KernelError::ShapeMismatch {
                what: "KV pool length (a multiple of block_elems)".to_string(),
                expected: data.len().div_ceil(block) * block,
                actual: data.len(),
            });
        }
        Ok(Self { layout, data })
    }

    /// The layout of every block.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Number of blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.data.len() / self.layout.block_elems()
    }

    /// The whole pool, in the documented layout.
    pub fn data(&self) -> KvData<'a> {
        self.data
    }

    /// The element type.
    pub fn dtype(&self) -> KvDtype {
        self.data.dtype()
    }

    /// The `head_dim` row of `(block, layer, part, kv_head, slot)` of an f32 pool, borrowed
    /// (`None` for a 16-bit pool: [`KvPages::widen_row`]). Arguments must be in range (callers
    /// validate block tables first); out-of-range arguments panic on slice indexing.
    #[inline]
    pub fn row(
        &self,
        block: BlockId,
        layer: usize,
        part: KvPart,
        kv_head: usize,
        slot: usize,
    ) -> Option<&'a [f32]> {
        let start = self.layout.row_offset(block, layer, part, kv_head, slot);
        let data = self.data.as_f32()?;
        Some(&data[start..start + self.layout.head_dim])
    }

    /// The same row, of any element type, widened to f32 into `out` (`head_dim` long).
    #[inline]
    pub fn widen_row(
        &self,
        (block, layer, part, kv_head, slot): (BlockId, usize, KvPart, usize, usize),
        out: &mut [f32],
    ) {
        let start = self.layout.row_offset(block, layer, part, kv_head, slot);
        self.data.widen_into(start, out);
    }

    /// Checks that `block_table` names blocks of this pool and covers `tokens` slots.
    ///
    /// # Errors
    /// As [`KvLayout::check_block_table`].
    pub fn check_block_table(&self, block_table: &[BlockId], tokens: usize) -> Result<()> {
        self.layout
            .check_block_table(self.num_blocks(), block_table, tokens)
    }
}
