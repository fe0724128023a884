//! [`CpuBackend`]: the forward's device boundary ([`DeviceBackend`]) on the host: `Vec<f32>`
//! buffers, quantised [`WeightMatrix`] products on the chosen [`MatmulPath`], a
//! [`PagedKvCache`] (also the host [`KvPool`]), the kernels crate's CPU references
//! (rayon-parallel where it pays), and a tensor-parallel rank's collectives.

use std::ops::Range;

use specdec_kernels::attention::{tree_attention_into, AttentionParams, AttentionSeq};
use specdec_kernels::kv::{PagedKvCache, SlotMoves};
use specdec_kernels::ops::{apply_rope, embed_rows, rms_norm, swiglu, RopeAngles};
use specdec_kernels::KernelError;

use super::block::{add, BlockSeq, BlockShape, TensorParallel};
use super::forward::{BlockWeights, DecoderWeights, DeviceBackend, KvPool};
use super::model::MatmulPath;
use super::op_times::OpClock;
use super::product::ProductInput;
use super::weights::{LayerWeights, ModelWeights, WeightMatrix};
use crate::error::Result;

/// The host as one forward sees it: the products' path, the rank's group (if sharded), the KV
/// cache the blocks write, the batch's sequences in row order and their rows' RoPE angles.
pub(crate) struct CpuBackend<'a> {
    /// How the products run.
    pub(crate) path: MatmulPath,
    /// The group of a sharded model; `None` for a single rank with nothing to combine.
    pub(crate) parallel: Option<TensorParallel<'a>>,
    /// The cache whose reserved slots take the new rows' K/V.
    pub(crate) cache: &'a mut PagedKvCache,
    /// The sequences of the batch, in row order.
    pub(crate) seqs: &'a [BlockSeq<'a>],
    /// Angles of every row (`committed_len + depth` of its sequence).
    pub(crate) angles: &'a RopeAngles,
    /// The clock of a profiled forward ([`DeviceBackend::mark`]); `None`: no timing.
    pub(crate) clock: Option<&'a OpClock>,
}

impl CpuBackend<'_> {
    /// The new rows of the batch, all sequences together.
    fn rows(&self) -> usize {
        self.seqs.iter().map(|s| s.tree.len()).sum()
    }
}

/// Each sequence of `seqs` with its rows of the batch, in batch order.
fn seq_rows<'s>(
    seqs: &'s [BlockSeq<'s>],
) -> impl Iterator<Item = (&'s BlockSeq<'s>, Range<usize>)> {
    seqs.iter().scan(0, |first, seq| {
        let own = *first..*first + seq.tree.len();
        *first = own.end;
        Some((seq, own))
    })
}

/// The host pool: the cache's own rows, moved by [`PagedKvCache::move_slots`].
impl KvPool for PagedKvCache {
    fn move_kv(&mut self, moves: &SlotMoves) -> Result<()> {
        Ok(self.move_slots(moves)?)
    }
}

impl KvPool for CpuBackend<'_> {
    fn move_kv(&mut self, moves: &SlotMoves) -> Result<()> {
        self.cache.move_kv(moves)
    }
}

impl DeviceBackend for CpuBackend<'_> {
    type Buffer = Vec<f32>;
    type Matrix = WeightMatrix;

    fn rows_of(&self, m: &WeightMatrix) -> usize {
        m.rows()
    }

    fn zeros(&self, _what: &str, len: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; len])
    }

    fn embed(&self, table: &WeightMatrix, tokens: &[u32], out: &mut Vec<f32>) -> Result<()> {
        Ok(embed_rows(&table.view(), tokens, out)?)
    }

    fn rms_norm(&self, x: &Vec<f32>, gain: &Vec<f32>, eps: f32, out: &mut Vec<f32>) -> Result<()> {
        Ok(rms_norm(x, gain, eps, out)?)
    }

    fn products(
        &self,
        x: &Vec<f32>,
        n: usize,
        pairs: &mut [(&WeightMatrix, &mut Vec<f32>)],
    ) -> Result<()> {
        ProductInput::new(x, n, self.path).products(pairs)
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>) -> Result<()> {
        if y.is_empty() || !x.len().is_multiple_of(y.len()) {
            return Err(KernelError::ShapeMismatch {
                what: "added rows (a length dividing the rows')".to_string(),
                expected: x.len(),
                actual: y.len(),
            }
            .into());
        }
        for row in x.chunks_mut(y.len()) {
            add(row, y);
        }
        Ok(())
    }

    fn rope(&self, x: &mut Vec<f32>, heads: usize, shape: &BlockShape) -> Result<()> {
        Ok(apply_rope(x, heads, self.angles, shape.rope_layout)?)
    }

    fn write_kv(&mut self, layer: usize, k: &Vec<f32>, v: &Vec<f32>) -> Result<()> {
        let rows = self.rows();
        if rows == 0 || v.len() != k.len() || !k.len().is_multiple_of(rows) {
            return Err(KernelError::ShapeMismatch {
                what: format!("new keys and values ({rows} rows each)"),
                expected: k.len(),
                actual: v.len(),
            }
            .into());
        }
        let kv_w = k.len() / rows;
        for (seq, own) in seq_rows(self.seqs) {
            let r = own.start * kv_w..own.end * kv_w;
            self.cache
                .write_kv(seq.seq, layer, 0, &k[r.clone()], &v[r])?;
        }
        Ok(())
    }

    fn attention(
        &mut self,
        layer: usize,
        shape: &BlockShape,
        q: &Vec<f32>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let q_w = shape.q_width();
        let rows = self.rows();
        if q.len() != rows * q_w {
            return Err(KernelError::ShapeMismatch {
                what: format!("queries ({rows} rows of {q_w})"),
                expected: rows * q_w,
                actual: q.len(),
            }
            .into());
        }
        let batch = seq_rows(self.seqs)
            .map(|(seq, own)| {
                Ok(AttentionSeq {
                    queries: &q[own.start * q_w..own.end * q_w],
                    block_table: self.cache.block_table(seq.seq)?,
                    prefix_len: self.cache.len(seq.seq)?,
                    tree: seq.tree,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let params = AttentionParams {
            layer,
            num_q_heads: shape.q_heads,
            scale: shape.attention_scale(),
        };
        Ok(tree_attention_into(
            &self.cache.pages(),
            &params,
            &batch,
            out,
        )?)
    }

    fn swiglu(&self, gate: &Vec<f32>, up: &Vec<f32>, out: &mut Vec<f32>) -> Result<()> {
        Ok(swiglu(gate, up, out)?)
    }

    fn attention_projection(
        &self,
        attn: &Vec<f32>,
        n: usize,
        wo: &WeightMatrix,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        match self.parallel {
            Some(tp) if tp.plan.gather_attention => {
                self.products(&tp.gathered_attention(attn, n)?, n, &mut [(wo, out)])
            }
            _ => self.products(attn, n, &mut [(wo, out)]),
        }
    }

    fn all_reduce(&self, partial: &mut Vec<f32>) -> Result<()> {
        match self.parallel {
            Some(tp) => tp.comm.all_reduce_sum(partial),
            None => Ok(()),
        }
    }

    fn mark(&self, op: &'static str) {
        if let Some(clock) = self.clock {
            clock.mark(op);
        }
    }
}

impl LayerWeights {
    /// This block's weights as the CPU forward reads them.
    pub(crate) fn on_cpu<'w, 'a>(&'w self) -> BlockWeights<'w, CpuBackend<'a>> {
        BlockWeights {
            attn_norm: &self.attn_norm,
            wq: &self.wq,
            wk: &self.wk,
            wv: &self.wv,
            bias: [self.bq.as_ref(), self.bk.as_ref(), self.bv.as_ref()],
            wo: &self.wo,
            ffn_norm: &self.ffn_norm,
            w_gate: &self.w_gate,
            w_up: &self.w_up,
            w_down: &self.w_down,
        }
    }
}

impl ModelWeights {
    /// The decoder as the CPU forward reads it: blocks `blocks` (indices into `layers`, in run
    /// order) and `head` as the LM head.
    pub(crate) fn on_cpu<'w, 'a>(
        &'w self,
        blocks: &[usize],
        head: &'w WeightMatrix,
    ) -> DecoderWeights<'w, CpuBackend<'a>> {
        DecoderWeights {
            token_embd: &self.token_embd,
            blocks: blocks.iter().map(|&b| self.layers[b].on_cpu()).collect(),
            output_norm: &self.output_norm,
            head,
        }
    }
}

#[cfg(test)]
mod tests {
    use specdec_kernels::kv::KvLayout;
    use specdec_kernels::TreeTopology;

    use super::*;
    use crate::model::SeqId;

    /// Runs `check` on a host backend over one sequence of `rows` chain rows in a small cache.
    fn with_backend(rows: usize, check: impl FnOnce(&mut CpuBackend<'_>)) {
        let layout = KvLayout::new(1, 1, 2, 4).unwrap();
        let mut cache = PagedKvCache::new(layout, 4).unwrap();
        let seq: SeqId = cache.create_sequence();
        cache.reserve(seq, rows).unwrap();
        let tree = TreeTopology::chain(rows);
        let seqs = [BlockSeq { seq, tree: &tree }];
        let angles = RopeAngles::new(&(0..rows).collect::<Vec<_>>(), 2, 10_000.0).unwrap();
        let mut dev = CpuBackend {
            path: MatmulPath::Exact,
            parallel: None,
            cache: &mut cache,
            seqs: &seqs,
            angles: &angles,
            clock: None,
        };
        check(&mut dev);
    }

    #[test]
    fn add_repeats_a_row_over_the_rows_and_refuses_one_that_does_not_divide() {
        with_backend(1, |dev| {
            let mut x = vec![1.0, 2.0, 3.0, 4.0];
            dev.add(&mut x, &vec![10.0, 20.0]).unwrap();
            assert_eq!(x, [11.0, 22.0, 13.0, 24.0]);
            let err = dev.add(&mut x, &vec![1.0, 2.0, 3.0]).unwrap_err();
            assert!(err.to_string().contains("added rows"), "{err}");
            assert!(dev.add(&mut x, &Vec::new()).is_err());
            assert_eq!(x, [11.0, 22.0, 13.0, 24.0], "a refused add changes nothing");
        });
    }

    #[test]
    fn write_kv_refuses_keys_and_values_of_other_shapes_without_panicking() {
        with_backend(2, |dev| {
            let k = vec![0.5; 4];
            assert!(dev.write_kv(0, &k, &vec![0.5; 3]).is_err());
            assert!(dev.write_kv(0, &vec![0.5; 3], &vec![0.5; 3]).is_err());
            dev.write_kv(0, &k, &k).unwrap();
        });
    }

    #[test]
    fn attention_refuses_queries_of_another_shape_without_panicking() {
        with_backend(2, |dev| {
            let shape = BlockShape {
                hidden: 2,
                head_dim: 2,
                q_heads: 1,
                kv_heads: 1,
                ffn: 2,
                rms_eps: 1e-6,
                rope_layout: specdec_kernels::ops::RopeLayout::Interleaved,
            };
            let mut out = vec![0.0; 4];
            let err = dev
                .attention(0, &shape, &vec![0.5; 3], &mut out)
                .unwrap_err();
            assert!(err.to_string().contains("queries"), "{err}");
            dev.write_kv(0, &vec![0.5; 4], &vec![0.5; 4]).unwrap();
            dev.attention(0, &shape, &vec![0.5; 4], &mut out).unwrap();
            assert!(out.iter().all(|v| (v - 0.5).abs() < 1e-6), "{out:?}");
        });
    }
}
