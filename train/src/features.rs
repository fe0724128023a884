//! The feature cache: token sequences with the target's features (last block output before the
//! final norm, one row per token), computed once by running the target and stored on disk as
//! bf16, keyed by what determines them ([`FeatureCacheKey`]).
//!
//! Layout of a cache folder: `meta.json` (the key, the width, whether it is complete),
//! `tokens.u32` (every sequence's token ids, little-endian u32, one after the other),
//! `features.bf16` (their feature rows, `hidden` little-endian bf16 values per token), and
//! `lengths.u32` (one u32 per **complete** sequence, appended after its tokens and features).
//! Building is resumable: a restart trims the data files to the sequences `lengths.u32` lists
//! and continues with the next one.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use half::bf16;
use serde::{Deserialize, Serialize};
use specdec_models::llama::{LlamaModel, LlamaOptions};
use specdec_models::LanguageModel;

use crate::error::{io_error, ModelContext, Result, TrainError};
use crate::progress::Progress;
use crate::target::FrozenTarget;

/// The version of the folder layout; a cache of another version is refused.
const CACHE_FORMAT: u32 = 1;
const META: &str = "meta.json";
const TOKENS: &str = "tokens.u32";
const FEATURES: &str = "features.bf16";
const LENGTHS: &str = "lengths.u32";

/// What determines a feature cache's contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeatureCacheKey {
    /// SHA-256 of the target GGUF.
    pub target_sha256: String,
    /// SHA-256 of the data the sequences come from.
    pub data_sha256: String,
    /// Longest sequence, in tokens.
    pub max_len: usize,
    /// Sequences asked for.
    pub count: usize,
    /// Seed of the shuffle that picked them.
    pub data_seed: u64,
}

impl FeatureCacheKey {
    /// The folder name of this key: the two hashes' first 12 hex digits and the numbers.
    pub fn folder_name(&self) -> String {
        let short = |s: &str| s.chars().take(12).collect::<String>();
        format!(
            "{}-{}-len{}-n{}-seed{}",
            short(&self.target_sha256),
            short(&self.data_sha256),
            self.max_len,
            self.count,
            self.data_seed
        )
    }
}

/// `meta.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct CacheMeta {
    format: u32,
    key: FeatureCacheKey,
    target_name: String,
    /// The tapped block.
    feature_block: usize,
    /// Values per feature row.
    hidden: usize,
    /// Sequences the finished cache holds.
    sequences: usize,
    /// Whether every sequence has been extracted.
    complete: bool,
}

/// How [`FeatureCache::build`] went.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ExtractionStats {
    /// Sequences already in the cache when this build started.
    pub resumed_from: usize,
    /// Sequences extracted by this build.
    pub sequences: usize,
    /// Tokens run through the target by this build.
    pub tokens: u64,
    /// Wall-clock seconds of the extraction.
    pub seconds: f64,
}

impl ExtractionStats {
    /// Tokens per second of this build's extraction (0 when nothing was extracted).
    pub fn tokens_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.tokens as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// A complete feature cache, open for reading.
#[derive(Debug)]
pub struct FeatureCache {
    dir: PathBuf,
    meta: CacheMeta,
    /// Token offset of each sequence, plus the total at the end.
    offsets: Vec<u64>,
    tokens: File,
    features: File,
}

impl FeatureCache {
    /// Builds the cache for `sequences` in `dir` (or continues an interrupted build there, or
    /// opens it when complete): runs `target` on each sequence as one prefill with the last
    /// block tapped and appends tokens and features. Shows a progress bar when `progress`.
    ///
    /// # Errors
    /// [`TrainError::FeatureCache`] when `dir` holds a cache of another key or width, or its
    /// stored tokens differ from `sequences` (a stale cache: delete the folder); a sequence
    /// longer than the target's context or empty; model and I/O errors.
    pub fn build(
        dir: &Path,
        key: &FeatureCacheKey,
        target: &FrozenTarget,
        sequences: &[Vec<u32>],
        progress: bool,
    ) -> Result<(Self, ExtractionStats)> {
        let config = target.config();
        let block = config.n_layers - 1;
        let fail = |reason: String| TrainError::FeatureCache {
            path: dir.display().to_string(),
            reason,
        };
        let longest = sequences.iter().map(Vec::len).max().unwrap_or(0);
        if longest > config.context_length || sequences.iter().any(Vec::is_empty) {
            return Err(fail(format!(
                "sequences must hold 1..={} tokens (the target's context); the longest has \
                 {longest}",
                config.context_length
            )));
        }
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        let wanted = CacheMeta {
            format: CACHE_FORMAT,
            key: key.clone(),
            target_name: target.identity().name.clone(),
            feature_block: block,
            hidden: config.hidden,
            sequences: sequences.len(),
            complete: false,
        };
        let meta_path = dir.join(META);
        match read_meta(&meta_path)? {
            Some(found)
                if CacheMeta {
                    complete: false,
                    ..found.clone()
                } == wanted => {}
            Some(found) => {
                return Err(fail(format!(
                    "it was built for {:?} (block {}, width {}, {} sequences), this run needs \
                     {:?} (block {block}, width {}, {} sequences); delete the folder to rebuild",
                    found.key,
                    found.feature_block,
                    found.hidden,
                    found.sequences,
                    key,
                    config.hidden,
                    sequences.len()
                )))
            }
            None => write_meta(&meta_path, &wanted)?,
        }
        let mut writer = Appender::open(dir, config.hidden)?;
        let resumed_from = writer.lengths.len();
        if resumed_from > sequences.len() {
            return Err(fail(format!(
                "it holds {resumed_from} sequences, more than the {} planned",
                sequences.len()
            )));
        }
        // The stored prefix must be these sequences' tokens.
        let stored = writer.stored_tokens()?;
        let expected: Vec<u32> = sequences[..resumed_from].concat();
        if stored != expected {
            return Err(fail(
                "its stored tokens differ from this run's sequences (stale cache); delete the \
                 folder to rebuild"
                    .into(),
            ));
        }
        let mut stats = ExtractionStats {
            resumed_from,
            ..ExtractionStats::default()
        };
        if resumed_from < sequences.len() {
            let mut model = LlamaModel::from_gguf(
                target.file(),
                LlamaOptions {
                    kv_capacity_tokens: longest.max(16),
                    ..LlamaOptions::default()
                },
            )
            .model_context(|| format!("loading {} to extract features", wanted.target_name))?;
            model
                .tap_features(&[block])
                .model_context(|| "tapping the last block".into())?;
            let mut bar = Progress::new(
                progress,
                sequences.len() as u64,
                "extracting features",
                "sequences",
                "{msg} [{bar:30}] {pos}/{len} sequences, {per_sec}, eta {eta}",
            );
            bar.start_at(resumed_from as u64);
            let start = Instant::now();
            for (i, tokens) in sequences.iter().enumerate().skip(resumed_from) {
                let context = || format!("extracting features of sequence {i}");
                let seq = model.new_sequence().model_context(context)?;
                let features = model
                    .prefill(seq, tokens)
                    .model_context(context)?
                    .ok_or_else(|| fail("the target handed back no features".into()))?;
                model.release(seq).model_context(context)?;
                writer.append(tokens, features.as_slice())?;
                stats.sequences += 1;
                stats.tokens += tokens.len() as u64;
                bar.inc();
            }
            stats.seconds = start.elapsed().as_secs_f64();
            bar.finish();
        }
        write_meta(
            &meta_path,
            &CacheMeta {
                complete: true,
                ..wanted
            },
        )?;
        drop(writer);
        Ok((Self::open(dir, key)?, stats))
    }

    /// Opens the complete cache in `dir`, checking it was built for `key`.
    ///
    /// # Errors
    /// [`TrainError::FeatureCache`] when it is missing, incomplete, of another key or format,
    /// or its files disagree in size.
    pub fn open(dir: &Path, key: &FeatureCacheKey) -> Result<Self> {
        let fail = |reason: String| TrainError::FeatureCache {
            path: dir.display().to_string(),
            reason,
        };
        let meta = read_meta(&dir.join(META))?.ok_or_else(|| fail("no meta.json".into()))?;
        if meta.format != CACHE_FORMAT || &meta.key != key || !meta.complete {
            return Err(fail(format!(
                "not a complete cache for {key:?} (found format {}, {:?}, complete: {})",
                meta.format, meta.key, meta.complete
            )));
        }
        let lengths = read_lengths(&dir.join(LENGTHS))?;
        if lengths.len() != meta.sequences {
            return Err(fail(format!(
                "{} sequences listed, {} expected",
                lengths.len(),
                meta.sequences
            )));
        }
        let mut offsets = Vec::with_capacity(lengths.len() + 1);
        let mut total = 0u64;
        offsets.push(0);
        for len in lengths {
            total += u64::from(len);
            offsets.push(total);
        }
        let open = |name: &str, bytes_per_token: u64| -> Result<File> {
            let path = dir.join(name);
            let file = File::open(&path).map_err(io_error(&path))?;
            let len = file.metadata().map_err(io_error(&path))?.len();
            if len != total * bytes_per_token {
                return Err(fail(format!(
                    "{name} has {len} bytes, {} expected",
                    total * bytes_per_token
                )));
            }
            Ok(file)
        };
        let tokens = open(TOKENS, 4)?;
        let features = open(FEATURES, 2 * meta.hidden as u64)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            meta,
            offsets,
            tokens,
            features,
        })
    }

    /// The cache folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The key it was built for.
    pub fn key(&self) -> &FeatureCacheKey {
        &self.meta.key
    }

    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Whether it holds no sequence.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values per feature row (the target's hidden size).
    pub fn hidden(&self) -> usize {
        self.meta.hidden
    }

    /// The target block whose outputs the features are.
    pub fn feature_block(&self) -> usize {
        self.meta.feature_block
    }

    /// Tokens of sequence `i`. Panics if `i >= len()`.
    pub fn seq_len(&self, i: usize) -> usize {
        (self.offsets[i + 1] - self.offsets[i]) as usize
    }

    /// Tokens over all sequences.
    pub fn total_tokens(&self) -> u64 {
        self.offsets[self.len()]
    }

    /// Bytes of the token and feature files together.
    pub fn size_bytes(&self) -> u64 {
        self.total_tokens() * (4 + 2 * self.meta.hidden as u64)
    }

    /// The token ids of sequence `i`.
    ///
    /// # Errors
    /// [`TrainError::Io`] when reading fails. Panics if `i >= len()`.
    pub fn tokens(&self, i: usize) -> Result<Vec<u32>> {
        let bytes = self.read(&self.tokens, TOKENS, i, 4)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// The feature rows of sequence `i`, `[seq_len(i) × hidden]` row-major, as f32.
    ///
    /// # Errors
    /// [`TrainError::Io`] when reading fails. Panics if `i >= len()`.
    pub fn features(&self, i: usize) -> Result<Vec<f32>> {
        let bytes = self.read(&self.features, FEATURES, i, 2 * self.meta.hidden)?;
        Ok(bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect())
    }

    fn read(&self, file: &File, name: &str, i: usize, bytes_per_token: usize) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.seq_len(i) * bytes_per_token];
        file.read_exact_at(&mut out, self.offsets[i] * bytes_per_token as u64)
            .map_err(io_error(&self.dir.join(name)))?;
        Ok(out)
    }
}

/// Appends complete sequences to a cache folder's files.
struct Appender {
    dir: PathBuf,
    hidden: usize,
    tokens: File,
    features: File,
    lengths_file: File,
    lengths: Vec<u32>,
}

impl Appender {
    /// Opens the three data files for appending, trimming them to the complete sequences.
    fn open(dir: &Path, hidden: usize) -> Result<Self> {
        let lengths_path = dir.join(LENGTHS);
        let lengths = read_lengths(&lengths_path)?;
        let total: u64 = lengths.iter().map(|&l| u64::from(l)).sum();
        let open = |name: &str, keep: u64| -> Result<File> {
            let path = dir.join(name);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io_error(&path))?;
            let len = file.metadata().map_err(io_error(&path))?.len();
            if len < keep {
                return Err(TrainError::FeatureCache {
                    path: dir.display().to_string(),
                    reason: format!("{name} has {len} bytes, fewer than the {keep} listed"),
                });
            }
            file.set_len(keep).map_err(io_error(&path))?;
            Ok(file)
        };
        let tokens = open(TOKENS, total * 4)?;
        let features = open(FEATURES, total * 2 * hidden as u64)?;
        let lengths_file = open(LENGTHS, lengths.len() as u64 * 4)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            hidden,
            tokens,
            features,
            lengths_file,
            lengths,
        })
    }

    fn stored_tokens(&self) -> Result<Vec<u32>> {
        let total: u64 = self.lengths.iter().map(|&l| u64::from(l)).sum();
        let mut bytes = vec![0u8; total as usize * 4];
        self.tokens
            .read_exact_at(&mut bytes, 0)
            .map_err(io_error(&self.dir.join(TOKENS)))?;
        Ok(bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// Appends one sequence: tokens, then features, then (once both are written) its length.
    fn append(&mut self, tokens: &[u32], features: &[f32]) -> Result<()> {
        debug_assert_eq!(features.len(), tokens.len() * self.hidden);
        let token_bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        let feature_bytes: Vec<u8> = features
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect();
        let write = |file: &mut File, name: &str, bytes: &[u8]| -> Result<()> {
            file.write_all(bytes)
                .and_then(|()| file.flush())
                .map_err(io_error(&self.dir.join(name)))
        };
        // Appends at the end of the (trimmed) files: the cursor of a fresh handle is at 0.
        seek_end(&mut self.tokens, &self.dir.join(TOKENS))?;
        seek_end(&mut self.features, &self.dir.join(FEATURES))?;
        seek_end(&mut self.lengths_file, &self.dir.join(LENGTHS))?;
        write(&mut self.tokens, TOKENS, &token_bytes)?;
        write(&mut self.features, FEATURES, &feature_bytes)?;
        let len = u32::try_from(tokens.len()).expect("checked against the context length");
        write(&mut self.lengths_file, LENGTHS, &len.to_le_bytes())?;
        self.lengths.push(len);
        Ok(())
    }
}

fn seek_end(file: &mut File, path: &Path) -> Result<()> {
    use std::io::{Seek, SeekFrom};
    file.seek(SeekFrom::End(0))
        .map(drop)
        .map_err(io_error(path))
}

fn read_lengths(path: &Path) -> Result<Vec<u32>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io_error(path)(e)),
    };
    // A length cut off mid-write is not a complete sequence.
    Ok(bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

fn read_meta(path: &Path) -> Result<Option<CacheMeta>> {
    match std::fs::read(path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| TrainError::FeatureCache {
                    path: path.display().to_string(),
                    reason: format!("unreadable meta.json: {e}"),
                })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error(path)(e)),
    }
}

fn write_meta(path: &Path, meta: &CacheMeta) -> Result<()> {
    let json = serde_json::to_vec_pretty(meta).expect("the cache metadata serialises");
    crate::checkpoint::write_atomically(path, &json)
}
