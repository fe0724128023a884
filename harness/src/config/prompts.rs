//! The prompt set of an experiment.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{HarnessError, Result};

/// The `[prompts]` table, tagged by `source`.
///
/// - `source = "humaneval"`: the HumanEval problems (fetched like the models, read from the
///   cache's `HumanEval.jsonl`), optionally the first `count`;
/// - `source = "file"`: a file of prompts: `.jsonl` (each line a JSON string or an object with a
///   `prompt` field) or plain text with prompts separated by lines holding only `---`;
///   a relative `path` is resolved against the config file's folder;
/// - `source = "inline"`: the prompts written out in `texts`;
/// - `source = "synthetic"`: `count` placeholder prompts of `prompt_tokens` tokens, for
///   simulation runs where no text is read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case", deny_unknown_fields)]
pub enum PromptSet {
    /// The HumanEval problems.
    Humaneval {
        /// Use only the first `count` problems.
        #[serde(default)]
        count: Option<usize>,
    },
    /// Prompts read from a file.
    File {
        /// The file (relative paths resolve against the config's folder).
        path: PathBuf,
        /// Use only the first `count` prompts.
        #[serde(default)]
        count: Option<usize>,
    },
    /// Prompts written in the config.
    Inline {
        /// The prompt texts.
        texts: Vec<String>,
    },
    /// Placeholder prompts for simulation.
    Synthetic {
        /// How many prompts.
        count: usize,
        /// Nominal prompt length in tokens (recorded, used by cost models).
        #[serde(default = "default_prompt_tokens")]
        prompt_tokens: usize,
    },
}

fn default_prompt_tokens() -> usize {
    64
}

/// One prompt of an experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prompt {
    /// Stable id (`humaneval/0`, `file:3`, `inline:0`, `synthetic:7`).
    pub id: String,
    /// The text (empty for synthetic prompts).
    pub text: String,
    /// Nominal length in tokens when known before tokenising (synthetic prompts), else `None`.
    pub nominal_tokens: Option<usize>,
}

impl PromptSet {
    /// Loads the prompts. `base_dir` is the config file's folder (for relative file paths).
    /// HumanEval is read from the fetch cache (`scripts/fetch-models.sh humaneval`); a missing
    /// file gives the models crate's error naming the fetch command.
    pub fn load(&self, base_dir: &Path) -> Result<Vec<Prompt>> {
        match self {
            PromptSet::Inline { texts } => Ok(texts
                .iter()
                .enumerate()
                .map(|(i, t)| Prompt {
                    id: format!("inline:{i}"),
                    text: t.clone(),
                    nominal_tokens: None,
                })
                .collect()),
            PromptSet::Synthetic {
                count,
                prompt_tokens,
            } => Ok((0..*count)
                .map(|i| Prompt {
                    id: format!("synthetic:{i}"),
                    text: String::new(),
                    nominal_tokens: Some(*prompt_tokens),
                })
                .collect()),
            PromptSet::File { path, count } => {
                let full = if path.is_absolute() {
                    path.clone()
                } else {
                    base_dir.join(path)
                };
                let text =
                    std::fs::read_to_string(&full).map_err(|e| HarnessError::io(&full, e))?;
                let mut prompts = parse_prompt_file(&full, &text)?;
                if let Some(n) = count {
                    prompts.truncate(*n);
                }
                Ok(prompts)
            }
            PromptSet::Humaneval { count } => {
                let path = specdec_models::registry::resolve("humaneval")?;
                let text =
                    std::fs::read_to_string(&path).map_err(|e| HarnessError::io(&path, e))?;
                let mut prompts = parse_prompt_file(&path, &text)?;
                for (i, p) in prompts.iter_mut().enumerate() {
                    p.id = format!("humaneval/{i}");
                }
                if let Some(n) = count {
                    prompts.truncate(*n);
                }
                Ok(prompts)
            }
        }
    }
}

fn parse_prompt_file(path: &Path, text: &str) -> Result<Vec<Prompt>> {
    let is_jsonl = path.extension().is_some_and(|e| e == "jsonl");
    let mut prompts = Vec::new();
    if is_jsonl {
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let value: serde_json::Value =
                serde_json::from_str(line).map_err(|e| HarnessError::ResultParse {
                    path: path.to_path_buf(),
                    line: i + 1,
                    message: e.to_string(),
                })?;
            let prompt = match &value {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Object(o) => match o.get("prompt") {
                    Some(serde_json::Value::String(s)) => s.clone(),
                    _ => {
                        return Err(HarnessError::ResultParse {
                            path: path.to_path_buf(),
                            line: i + 1,
                            message: "expected a string field `prompt`".to_string(),
                        })
                    }
                },
                _ => {
                    return Err(HarnessError::ResultParse {
                        path: path.to_path_buf(),
                        line: i + 1,
                        message: "expected a JSON string or an object with `prompt`".to_string(),
                    })
                }
            };
            prompts.push(prompt);
        }
    } else {
        let mut current = Vec::new();
        for line in text.lines() {
            if line.trim_end() == "---" {
                prompts.push(current.join("\n"));
                current.clear();
            } else {
                current.push(line);
            }
        }
        prompts.push(current.join("\n"));
        prompts.retain(|p| !p.trim().is_empty());
    }
    Ok(prompts
        .into_iter()
        .enumerate()
        .map(|(i, text)| Prompt {
            id: format!("file:{i}"),
            text,
            nominal_tokens: None,
        })
        .collect())
}
