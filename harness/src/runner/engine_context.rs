//! What the engine backend lends the method registry: [`ModelSet`], its [`DraftContext`] —
//! draft models on the run's device (checked to share the target's tokenizer), layer-skip views
//! of the CPU target, and the timings the cost-model policy starts from.

use std::collections::HashMap;
use std::time::Instant;

use specdec_kernels::cuda::Device;
use specdec_kernels::sampling::SamplingParams;
use specdec_kernels::TreeTopology;
use std::path::PathBuf;

use specdec_models::heads::{
    default_head_path, EagleHead, HeadFile, HeadKind, HeadOptions, HeadPrecision, MedusaHeads,
};
use specdec_models::llama::default_skip_layers;
use specdec_models::registry;
use specdec_models::{LanguageModel, SequenceStep};

use super::kv_memory::KvPlan;
use super::layer_skip_tune::tune_layer_skip;
use super::models::{
    check_same_tokenizer, kv_options, time_forward, DeviceModel, LoadedModel, Target,
};
use crate::engine::Penalties;
use crate::error::{HarnessError, Result};
use crate::methods::DraftContext;

/// What [`crate::methods::build_method`] may borrow from the engine backend: the target (for
/// layer skip and timings), the models it may load as drafts and the sampling settings.
pub struct ModelSet<'m> {
    /// The target model (its weights are shared by layer-skip drafters on the CPU).
    pub target: &'m mut Target,
    /// The target's file.
    pub target_file: &'m LoadedModel,
    /// Draft models opened so far, by name (the config's `models.draft` among them).
    pub drafts: &'m mut HashMap<String, LoadedModel>,
    /// The config's `models.draft`, if any.
    pub default_draft: Option<&'m str>,
    /// Sampling applied to target and drafts.
    pub sampling: SamplingParams,
    /// The target's penalties, applied by the draft models too.
    pub penalties: Penalties,
    /// Requests in flight at once.
    pub batch_size: usize,
    /// The token slots of the KV pools (drafters take `kv.draft_tokens`).
    pub kv: KvPlan,
    /// Where draft models run (the target's device).
    pub device: Device,
    /// A prompt to calibrate on (layer-skip tuning), usually the run's first.
    pub calibration: Option<&'m [u32]>,
    /// The target's relative forward costs `(n, t(n) / t(1))` timed so far, shared by the run's
    /// cost-model policies (timed on first use, `ModelSet::verify_curve`).
    pub verify_curve: &'m mut Vec<(usize, f64)>,
}

impl ModelSet<'_> {
    /// The kept blocks [`tune_layer_skip`] picks on `prompt` (its table goes to stderr).
    fn tuned_keep(&mut self, prompt: &[u32]) -> Result<Vec<usize>> {
        let target = self.target.cpu("layer-skip tuning")?;
        let ranked = tune_layer_skip(
            target,
            prompt,
            kv_options(self.kv.draft_tokens, self.kv.memory.dtype()),
        )?;
        eprintln!(
            "layer-skip tuning on {} prompt tokens (best first):",
            prompt.len()
        );
        for c in &ranked {
            eprintln!(
                "  {:<12} {:>2} blocks  agreement {:.3}  cost {:.3}  score {:.3} (K={})",
                c.label,
                c.keep.len(),
                c.agreement,
                c.cost,
                c.score,
                c.best_k
            );
        }
        ranked.into_iter().next().map(|c| c.keep).ok_or_else(|| {
            HarnessError::InvalidEngine("layer-skip tuning: the model has one block".into())
        })
    }
}

impl ModelSet<'_> {
    /// The head file of `kind` at `path` (default: the cache's head for the target), checked to
    /// have been trained for the target file.
    fn head_file(&mut self, kind: HeadKind, path: Option<&str>) -> Result<HeadFile> {
        let target = registry::identify(&self.target_file.name)?;
        let path = match path {
            Some(path) => PathBuf::from(path),
            None => default_head_path(&target.short_name, kind),
        };
        if !path.is_file() {
            return Err(HarnessError::InvalidEngine(format!(
                "no {} head at {}: train one with `specdec train-head --target {} --kind {}`, or \
                 give its path (head = \"...\", --head)",
                kind.name(),
                path.display(),
                self.target_file.name,
                kind.name()
            )));
        }
        let file = HeadFile::load(&path)?;
        if file.meta.kind != kind {
            return Err(HarnessError::InvalidEngine(format!(
                "{} holds a {} head, not a {} head",
                path.display(),
                file.meta.kind.name(),
                kind.name()
            )));
        }
        file.check_target(&target.file_name, &target.sha256)?;
        Ok(file)
    }
}

impl DraftContext for ModelSet<'_> {
    fn sampling(&self) -> SamplingParams {
        self.sampling
    }

    fn penalties(&self) -> Penalties {
        self.penalties
    }

    fn batch_size(&self) -> usize {
        self.batch_size
    }

    fn default_draft(&self) -> Option<String> {
        self.default_draft.map(str::to_string)
    }

    /// Opened once per name (and checked against the target's tokenizer then); each call gives
    /// a fresh instance with a pool of `kv.draft_tokens` slots.
    fn draft_model(&mut self, name: &str) -> Result<DeviceModel> {
        if name == "layer_skip" {
            return self.layer_skip(None, false);
        }
        if !self.drafts.contains_key(name) {
            let loaded = LoadedModel::open(name)?;
            check_same_tokenizer(self.target_file, &loaded)?;
            self.drafts.insert(name.to_string(), loaded);
        }
        self.drafts[name].instantiate_on(self.device, self.kv.draft_tokens, self.kv.memory.dtype())
    }

    /// A view of the CPU target sharing its weights; `tune` without `keep` measures the
    /// candidates on the run's first prompt ([`tune_layer_skip`]).
    fn layer_skip(&mut self, keep: Option<&[usize]>, tune: bool) -> Result<DeviceModel> {
        let tuned = match (keep, tune, self.calibration) {
            (None, true, Some(prompt)) => Some(self.tuned_keep(prompt)?),
            _ => None,
        };
        let kv_tokens = self.kv.draft_tokens;
        let target = self.target.cpu("layer-skip drafting")?;
        let default = default_skip_layers(target.active_layers());
        let keep = keep.or(tuned.as_deref()).unwrap_or(&default);
        Ok(Box::new(target.layer_skip(
            keep,
            kv_options(kv_tokens, self.kv.memory.dtype()),
        )?))
    }

    fn eagle_head(&mut self, path: Option<&str>, precision: HeadPrecision) -> Result<EagleHead> {
        let file = self.head_file(HeadKind::Eagle, path)?;
        let options = HeadOptions {
            precision,
            kv_capacity_tokens: self.kv.draft_tokens,
            kv_dtype: self.kv.memory.dtype(),
            ..HeadOptions::default()
        };
        let target = self.target.cpu("an EAGLE head")?;
        target.tap_features(&file.meta.feature_blocks)?;
        Ok(EagleHead::new(&file, target, options)?)
    }

    fn medusa_heads(
        &mut self,
        path: Option<&str>,
        precision: HeadPrecision,
    ) -> Result<MedusaHeads> {
        let file = self.head_file(HeadKind::Medusa, path)?;
        let target = self.target.cpu("Medusa heads")?;
        target.tap_features(&file.meta.feature_blocks)?;
        Ok(MedusaHeads::new(&file, target, precision)?)
    }

    fn measures_costs(&self) -> bool {
        true
    }

    /// A single-token forward on an empty sequence (no prefill), best of two.
    fn time_draft_pass(&mut self, model: &mut dyn LanguageModel) -> Result<f64> {
        let mut best = f64::INFINITY;
        for _ in 0..2 {
            let seq = model.new_sequence()?;
            let t0 = Instant::now();
            let forward =
                model.forward(&[SequenceStep::chain(seq, &[100], &TreeTopology::chain(1))]);
            best = best.min(t0.elapsed().as_secs_f64());
            model.release(seq)?;
            forward?;
        }
        Ok(best)
    }

    /// Timed with [`time_forward`] the first time a size is asked for and kept for the run.
    fn verify_curve(&mut self, tokens: usize) -> Result<Vec<(usize, f64)>> {
        let sizes = verify_curve_sizes(tokens, self.batch_size);
        let timed = self.verify_curve.iter().map(|&(n, _)| n);
        if !sizes.iter().copied().eq(timed) {
            let model = self.target.model();
            let t1 = time_forward(model, 1)?;
            let mut curve = vec![(1, 1.0)];
            for &n in &sizes[1..] {
                curve.push((n, time_forward(model, n)? / t1));
            }
            *self.verify_curve = curve;
        }
        Ok(self.verify_curve.clone())
    }
}

/// The forward sizes a verify-cost curve is timed at: every size up to `tree_tokens` (one
/// sequence's largest tree), then sizes growing by half up to `tree_tokens × batch_size` (the
/// largest batch forward), which under load give the curve its shape.
fn verify_curve_sizes(tree_tokens: usize, batch_size: usize) -> Vec<usize> {
    let tree_tokens = tree_tokens.max(1);
    let largest = tree_tokens * batch_size.max(1);
    let mut sizes: Vec<usize> = (1..=tree_tokens).collect();
    let mut n = tree_tokens;
    while n < largest {
        n = (n + n.div_ceil(2)).min(largest);
        sizes.push(n);
    }
    sizes
}

#[cfg(test)]
mod tests {
    use super::verify_curve_sizes;

    #[test]
    fn the_verify_curve_is_timed_densely_over_a_tree_then_sparsely_up_to_a_full_batch() {
        assert_eq!(verify_curve_sizes(5, 8), [1, 2, 3, 4, 5, 8, 12, 18, 27, 40]);
        assert_eq!(verify_curve_sizes(5, 1), [1, 2, 3, 4, 5]);
        assert_eq!(verify_curve_sizes(1, 3), [1, 2, 3]);
        assert_eq!(verify_curve_sizes(0, 0), [1]);
    }
}
