//! The prompt set of an experiment.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{HarnessError, Result};

/// The `[prompts]` table, tagged by `source`.
///
/// - `source = "humaneval"`: the HumanEval problems (fetched like the models, read from the
///   cache's `HumanEval.jsonl`), optionally the first `count`; raw completion prompts unless
///   `chat = true`;
/// - `source = "mtbench"`: MT-Bench's 80 questions (8 categories × 10, fetched like the
///   models), optionally only `categories` and the first `per_category` of each; `turns = 2`
///   adds each question's second turn (see [`Prompt::answer_of`]); wrapped in the model's chat
///   template unless `chat = false`;
/// - `source = "file"`: a file of prompts: `.jsonl` (each line a JSON string, an object with a
///   `prompt` field, or a question with `turns` and `category` as in MT-Bench's and
///   Spec-Bench's `question.jsonl`, read like `mtbench` with `categories`, `per_category` and
///   `turns`) or plain text with prompts separated by lines holding only `---`; a relative
///   `path` is resolved against the config file's folder; questions are chat prompts and the
///   rest raw unless `chat` says otherwise;
/// - `source = "inline"`: the prompts written out in `texts`, raw unless `chat = true`;
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
        /// Wrap each prompt in the model's chat template [default: false, completion prompts].
        #[serde(default)]
        chat: Option<bool>,
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
        /// 1: first turns only; 2: each question's second turn too [default: 1].
        #[serde(default)]
        turns: Option<usize>,
        /// Wrap each prompt in the model's chat template [default: true].
        #[serde(default)]
        chat: Option<bool>,
    },
    /// Prompts read from a file.
    File {
        /// The file (relative paths resolve against the config's folder).
        path: PathBuf,
        /// Use only the first `count` prompts (questions: after `categories` and
        /// `per_category`, before adding second turns).
        #[serde(default)]
        count: Option<usize>,
        /// Questions only: keep these categories [default: all].
        #[serde(default)]
        categories: Option<Vec<String>>,
        /// Questions only: the first `per_category` of each category [default: all].
        #[serde(default)]
        per_category: Option<usize>,
        /// Questions only: 1 or 2 turns [default: 1].
        #[serde(default)]
        turns: Option<usize>,
        /// Wrap each prompt in the model's chat template [default: true for questions with
        /// `turns`, false for other prompts].
        #[serde(default)]
        chat: Option<bool>,
    },
    /// Prompts written in the config.
    Inline {
        /// The prompt texts.
        texts: Vec<String>,
        /// Wrap each prompt in the model's chat template [default: false].
        #[serde(default)]
        chat: Option<bool>,
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
    /// The question's category (MT-Bench, Spec-Bench), for per-category tables.
    #[serde(default)]
    pub category: Option<String>,
    /// 1-based turn of a multi-turn question (1 for every other prompt).
    #[serde(default = "first_turn")]
    pub turn: usize,
    /// For a later turn: the index (in the experiment's prompt list) of the previous turn's
    /// prompt. The runner runs that prompt first and puts the **baseline's** answer to it into
    /// `history` before this prompt runs, so that every method continues the same conversation
    /// (at T > 0 too: a method's own turn-1 answer would give each method other contexts).
    #[serde(default)]
    pub answer_of: Option<usize>,
    /// Earlier (user, assistant) exchanges before `text`, oldest first.
    #[serde(default)]
    pub history: Vec<(String, String)>,
}

fn first_turn() -> usize {
    1
}

impl Prompt {
    /// A single-turn prompt without a category.
    pub fn single(id: String, text: String, chat: bool) -> Prompt {
        Prompt {
            id,
            text,
            nominal_tokens: None,
            chat,
            category: None,
            turn: 1,
            answer_of: None,
            history: Vec::new(),
        }
    }

    /// The conversation as chat messages: the history's exchanges, then `text` as the user.
    pub fn messages(&self) -> Vec<specdec_models::tokenizer::ChatMessage> {
        use specdec_models::tokenizer::ChatMessage;
        let mut out = Vec::with_capacity(2 * self.history.len() + 1);
        for (user, assistant) in &self.history {
            out.push(ChatMessage::user(user));
            out.push(ChatMessage::new("assistant", assistant));
        }
        out.push(ChatMessage::user(&self.text));
        out
    }

    /// The conversation as raw text (for `chat = false`): every turn, blank-line separated.
    pub fn raw_text(&self) -> String {
        let mut out = String::new();
        for (user, assistant) in &self.history {
            out.push_str(user);
            out.push_str("\n\n");
            out.push_str(assistant);
            out.push_str("\n\n");
        }
        out.push_str(&self.text);
        out
    }
}

impl PromptSet {
    /// Loads the prompts. `base_dir` is the config file's folder (for relative file paths).
    /// HumanEval is read from the fetch cache (`scripts/fetch-models.sh humaneval`); a missing
    /// file gives the models crate's error naming the fetch command.
    pub fn load(&self, base_dir: &Path) -> Result<Vec<Prompt>> {
        match self {
            PromptSet::Inline { texts, chat } => Ok(texts
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    Prompt::single(format!("inline:{i}"), t.clone(), chat.unwrap_or(false))
                })
                .collect()),
            PromptSet::Synthetic {
                count,
                prompt_tokens,
            } => Ok((0..*count)
                .map(|i| Prompt {
                    nominal_tokens: Some(*prompt_tokens),
                    ..Prompt::single(format!("synthetic:{i}"), String::new(), false)
                })
                .collect()),
            PromptSet::File {
                path,
                count,
                categories,
                per_category,
                turns,
                chat,
            } => {
                let full = if path.is_absolute() {
                    path.clone()
                } else {
                    base_dir.join(path)
                };
                let text =
                    std::fs::read_to_string(&full).map_err(|e| HarnessError::io(&full, e))?;
                if is_question_file(&full, &text) {
                    let selection = QuestionSelection {
                        categories: categories.as_deref(),
                        per_category: *per_category,
                        count: *count,
                        turns: turns.unwrap_or(1),
                        chat: chat.unwrap_or(true),
                    };
                    return question_prompts(&full, &text, "file", &selection);
                }
                if let Some(field) = [
                    ("categories", categories.is_some()),
                    ("per_category", per_category.is_some()),
                    ("turns", turns.is_some()),
                ]
                .iter()
                .find_map(|(f, set)| set.then_some(*f))
                {
                    return Err(HarnessError::ConfigInvalid {
                        origin: full.display().to_string(),
                        field: format!("prompts.{field}"),
                        problem: "only applies to a question file (JSONL lines with `turns` and \
                                  `category`, as MT-Bench's and Spec-Bench's question.jsonl)"
                            .into(),
                    });
                }
                let mut prompts = parse_prompt_file(&full, &text, chat.unwrap_or(false))?;
                if let Some(n) = count {
                    prompts.truncate(*n);
                }
                Ok(prompts)
            }
            PromptSet::Mtbench {
                categories,
                per_category,
                turns,
                chat,
            } => {
                let path = specdec_models::registry::resolve("mtbench")?;
                let text =
                    std::fs::read_to_string(&path).map_err(|e| HarnessError::io(&path, e))?;
                let selection = QuestionSelection {
                    categories: categories.as_deref(),
                    per_category: *per_category,
                    count: None,
                    turns: turns.unwrap_or(1),
                    chat: chat.unwrap_or(true),
                };
                question_prompts(&path, &text, "mtbench", &selection)
            }
            PromptSet::Humaneval { count, chat } => {
                let path = specdec_models::registry::resolve("humaneval")?;
                let text =
                    std::fs::read_to_string(&path).map_err(|e| HarnessError::io(&path, e))?;
                let mut prompts = parse_prompt_file(&path, &text, chat.unwrap_or(false))?;
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

/// Which questions of a question file to run, and how.
#[derive(Debug, Clone, Copy)]
pub struct QuestionSelection<'a> {
    /// Keep only these categories (all when `None`).
    pub categories: Option<&'a [String]>,
    /// The first `per_category` questions of each category.
    pub per_category: Option<usize>,
    /// The first `count` questions after the two filters above.
    pub count: Option<usize>,
    /// 1: first turns; 2: second turns too.
    pub turns: usize,
    /// Wrap the prompts in the model's chat template.
    pub chat: bool,
}

/// Whether a file is a question file: a `.jsonl` whose first non-empty line is an object with
/// `turns`.
fn is_question_file(path: &Path, text: &str) -> bool {
    path.extension().is_some_and(|e| e == "jsonl")
        && text
            .lines()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .is_some_and(|v| v.get("turns").is_some())
}

/// The prompts of an MT-Bench or Spec-Bench `question.jsonl`: lines with `question_id`,
/// `category` and `turns` (other fields ignored), in file order, filtered by `selection`. The
/// first turns come first, ids `PREFIX/CATEGORY/ID`; with `turns = 2` the second turns follow,
/// ids `PREFIX/CATEGORY/ID/turn2`, each with [`Prompt::answer_of`] naming its first turn
/// (questions with one turn have no second).
///
/// # Errors
/// [`HarnessError::ResultParse`] naming the line of a malformed question;
/// [`HarnessError::ConfigInvalid`] for a category the file does not have, or `turns` not 1 or 2.
pub fn question_prompts(
    path: &Path,
    text: &str,
    prefix: &str,
    selection: &QuestionSelection<'_>,
) -> Result<Vec<Prompt>> {
    #[derive(Deserialize)]
    struct Question {
        question_id: serde_json::Value,
        category: String,
        turns: Vec<String>,
    }
    if !(1..=2).contains(&selection.turns) {
        return Err(HarnessError::ConfigInvalid {
            origin: path.display().to_string(),
            field: "prompts.turns".into(),
            problem: format!("{} is not 1 or 2", selection.turns),
        });
    }
    let mut taken: std::collections::HashMap<String, usize> = Default::default();
    let mut firsts = Vec::new();
    let mut seconds = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let q: Question = serde_json::from_str(line).map_err(|e| HarnessError::ResultParse {
            path: path.to_path_buf(),
            line: i + 1,
            message: format!("a question (question_id, category, turns): {e}"),
        })?;
        seen.insert(q.category.clone());
        if selection
            .categories
            .is_some_and(|c| !c.contains(&q.category))
        {
            continue;
        }
        if selection.count.is_some_and(|max| firsts.len() >= max) {
            continue;
        }
        let n = taken.entry(q.category.clone()).or_default();
        if selection.per_category.is_some_and(|max| *n >= max) {
            continue;
        }
        *n += 1;
        let mut turns = q.turns.into_iter();
        let first = turns.next().ok_or_else(|| HarnessError::ResultParse {
            path: path.to_path_buf(),
            line: i + 1,
            message: "a question without turns".into(),
        })?;
        let id = match &q.question_id {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let base = format!("{prefix}/{}/{id}", q.category);
        let first_index = firsts.len();
        firsts.push(Prompt {
            category: Some(q.category.clone()),
            ..Prompt::single(base.clone(), first, selection.chat)
        });
        if selection.turns >= 2 {
            if let Some(second) = turns.next() {
                seconds.push((
                    first_index,
                    Prompt {
                        category: Some(q.category.clone()),
                        turn: 2,
                        ..Prompt::single(format!("{base}/turn2"), second, selection.chat)
                    },
                ));
            }
        }
    }
    if let Some(wanted) = selection.categories {
        if let Some(missing) = wanted.iter().find(|c| !taken.contains_key(*c)) {
            return Err(HarnessError::ConfigInvalid {
                origin: path.display().to_string(),
                field: "prompts.categories".into(),
                problem: format!(
                    "`{missing}` is not a category of the file ({})",
                    seen.into_iter().collect::<Vec<_>>().join(", ")
                ),
            });
        }
    }
    let mut prompts = firsts;
    for (first_index, mut second) in seconds {
        second.answer_of = Some(first_index);
        prompts.push(second);
    }
    Ok(prompts)
}

fn parse_prompt_file(path: &Path, text: &str, chat: bool) -> Result<Vec<Prompt>> {
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
                        message: "expected a JSON string, an object with `prompt`, or a question \
                                  with `turns` and `category` (only when the first line is one)"
                            .to_string(),
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
        .map(|(i, text)| Prompt::single(format!("file:{i}"), text, chat))
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

    fn select(
        categories: Option<&[String]>,
        per_category: Option<usize>,
        turns: usize,
        chat: bool,
    ) -> QuestionSelection<'_> {
        QuestionSelection {
            categories,
            per_category,
            count: None,
            turns,
            chat,
        }
    }

    #[test]
    fn first_turns_by_category() {
        let path = Path::new("question.jsonl");
        let all = question_prompts(path, SAMPLE, "mtbench", &select(None, None, 1, true)).unwrap();
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
        assert_eq!(all[2].category.as_deref(), Some("reasoning"));
        assert!(all
            .iter()
            .all(|p| p.chat && p.turn == 1 && p.answer_of.is_none()));
        let one_each =
            question_prompts(path, SAMPLE, "mtbench", &select(None, Some(1), 1, false)).unwrap();
        assert_eq!(one_each.len(), 3);
        assert!(!one_each[0].chat);
        let coding = ["coding".to_string()];
        let only = question_prompts(
            path,
            SAMPLE,
            "mtbench",
            &select(Some(&coding), None, 1, true),
        )
        .unwrap();
        assert_eq!(only.len(), 1);
        let bogus = ["poetry".to_string()];
        let err = question_prompts(
            path,
            SAMPLE,
            "mtbench",
            &select(Some(&bogus), None, 1, true),
        )
        .unwrap_err();
        assert!(err.to_string().contains("poetry"), "{err}");
        let err = question_prompts(
            path,
            "{\"category\": \"x\"}\n",
            "mtbench",
            &select(None, None, 1, true),
        )
        .unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
        let err =
            question_prompts(path, SAMPLE, "mtbench", &select(None, None, 3, true)).unwrap_err();
        assert!(err.to_string().contains("turns"), "{err}");
    }

    #[test]
    fn second_turns_follow_and_name_their_first() {
        let path = Path::new("question.jsonl");
        let both =
            question_prompts(path, SAMPLE, "mtbench", &select(None, Some(1), 2, true)).unwrap();
        let ids: Vec<&str> = both.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "mtbench/writing/81",
                "mtbench/reasoning/101",
                "mtbench/coding/121",
                "mtbench/writing/81/turn2",
                "mtbench/reasoning/101/turn2",
                "mtbench/coding/121/turn2"
            ]
        );
        assert_eq!(both[4].answer_of, Some(1));
        assert_eq!((both[4].turn, both[4].text.as_str()), (2, "Why?"));
        // once the runner has the baseline's answer, the conversation reads in order
        let mut second = both[4].clone();
        second.history = vec![(both[1].text.clone(), "Bob.".into())];
        let roles: Vec<(String, String)> = second
            .messages()
            .into_iter()
            .map(|m| (m.role, m.content))
            .collect();
        assert_eq!(
            roles,
            [
                ("user".to_string(), "Who is taller?".to_string()),
                ("assistant".into(), "Bob.".into()),
                ("user".into(), "Why?".into())
            ]
        );
        assert_eq!(second.raw_text(), "Who is taller?\n\nBob.\n\nWhy?");
    }

    /// A Spec-Bench `question.jsonl` (extra fields, its own categories) loads through
    /// `source = "file"`: chat by default, categories kept, second turns on request.
    #[test]
    fn spec_bench_question_files_load_as_files() {
        let dir = std::env::temp_dir().join(format!("specdec-qfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("question.jsonl");
        std::fs::write(
            &file,
            r#"{"question_id": 1, "category": "translation", "turns": ["Translate: Hallo Welt"], "reference": []}
{"question_id": 2, "category": "math_reasoning", "turns": ["2 + 2?"]}
{"question_id": 3, "category": "mt_bench", "turns": ["Hi.", "Again."]}
"#,
        )
        .unwrap();
        let set: PromptSet = toml::from_str(&format!(
            "source = \"file\"\npath = {:?}\nturns = 2",
            file.display().to_string()
        ))
        .unwrap();
        let prompts = set.load(&dir).unwrap();
        assert_eq!(prompts.len(), 4);
        assert!(prompts.iter().all(|p| p.chat));
        assert_eq!(prompts[0].category.as_deref(), Some("translation"));
        assert_eq!(prompts[3].answer_of, Some(2));
        // plain prompt files stay raw, and refuse question-only keys
        let plain = dir.join("plain.jsonl");
        std::fs::write(&plain, "\"def f():\"\n").unwrap();
        let set: PromptSet = toml::from_str(&format!(
            "source = \"file\"\npath = {:?}",
            plain.display().to_string()
        ))
        .unwrap();
        assert!(!set.load(&dir).unwrap()[0].chat);
        let set: PromptSet = toml::from_str(&format!(
            "source = \"file\"\npath = {:?}\nturns = 2",
            plain.display().to_string()
        ))
        .unwrap();
        let err = set.load(&dir).unwrap_err().to_string();
        assert!(err.contains("turns") && err.contains("question"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn chat_defaults_per_source() {
        let inline: PromptSet = toml::from_str("source = \"inline\"\ntexts = [\"a\"]").unwrap();
        assert!(!inline.load(Path::new(".")).unwrap()[0].chat);
        let inline: PromptSet =
            toml::from_str("source = \"inline\"\ntexts = [\"a\"]\nchat = true").unwrap();
        assert!(inline.load(Path::new(".")).unwrap()[0].chat);
    }
}
