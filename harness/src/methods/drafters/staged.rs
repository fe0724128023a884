//! `staged`: multi-level speculation, n-gram → draft model → target.

use serde::{Deserialize, Serialize};
use specdec_algorithms::drafters::{
    EagleFeatureHead, FeatureDraftModel, NgramConfig, NgramDrafter, StagedDrafter,
};

use super::eagle::{head_setup, time_head_pass};
use super::{model_drafter_setup, BuiltDrafter, DraftContext, DraftSetup, DrafterKind};
use crate::config::ModelSource;
use crate::error::{HarnessError, Result};
use crate::methods::Kind;

/// The level name of a trained EAGLE head (`specdec train-head --kind eagle`).
const EAGLE_LEVEL: &str = "eagle";

/// Multi-level speculation: an n-gram level 0 proposes, the model level checks it losslessly
/// against its own distribution and extends it, and the target verifies the result (chain
/// rejection). `levels` names the model level: exactly one entry today (a known name, a
/// `.gguf` path, `layer_skip` for the target with its default blocks skipped, or `eagle` for a
/// trained EAGLE head over the target's features, from `head` or the cache); a list of several
/// is refused rather than run with all but one ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Staged {
    /// The model level's name (one entry).
    pub levels: Vec<String>,
    /// The head file of an `eagle` level [default: `<cache>/heads/<target>-eagle.safetensors`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
}

impl Staged {
    /// Whether level name `level` is a model to load (a known name or a `.gguf` path), not
    /// `layer_skip` or `eagle`, which run on the target.
    pub fn level_is_model(level: &str) -> bool {
        !matches!(level, "layer_skip" | EAGLE_LEVEL)
    }
}

impl Kind for Staged {
    const NAME: &'static str = "staged";
    const ALIASES: &'static [&'static str] = &["multi_level"];
    const SUMMARY: &'static str =
        "n-gram proposes, a draft model (`levels`, or layer_skip) checks and extends, the target verifies";

    fn check(&self) -> std::result::Result<(), String> {
        match self.levels.len() {
            0 => return Err("staged.levels is empty: name the draft model level".into()),
            1 => {}
            n => {
                return Err(format!(
                    "staged.levels lists {n} model levels ({}); one model level runs between the \
                     n-gram level and the target, so list exactly one",
                    self.levels.join(", ")
                ))
            }
        }
        for level in self.levels.iter() {
            match level.as_str() {
                "layer_skip" | EAGLE_LEVEL => {}
                "medusa" => {
                    return Err(
                        "staged.levels: `medusa` cannot be a level (its heads give no \
                                distribution past their last one, so they cannot extend a chain \
                                to any K); use `eagle`"
                            .into(),
                    )
                }
                other => {
                    ModelSource::parse(other)?;
                }
            }
        }
        if self.head.is_some() && self.levels.last().map(String::as_str) != Some(EAGLE_LEVEL) {
            return Err(
                "staged.head is the file of an `eagle` level; the last level is not `eagle`".into(),
            );
        }
        Ok(())
    }
}

impl DrafterKind for Staged {
    fn is_chain(&self) -> bool {
        true
    }
    fn uses_model(&self) -> bool {
        true
    }
    /// Level 1 is `--draft`, or layer skip without one.
    fn for_generate(draft: Option<&str>) -> Option<Self> {
        Some(Staged {
            levels: vec![draft.unwrap_or("layer_skip").to_string()],
            head: None,
        })
    }
    fn build(&self, ctx: &mut dyn DraftContext, setup: &DraftSetup<'_>) -> Result<BuiltDrafter> {
        self.check().map_err(HarnessError::InvalidEngine)?;
        let name = &self.levels[0];
        let level0 = NgramDrafter::new(NgramConfig::default(), 16)?;
        if name == EAGLE_LEVEL {
            let precision = head_setup(EAGLE_LEVEL, setup, None)?;
            let mut head = ctx.eagle_head(self.head.as_deref(), precision)?;
            let draft_pass_s = match setup.time_passes {
                true => Some(time_head_pass(&mut head)?),
                false => None,
            };
            let head = EagleFeatureHead::new(head, ctx.sampling())?.with_penalties(ctx.penalties());
            let level1 = FeatureDraftModel::new(head);
            return Ok(BuiltDrafter {
                drafter: Box::new(StagedDrafter::new(level0, level1)),
                is_chain: true,
                shape: None,
                draft_pass_s,
            });
        }
        let model = ctx.draft_model(name)?;
        let (lm, draft_pass_s) = model_drafter_setup(ctx, setup, model, false)?;
        Ok(BuiltDrafter {
            drafter: Box::new(StagedDrafter::new(level0, lm)),
            is_chain: true,
            shape: None,
            draft_pass_s,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(levels: &[&str], head: Option<&str>) -> Staged {
        Staged {
            levels: levels.iter().map(|l| l.to_string()).collect(),
            head: head.map(str::to_string),
        }
    }

    #[test]
    fn levels_and_head_are_checked() {
        assert!(staged(&["eagle"], Some("h.safetensors")).check().is_ok());
        assert!(staged(&["layer_skip"], None).check().is_ok());
        let medusa = staged(&["medusa"], None).check().unwrap_err();
        assert!(
            medusa.contains("medusa") && medusa.contains("eagle"),
            "{medusa}"
        );
        let stray = staged(&["layer_skip"], Some("h.safetensors"))
            .check()
            .unwrap_err();
        assert!(stray.contains("staged.head"), "{stray}");
        assert!(staged(&[], None).check().is_err());
    }
}
