//! # specdec-train
//!
//! Training draft heads for a specdec target on CPU with candle: **EAGLE-style** heads (one
//! decoder layer over (feature, token) pairs, trained with EAGLE-3's training-time test) and
//! **Medusa-style** heads (K residual heads over the last feature), implementing exactly the
//! math of [`specdec_models::heads`] and writing [`specdec_models::heads::HeadFile`]s.
//!
//! The pipeline ([`train_head`], `specdec train-head`): open the target ([`FrozenTarget`]);
//! read ShareGPT conversations ([`sharegpt`]), render them with the target's chat template and
//! tokenize; run the target once over them and cache tokens + last-block features on disk
//! ([`FeatureCache`]); pick the draft vocabulary ([`vocab`]); train ([`train`]) with AdamW,
//! warm-up and cosine decay, checkpoints and resume; measure held-out top-1 agreement at
//! depths 1 and 2; write the head (BF16), its checkpoint and its loss curve.
//!
//! [`evaluate_head`] (`specdec eval-head`: [`eval_head`]) measures a stored head's agreement
//! by depth on any data set, the same measurement a training run records.
//!
//! [`eagle_chain`] and [`medusa_logits`] compute a trained head's outputs in f32 for given
//! inputs, for checking another implementation of the head math against this one.

mod batch;
mod checkpoint;
pub mod eagle;
mod error;
mod evaluate;
pub mod features;
mod head;
pub mod medusa;
mod nn;
pub mod optim;
mod options;
mod params;
mod plot;
mod progress;
mod ranking;
pub mod regenerate;
pub mod sharegpt;
pub mod synthetic;
pub mod target;
pub mod trainer;
pub mod vocab;

pub use checkpoint::{AgreementRecord, LossRecord, ScheduleChange};
pub use eagle::{eagle_chain, ttt_mask, EagleChainOutput, TttMask};
pub use error::{Result, TrainError};
pub use evaluate::{
    eval_head, evaluate_head, EvalHeadOptions, EvalReport, HeadEvaluation, MAX_EVAL_DEPTHS,
};
pub use features::{ExtractionStats, FeatureCache, FeatureCacheKey};
pub use medusa::medusa_logits;
pub use options::{
    check_train_config, train_head, DataOptions, ExtractionReport, KindArg, TrainHeadOptions,
};
pub use ranking::{rank_vocab, RankReport, RankVocabOptions};
pub use target::FrozenTarget;
pub use trainer::{
    fitted_steps, stop_on_signals, tenth_means, train, Schedule, StopReason, TrainConfig,
    TrainControl, TrainData, TrainPaths, TrainReport, FIT_SHARE, PROBE_STEPS,
};
