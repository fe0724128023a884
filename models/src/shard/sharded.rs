//! [`ShardedModel`]: a tensor-parallel group of ranks on threads of one process, presented as
//! one [`LanguageModel`]: CPU ranks ([`LlamaModel`]) joined by the thread communicator, or GPU
//! ranks ([`CudaLlamaModel`], one per GPU) joined by NCCL.

use std::sync::Arc;

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::llama::cuda::{CudaLlamaModel, CudaLlamaOptions};
use crate::llama::{
    read_config, read_special_tokens, read_weights, LlamaConfig, LlamaModel, LlamaOptions,
    ModelWeights, SpecialTokens,
};
use crate::model::{LanguageModel, Logits, SeqId, SequenceStep, VerifiedBatch, VerifyRequest};
use crate::shard::{Communicator, NcclCommunicator, ThreadCommunicator};

/// `world` ranks `R`, each holding its slice of the weights and KV heads, joined by their
/// communicators. Every call runs on all ranks (forward on one thread per rank); the ranks'
/// sequence ids agree because every rank sees the same calls.
pub struct ShardedModel<R = LlamaModel> {
    ranks: Vec<R>,
    comms: Vec<Arc<dyn Communicator>>,
}

impl<R> std::fmt::Debug for ShardedModel<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedModel")
            .field("world", &self.ranks.len())
            .finish_non_exhaustive()
    }
}

/// Aborts the group if its rank's thread unwinds, so the other ranks fail instead of waiting.
struct AbortOnPanic<'a>(&'a dyn Communicator);

impl Drop for AbortOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.abort();
        }
    }
}

impl ShardedModel<LlamaModel> {
    /// Splits `weights` among `world` CPU ranks.
    ///
    /// # Errors
    /// As [`crate::shard::ShardPlan::new`] (too many ranks for the KV heads or blocks).
    pub fn new(
        config: &LlamaConfig,
        weights: &ModelWeights,
        special: &SpecialTokens,
        options: LlamaOptions,
        world: usize,
    ) -> Result<Self> {
        Self::joined(ThreadCommunicator::group(world)?, |comm| {
            LlamaModel::rank_of(config.clone(), weights, special.clone(), options, comm)
        })
    }

    /// Splits the decoder in a parsed GGUF file among `world` ranks.
    ///
    /// # Errors
    /// As [`crate::llama::LlamaModel::from_gguf`] and [`ShardedModel::new`].
    pub fn from_gguf(file: &Arc<GgufFile>, options: LlamaOptions, world: usize) -> Result<Self> {
        let config = read_config(file)?;
        let weights = read_weights(file, &config)?;
        Self::new(
            &config,
            &weights,
            &read_special_tokens(file),
            options,
            world,
        )
    }
}

impl ShardedModel<CudaLlamaModel> {
    /// Splits `weights` among `world` GPU ranks, rank `r` on CUDA device `r` (NCCL puts one rank
    /// per GPU); `options.device` is ignored, every other option holds for every rank.
    ///
    /// # Errors
    /// As [`NcclCommunicator::group`] (fewer GPUs than ranks, no NCCL) and
    /// [`CudaLlamaModel::rank_of`].
    pub fn on_gpus(
        config: &LlamaConfig,
        weights: &ModelWeights,
        special: &SpecialTokens,
        options: CudaLlamaOptions,
        world: usize,
    ) -> Result<Self> {
        Self::joined(NcclCommunicator::group(world)?, |comm| {
            CudaLlamaModel::rank_of(config.clone(), weights, special.clone(), options, comm)
        })
    }
}

impl<R: LanguageModel + Send> ShardedModel<R> {
    /// The group of one rank per communicator of `comms` (rank order), each built by
    /// `rank_of` around its communicator.
    ///
    /// # Errors
    /// The first of `rank_of`'s errors.
    fn joined<C: Communicator + 'static>(
        comms: Vec<C>,
        rank_of: impl Fn(Arc<C>) -> Result<R>,
    ) -> Result<Self> {
        let comms: Vec<Arc<C>> = comms.into_iter().map(Arc::new).collect();
        let ranks = comms
            .iter()
            .map(|comm| rank_of(comm.clone()))
            .collect::<Result<Vec<_>>>()?;
        let comms = comms
            .into_iter()
            .map(|comm| comm as Arc<dyn Communicator>)
            .collect();
        Ok(Self { ranks, comms })
    }

    /// The ranks, rank `r` at index `r`.
    pub fn ranks(&self) -> &[R] {
        &self.ranks
    }

    /// Runs `f` on every rank and checks they agree; returns rank 0's answer.
    fn on_all<T: PartialEq + std::fmt::Debug>(
        &mut self,
        what: &str,
        mut f: impl FnMut(&mut R) -> Result<T>,
    ) -> Result<T> {
        let mut answers = self
            .ranks
            .iter_mut()
            .map(&mut f)
            .collect::<Result<Vec<_>>>()?;
        if answers.iter().any(|a| *a != answers[0]) {
            return Err(ModelError::Communicator(format!(
                "ranks disagree on {what}: {answers:?}"
            )));
        }
        Ok(answers.swap_remove(0))
    }

    /// Runs `f` on every rank at once, one thread each (the ranks meet in collectives), and
    /// returns rank 0's answer. A rank that panics aborts the group, so the others fail instead
    /// of waiting for it.
    ///
    /// # Errors
    /// The first rank's error, in rank order; a panic as [`ModelError::Communicator`].
    fn in_parallel<T: Send>(&mut self, f: impl Fn(&mut R) -> Result<T> + Sync) -> Result<T> {
        let f = &f;
        let results: Vec<Result<T>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .ranks
                .iter_mut()
                .zip(&self.comms)
                .map(|(rank, comm)| {
                    s.spawn(move || {
                        let _guard = AbortOnPanic(comm.as_ref());
                        f(rank)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(ModelError::Communicator("a rank panicked".into())))
                })
                .collect()
        });
        let mut first = None;
        for result in results {
            let answer = result?;
            first.get_or_insert(answer);
        }
        first.ok_or_else(|| ModelError::Communicator("a group without ranks".into()))
    }
}

impl<R: LanguageModel + Send> LanguageModel for ShardedModel<R> {
    fn vocab_size(&self) -> usize {
        self.ranks[0].vocab_size()
    }

    fn bos_id(&self) -> Option<u32> {
        self.ranks[0].bos_id()
    }

    fn eos_ids(&self) -> &[u32] {
        self.ranks[0].eos_ids()
    }

    fn max_context(&self) -> usize {
        self.ranks[0].max_context()
    }

    fn new_sequence(&mut self) -> Result<SeqId> {
        self.on_all("new_sequence", |m| m.new_sequence())
    }

    fn fork(&mut self, seq: SeqId) -> Result<SeqId> {
        self.on_all("fork", |m| m.fork(seq))
    }

    fn release(&mut self, seq: SeqId) -> Result<()> {
        self.on_all("release", |m| m.release(seq))
    }

    fn seq_len(&self, seq: SeqId) -> Result<usize> {
        self.ranks[0].seq_len(seq)
    }

    /// Forwards on every rank (one thread each); returns rank 0's logits, which every rank
    /// holds identically after the final all-gather.
    fn forward(&mut self, steps: &[SequenceStep<'_>]) -> Result<Vec<Logits>> {
        self.in_parallel(|rank| rank.forward(steps))
    }

    /// Forwards and verifies on every rank (one thread each), each over the whole logits it
    /// holds after the final all-gather, where its logits live (a GPU rank verifies on its
    /// GPU); returns rank 0's verdicts. The verdicts agree: the same logits and the same
    /// counter-based seeds on every rank.
    fn forward_verify(
        &mut self,
        steps: &[SequenceStep<'_>],
        request: &VerifyRequest<'_>,
    ) -> Result<VerifiedBatch> {
        self.in_parallel(|rank| rank.forward_verify(steps, request))
    }

    fn commit(&mut self, seq: SeqId, path: &[usize]) -> Result<()> {
        self.on_all("commit", |m| m.commit(seq, path))
    }

    fn rewind(&mut self, seq: SeqId, n: usize) -> Result<()> {
        self.on_all("rewind", |m| m.rewind(seq, n))
    }

    /// Rank 0's pool (every rank holds the same blocks, each for its share of the heads).
    fn kv_room(&self) -> Option<crate::model::KvRoom> {
        self.ranks.first().and_then(|r| r.kv_room())
    }
}
