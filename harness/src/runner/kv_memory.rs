//! The KV memory budget of a run (`models.kv_memory` in configs, `--kv-memory` on `generate`):
//! how many bytes the paged KV pools of the target and of one drafter may take together, and
//! the token slots that gives each pool.
//!
//! A pool is one shared paged cache (`specdec_kernels::kv::PagedKvCache`): sequences take blocks
//! as they grow and the engine admits a request only when its whole need (prompt, `max_tokens`
//! and [`KV_TREE_ROOM`]) fits beside the needs of the requests in flight, queueing it otherwise
//! (see [`crate::engine`]). So the budget is shared, not cut into fixed per-sequence slices, and
//! a single request may use all of it — up to the model's context.
//!
//! The split: the target's pool gets `T` token slots and each drafter's pool (draft model,
//! layer-skip view, EAGLE head) `T + (sequences + 2) · KV_TREE_ROOM` slots, where
//! `T = (budget − slack) / (target bytes per token + draft bytes per token)`, the draft's bytes
//! being the configured draft model's, or the target's when there is none (a bound for
//! layer-skip views and one-layer heads). `T` is capped at `sequences · (context +
//! KV_TREE_ROOM)`, all a batch can ever use. On the CPU pools are zeroed lazily by the operating
//! system, so a budget costs memory only as blocks are written; the CUDA runner allocates its
//! pool up front.

use std::fmt;

use specdec_kernels::kv::KvDtype;

use crate::engine::KV_TREE_ROOM;
use crate::error::{HarnessError, Result};

/// Fewest target token slots a budget may leave (below this no useful request fits).
pub const MIN_KV_TOKENS: usize = 256;

/// A KV memory budget in bytes (≥ 1 MiB), and the element type the pools store in it
/// (`kv_dtype`: f32 by default; bf16 and f16 hold twice the tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvMemory {
    bytes: u64,
    dtype: KvDtype,
}

/// The token slots a [`KvMemory`] gives each pool of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvPlan {
    /// The budget the plan came from.
    pub memory: KvMemory,
    /// Token slots of the target's pool.
    pub target_tokens: usize,
    /// Token slots of each drafter's pool (the target's plus the draft trees' slack).
    pub draft_tokens: usize,
}

impl KvMemory {
    /// A budget of `bytes`.
    ///
    /// # Errors
    /// [`HarnessError::InvalidEngine`] below 1 MiB.
    pub fn from_bytes(bytes: u64) -> Result<Self> {
        if bytes < 1 << 20 {
            return Err(HarnessError::InvalidEngine(format!(
                "kv_memory of {bytes} bytes: at least 1 MiB is needed"
            )));
        }
        Ok(Self {
            bytes,
            dtype: KvDtype::F32,
        })
    }

    /// The same budget with pools of `dtype` elements.
    pub fn with_dtype(self, dtype: KvDtype) -> Self {
        Self { dtype, ..self }
    }

    /// The element type of the pools.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Parses a size: a number with an optional unit, `B`, `KiB`/`MiB`/`GiB`/`TiB` (or `K`, `M`,
    /// `G`, `T`: powers of 1024) or `KB`/`MB`/`GB`/`TB` (powers of 1000), case-insensitive, e.g.
    /// `"8GiB"`, `"512 MiB"`, `"1.5G"`, `"2000000000"`.
    ///
    /// # Errors
    /// [`HarnessError::InvalidEngine`] naming the text for anything else, and as
    /// [`KvMemory::from_bytes`].
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || {
            HarnessError::InvalidEngine(format!(
                "kv_memory `{text}`: expected a size such as 8GiB, 512MiB, 1.5G or a number of \
                 bytes"
            ))
        };
        let trimmed = text.trim();
        let split = trimmed
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(trimmed.len());
        let (number, unit) = trimmed.split_at(split);
        let value: f64 = number.parse().map_err(|_| bad())?;
        let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1.0,
            "k" | "kib" => 1024.0,
            "m" | "mib" => 1024f64.powi(2),
            "g" | "gib" => 1024f64.powi(3),
            "t" | "tib" => 1024f64.powi(4),
            "kb" => 1e3,
            "mb" => 1e6,
            "gb" => 1e9,
            "tb" => 1e12,
            _ => return Err(bad()),
        };
        let bytes = value * scale;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(bad());
        }
        Self::from_bytes(bytes as u64)
    }

    /// The default budget: a quarter of this machine's memory (`MemTotal` of `/proc/meminfo`),
    /// 4 GiB where that cannot be read.
    pub fn machine_default() -> Self {
        let total = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|info| {
                let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
                let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
                kib.checked_mul(1024)
            });
        Self {
            bytes: total.map_or(4 << 30, |t| (t / 4).max(1 << 20)),
            dtype: KvDtype::F32,
        }
    }

    /// The budget `kv_memory` (a size for [`KvMemory::parse`]; `None`: the
    /// [`KvMemory::machine_default`]) of `kv_dtype` elements ([`parse_kv_dtype`]; `None`: f32)
    /// for models on `device`.
    ///
    /// # Errors
    /// As [`KvMemory::parse`] and [`parse_kv_dtype`].
    pub fn configured(
        kv_memory: Option<&str>,
        kv_dtype: Option<&str>,
        device: &str,
    ) -> Result<Self> {
        let memory = match kv_memory {
            Some(text) => Self::parse(text)?,
            None => Self::machine_default(),
        };
        let dtype = match kv_dtype {
            Some(text) => parse_kv_dtype(text, device)?,
            None => KvDtype::F32,
        };
        Ok(memory.with_dtype(dtype))
    }

    /// The budget in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The pools' token slots for a target of `target_token_bytes` KV bytes per token and a
    /// drafter of `draft_token_bytes` (bytes of this budget's element type), serving `sequences` requests at once in a context of
    /// `context` tokens (module docs for the split).
    ///
    /// # Errors
    /// [`HarnessError::InvalidEngine`] when the budget leaves the target fewer than
    /// [`MIN_KV_TOKENS`] slots, naming the budget and the bytes per token.
    pub fn plan(
        &self,
        target_token_bytes: usize,
        draft_token_bytes: usize,
        sequences: usize,
        context: usize,
    ) -> Result<KvPlan> {
        let sequences = sequences.max(1);
        let slack = (sequences + 2) * KV_TREE_ROOM;
        let per_token = (target_token_bytes + draft_token_bytes).max(1) as u64;
        let spare = self
            .bytes
            .saturating_sub(slack as u64 * draft_token_bytes as u64);
        let fits = usize::try_from(spare / per_token).unwrap_or(usize::MAX);
        let useful = sequences.saturating_mul(context.saturating_add(KV_TREE_ROOM));
        let target_tokens = fits.min(useful);
        if target_tokens < MIN_KV_TOKENS.min(useful) {
            return Err(HarnessError::InvalidEngine(format!(
                "kv_memory {self} holds only {target_tokens} tokens of KV ({target_token_bytes} \
                 bytes per token for the target, {draft_token_bytes} for its drafter): at least \
                 {MIN_KV_TOKENS} are needed"
            )));
        }
        Ok(KvPlan {
            memory: *self,
            target_tokens,
            draft_tokens: target_tokens + slack,
        })
    }
}

/// Parses a `kv_dtype` (`f32`, `bf16` or `f16`) for models on `device` (`cpu`, `cuda`,
/// `cuda:N`).
///
/// # Errors
/// [`HarnessError::InvalidEngine`] for another name, or a 16-bit type on a GPU (the CUDA
/// kernels read f32 pools).
pub fn parse_kv_dtype(text: &str, device: &str) -> Result<KvDtype> {
    let dtype: KvDtype = text
        .parse()
        .map_err(|e: specdec_kernels::KernelError| HarnessError::InvalidEngine(e.to_string()))?;
    if dtype != KvDtype::F32 && device.trim() != "cpu" {
        return Err(HarnessError::InvalidEngine(format!(
            "kv_dtype {dtype} runs on the CPU only: the CUDA kernels read f32 KV pools (device \
             `{device}`)"
        )));
    }
    Ok(dtype)
}

impl fmt::Display for KvMemory {
    /// `N bytes` below 1 MiB, else MiB or GiB with one decimal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bytes as f64;
        if self.bytes >= 1 << 30 {
            write!(f, "{:.1} GiB", b / f64::from(1u32 << 30))
        } else {
            write!(f, "{:.1} MiB", b / f64::from(1u32 << 20))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_their_units_and_bad_ones_are_refused() {
        for (text, bytes) in [
            ("8GiB", 8u64 << 30),
            ("512 MiB", 512 << 20),
            ("1.5g", 3 << 29),
            ("2GB", 2_000_000_000),
            ("3000000", 3_000_000),
            ("4M", 4 << 20),
        ] {
            assert_eq!(KvMemory::parse(text).unwrap().bytes(), bytes, "{text}");
        }
        for bad in [
            "",
            "lots",
            "8 GiBs",
            "-1G",
            "1e3",
            "1.2.3G",
            "100",
            "99999999999T",
        ] {
            let err = KvMemory::parse(bad).unwrap_err().to_string();
            assert!(err.contains("kv_memory"), "{bad}: {err}");
        }
        assert!(KvMemory::machine_default().bytes() >= 1 << 20);
    }

    #[test]
    fn the_plan_splits_the_budget_and_caps_it_at_what_the_batch_can_use() {
        let memory = KvMemory::parse("100MiB").unwrap();
        // 1000 + 500 bytes per token: (100 MiB − slack) / 1500 slots for the target
        let plan = memory.plan(1000, 500, 1, 1 << 20).unwrap();
        let slack = 3 * KV_TREE_ROOM;
        assert_eq!(
            plan.target_tokens,
            ((100u64 << 20) - slack as u64 * 500) as usize / 1500
        );
        assert_eq!(plan.draft_tokens, plan.target_tokens + slack);
        let bytes = plan.target_tokens * 1000 + plan.draft_tokens * 500;
        assert!(bytes as u64 <= memory.bytes(), "{bytes}");
        // a small context caps the pool at what two sequences can use
        let capped = memory.plan(1000, 500, 2, 4096).unwrap();
        assert_eq!(capped.target_tokens, 2 * (4096 + KV_TREE_ROOM));
        // a budget too small for any request is refused, naming the bytes per token
        let err = KvMemory::parse("1MiB")
            .unwrap()
            .plan(57_344, 57_344, 1, 32_768)
            .unwrap_err()
            .to_string();
        assert!(err.contains("1.0 MiB") && err.contains("57344"), "{err}");
    }

    #[test]
    fn a_kv_dtype_is_parsed_with_the_budget_and_refused_on_a_gpu() {
        let memory = KvMemory::configured(Some("1GiB"), Some("bf16"), "cpu").unwrap();
        assert_eq!((memory.bytes(), memory.dtype()), (1 << 30, KvDtype::Bf16));
        let default = KvMemory::configured(None, None, "cuda").unwrap();
        assert_eq!(default.dtype(), KvDtype::F32);
        for (text, device, named) in [("fp8", "cpu", "fp8"), ("f16", "cuda:0", "CPU only")] {
            let err = parse_kv_dtype(text, device).unwrap_err().to_string();
            assert!(err.contains(named), "{text} {device}: {err}");
        }
        assert_eq!(parse_kv_dtype("f32", "cuda").unwrap(), KvDtype::F32);
    }
}
