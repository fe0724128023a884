//! [`LlamaModel`]: a (possibly sharded) Llama-family decoder with its own paged KV cache.

use std::path::Path;
use std::sync::Arc;

use specdec_kernels::kv::{KvDtype, KvLayout, PagedKvCache};
use specdec_kernels::ops::RopeAngles;
use specdec_kernels::quant::SimdLevel;
#[cfg(doc)]
use specdec_kernels::quant::{
    int8::Q8_BLOCK, int8_supported, q32_supported, quant_matmul_int8, quant_matmul_q32,
    Q8Activations, Q8Blocks32,
};
use specdec_kernels::TreeTopology;

use super::block::{interleave, on_pool, BlockSeq, BlockShape, SpeculativeCache, TensorParallel};
use super::config::LlamaConfig;
use super::cpu::CpuBackend;
use super::forward::run_blocks;
use super::load::{read_config, read_special_tokens, read_weights, SpecialTokens};
use super::op_times::{OpClock, OpTime};
use super::step_checks::check_steps;
use super::weights::{ModelWeights, WeightMatrix};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::model::{
    check_logit_ids, prefill_in_chunks, Features, KvRoom, LanguageModel, Logits, SeqId,
    SequenceStep,
};
use crate::shard::{Communicator, ShardPlan, SingleRank};

/// How the forward pass multiplies activations by the quantised weight matrices. Both choices
/// are batch-invariant (a token's logits are bit-identical whatever else is in the forward), so
/// greedy speculative output equals greedy plain output on either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MatmulPath {
    /// f32 activations against the dequantised weights
    /// ([`quant_matmul`](specdec_kernels::quant::quant_matmul)) for every matrix: the
    /// reference path, matching an f32 transformers run of the same GGUF to ~1e-4.
    Exact,
    /// The llama.cpp-like fast path: each layer input is quantised once to 8 bits and shared
    /// by every matrix reading it (Q/K/V, gate/up), with integer dot products. Q4_K / Q6_K
    /// matrices ([`int8_supported`]) whose input width is a multiple of [`Q8_BLOCK`] use
    /// [`quant_matmul_int8`] (256-element blocks, [`Q8Activations`]); Q8_0, Q4_0, Q4_1 and Q5_0
    /// matrices ([`q32_supported`], the LM head / tied embedding included) use
    /// [`quant_matmul_q32`] (32-element blocks, [`Q8Blocks32`]); every other matrix takes the
    /// [`MatmulPath::Exact`] product. On AVX-512 and AVX2 both families are read from a copy
    /// repacked sixteen rows at a time ([`MatmulPath::prepare`], same results). Logits then
    /// differ from the f32 reference by activation-quantisation noise (as llama.cpp's do).
    #[default]
    Int8,
}

impl MatmulPath {
    /// Readies `weights` for this path: on [`MatmulPath::Int8`] with AVX-512 or AVX2, the
    /// matrices of both 8-bit families get the copy the tile kernels read
    /// ([`ModelWeights::pack_for_int8`], the same results faster); otherwise nothing changes.
    ///
    /// # Errors
    /// Packing errors.
    pub fn prepare(self, weights: &mut ModelWeights) -> Result<()> {
        if self == MatmulPath::Int8 {
            weights.pack_for_int8(SimdLevel::detect())?;
        }
        Ok(())
    }
}

/// Options of a [`LlamaModel`]: the sizing of its KV cache and the matmul path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlamaOptions {
    /// Token slots in the KV cache, over all sequences (rounded up to whole blocks).
    pub kv_capacity_tokens: usize,
    /// Token slots per KV block.
    pub kv_block_size: usize,
    /// Element type of the KV cache (f32, bf16 or f16; attention computes in f32 either way).
    pub kv_dtype: KvDtype,
    /// How quantised weights are multiplied (every rank of a sharded model uses the same).
    pub matmul: MatmulPath,
}

impl LlamaOptions {
    /// The default options with `matmul` as the matmul path.
    pub fn with_matmul(matmul: MatmulPath) -> Self {
        Self {
            matmul,
            ..Self::default()
        }
    }
}

impl Default for LlamaOptions {
    /// 4096 f32 slots in blocks of 16, the [`MatmulPath::Int8`] fast path.
    fn default() -> Self {
        Self {
            kv_capacity_tokens: 4096,
            kv_block_size: 16,
            kv_dtype: KvDtype::F32,
            matmul: MatmulPath::default(),
        }
    }
}

/// A Llama / Qwen2 decoder implementing [`LanguageModel`]: quantised weights, paged KV cache,
/// tree attention. As one rank of a tensor-parallel group (see [`crate::shard`]) it holds its
/// slice of the weights and of the KV heads, and its `forward` must be called on every rank of
/// the group at once with the same steps.
pub struct LlamaModel {
    config: LlamaConfig,
    plan: ShardPlan,
    weights: Arc<ModelWeights>,
    /// Indices (into `weights.layers`) of the blocks run, in order; all of them unless this is a
    /// layer-skip view (see [`super::layer_skip`]). KV layer `i` belongs to block `layers[i]`.
    layers: Vec<usize>,
    comm: Arc<dyn Communicator>,
    /// The KV cache and the tree of each sequence's last forward.
    kv: SpeculativeCache,
    special: SpecialTokens,
    matmul: MatmulPath,
    /// The LM head's first rows when only the logits of token ids `0..rows` are computed
    /// ([`LanguageModel::limit_logits`]).
    limited_head: Option<LimitedHead>,
    /// Blocks (indices into `weights.layers`) whose outputs a forward hands back
    /// ([`LanguageModel::tap_features`]).
    taps: Vec<usize>,
    /// The per-op clock of a profiled model ([`LlamaModel::time_ops`]).
    op_clock: Option<OpClock>,
}

impl std::fmt::Debug for LlamaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaModel")
            .field("config", &self.config)
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

/// A limited LM head ([`LanguageModel::limit_logits`]): row `j` of `head` is the full head's
/// row `ids[j]`.
struct LimitedHead {
    head: WeightMatrix,
    ids: Vec<u32>,
}

impl LlamaModel {
    /// Opens the GGUF file at `path` (memory-mapped) as a single-rank model.
    ///
    /// # Errors
    /// I/O and GGUF errors, an unsupported architecture, missing or misshapen tensors.
    pub fn load(path: impl AsRef<Path>, options: LlamaOptions) -> Result<Self> {
        Self::from_gguf(&Arc::new(GgufFile::open(path)?), options)
    }

    /// A single-rank model over a parsed GGUF file.
    ///
    /// # Errors
    /// As [`LlamaModel::load`].
    pub fn from_gguf(file: &Arc<GgufFile>, options: LlamaOptions) -> Result<Self> {
        let config = read_config(file)?;
        let weights = read_weights(file, &config)?;
        Self::from_weights(config, weights, read_special_tokens(file), options)
    }

    /// A single-rank model over weights built in memory (synthetic test models).
    ///
    /// # Errors
    /// [`ModelError::Config`] / [`ModelError::Shape`] when the weights do not match `config`.
    pub fn from_weights(
        config: LlamaConfig,
        weights: ModelWeights,
        special: SpecialTokens,
        options: LlamaOptions,
    ) -> Result<Self> {
        Self::rank_of(config, &weights, special, options, Arc::new(SingleRank))
    }

    /// Rank `comm.rank()` of a tensor-parallel group of `comm.world_size()` ranks over the full
    /// `weights` (each rank keeps its slice; see [`ShardPlan`]).
    ///
    /// # Errors
    /// As [`ShardPlan::new`] and [`LlamaModel::from_weights`].
    pub fn rank_of(
        config: LlamaConfig,
        weights: &ModelWeights,
        special: SpecialTokens,
        options: LlamaOptions,
        comm: Arc<dyn Communicator>,
    ) -> Result<Self> {
        config.validate()?;
        if weights.layers.len() != config.n_layers {
            return Err(ModelError::Config(format!(
                "{} layers of weights for {} blocks",
                weights.layers.len(),
                config.n_layers
            )));
        }
        let plan = ShardPlan::new(&config, weights, comm.rank(), comm.world_size())?;
        let mut weights = plan.slice_weights(&config, weights)?;
        options.matmul.prepare(&mut weights)?;
        let weights = Arc::new(weights);
        let layers = (0..config.n_layers).collect();
        Self::assemble(config, plan, weights, layers, special, options, comm)
    }

    /// Builds a model running blocks `layers` of `weights` (shared, not copied), with a fresh KV
    /// cache holding one layer per entry of `layers`.
    pub(super) fn assemble(
        config: LlamaConfig,
        plan: ShardPlan,
        weights: Arc<ModelWeights>,
        layers: Vec<usize>,
        special: SpecialTokens,
        options: LlamaOptions,
        comm: Arc<dyn Communicator>,
    ) -> Result<Self> {
        let layout = KvLayout::new(
            layers.len(),
            plan.kv_heads.len(),
            config.head_dim,
            options.kv_block_size,
        )?;
        Ok(Self {
            kv: SpeculativeCache::new(layout, options.kv_capacity_tokens, options.kv_dtype)?,
            config,
            plan,
            weights,
            layers,
            comm,
            special,
            matmul: options.matmul,
            limited_head: None,
            taps: Vec::new(),
            op_clock: None,
        })
    }

    /// The shared weights, the blocks run, and what [`LlamaModel::assemble`] needs to build a
    /// sibling over the same weights (for [`super::layer_skip`]).
    #[allow(clippy::type_complexity)]
    pub(super) fn parts(
        &self,
    ) -> (
        &LlamaConfig,
        &ShardPlan,
        &Arc<ModelWeights>,
        &[usize],
        &SpecialTokens,
        &Arc<dyn Communicator>,
    ) {
        (
            &self.config,
            &self.plan,
            &self.weights,
            &self.layers,
            &self.special,
            &self.comm,
        )
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// This rank's share of the model.
    pub fn plan(&self) -> &ShardPlan {
        &self.plan
    }

    /// The matmul path of the forward pass.
    pub fn matmul_path(&self) -> MatmulPath {
        self.matmul
    }

    /// The KV cache (for metrics: blocks in use).
    pub fn cache(&self) -> &PagedKvCache {
        self.kv.cache()
    }

    /// The token embedding `[vocab, hidden]` (as stored; shared, cheap to clone), which the
    /// forward gathers rows of. Draft heads embed their tokens with it.
    pub fn token_embedding(&self) -> &WeightMatrix {
        &self.weights.token_embd
    }

    /// The final RMSNorm gains `[hidden]` (applied with `config().rms_eps` before the LM head).
    pub fn output_norm(&self) -> &[f32] {
        &self.weights.output_norm
    }

    /// This rank's weights, shared (draft heads keep them for the token embedding and the final
    /// norm, which every rank holds whole).
    pub(crate) fn shared_weights(&self) -> &Arc<ModelWeights> {
        &self.weights
    }

    fn check_steps(&self, steps: &[SequenceStep<'_>]) -> Result<()> {
        check_steps(steps, self.config.vocab_size, self.max_context(), |seq| {
            self.kv.len(seq)
        })
    }

    /// The forward pass: each step's logits (with its tapped features attached), and each
    /// step's tapped features (`None` without taps; moved into the logits when there are
    /// logits). Without `with_logits` it stops after the blocks (a prefill: the K/V are written,
    /// no LM head is run) and returns no logits.
    fn forward_impl(
        &mut self,
        steps: &[SequenceStep<'_>],
        with_logits: bool,
    ) -> Result<(Vec<Logits>, Vec<Option<Features>>)> {
        self.check_steps(steps)?;
        if steps.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let seqs = BlockSeq::of_steps(steps);
        self.kv.reserve(&seqs, "LlamaOptions::kv_capacity_tokens")?;
        let c = &self.config;
        let hidden = c.hidden;
        let shape = BlockShape {
            hidden,
            head_dim: c.head_dim,
            q_heads: self.plan.q_heads(c).len(),
            kv_heads: self.plan.kv_heads.len(),
            ffn: self.plan.ffn.len(),
            rms_eps: c.rms_eps,
            rope_layout: c.rope_layout,
        };
        let mut positions = Vec::new();
        let mut tokens = Vec::new();
        for step in steps {
            let len = self.kv.len(step.seq)?;
            positions.extend(step.tree.depths().iter().map(|d| len + d));
            tokens.extend_from_slice(step.tokens);
        }
        let n = tokens.len();
        let angles = RopeAngles::scaled(&positions, c.head_dim, c.rope_base, &c.rope_scaling)?;
        let head = self
            .limited_head
            .as_ref()
            .map_or(&self.weights.output, |limited| &limited.head);
        let decoder = self.weights.on_cpu(&self.layers, head);
        let mut dev = CpuBackend {
            path: self.matmul,
            parallel: Some(TensorParallel {
                comm: self.comm.as_ref(),
                plan: &self.plan,
                q_dim: c.q_dim(),
            }),
            cache: self.kv.cache_mut(),
            seqs: &seqs,
            angles: &angles,
            clock: self.op_clock.as_ref(),
        };
        if let Some(clock) = &self.op_clock {
            clock.start();
        }
        let tap_dim = self.taps.len() * hidden;
        let mut tapped = vec![0.0f32; n * tap_dim];
        let (layers, taps) = (&self.layers, &self.taps);
        let rows = run_blocks(&mut dev, &shape, &decoder, &tokens, &mut |layer, x| {
            let block = layers[layer];
            for (slot, _) in taps.iter().enumerate().filter(|(_, &t)| t == block) {
                for (row, out) in x.chunks(hidden).zip(tapped.chunks_mut(tap_dim)) {
                    out[slot * hidden..(slot + 1) * hidden].copy_from_slice(row);
                }
            }
            Ok(())
        })?;
        // Each step's rows of the tapped features.
        let mut features = Vec::with_capacity(steps.len());
        let mut first = 0;
        for step in steps {
            let rows = step.tokens.len();
            let own = &tapped[first * tap_dim..(first + rows) * tap_dim];
            features.push(if tap_dim > 0 {
                Some(Features::new(tap_dim, own.to_vec())?)
            } else {
                None
            });
            first += rows;
        }
        if !with_logits {
            for step in steps {
                self.kv.record_tree(step.seq, step.tree);
            }
            return Ok((Vec::new(), features));
        }
        let mut logits = rows.logits(&dev, &shape, &decoder)?;
        if self.plan.world > 1 {
            logits = interleave(&self.comm.all_gather(&logits)?, n);
        }
        let vocab = c.vocab_size;
        if let Some(limited) = &self.limited_head {
            // the ids outside the limit were not computed: -inf, which no sampler takes
            logits = scatter_rows(&logits, &limited.ids, vocab, f32::NEG_INFINITY);
        }
        let mut out = Vec::with_capacity(steps.len());
        let mut first = 0;
        for step in steps {
            let rows = step.tokens.len();
            let own = if steps.len() == 1 {
                // one sequence: its rows are the whole buffer, handed over without a copy
                std::mem::take(&mut logits)
            } else {
                logits[first * vocab..(first + rows) * vocab].to_vec()
            };
            let mut step_logits = Logits::new(vocab, own)?;
            if let Some(f) = features[out.len()].take() {
                step_logits = step_logits.with_features(f)?;
            }
            out.push(step_logits);
            first += rows;
            self.kv.record_tree(step.seq, step.tree);
        }
        if let Some(clock) = &self.op_clock {
            clock.mark("outputs");
        }
        Ok((out, features))
    }
}

/// `[n, width]` rows widened to `[n, to]`, the new entries `fill`.
fn scatter_rows(rows: &[f32], ids: &[u32], to: usize, fill: f32) -> Vec<f32> {
    let mut out = vec![fill; rows.len() / ids.len() * to];
    for (row, wide) in rows.chunks_exact(ids.len()).zip(out.chunks_exact_mut(to)) {
        for (&value, &id) in row.iter().zip(ids) {
            wide[id as usize] = value;
        }
    }
    out
}

impl LlamaModel {
    /// Times every op of each forward from now on (`on`), adding to totals that
    /// [`LlamaModel::op_times`] reads, or stops timing and drops them. Timing costs a clock
    /// read and an uncontended lock per op.
    pub fn time_ops(&mut self, on: bool) {
        self.op_clock = on.then(OpClock::default);
    }

    /// The wall time of each op over the forwards since timing began or the last reset
    /// (empty when not timing), in the order the ops first ran; they add up to the forwards'
    /// time less the input checks and cache reservations before the first op.
    pub fn op_times(&self) -> Vec<OpTime> {
        self.op_clock
            .as_ref()
            .map(OpClock::times)
            .unwrap_or_default()
    }

    /// Clears the totals of [`LlamaModel::op_times`] (timing stays on if it was).
    pub fn reset_op_times(&self) {
        if let Some(clock) = &self.op_clock {
            clock.reset();
        }
    }

    /// [`LlamaModel::forward_impl`] on the thread pool. A single rank runs its whole forward on
    /// a rayon worker ([`on_pool`]), so the ~7 parallel products per layer start from a pool
    /// thread. Ranks of a tensor-parallel group stay on their own threads: they block in
    /// collectives and must not hold pool threads the other ranks' products need.
    fn forward_on_pool(
        &mut self,
        steps: &[SequenceStep<'_>],
        with_logits: bool,
    ) -> Result<(Vec<Logits>, Vec<Option<Features>>)> {
        if self.comm.world_size() == 1 {
            return on_pool(|| self.forward_impl(steps, with_logits));
        }
        self.forward_impl(steps, with_logits)
    }
}

impl LanguageModel for LlamaModel {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn logit_ids(&self) -> Option<&[u32]> {
        self.limited_head.as_ref().map(|limited| &limited.ids[..])
    }

    /// Builds an LM head of the rows `ids` (the file's first rows in place when `ids` is
    /// `0..n`, else a copy of those rows; repacked like the full head when the 8-bit path reads
    /// a packed copy); each logit computed is bit-identical to the full head's (each output row
    /// is its own dot product).
    fn limit_logits(&mut self, ids: &[u32]) -> Result<()> {
        let vocab = self.config.vocab_size;
        if check_logit_ids(ids, vocab)? {
            self.limited_head = None;
            return Ok(());
        }
        if self.plan.world > 1 {
            return Err(ModelError::Config(format!(
                "limited vocabulary of {} ids: a sharded model ({} ranks) computes the whole \
                 vocabulary",
                ids.len(),
                self.plan.world
            )));
        }
        let prefix = ids.iter().enumerate().all(|(i, &id)| id as usize == i);
        let mut head = match prefix {
            true => self.weights.output.slice_rows(0..ids.len())?,
            false => self.weights.output.gather_rows(ids)?,
        };
        if self.weights.output.int8_packed().is_some() {
            head.pack_for_int8()?;
        }
        self.limited_head = Some(LimitedHead {
            head,
            ids: ids.to_vec(),
        });
        Ok(())
    }

    /// Taps block outputs (indices of the full model's blocks; a layer-skip view taps only
    /// blocks it runs).
    fn tap_features(&mut self, blocks: &[usize]) -> Result<()> {
        if let Some(&bad) = blocks.iter().find(|b| !self.layers.contains(b)) {
            return Err(ModelError::Config(format!(
                "feature tap: block {bad} is not one of the {} blocks this model runs",
                self.layers.len()
            )));
        }
        self.taps = blocks.to_vec();
        Ok(())
    }

    fn tapped_features(&self) -> &[usize] {
        &self.taps
    }

    fn bos_id(&self) -> Option<u32> {
        self.special.bos
    }

    fn eos_ids(&self) -> &[u32] {
        &self.special.eos
    }

    fn max_context(&self) -> usize {
        self.config.context_length
    }

    fn new_sequence(&mut self) -> Result<SeqId> {
        Ok(self.kv.create_sequence())
    }

    fn fork(&mut self, seq: SeqId) -> Result<SeqId> {
        self.kv.fork(seq)
    }

    fn release(&mut self, seq: SeqId) -> Result<()> {
        self.kv.release(seq)
    }

    fn seq_len(&self, seq: SeqId) -> Result<usize> {
        self.kv.len(seq)
    }

    fn forward(&mut self, steps: &[SequenceStep<'_>]) -> Result<Vec<Logits>> {
        Ok(self.forward_on_pool(steps, true)?.0)
    }

    /// Runs the blocks only (no LM head: a prompt's logits are not needed) when this is a
    /// single rank; a rank of a sharded group runs its head too (its all-gather is a
    /// collective every rank must join).
    /// In chunks of [`crate::PREFILL_CHUNK`] tokens, as the trait's default.
    fn prefill(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Option<Features>> {
        let single = self.comm.world_size() == 1;
        prefill_in_chunks(tokens, |chunk| {
            let chain = TreeTopology::chain(chunk.len());
            let (mut logits, mut features) =
                self.forward_on_pool(&[SequenceStep::chain(seq, chunk, &chain)], !single)?;
            self.commit(seq, &(0..chunk.len()).collect::<Vec<_>>())?;
            Ok(match logits.pop() {
                Some(mut l) => l.take_features(),
                None => features.pop().flatten(),
            })
        })
    }

    fn kv_room(&self) -> Option<KvRoom> {
        Some(KvRoom::of(self.kv.cache()))
    }

    /// [`LlamaModel::time_ops`] for a model of one rank; a rank of a tensor-parallel group
    /// cannot (its forward waits on the others').
    fn set_op_clock(&mut self, on: bool) -> bool {
        if self.plan.world > 1 {
            return false;
        }
        self.time_ops(on);
        true
    }

    fn take_op_times(&mut self) -> Vec<OpTime> {
        let times = self.op_times();
        self.reset_op_times();
        times
    }

    fn commit(&mut self, seq: SeqId, path: &[usize]) -> Result<()> {
        self.kv.commit(seq, path)
    }

    fn rewind(&mut self, seq: SeqId, n: usize) -> Result<()> {
        self.kv.rewind(seq, n)
    }
}
