//! The prompt set of an experiment.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{HarnessError, Result};

/// The `[prompts]` table, tagged by `source`.
///
/// - `source = "humaneval"`: the HumanEval problems (fetched like the models, read from the
///   cache's `HumanEval.jsonl`), optionally the first `count`;
/// - `source = "mtbench"`: the first turns of MT-Bench's 80 questions (8 categories × 10,
///   fetched like the models), optionally only `categories` and the first `per_category` of
///   each, wrapped in the model's chat template unless `chat = false`;
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
    /// MT-Bench first turns.
    Mtbench {
        /// Only these categories (writing, roleplay, reasoning, math, coding, extraction, stem,
        /// humanities) [default: all].
        #[serde(default)]
        categories: Option<Vec<String>>,
        /// The first `per_category` questions of each category [default: all 10].
        #[serde(default)]
        per_category: Option<usize>,
        /// Wrap each prompt in the model's chat template [default: true].
        #[serde(default)]
        chat: Option<bool>,
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
    /// Stable id (`humaneval/0`, `mtbench/coding/81`, `file:3`, `inline:0`, `synthetic:7`).
    pub id: String,
    /// The text (empty for synthetic prompts).
    pub text: String,
    /// Nominal length in tokens when known before tokenising (synthetic prompts), else `None`.
    pub nominal_tokens: Option<usize>,
    /// Whether the text is a user message to wrap in the model's chat template (else raw).
    #[serde(default)]
    pub chat: bool,
}

/// The MT-Bench categories, in the order of its question file.
pub const MTBENCH_CATEGORIES: [&str; 8] = [
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
];

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
                    chat: false,
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
                    chat: false,
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
            PromptSet::Mtbench {
                categories,
                per_category,
                chat,
            } => {
                let path = specdec_models::registry::resolve("mtbench")?;
                let text =
                    std::fs::read_to_string(&path).map_err(|e| HarnessError::io(&path, e))?;
                mtbench_prompts(
                    &path,
                    &text,
                    categories.as_deref(),
                    *per_category,
                    chat.unwrap_or(true),
                )
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

/// The first turns of an MT-Bench (or Spec-Bench) `question.jsonl`: lines with `question_id`,
/// `category` and `turns`, in file order, keeping `categories` (all when `None`) and the first
/// `per_category` of each.
///
/// # Errors
/// [`HarnessError::ResultParse`] naming the line of a malformed question;
/// [`HarnessError::ConfigInvalid`] for a category the file does not have.
pub fn mtbench_prompts(
    path: &Path,
    text: &str,
    categories: Option<&[String]>,
    per_category: Option<usize>,
    chat: bool,
) -> Result<Vec<Prompt>> {
    #[derive(Deserialize)]
    struct Question {
        question_id: serde_json::Value,
        category: String,
        turns: Vec<String>,
    }
    let mut taken: std::collections::HashMap<String, usize> = Default::default();
    let mut prompts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let q: Question = serde_json::from_str(line).map_err(|e| HarnessError::ResultParse {
            path: path.to_path_buf(),
            line: i + 1,
            message: format!("an MT-Bench question (question_id, category, turns): {e}"),
        })?;
        if categories.is_some_and(|c| !c.contains(&q.category)) {
            continue;
        }
        let n = taken.entry(q.category.clone()).or_default();
        if per_category.is_some_and(|max| *n >= max) {
            continue;
        }
        *n += 1;
        let first = q
            .turns
            .into_iter()
            .next()
            .ok_or_else(|| HarnessError::ResultParse {
                path: path.to_path_buf(),
                line: i + 1,
                message: "a question without turns".into(),
            })?;
        let id = match &q.question_id {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        prompts.push(Prompt {
            id: format!("mtbench/{}/{id}", q.category),
            text: first,
            nominal_tokens: None,
            chat,
        });
    }
    if let Some(wanted) = categories {
        if let Some(missing) = wanted.iter().find(|c| !taken.contains_key(*c)) {
            return Err(HarnessError::ConfigInvalid {
                origin: path.display().to_string(),
                field: "prompts.categories".into(),
                problem: format!(
                    "`{missing}` is not a category of the file ({})",
                    MTBENCH_CATEGORIES.join(", ")
                ),
            });
        }
    }
    Ok(prompts)
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
            chat: false,
        })
        .collect())
}

#[cfg(test)]
mod mtbench_tests {
    use super::*;

    const SAMPLE: &str = r#"{"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]}
{"question_id": 82, "category": "writing", "turns": ["Write a haiku.", "Again."]}
{"question_id": 101, "category": "reasoning", "turns": ["Who is taller?", "Why?"]}
{"question_id": "121", "category": "coding", "turns": ["Sort a list.", "Faster."]}
"#;

    #[test]
    fn first_turns_by_category() {
        let path = Path::new("question.jsonl");
        let all = mtbench_prompts(path, SAMPLE, None, None, true).unwrap();
        let ids: Vec<&str> = all.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "mtbench/writing/81",
                "mtbench/writing/82",
                "mtbench/reasoning/101",
                "mtbench/coding/121"
            ]
        );
        assert_eq!(all[2].text, "Who is taller?");
        assert!(all.iter().all(|p| p.chat));
        let one_each = mtbench_prompts(path, SAMPLE, None, Some(1), false).unwrap();
        assert_eq!(one_each.len(), 3);
        assert!(!one_each[0].chat);
        let coding = ["coding".to_string()];
        let only = mtbench_prompts(path, SAMPLE, Some(&coding), None, true).unwrap();
        assert_eq!(only.len(), 1);
        let bogus = ["poetry".to_string()];
        let err = mtbench_prompts(path, SAMPLE, Some(&bogus), None, true).unwrap_err();
        assert!(err.to_string().contains("poetry"), "{err}");
        let err = mtbench_prompts(path, "{\"category\": \"x\"}\n", None, None, true).unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
    }
}
