//! How a decoder is split among tensor-parallel ranks (Megatron style).
//!
//! - **Column-parallel** (split output rows, no communication before): Q/K/V by KV-head group
//!   (rank r gets KV heads `kv_heads` and their query heads), gate/up by FFN rows, the LM head by
//!   vocabulary rows (logits are all-gathered).
//! - **Row-parallel** (split input columns, all-reduce after): the attention output projection
//!   and the down projection. A quantised row can only be cut on a block boundary of its format
//!   (32 elements for Q8_0/Q4_0/Q4_1/Q5_0, a 256-element super-block for the K-quants), so the
//!   split is counted in blocks and is **uneven** when the block count does not divide (Qwen
//!   0.5B's down projection has 4864 = 19 × 256 columns: 10 super-blocks to rank 0, 9 to rank 1).
//!   The FFN rows of gate/up follow the down projection's split, so no gather is needed there.
//!   For the output projection the columns are tied to the attention heads; when the head
//!   boundaries do not fall on its block boundaries, the ranks all-gather the attention output
//!   and each multiplies a block-aligned column range instead.
//!
//! Within a split, the first `units % world` ranks take one unit more than the rest.

use std::ops::Range;

pub use specdec_kernels::ops::split_even;

use crate::error::{ModelError, Result};
use crate::llama::{LayerWeights, LlamaConfig, ModelWeights};

/// One rank's share of a decoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlan {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// KV heads of this rank (its query heads are these times the group size).
    pub kv_heads: Range<usize>,
    /// Columns of the attention output projection this rank multiplies.
    pub o_cols: Range<usize>,
    /// True when `o_cols` are not this rank's own head columns, so the attention output must be
    /// all-gathered first.
    pub gather_attention: bool,
    /// FFN rows of gate/up, and columns of down, of this rank.
    pub ffn: Range<usize>,
    /// Vocabulary rows of the LM head of this rank.
    pub vocab: Range<usize>,
}

impl ShardPlan {
    /// The whole model on one rank.
    pub fn single(config: &LlamaConfig) -> Self {
        Self {
            rank: 0,
            world: 1,
            kv_heads: 0..config.n_kv_heads,
            o_cols: 0..config.q_dim(),
            gather_attention: false,
            ffn: 0..config.ffn,
            vocab: 0..config.vocab_size,
        }
    }

    /// The share of `rank` among `world` ranks of a model with `weights` (block sizes are read
    /// from the first layer's formats; every layer must use the same ones).
    ///
    /// # Errors
    /// [`ModelError::Config`] when there are more ranks than KV heads or than blocks of a
    /// row-parallel matrix, or `rank >= world`.
    pub fn new(
        config: &LlamaConfig,
        weights: &ModelWeights,
        rank: usize,
        world: usize,
    ) -> Result<Self> {
        if world == 0 || rank >= world {
            return Err(ModelError::Config(format!("rank {rank} of {world}")));
        }
        if world == 1 {
            return Ok(Self::single(config));
        }
        if config.n_kv_heads < world {
            return Err(ModelError::Config(format!(
                "{} KV heads cannot be split among {world} ranks",
                config.n_kv_heads
            )));
        }
        let layer = weights
            .layers
            .first()
            .ok_or_else(|| ModelError::Config("a model without layers".into()))?;
        let head_cols = config.group_size() * config.head_dim;
        let o_block = layer.wo.quant_type().block_len();
        let heads_aligned = (0..world).all(|r| {
            (split_even(config.n_kv_heads, world, r).start * head_cols).is_multiple_of(o_block)
        });
        let kv_heads = split_even(config.n_kv_heads, world, rank);
        let (o_cols, gather_attention) = if heads_aligned {
            (kv_heads.start * head_cols..kv_heads.end * head_cols, false)
        } else {
            (
                Self::block_split(config.q_dim(), o_block, world, rank, "attn_output")?,
                true,
            )
        };
        let down_block = layer.w_down.quant_type().block_len();
        let ffn = Self::block_split(config.ffn, down_block, world, rank, "ffn_down")?;
        Ok(Self {
            rank,
            world,
            kv_heads,
            o_cols,
            gather_attention,
            ffn,
            vocab: split_even(config.vocab_size, world, rank),
        })
    }

    fn block_split(
        len: usize,
        block: usize,
        world: usize,
        rank: usize,
        what: &str,
    ) -> Result<Range<usize>> {
        let blocks = len / block;
        if blocks < world {
            return Err(ModelError::Config(format!(
                "{what}: {blocks} blocks of {block} cannot be split among {world} ranks"
            )));
        }
        let r = split_even(blocks, world, rank);
        Ok(r.start * block..r.end * block)
    }

    /// Query heads of this rank.
    pub fn q_heads(&self, config: &LlamaConfig) -> Range<usize> {
        self.kv_heads.start * config.group_size()..self.kv_heads.end * config.group_size()
    }

    /// This rank's slice of `weights` (full-range slices share the original bytes).
    ///
    /// # Errors
    /// [`ModelError::Shape`] when a matrix cannot be cut as planned.
    pub fn slice_weights(
        &self,
        config: &LlamaConfig,
        weights: &ModelWeights,
    ) -> Result<ModelWeights> {
        if self.world == 1 {
            return Ok(weights.clone());
        }
        let hd = config.head_dim;
        let q_rows = self.q_heads(config).start * hd..self.q_heads(config).end * hd;
        let kv_rows = self.kv_heads.start * hd..self.kv_heads.end * hd;
        let cut =
            |v: &Option<Vec<f32>>, r: &Range<usize>| v.as_ref().map(|v| v[r.clone()].to_vec());
        let layers = weights
            .layers
            .iter()
            .map(|l| {
                Ok(LayerWeights {
                    attn_norm: l.attn_norm.clone(),
                    wq: l.wq.slice_rows(q_rows.clone())?,
                    wk: l.wk.slice_rows(kv_rows.clone())?,
                    wv: l.wv.slice_rows(kv_rows.clone())?,
                    bq: cut(&l.bq, &q_rows),
                    bk: cut(&l.bk, &kv_rows),
                    bv: cut(&l.bv, &kv_rows),
                    wo: l.wo.slice_cols(self.o_cols.clone())?,
                    ffn_norm: l.ffn_norm.clone(),
                    w_gate: l.w_gate.slice_rows(self.ffn.clone())?,
                    w_up: l.w_up.slice_rows(self.ffn.clone())?,
                    w_down: l.w_down.slice_cols(self.ffn.clone())?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ModelWeights {
            token_embd: weights.token_embd.clone(),
            layers,
            output_norm: weights.output_norm.clone(),
            output: weights.output.slice_rows(self.vocab.clone())?,
        })
    }
}
