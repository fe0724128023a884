//! `specdec rank-vocab`: a model's vocabulary ranked by frequency in ShareGPT (or any
//! ShareGPT-format file), for the limited LM head of a draft model (`draft_vocab` with
//! `draft_vocab_ranking`, the frequency-ranked drafting of FR-Spec). Counting needs only the
//! tokenizer: no forward runs.

use std::path::PathBuf;
use std::time::Instant;

use specdec_models::gguf::GgufFile;
use specdec_models::llama::read_special_tokens;
use specdec_models::tokenizer::Tokenizer;
use specdec_models::{registry, VocabRanking};

use crate::batch::permutation;
use crate::error::{io_error, ModelContext, Result, TrainError};
use crate::options::resolve_data;
use crate::sharegpt::{parse_conversations, tokenize_conversations};

/// Options of `specdec rank-vocab`.
#[derive(Debug, Clone, clap::Args)]
pub struct RankVocabOptions {
    /// The model whose tokenizer and chat template are used: a registry name (smollm2-135m,
    /// qwen2.5-coder-1.5b, …) or a GGUF path. Models sharing a tokenizer share a ranking.
    #[arg(long)]
    pub target: String,
    /// The text counted: `sharegpt` (scripts/fetch-models.sh sharegpt) or a ShareGPT-format
    /// JSON file.
    #[arg(long, default_value = "sharegpt")]
    pub data: String,
    /// Conversations counted (the first N usable ones after a seeded shuffle).
    #[arg(long, default_value_t = 8000)]
    pub conversations: usize,
    /// Seed of the shuffle.
    #[arg(long, default_value_t = 0)]
    pub data_seed: u64,
    /// Tokens counted per conversation at most (each rendered with the chat template).
    #[arg(long, default_value_t = 2048)]
    pub max_len: usize,
    /// Where to write the ranking (default `<cache>/vocab/<model>-<data>.json`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// What [`rank_vocab`] did.
#[derive(Debug, Clone)]
pub struct RankReport {
    /// The file written.
    pub path: PathBuf,
    /// The ranking.
    pub ranking: VocabRanking,
    /// Conversations counted.
    pub conversations: usize,
    /// Share of the counted tokens inside the first 16,384 and 32,768 ids of the ranking, and
    /// of the lowest ids (the ranking a limited head uses without a file).
    pub coverage: Vec<(usize, f64, f64)>,
    /// Seconds taken.
    pub seconds: f64,
}

impl RankReport {
    /// A few lines for the terminal: the file, what was counted, coverage, and the config keys.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "ranked {} ids from {} tokens of {} conversations in {:.1} s: {}\n",
            self.ranking.vocab_size,
            self.ranking.tokens_counted,
            self.conversations,
            self.seconds,
            self.path.display()
        );
        for (n, ranked, lowest) in &self.coverage {
            out.push_str(&format!(
                "  the {n} most frequent ids cover {:.2}% of the counted tokens (the lowest {n} ids: {:.2}%)\n",
                100.0 * ranked,
                100.0 * lowest
            ));
        }
        out.push_str(&format!(
            "use it in a method: draft_vocab = 32768, draft_vocab_ranking = \"{}\"",
            self.path.display()
        ));
        out
    }
}

/// Counts the tokens of `options.conversations` conversations (rendered with the model's chat
/// template, cut to `max_len`) and ranks every id of the model's vocabulary: its
/// end-of-generation ids first (a draft must be able to end), then by count (see
/// [`VocabRanking::from_counts`]); writes the ranking.
///
/// # Errors
/// [`TrainError::Option`] for no conversations or `max_len` 0; a model or data file that cannot
/// be found or read (naming the fetch command); I/O errors writing the file.
pub fn rank_vocab(options: &RankVocabOptions) -> Result<RankReport> {
    let started = Instant::now();
    for (name, value) in [
        ("conversations", options.conversations),
        ("max-len", options.max_len),
    ] {
        if value == 0 {
            return Err(TrainError::Option {
                name,
                reason: "must be at least 1".into(),
            });
        }
    }
    let id = registry::identify(&options.target)
        .model_context(|| format!("model `{}`", options.target))?;
    let file = GgufFile::open(&id.path).model_context(|| format!("model {}", id.path.display()))?;
    let tokenizer = Tokenizer::from_gguf(&file)
        .model_context(|| format!("the tokenizer of {}", id.file_name))?;
    let vocab_size = specdec_models::llama::read_config(&file)
        .model_context(|| format!("model {}", id.file_name))?
        .vocab_size;
    let data = resolve_data(&options.data)?;
    let bytes = std::fs::read(&data.path).map_err(io_error(&data.path))?;
    let parsed = parse_conversations(&bytes, &data.path.display().to_string())?;
    drop(bytes);
    let order = permutation(parsed.conversations.len(), options.data_seed);
    let (sequences, _) = tokenize_conversations(
        &parsed.conversations,
        &order,
        &tokenizer,
        options.max_len,
        1,
        options.conversations,
    )?;
    let mut counts = vec![0u64; vocab_size];
    for &token in sequences.iter().flatten() {
        if let Some(count) = counts.get_mut(token as usize) {
            *count += 1;
        }
    }
    let source = format!(
        "{} (sha256 {}), {} conversations (seed {}) cut to {} tokens, rendered with the chat \
         template of {}",
        options.data,
        data.sha256,
        sequences.len(),
        options.data_seed,
        options.max_len,
        id.file_name
    );
    let ranking = VocabRanking::from_counts(&counts, &read_special_tokens(&file).eos, source)
        .model_context(|| format!("ranking the vocabulary of {}", id.file_name))?;
    let data_stem = PathBuf::from(&options.data)
        .file_stem()
        .map_or_else(|| "data".into(), |s| s.to_string_lossy().into_owned());
    let path = options.out.clone().unwrap_or_else(|| {
        registry::cache_dir()
            .join("vocab")
            .join(format!("{}-{data_stem}.json", id.short_name))
    });
    ranking
        .write(&path)
        .model_context(|| "writing the ranking".to_string())?;
    let total = ranking.tokens_counted.max(1) as f64;
    let coverage = [16_384usize, 32_768]
        .into_iter()
        .filter(|&n| n < vocab_size)
        .map(|n| {
            let ranked: u64 = ranking.ids[..n].iter().map(|&i| counts[i as usize]).sum();
            let lowest: u64 = counts[..n].iter().sum();
            (n, ranked as f64 / total, lowest as f64 / total)
        })
        .collect();
    Ok(RankReport {
        path,
        conversations: sequences.len(),
        ranking,
        coverage,
        seconds: started.elapsed().as_secs_f64(),
    })
}
