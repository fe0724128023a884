//! The head file: one safetensors file holding a trained head's tensors, its draft vocabulary
//! and metadata ([`HeadMeta`], JSON under the key `specdec.head`) naming the target it was
//! trained for, so that a head is never run against another model.
//!
//! Tensors are `[rows, cols]` row-major with `y = W · x` (rows = outputs), stored in BF16 (or
//! F32); the draft vocabulary `d2t` is an I32 vector of target token ids. The tensors each kind
//! holds, with their shapes, are [`HeadMeta::tensor_shapes`] (one list serves the trainer that
//! writes them and the loader that checks them).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::Dtype;
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::llama::{LlamaConfig, RopeLayout, RopeScaling};
use crate::safetensors_file::{encode_f32, write_safetensors, OwnedTensor, SafetensorsFile};

/// The version of the layout [`HeadFile`] writes; a file of another version is refused.
pub const HEAD_FORMAT_VERSION: u32 = 1;

/// The metadata key holding [`HeadMeta`] as JSON.
const META_KEY: &str = "specdec.head";

/// The tensor holding the draft vocabulary.
const D2T: &str = "d2t";

/// Which family a head belongs to (see the module docs of [`crate::heads`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadKind {
    /// Feature-level autoregression with one decoder layer (EAGLE).
    Eagle,
    /// K independent residual heads over the last feature (Medusa).
    Medusa,
}

impl HeadKind {
    /// The name used in file names, configs and the command line: `eagle`, `medusa`.
    pub fn name(self) -> &'static str {
        match self {
            HeadKind::Eagle => "eagle",
            HeadKind::Medusa => "medusa",
        }
    }
}

/// The target a head was trained for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadTarget {
    /// The target's file name (for messages).
    pub name: String,
    /// SHA-256 of the target's GGUF file, lower-case hex: the identity the loader checks.
    pub sha256: String,
    /// `general.architecture` of the target (`llama`, `qwen2`).
    pub architecture: String,
    /// The target's residual width.
    pub hidden: usize,
    /// The target's vocabulary size.
    pub vocab_size: usize,
}

/// The decoder layer of an EAGLE head: the target's attention geometry, its own FFN width.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EagleShape {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (divides `n_heads`).
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// SwiGLU inner width.
    pub ffn: usize,
    /// Whether Q, K and V carry a bias (as the target's do, for qwen2).
    pub qkv_bias: bool,
    /// RMSNorm epsilon (the target's).
    pub rms_eps: f32,
    /// RoPE base frequency (the target's).
    pub rope_base: f32,
    /// RoPE pairing: `interleaved` (llama) or `half_split` (qwen2), the target's.
    pub rope_layout: String,
    /// Whether the two halves of the `fc` input are RMS-normalised first, as EAGLE-3 does:
    /// `fc · [rms_norm(embed; embed_norm); rms_norm(feature; feature_norm)]` with the gains
    /// `embed_norm: [hidden]` and `feature_norm: [feature_dim]` (one norm over a whole feature
    /// row) and the layer's `rms_eps`. Without them the target's raw residual stream, whose
    /// scale can dwarf the embedding's, enters `fc` as it is (EAGLE-1). Absent in older
    /// files: `false`.
    #[serde(default)]
    pub input_norms: bool,
}

impl EagleShape {
    /// The shape of an EAGLE layer for `target`: its attention geometry, bias, epsilon and RoPE,
    /// with an FFN of `ffn` rows.
    pub fn for_target(target: &LlamaConfig, ffn: usize) -> Self {
        Self {
            n_heads: target.n_heads,
            n_kv_heads: target.n_kv_heads,
            head_dim: target.head_dim,
            ffn,
            qkv_bias: target.qkv_bias,
            rms_eps: target.rms_eps,
            rope_base: target.rope_base,
            rope_layout: rope_layout_name(target.rope_layout).to_string(),
            input_norms: false,
        }
    }

    /// Refuses a target that scales RoPE (`{arch}.rope.scaling.*`): a head file stores the
    /// target's RoPE base and layout but no scaling, so its angles would not be the target's.
    ///
    /// # Errors
    /// [`ModelError::Config`] naming the target's scaling.
    pub fn check_rope_scaling(target: &LlamaConfig) -> Result<()> {
        if target.rope_scaling != RopeScaling::None {
            return Err(ModelError::Config(format!(
                "EAGLE heads do not carry RoPE scaling yet, and this target scales RoPE ({:?}); \
                 use another drafter for it",
                target.rope_scaling
            )));
        }
        Ok(())
    }

    /// The RoPE layout `rope_layout` names.
    ///
    /// # Errors
    /// [`ModelError::Config`] for a name other than `interleaved` and `half_split`.
    pub fn rope(&self) -> Result<RopeLayout> {
        match self.rope_layout.as_str() {
            "interleaved" => Ok(RopeLayout::Interleaved),
            "half_split" => Ok(RopeLayout::HalfSplit),
            other => Err(ModelError::Config(format!(
                "EAGLE rope_layout `{other}` (interleaved or half_split expected)"
            ))),
        }
    }

    /// Checks that the layer can run: non-zero sizes, query heads a multiple of the KV heads,
    /// an even head width, positive epsilon and RoPE base, a known RoPE layout.
    ///
    /// # Errors
    /// [`ModelError::Config`] naming the first bad value.
    pub fn check(&self) -> Result<()> {
        let fail = |reason: String| Err(ModelError::Config(format!("EAGLE shape: {reason}")));
        if self.n_heads == 0 || self.ffn == 0 || self.head_dim == 0 {
            return fail(format!(
                "zero size ({} heads, head width {}, FFN {})",
                self.n_heads, self.head_dim, self.ffn
            ));
        }
        if self.n_kv_heads == 0 || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return fail(format!(
                "{} query heads are not a multiple of {} KV heads",
                self.n_heads, self.n_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return fail(format!("head width {} is not even", self.head_dim));
        }
        if !(self.rms_eps > 0.0 && self.rope_base > 0.0 && self.rope_base.is_finite()) {
            return fail(format!(
                "rms epsilon {} and rope base {} must be positive",
                self.rms_eps, self.rope_base
            ));
        }
        self.rope().map(drop)
    }
}

/// The name [`EagleShape::rope_layout`] gives `layout`: `interleaved` or `half_split`.
pub fn rope_layout_name(layout: RopeLayout) -> &'static str {
    match layout {
        RopeLayout::Interleaved => "interleaved",
        RopeLayout::HalfSplit => "half_split",
    }
}

/// How a head was trained (for provenance; the loader checks none of it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainingInfo {
    /// SHA-256 of the training data file.
    pub data_sha256: String,
    /// Optimiser steps taken.
    pub steps: u64,
    /// Training positions seen (tokens × unroll steps).
    pub tokens_seen: u64,
    /// Seed of initialisation and data order.
    pub seed: u64,
    /// Anything else worth keeping (learning rate, final loss, sequence length...).
    #[serde(default)]
    pub extra: BTreeMap<String, String>,
}

/// Everything a head file says about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeadMeta {
    /// [`HEAD_FORMAT_VERSION`] when written.
    pub format_version: u32,
    /// The family.
    pub kind: HeadKind,
    /// The target it drafts for.
    pub target: HeadTarget,
    /// The target blocks whose outputs, side by side, form the head's input feature (EAGLE and
    /// Medusa: the last block).
    pub feature_blocks: Vec<usize>,
    /// Draft vocabulary size (`d2t` length, ≤ the target's vocabulary).
    pub draft_vocab: usize,
    /// The EAGLE layer's shape (`kind = eagle` only).
    pub eagle: Option<EagleShape>,
    /// Number of Medusa heads K (`kind = medusa` only): head k predicts k + 2 tokens ahead.
    pub medusa_heads: usize,
    /// How it was trained.
    pub training: TrainingInfo,
}

impl HeadTarget {
    /// The identity of a target of `config` stored as the file `name` with SHA-256 `sha256`.
    pub fn for_target(config: &LlamaConfig, name: &str, sha256: &str) -> Self {
        Self {
            name: name.to_string(),
            sha256: sha256.to_string(),
            architecture: config.arch.key_prefix().to_string(),
            hidden: config.hidden,
            vocab_size: config.vocab_size,
        }
    }
}

impl HeadMeta {
    /// The width of the input feature: feature blocks × the target's hidden size.
    pub fn feature_dim(&self) -> usize {
        self.feature_blocks.len() * self.target.hidden
    }

    /// Every tensor a head of this metadata holds (besides `d2t`), with its shape, in a fixed
    /// order. EAGLE: `fc [H, F + H]` (F = the feature width; input `[embed; feature]`),
    /// `attn_norm [H]`, `wq [nh·hd, H]`, `wk`/`wv [nkv·hd, H]`, `bq`/`bk`/`bv` when
    /// `qkv_bias`, `wo [H, nh·hd]`, `ffn_norm [H]`, `w_gate`/`w_up [ffn, H]`,
    /// `w_down [H, ffn]`, `lm_head [V_d, H]`. Medusa: `medusa.{k}.weight [H, H]`,
    /// `medusa.{k}.bias [H]` for each head, `lm_head [V_d, H]`.
    ///
    /// # Errors
    /// [`ModelError::Config`] for an EAGLE head without its [`EagleShape`].
    pub fn tensor_shapes(&self) -> Result<Vec<(String, Vec<usize>)>> {
        let h = self.target.hidden;
        let mut shapes: Vec<(String, Vec<usize>)> = Vec::new();
        let mut add = |name: &str, shape: &[usize]| shapes.push((name.to_string(), shape.to_vec()));
        match self.kind {
            HeadKind::Eagle => {
                let e = self.eagle.as_ref().ok_or_else(|| {
                    ModelError::Config("an EAGLE head's metadata needs its `eagle` shape".into())
                })?;
                let (q, kv) = (e.n_heads * e.head_dim, e.n_kv_heads * e.head_dim);
                if e.input_norms {
                    add("embed_norm", &[h]);
                    add("feature_norm", &[self.feature_dim()]);
                }
                add("fc", &[h, self.feature_dim() + h]);
                add("attn_norm", &[h]);
                add("wq", &[q, h]);
                add("wk", &[kv, h]);
                add("wv", &[kv, h]);
                if e.qkv_bias {
                    add("bq", &[q]);
                    add("bk", &[kv]);
                    add("bv", &[kv]);
                }
                add("wo", &[h, q]);
                add("ffn_norm", &[h]);
                add("w_gate", &[e.ffn, h]);
                add("w_up", &[e.ffn, h]);
                add("w_down", &[h, e.ffn]);
            }
            HeadKind::Medusa => {
                for k in 0..self.medusa_heads {
                    add(&format!("medusa.{k}.weight"), &[h, h]);
                    add(&format!("medusa.{k}.bias"), &[h]);
                }
            }
        }
        add("lm_head", &[self.draft_vocab, h]);
        Ok(shapes)
    }
}

/// One f32 tensor in memory (stored as [`StoredDtype`]).
#[derive(Debug, Clone, PartialEq)]
pub struct HeadTensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Row-major values, `shape.iter().product()` of them.
    pub data: Vec<f32>,
}

impl HeadTensor {
    /// A tensor of `shape` holding `data`.
    ///
    /// # Errors
    /// [`ModelError::Shape`] when the lengths disagree.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Result<Self> {
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(ModelError::Shape {
                what: "head tensor".into(),
                reason: format!(
                    "shape {shape:?} holds {expected} values, got {}",
                    data.len()
                ),
            });
        }
        Ok(Self { shape, data })
    }
}

/// How [`HeadFile::save`] stores tensor values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoredDtype {
    /// bfloat16 (half the bytes; what inference reads).
    #[default]
    Bf16,
    /// float32 (exact; for checkpoints).
    F32,
}

impl StoredDtype {
    /// The safetensors dtype of this choice.
    pub fn dtype(self) -> Dtype {
        match self {
            StoredDtype::Bf16 => Dtype::BF16,
            StoredDtype::F32 => Dtype::F32,
        }
    }
}

/// A head: metadata, draft vocabulary and tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadFile {
    /// What the head is and what it drafts for.
    pub meta: HeadMeta,
    /// Draft id → target token id, `meta.draft_vocab` distinct ids.
    pub d2t: Vec<u32>,
    /// The tensors of [`HeadMeta::tensor_shapes`], by name.
    pub tensors: BTreeMap<String, HeadTensor>,
}

impl HeadFile {
    /// Checks that the tensors and draft vocabulary are exactly those the metadata implies.
    ///
    /// # Errors
    /// [`ModelError::Config`] naming the missing, extra or misshapen tensor, or the bad id.
    pub fn validate(&self) -> Result<()> {
        let m = &self.meta;
        if m.format_version != HEAD_FORMAT_VERSION {
            return Err(ModelError::Config(format!(
                "head format version {} (this build reads {HEAD_FORMAT_VERSION})",
                m.format_version
            )));
        }
        if m.feature_blocks.is_empty() || m.target.hidden == 0 {
            return Err(ModelError::Config(
                "a head needs at least one feature block and a hidden size".into(),
            ));
        }
        if let (HeadKind::Eagle, Some(shape)) = (m.kind, &m.eagle) {
            shape.check()?;
        }
        if m.kind == HeadKind::Medusa && m.medusa_heads == 0 {
            return Err(ModelError::Config(
                "a Medusa head file holds no head".into(),
            ));
        }
        if m.kind == HeadKind::Medusa && m.feature_blocks.len() != 1 {
            return Err(ModelError::Config(format!(
                "a Medusa head reads one feature block, this file lists {:?}",
                m.feature_blocks
            )));
        }
        if self.d2t.len() != m.draft_vocab || m.draft_vocab == 0 {
            return Err(ModelError::Config(format!(
                "draft vocabulary: {} ids for draft_vocab = {}",
                self.d2t.len(),
                m.draft_vocab
            )));
        }
        let mut seen = vec![false; m.target.vocab_size];
        for &id in &self.d2t {
            match seen.get_mut(id as usize) {
                Some(s) if !*s => *s = true,
                Some(_) => {
                    return Err(ModelError::Config(format!(
                        "draft vocabulary lists id {id} twice"
                    )))
                }
                None => {
                    return Err(ModelError::Config(format!(
                        "draft vocabulary id {id} is outside the target's {} ids",
                        m.target.vocab_size
                    )))
                }
            }
        }
        let shapes = m.tensor_shapes()?;
        for (name, shape) in &shapes {
            match self.tensors.get(name) {
                None => {
                    return Err(ModelError::Config(format!(
                        "head tensor `{name}` is missing"
                    )))
                }
                Some(t) if &t.shape != shape => {
                    return Err(ModelError::Config(format!(
                        "head tensor `{name}` has shape {:?}, expected {shape:?}",
                        t.shape
                    )))
                }
                Some(_) => {}
            }
        }
        if let Some(extra) = self
            .tensors
            .keys()
            .find(|k| !shapes.iter().any(|(n, _)| n == *k))
        {
            return Err(ModelError::Config(format!(
                "head tensor `{extra}` does not belong to a {} head",
                m.kind.name()
            )));
        }
        Ok(())
    }

    /// The tensor `name`.
    ///
    /// # Errors
    /// [`ModelError::Config`] when it is absent.
    pub fn tensor(&self, name: &str) -> Result<&HeadTensor> {
        self.tensors
            .get(name)
            .ok_or_else(|| ModelError::Config(format!("head tensor `{name}` is missing")))
    }

    /// Refuses a head trained for another target file than the one of `sha256` (`name` for the
    /// message).
    ///
    /// # Errors
    /// [`ModelError::Config`] naming both targets.
    pub fn check_target(&self, name: &str, sha256: &str) -> Result<()> {
        let t = &self.meta.target;
        if t.sha256 != sha256 {
            return Err(ModelError::Config(
                format!(
                    "this {} head was trained for target `{}` (SHA-256 {}), not for `{name}` \
                 (SHA-256 {sha256}); train one for it with `specdec train-head`",
                    self.meta.kind.name(),
                    t.name,
                    short(&t.sha256),
                )
                .replace(sha256, short(sha256)),
            ));
        }
        Ok(())
    }

    /// Writes the head to `path` (validated first; values as `dtype`), through a temporary
    /// file renamed into place, so a reader never sees half a file.
    ///
    /// # Errors
    /// [`HeadFile::validate`]'s errors; I/O errors naming the path.
    pub fn save(&self, path: &Path, dtype: StoredDtype) -> Result<()> {
        self.validate()?;
        let stored = dtype.dtype();
        let tensors: Vec<OwnedTensor> = self
            .tensors
            .iter()
            .map(|(name, t)| {
                let bytes = encode_f32(&t.data, stored).expect("a float dtype");
                (name.clone(), stored, t.shape.clone(), bytes)
            })
            .chain(std::iter::once((
                D2T.to_string(),
                Dtype::I32,
                vec![self.d2t.len()],
                self.d2t
                    .iter()
                    .flat_map(|&i| (i as i32).to_le_bytes())
                    .collect(),
            )))
            .collect();
        let meta = serde_json::to_string(&self.meta)
            .map_err(|e| ModelError::Config(format!("head metadata: {e}")))?;
        write_safetensors(
            path,
            &tensors,
            Some(HashMap::from([(META_KEY.into(), meta)])),
        )
    }

    /// Reads and validates a head file.
    ///
    /// # Errors
    /// I/O errors naming the path; a file that is not safetensors, lacks the `specdec.head`
    /// metadata, or does not [`HeadFile::validate`].
    pub fn load(path: &Path) -> Result<Self> {
        let file = SafetensorsFile::open(path)?;
        let meta_json = file.metadata().get(META_KEY).ok_or_else(|| {
            ModelError::Config(format!(
                "{}: not a specdec head (no `{META_KEY}` metadata)",
                path.display()
            ))
        })?;
        let meta: HeadMeta = serde_json::from_str(meta_json)
            .map_err(|e| ModelError::Config(format!("{}: head metadata: {e}", path.display())))?;
        let mut tensors = BTreeMap::new();
        let mut d2t = None;
        for name in file.names() {
            let entry = file.entry(name).expect("a listed name");
            if name == D2T {
                if entry.dtype != Dtype::I32 {
                    return Err(ModelError::Config(format!(
                        "{}: `d2t` must be I32, found {:?}",
                        path.display(),
                        entry.dtype
                    )));
                }
                let ids = file
                    .data(entry)
                    .chunks_exact(4)
                    .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .map(|i| u32::try_from(i).unwrap_or(u32::MAX))
                    .collect();
                d2t = Some(ids);
                continue;
            }
            let data = file.to_f32(name)?;
            tensors.insert(
                name.to_string(),
                HeadTensor::new(entry.shape.clone(), data)?,
            );
        }
        let head = HeadFile {
            meta,
            d2t: d2t.ok_or_else(|| {
                ModelError::Config(format!("{}: no `d2t` tensor", path.display()))
            })?,
            tensors,
        };
        head.validate()
            .map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))?;
        Ok(head)
    }
}

/// The first 12 hex digits of a hash (enough to tell files apart in a message).
fn short(sha256: &str) -> &str {
    &sha256[..sha256.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(kind: HeadKind) -> HeadMeta {
        HeadMeta {
            format_version: HEAD_FORMAT_VERSION,
            kind,
            target: HeadTarget {
                name: "toy.gguf".into(),
                sha256: "ab".repeat(32),
                architecture: "llama".into(),
                hidden: 4,
                vocab_size: 10,
            },
            feature_blocks: vec![1],
            draft_vocab: 3,
            eagle: (kind == HeadKind::Eagle).then(|| EagleShape {
                n_heads: 2,
                n_kv_heads: 1,
                head_dim: 2,
                ffn: 6,
                qkv_bias: true,
                rms_eps: 1e-5,
                rope_base: 10_000.0,
                rope_layout: "interleaved".into(),
                input_norms: false,
            }),
            medusa_heads: if kind == HeadKind::Medusa { 2 } else { 0 },
            training: TrainingInfo::default(),
        }
    }

    fn head(kind: HeadKind) -> HeadFile {
        let meta = meta(kind);
        let tensors = meta
            .tensor_shapes()
            .unwrap()
            .into_iter()
            .enumerate()
            .map(|(i, (name, shape))| {
                let n: usize = shape.iter().product();
                let data = (0..n)
                    .map(|j| ((i * 7 + j) % 64) as f32 / 32.0 - 1.0)
                    .collect();
                (name, HeadTensor::new(shape, data).unwrap())
            })
            .collect();
        HeadFile {
            meta,
            d2t: vec![7, 0, 3],
            tensors,
        }
    }

    #[test]
    fn round_trip_in_both_dtypes_and_kinds() {
        let dir = std::env::temp_dir().join(format!("specdec-head-{}", std::process::id()));
        for kind in [HeadKind::Eagle, HeadKind::Medusa] {
            let original = head(kind);
            for dtype in [StoredDtype::F32, StoredDtype::Bf16] {
                let path = dir.join(format!("{}-{dtype:?}.safetensors", kind.name()));
                original.save(&path, dtype).unwrap();
                // values are multiples of 1/32 in [-1, 1): exact in bf16 too
                assert_eq!(
                    HeadFile::load(&path).unwrap(),
                    original,
                    "{kind:?} {dtype:?}"
                );
            }
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Asserts that `kind`'s test head, changed by `change`, is refused with a message
    /// holding `fault`.
    fn assert_invalid(kind: HeadKind, change: impl FnOnce(&mut HeadFile), fault: &str) {
        let mut h = head(kind);
        change(&mut h);
        let err = h.validate().unwrap_err().to_string();
        assert!(err.contains(fault), "`{fault}` is not in: {err}");
    }

    #[test]
    fn bad_heads_are_refused_naming_the_fault() {
        use HeadKind::{Eagle, Medusa};
        let eagle = |h: &mut HeadFile| h.meta.eagle.clone().unwrap();
        assert_invalid(Eagle, |h| drop(h.tensors.remove("wk")), "`wk`");
        assert_invalid(
            Eagle,
            |h| h.tensors.get_mut("fc").unwrap().shape = vec![4, 4],
            "`fc` has shape",
        );
        assert_invalid(
            Eagle,
            |h| {
                h.meta.eagle = Some(EagleShape {
                    input_norms: true,
                    ..eagle(h)
                })
            },
            "`embed_norm`",
        );
        assert_invalid(
            Eagle,
            |h| {
                h.meta.eagle = Some(EagleShape {
                    rope_layout: "spiral".into(),
                    ..eagle(h)
                })
            },
            "`spiral`",
        );
        assert_invalid(
            Eagle,
            |h| {
                h.meta.eagle = Some(EagleShape {
                    n_kv_heads: 3,
                    ..eagle(h)
                })
            },
            "2 query heads are not a multiple of 3 KV heads",
        );
        assert_invalid(
            Medusa,
            |h| h.meta.feature_blocks = vec![0, 1],
            "one feature block",
        );
        assert_invalid(Medusa, |h| h.d2t = vec![1, 1, 2], "twice");
        assert_invalid(Medusa, |h| h.d2t = vec![1, 2, 10], "outside");
        assert_invalid(
            Medusa,
            |h| {
                let stray = HeadTensor::new(vec![1], vec![0.0]).unwrap();
                h.tensors.insert("wq".into(), stray);
            },
            "does not belong",
        );
    }

    #[test]
    fn a_head_for_another_target_is_refused_naming_both() {
        let h = head(HeadKind::Eagle);
        assert!(h.check_target("toy.gguf", &"ab".repeat(32)).is_ok());
        let err = h
            .check_target("other.gguf", &"cd".repeat(32))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("toy.gguf") && err.contains("other.gguf") && err.contains("abababab"),
            "{err}"
        );
    }
}
