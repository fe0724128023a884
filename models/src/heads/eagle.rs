//! [`EagleHead`]: an EAGLE-style draft head (see the module docs of [`crate::heads`] for its
//! math) running its one decoder layer with the target's own block code over its own paged KV
//! cache, with the life cycle of a [`crate::LanguageModel`]: sequences, ragged batches of
//! chains and trees, commit of a root-to-node path, rewind.

use specdec_kernels::kv::{KvLayout, PagedKvCache};
use specdec_kernels::ops::{embed_rows, rms_norm, RopeAngles};
use specdec_kernels::TreeTopology;

use super::{
    head_matrix, head_vector, DraftHead, EagleShape, HeadBase, HeadFile, HeadKind, HeadMeta,
    HeadOptions,
};
use crate::error::{ModelError, Result};
use crate::llama::block::{on_pool, BlockSeq, BlockShape, SpeculativeCache};
use crate::llama::cpu::CpuBackend;
use crate::llama::forward::{run_block, BlockScratch};
use crate::llama::product::ProductInput;
use crate::llama::step_checks::check_steps;
use crate::llama::{LayerWeights, LlamaModel, WeightMatrix};
use crate::model::{SeqId, SequenceStep};

/// The new pairs of one sequence in one [`EagleHead::forward`]: node `i` of `tree` is the pair
/// (features row `i`, `tokens[i]`) at head position `committed_len + depth(i)`.
#[derive(Debug, Clone, Copy)]
pub struct HeadStep<'a> {
    /// The sequence (of the head's cache) these pairs extend.
    pub seq: SeqId,
    /// Target token ids, one per node: the token after the node's feature.
    pub tokens: &'a [u32],
    /// `[tokens.len(), feature_dim]` row-major: the target's features, or the head's own
    /// predicted ones ([`HeadOutput::features`]) deeper in a draft.
    pub features: &'a [f32],
    /// The shape of the new pairs (`tree.len() == tokens.len()`).
    pub tree: &'a TreeTopology,
}

/// What the head gives for the nodes of one [`HeadStep`], row `i` for node `i`.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadOutput {
    /// `[n, hidden]`: the predicted feature `f̂` of the position after each node's (the layer's
    /// output, before any norm), which the next depth reads as its feature.
    pub features: Vec<f32>,
    /// `[n, draft_vocab]`: the draft logits; column `d` is target token `d2t[d]`.
    pub logits: Vec<f32>,
}

/// An EAGLE head for one target: the file's `fc`, decoder layer and LM head, the target's token
/// embedding and final norm (shared with the target, not copied), and a one-layer paged KV
/// cache of its sequences' committed pairs.
///
/// Batch-invariant like the target: a node's outputs depend only on its sequence's committed
/// pairs and its tree ancestors, bit for bit — alone, in a chain, in a tree or in a batch.
pub struct EagleHead {
    base: HeadBase,
    /// `(embed_norm, feature_norm)` when the file normalises the `fc` input's halves
    /// ([`EagleShape::input_norms`]).
    input_norms: Option<(Vec<f32>, Vec<f32>)>,
    fc: WeightMatrix,
    layer: LayerWeights,
    shape: BlockShape,
    rope_base: f32,
    kv: SpeculativeCache,
}

impl std::fmt::Debug for EagleHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EagleHead")
            .field("target", &self.base.meta.target.name)
            .field("shape", &self.shape)
            .field("precision", &self.base.precision)
            .finish_non_exhaustive()
    }
}

impl DraftHead for EagleHead {
    fn meta(&self) -> &HeadMeta {
        &self.base.meta
    }

    fn d2t(&self) -> &[u32] {
        &self.base.d2t
    }
}

impl EagleHead {
    /// The head of `file` (kind eagle) for `target`, with matrices stored as
    /// `options.precision` says and a KV cache of `options.kv_capacity_tokens` pair slots.
    /// The target's identity (SHA-256) is not checked here: the model does not know its file's
    /// hash; see [`HeadFile::check_target`].
    ///
    /// # Errors
    /// [`ModelError::Config`] for an invalid file, a Medusa file, or a head trained for another
    /// architecture, hidden size or vocabulary (naming both); KV layout errors.
    pub fn new(file: &HeadFile, target: &LlamaModel, options: HeadOptions) -> Result<Self> {
        let precision = options.precision;
        EagleShape::check_rope_scaling(target.config())?;
        let base = HeadBase::new(file, HeadKind::Eagle, target, precision)?;
        let e =
            base.meta.eagle.clone().ok_or_else(|| {
                ModelError::Config("an EAGLE head needs its `eagle` shape".into())
            })?;
        let matrix = |name: &str| head_matrix(file, name, precision);
        let bias = |name: &str| e.qkv_bias.then(|| head_vector(file, name)).transpose();
        let layer = LayerWeights {
            attn_norm: head_vector(file, "attn_norm")?,
            wq: matrix("wq")?,
            wk: matrix("wk")?,
            wv: matrix("wv")?,
            bq: bias("bq")?,
            bk: bias("bk")?,
            bv: bias("bv")?,
            wo: matrix("wo")?,
            ffn_norm: head_vector(file, "ffn_norm")?,
            w_gate: matrix("w_gate")?,
            w_up: matrix("w_up")?,
            w_down: matrix("w_down")?,
        };
        let shape = BlockShape {
            hidden: base.meta.target.hidden,
            head_dim: e.head_dim,
            q_heads: e.n_heads,
            kv_heads: e.n_kv_heads,
            ffn: e.ffn,
            rms_eps: e.rms_eps,
            rope_layout: e.rope()?,
        };
        let layout = KvLayout::new(1, e.n_kv_heads, e.head_dim, options.kv_block_size)?;
        let input_norms = if e.input_norms {
            Some((
                head_vector(file, "embed_norm")?,
                head_vector(file, "feature_norm")?,
            ))
        } else {
            None
        };
        Ok(Self {
            input_norms,
            fc: matrix("fc")?,
            layer,
            shape,
            rope_base: e.rope_base,
            kv: SpeculativeCache::new(layout, options.kv_capacity_tokens, options.kv_dtype)?,
            base,
        })
    }

    /// The head's KV cache (for metrics: blocks in use).
    pub fn cache(&self) -> &PagedKvCache {
        self.kv.cache()
    }

    /// Opens an empty sequence.
    ///
    /// # Errors
    /// Never today (the `Result` mirrors [`crate::LanguageModel::new_sequence`]).
    pub fn new_sequence(&mut self) -> Result<SeqId> {
        Ok(self.kv.create_sequence())
    }

    /// Closes `seq`, freeing its cache entries.
    ///
    /// # Errors
    /// An unknown sequence.
    pub fn release(&mut self, seq: SeqId) -> Result<()> {
        self.kv.release(seq)
    }

    /// Committed pairs of `seq` (the head position of its next root).
    ///
    /// # Errors
    /// An unknown sequence.
    pub fn seq_len(&self, seq: SeqId) -> Result<usize> {
        self.kv.len(seq)
    }

    /// Forwards the new pairs of every step and returns their outputs, in step order. Each
    /// step's pairs are written to the cache as speculative entries (earlier uncommitted ones
    /// of the same sequence are discarded first), visible to later forwards once committed.
    ///
    /// # Errors
    /// [`ModelError::InvalidStep`] naming the sequence for: a token/tree length mismatch or no
    /// pair, a token id outside the target's vocabulary, a features slice that is not
    /// `[n, feature_dim]` or holds a non-finite value, a sequence given twice, a position past
    /// the target's context, a full cache; an unknown sequence. On error no committed pair has
    /// changed.
    pub fn forward(&mut self, steps: &[HeadStep<'_>]) -> Result<Vec<HeadOutput>> {
        on_pool(|| self.forward_impl(steps))
    }

    /// Checks `steps` (see [`EagleHead::forward`]) and returns them as token steps.
    fn check_steps<'a>(&self, steps: &[HeadStep<'a>]) -> Result<Vec<SequenceStep<'a>>> {
        let as_token_steps: Vec<SequenceStep<'a>> = steps
            .iter()
            .map(|s| SequenceStep {
                seq: s.seq,
                tokens: s.tokens,
                tree: s.tree,
            })
            .collect();
        check_steps(
            &as_token_steps,
            self.base.target_vocab,
            self.base.max_context,
            |seq| self.kv.len(seq),
        )?;
        let dim = self.feature_dim();
        for step in steps {
            let bad = |reason: String| ModelError::InvalidStep {
                seq: step.seq.0,
                reason,
            };
            if step.features.len() != step.tokens.len() * dim {
                return Err(bad(format!(
                    "features: {} values for {} nodes of {dim} (the head's feature_dim)",
                    step.features.len(),
                    step.tokens.len()
                )));
            }
            if let Some(i) = step.features.iter().position(|v| !v.is_finite()) {
                return Err(bad(format!(
                    "features: value {} of node {} is {}",
                    i % dim,
                    i / dim,
                    step.features[i]
                )));
            }
        }
        Ok(as_token_steps)
    }

    fn forward_impl(&mut self, steps: &[HeadStep<'_>]) -> Result<Vec<HeadOutput>> {
        let token_steps = self.check_steps(steps)?;
        if steps.is_empty() {
            return Ok(Vec::new());
        }
        let seqs = BlockSeq::of_steps(&token_steps);
        self.kv.reserve(&seqs, "HeadOptions::kv_capacity_tokens")?;
        let (hidden, dim) = (self.shape.hidden, self.feature_dim());
        let width = hidden + dim;
        let mut positions = Vec::new();
        for step in steps {
            let len = self.kv.len(step.seq)?;
            positions.extend(step.tree.depths().iter().map(|d| len + d));
        }
        let n = positions.len();
        // Each row's fc input: [embed(token); feature], each half normalised with its own gains
        // when the head has input norms.
        let mut input = vec![0.0f32; n * width];
        let embedding = self.base.target.token_embd.view();
        let pairs = steps
            .iter()
            .flat_map(|s| s.tokens.iter().zip(s.features.chunks_exact(dim)));
        let mut embed = vec![0.0f32; hidden];
        for (row, (&token, feature)) in input.chunks_exact_mut(width).zip(pairs) {
            let (embed_half, feature_half) = row.split_at_mut(hidden);
            embed_rows(&embedding, &[token], &mut embed)?;
            match &self.input_norms {
                Some((embed_norm, feature_norm)) => {
                    rms_norm(&embed, embed_norm, self.shape.rms_eps, embed_half)?;
                    rms_norm(feature, feature_norm, self.shape.rms_eps, feature_half)?;
                }
                None => {
                    embed_half.copy_from_slice(&embed);
                    feature_half.copy_from_slice(feature);
                }
            }
        }
        let path = self.base.path;
        let mut x = vec![0.0f32; n * hidden];
        ProductInput::new(&input, n, path).product(&self.fc, &mut x)?;
        let angles = RopeAngles::new(&positions, self.shape.head_dim, self.rope_base)?;
        let mut dev = CpuBackend {
            path,
            parallel: None,
            cache: self.kv.cache_mut(),
            seqs: &seqs,
            angles: &angles,
            clock: None,
        };
        let mut scratch = BlockScratch::new(&dev, n, &self.shape)?;
        let layer = self.layer.on_cpu();
        run_block(&mut dev, &self.shape, &layer, 0, n, &mut x, &mut scratch)?;
        let normed = &mut scratch.h;
        rms_norm(
            &x,
            self.base.output_norm(),
            self.base.final_norm_eps,
            normed,
        )?;
        let vocab = self.draft_vocab();
        let mut logits = vec![0.0f32; n * vocab];
        ProductInput::new(normed, n, path).product(&self.base.lm_head, &mut logits)?;
        let mut out = Vec::with_capacity(steps.len());
        let mut first = 0;
        for step in steps {
            let rows = first..first + step.tokens.len();
            out.push(HeadOutput {
                features: x[rows.start * hidden..rows.end * hidden].to_vec(),
                logits: logits[rows.start * vocab..rows.end * vocab].to_vec(),
            });
            first = rows.end;
            self.kv.record_tree(step.seq, step.tree);
        }
        Ok(out)
    }

    /// Keeps the pairs on `path` of the last forward of `seq` as committed, in path order, and
    /// discards its other speculative entries. `path` lists node indices of that forward's
    /// tree from the root (node 0), each the parent of the next, or is empty (keeps none).
    ///
    /// # Errors
    /// An unknown sequence; [`ModelError::InvalidStep`] when `path` is not a root-to-node path
    /// of its last forward.
    pub fn commit(&mut self, seq: SeqId, path: &[usize]) -> Result<()> {
        self.kv.commit(seq, path)
    }

    /// Drops the last `n` committed pairs of `seq` (and any speculative entries).
    ///
    /// # Errors
    /// An unknown sequence, or fewer than `n` committed pairs.
    pub fn rewind(&mut self, seq: SeqId, n: usize) -> Result<()> {
        self.kv.rewind(seq, n)
    }
}
