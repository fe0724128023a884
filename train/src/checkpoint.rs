//! Checkpoints: one safetensors file holding the trainable tensors and their AdamW moments in
//! F32 (`param.NAME`, `adam_m.NAME`, `adam_v.NAME`), with the run's state as JSON metadata
//! (`specdec.checkpoint`: step, data position, loss history, and the settings a resumed run
//! must share). Written through a temporary file renamed into place.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use candle_core::{Device, Tensor};
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use serde::{Deserialize, Serialize};

use crate::error::{io_error, Result, TensorContext, TrainError};
use crate::optim::AdamW;
use crate::params::Params;

/// The version of the checkpoint layout.
const CHECKPOINT_FORMAT: u32 = 1;
const META_KEY: &str = "specdec.checkpoint";

/// One optimiser step's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossRecord {
    /// The step (0-based).
    pub step: u64,
    /// The total loss.
    pub loss: f32,
    /// The loss parts (see the head kind's component names).
    pub components: Vec<f32>,
    /// The learning rate used.
    pub lr: f64,
    /// The gradient norm before clipping.
    pub grad_norm: f64,
}

/// The held-out agreement measured during a run ([`crate::TrainControl::eval_every`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgreementRecord {
    /// Steps done when it was measured.
    pub step: u64,
    /// Top-1 agreement at depths 1, 2 (as [`crate::TrainReport::agreement`]).
    pub agreement: Vec<f64>,
}

/// Everything besides tensors a resumed run needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct CheckpointState {
    pub format: u32,
    /// The settings that define the run (a resumed run must have the same).
    pub run: serde_json::Value,
    /// Optimiser steps done.
    pub step: u64,
    /// Training sequences consumed (the data position).
    pub consumed: u64,
    /// Training positions seen.
    pub positions: u64,
    /// Tokens (head positions) seen.
    pub tokens: u64,
    /// Seconds spent in training steps so far.
    pub train_seconds: f64,
    /// One record per step.
    pub history: Vec<LossRecord>,
    /// The held-out agreement measured every `eval_every` steps (none in older checkpoints).
    #[serde(default)]
    pub agreement_curve: Vec<AgreementRecord>,
    /// The schedule's re-plans on resuming ([`crate::Schedule::Replan`]), in order.
    #[serde(default)]
    pub schedule_changes: Vec<ScheduleChange>,
}

/// A resumed run's schedule re-planned to a new length ([`crate::Schedule::Replan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleChange {
    /// Steps done when it was re-planned.
    pub at_step: u64,
    /// The schedule's length before.
    pub from_steps: u64,
    /// Its length after.
    pub to_steps: u64,
}

/// What a checkpoint's header says of its run's schedule ([`stored_schedule`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoredSchedule {
    /// The schedule's length (the run's `config.steps`).
    pub steps: u64,
    /// Its warm-up steps.
    pub warmup_steps: u64,
    /// Steps done.
    pub done: u64,
}

impl CheckpointState {
    pub(crate) fn new(run: serde_json::Value) -> Self {
        Self {
            format: CHECKPOINT_FORMAT,
            run,
            step: 0,
            consumed: 0,
            positions: 0,
            tokens: 0,
            train_seconds: 0.0,
            history: Vec::new(),
            agreement_curve: Vec::new(),
            schedule_changes: Vec::new(),
        }
    }
}

/// Writes `bytes` to `path` through `path.partial`, renamed into place (a reader never sees
/// half a file), creating the parent folder.
///
/// # Errors
/// [`TrainError::Io`] naming the path.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    }
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    std::fs::write(&partial, bytes).map_err(io_error(&partial))?;
    std::fs::rename(&partial, path).map_err(io_error(path))
}

fn f32_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let values = t
        .flatten_all()
        .and_then(|f| f.to_vec1::<f32>())
        .tensor_context("checkpoint tensor")?;
    Ok(values.iter().flat_map(|v| v.to_le_bytes()).collect())
}

/// Saves `state` with the trainable tensors of `params` and the moments of `opt`.
///
/// # Errors
/// I/O errors naming `path`.
pub(crate) fn save(
    path: &Path,
    state: &CheckpointState,
    params: &Params,
    opt: &AdamW,
) -> Result<()> {
    let bad = |reason: String| TrainError::Checkpoint {
        path: path.display().to_string(),
        reason,
    };
    let mut encoded: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (i, (name, var)) in params.trainable().into_iter().enumerate() {
        let shape = var.as_tensor().dims().to_vec();
        encoded.push((
            format!("param.{name}"),
            shape.clone(),
            f32_bytes(var.as_tensor())?,
        ));
        encoded.push((
            format!("adam_m.{name}"),
            shape.clone(),
            f32_bytes(&opt.m[i])?,
        ));
        encoded.push((format!("adam_v.{name}"), shape, f32_bytes(&opt.v[i])?));
    }
    let views = encoded
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| bad(e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta = serde_json::to_string(state).map_err(|e| bad(e.to_string()))?;
    let bytes = safetensors::serialize(views, Some(HashMap::from([(META_KEY.to_string(), meta)])))
        .map_err(|e| bad(e.to_string()))?;
    write_atomically(path, &bytes)
}

/// The run state in a checkpoint's safetensors metadata (`metadata`, read from `path`).
fn state_of(path: &Path, metadata: Option<&HashMap<String, String>>) -> Result<CheckpointState> {
    let bad = |reason: String| TrainError::Checkpoint {
        path: path.display().to_string(),
        reason,
    };
    let meta = metadata
        .and_then(|m| m.get(META_KEY))
        .ok_or_else(|| bad(format!("no `{META_KEY}` metadata")))?;
    let state: CheckpointState =
        serde_json::from_str(meta).map_err(|e| bad(format!("state: {e}")))?;
    if state.format != CHECKPOINT_FORMAT {
        return Err(bad(format!(
            "format {} (this build reads {CHECKPOINT_FORMAT})",
            state.format
        )));
    }
    Ok(state)
}

/// The schedule of the checkpoint at `path` (its length, warm-up and steps done), from its
/// header alone (the tensors can be large).
///
/// # Errors
/// [`TrainError::Checkpoint`] for an unreadable header or one without it; I/O errors.
pub(crate) fn stored_schedule(path: &Path) -> Result<StoredSchedule> {
    let bad = |reason: String| TrainError::Checkpoint {
        path: path.display().to_string(),
        reason,
    };
    // a safetensors file starts with its header's length (8 bytes, little-endian), then the
    // header (JSON), whose `__metadata__` holds the state
    let mut file = std::fs::File::open(path).map_err(io_error(path))?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(io_error(path))?;
    let len = u64::from_le_bytes(len);
    if len > MAX_HEADER_BYTES {
        return Err(bad(format!("a header of {len} bytes")));
    }
    let mut header = vec![0u8; len as usize];
    file.read_exact(&mut header).map_err(io_error(path))?;
    #[derive(Deserialize)]
    struct Header {
        #[serde(rename = "__metadata__")]
        metadata: Option<HashMap<String, String>>,
    }
    let header: Header =
        serde_json::from_slice(&header).map_err(|e| bad(format!("header: {e}")))?;
    let state = state_of(path, header.metadata.as_ref())?;
    let setting = |value: &serde_json::Value, name: &str| {
        value
            .as_u64()
            .ok_or_else(|| bad(format!("its run has no `{name}`")))
    };
    let config = &state.run["config"];
    Ok(StoredSchedule {
        steps: setting(&config["steps"], "config.steps")?,
        warmup_steps: setting(
            &config["optimizer"]["warmup_steps"],
            "config.optimizer.warmup_steps",
        )?,
        done: state.step,
    })
}

/// The largest checkpoint header [`stored_schedule`] reads (100 MB, as the safetensors crate).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Reads the checkpoint at `path`, checks it belongs to the run `run` (refusing it naming the
/// first differing setting; the schedule's length aside when `replanned`), and restores the
/// trainable tensors of `params` and the moments of `opt` from it. Returns its state.
///
/// # Errors
/// [`TrainError::Checkpoint`] for an unreadable file, another run's checkpoint, or a tensor
/// missing or misshapen; I/O errors.
pub(crate) fn restore(
    path: &Path,
    run: &serde_json::Value,
    replanned: bool,
    params: &Params,
    opt: &mut AdamW,
) -> Result<CheckpointState> {
    let bad = |reason: String| TrainError::Checkpoint {
        path: path.display().to_string(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(io_error(path))?;
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
    let state = state_of(path, header.metadata().as_ref())?;
    let compared = |run: &serde_json::Value| {
        let mut run = run.clone();
        if replanned {
            // the two settings a re-plan changes (`config.steps` = `optimizer.total_steps`)
            run["config"]["steps"] = serde_json::Value::Null;
            run["config"]["optimizer"]["total_steps"] = serde_json::Value::Null;
        }
        run
    };
    if let Some(diff) = first_difference(&compared(&state.run), &compared(run)) {
        return Err(bad(format!(
            "it belongs to another run: {diff}; resume with the same settings, or train \
             without --resume to start over"
        )));
    }
    let file = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
    let read = |name: &str, shape: &[usize]| -> Result<Tensor> {
        let view = file
            .tensor(name)
            .map_err(|_| bad(format!("tensor `{name}` is missing")))?;
        if view.dtype() != Dtype::F32 || view.shape() != shape {
            return Err(bad(format!(
                "tensor `{name}` is {:?} {:?}, expected F32 {shape:?}",
                view.dtype(),
                view.shape()
            )));
        }
        let values: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Tensor::from_vec(values, shape, &Device::Cpu).tensor_context("checkpoint tensor")
    };
    for (i, (name, var)) in params.trainable().into_iter().enumerate() {
        let shape = var.as_tensor().dims().to_vec();
        var.set(&read(&format!("param.{name}"), &shape)?)
            .tensor_context("restoring a parameter")?;
        opt.m[i] = read(&format!("adam_m.{name}"), &shape)?;
        opt.v[i] = read(&format!("adam_v.{name}"), &shape)?;
    }
    opt.step = state.step;
    Ok(state)
}

/// The first setting where two run descriptions differ, as `key: found vs wanted`.
fn first_difference(found: &serde_json::Value, wanted: &serde_json::Value) -> Option<String> {
    match (found, wanted) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter().find_map(|k| match (a.get(k), b.get(k)) {
                (Some(x), Some(y)) if x == y => None,
                (x, y) => Some(format!(
                    "`{k}` is {} in the checkpoint, {} now",
                    x.map_or("absent".into(), |v| v.to_string()),
                    y.map_or("absent".into(), |v| v.to_string())
                )),
            })
        }
        (a, b) if a == b => None,
        (a, b) => Some(format!("{a} in the checkpoint, {b} now")),
    }
}
