//! Where a result came from: code, machine, seeds, models and the config itself.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::{ExperimentConfig, ModelSource};
use crate::error::{HarnessError, Result};

/// The provenance recorded with every result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// The git commit the running binary was built from ([`BUILD_COMMIT`]; `unknown` without
    /// git at build time).
    pub git_commit: String,
    /// Whether that build had uncommitted changes to tracked files (`None` when unknown).
    pub git_dirty: Option<bool>,
    /// Version of the specdec crates.
    pub specdec_version: String,
    /// Versions of the main third-party crates, from the workspace lock file at build time.
    pub crate_versions: BTreeMap<String, String>,
    /// CPU model name (from /proc/cpuinfo, else `unknown`).
    pub cpu_model: String,
    /// Threads available to the process.
    pub threads: usize,
    /// Operating system and architecture.
    pub os: String,
    /// The GPU seen by the NVIDIA driver, if any.
    pub gpu: Option<String>,
    /// Which backend produced the records (`simulation`, `toy`, `cpu`, `cuda`).
    pub backend: String,
    /// The sampling seed of the run.
    pub seed: u64,
    /// SHA-256 of every model file given by path (hashed at run time), and of every model given by
    /// registry name (the pinned hash, which the file is checked against when it is opened,
    /// marked `(registry pin)`).
    pub model_hashes: BTreeMap<String, String>,
    /// Unix seconds at the start of the run.
    pub started_unix_s: u64,
    /// The config file, when run from one.
    pub config_path: Option<String>,
    /// The config as run (baseline included).
    pub config: ExperimentConfig,
    /// Notes from validation and running.
    pub notes: Vec<String>,
    /// Whether every method ran over every prompt, in every repeat. False while the run is going, and after a
    /// run stopped by a signal or with a failed method: `specdec run --resume DIR` continues
    /// it. Folders written before this field existed read as complete.
    #[serde(default = "complete_by_default")]
    pub complete: bool,
    /// `method: error` for each method whose run failed (its records are left out; the other
    /// methods' are kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
    /// Why the run stopped before the end, when it did (`interrupted by a signal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

fn complete_by_default() -> bool {
    true
}

impl Provenance {
    /// Collects the provenance of a run of `config` now. Hashes the model files given by path
    /// (errors if one cannot be read).
    pub fn collect(
        config: &ExperimentConfig,
        config_path: Option<&Path>,
        backend: &str,
        notes: Vec<String>,
    ) -> Result<Provenance> {
        let (git_commit, git_dirty) = (BUILD_COMMIT.to_string(), build_dirty());
        let mut model_hashes = BTreeMap::new();
        let entries = std::iter::once(&config.models.target).chain(config.models.draft.iter());
        for entry in entries {
            match ModelSource::parse(entry) {
                Ok(ModelSource::Gguf(path)) => {
                    model_hashes.insert(entry.clone(), hash_file(&path)?);
                }
                Ok(ModelSource::HfFolder(path)) => {
                    let digest = specdec_models::registry::folder_sha256(&path)?;
                    model_hashes.insert(entry.clone(), format!("{digest} (folder)"));
                }
                Ok(ModelSource::Named(_)) => {
                    if let Some(e) = specdec_models::registry::entry(entry) {
                        model_hashes.insert(entry.clone(), format!("{} (registry pin)", e.sha256));
                    }
                }
                _ => {}
            }
        }
        Ok(Provenance {
            git_commit,
            git_dirty,
            specdec_version: env!("CARGO_PKG_VERSION").to_string(),
            crate_versions: crate_versions(),
            cpu_model: cpu_model(),
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
            gpu: gpu_name(),
            backend: backend.to_string(),
            seed: config.sampling.seed,
            model_hashes,
            started_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            config_path: config_path.map(|p| p.display().to_string()),
            config: config.clone(),
            notes,
            complete: false,
            failures: Vec::new(),
            stopped: None,
        })
    }
}

/// The git commit this crate was built from (by `build.rs`; `unknown` without git).
pub const BUILD_COMMIT: &str = env!("SPECDEC_BUILD_COMMIT");

/// Whether the build had uncommitted changes to tracked files (`None` when unknown).
pub fn build_dirty() -> Option<bool> {
    match env!("SPECDEC_BUILD_DIRTY") {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}

fn gpu_name() -> Option<String> {
    let dir = std::fs::read_dir("/proc/driver/nvidia/gpus").ok()?;
    let mut names = Vec::new();
    for entry in dir.flatten() {
        if let Ok(info) = std::fs::read_to_string(entry.path().join("information")) {
            if let Some(model) = info
                .lines()
                .find(|l| l.starts_with("Model:"))
                .map(|l| l["Model:".len()..].trim().to_string())
            {
                names.push(model);
            }
        }
    }
    (!names.is_empty()).then(|| names.join(", "))
}

const LOCK_FILE: &str = include_str!("../../../Cargo.lock");
const TRACKED_CRATES: [&str; 10] = [
    "cudarc",
    "half",
    "indicatif",
    "plotters",
    "rayon",
    "serde",
    "serde_json",
    "sha2",
    "tokenizers",
    "toml",
];

/// Versions of the main third-party crates, read from the workspace's `Cargo.lock` as it was at
/// build time (crates not in the lock are omitted).
pub fn crate_versions() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut name: Option<&str> = None;
    for line in LOCK_FILE.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"'));
        } else if let (Some(v), Some(n)) = (line.strip_prefix("version = "), name) {
            if TRACKED_CRATES.contains(&n) {
                out.insert(n.to_string(), v.trim_matches('"').to_string());
            }
            name = None;
        }
    }
    out
}

/// SHA-256 of a file, as lowercase hex, read in 1 MiB chunks.
pub fn hash_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| HarnessError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| HarnessError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_a_known_file() {
        let dir = std::env::temp_dir().join(format!("specdec-hash-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("abc");
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(
            hash_file(&p).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_build_commit_is_built_in() {
        // this test runs from a git checkout: the build script saw a 40-hex commit
        assert!(
            BUILD_COMMIT == "unknown"
                || (BUILD_COMMIT.len() == 40
                    && BUILD_COMMIT.chars().all(|c| c.is_ascii_hexdigit())),
            "{BUILD_COMMIT}"
        );
    }

    #[test]
    fn lock_file_versions_are_found() {
        let v = crate_versions();
        assert!(v.contains_key("serde"), "{v:?}");
        assert!(v.contains_key("plotters"), "{v:?}");
    }
}
