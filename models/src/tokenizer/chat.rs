//! Chat-template rendering: the Jinja template a GGUF file ships in `tokenizer.chat_template`,
//! rendered with `minijinja` configured as Hugging Face renders them (`trim_blocks`,
//! `lstrip_blocks`, `raise_exception`, and the Python string/dict methods templates call).

use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};
use serde::Serialize;

use crate::error::{ModelError, Result};

/// One chat message, as templates see it (`message.role`, `message['content']`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.to_owned(),
            content: content.to_owned(),
        }
    }

    /// A `user` message.
    pub fn user(content: &str) -> Self {
        Self::new("user", content)
    }

    /// A `system` message.
    pub fn system(content: &str) -> Self {
        Self::new("system", content)
    }

    /// An `assistant` message.
    pub fn assistant(content: &str) -> Self {
        Self::new("assistant", content)
    }
}

/// A compiled chat template with the special-token strings it may reference.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are the strings the template sees under
    /// those names.
    ///
    /// # Errors
    /// [`ModelError::ChatTemplate`] with minijinja's message when the template does not parse.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(python_method);
        env.add_function(
            "raise_exception",
            |message: String| -> std::result::Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned(NAME, source.to_owned())
            .map_err(|e| ModelError::ChatTemplate(describe(&e)))?;
        Ok(Self {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends with the opening of an
    /// assistant turn, ready for generation.
    ///
    /// # Errors
    /// [`ModelError::ChatTemplate`] when rendering fails (an unknown filter or method, or the
    /// template's own `raise_exception`, e.g. for roles it does not accept).
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| ModelError::ChatTemplate(describe(&e)))?;
        template
            .render(minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(|e| ModelError::ChatTemplate(describe(&e)))
    }
}

fn describe(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        text.push_str(&format!(": {inner}"));
        source = inner.source();
    }
    text
}

fn unknown_method() -> Error {
    Error::from(ErrorKind::UnknownMethod)
}

fn str_arg(args: &[Value], i: usize) -> std::result::Result<Option<&str>, Error> {
    match args.get(i) {
        None => Ok(None),
        Some(v) if v.is_none() || v.is_undefined() => Ok(None),
        Some(v) => v.as_str().map(Some).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("expected a string argument, got {v}"),
            )
        }),
    }
}

/// The Python methods chat templates call on strings and dicts, which Jinja2 inherits from
/// Python and minijinja does not have.
fn python_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, Error> {
    if let Some(s) = value.as_str() {
        let chars = match method {
            "strip" | "lstrip" | "rstrip" | "split" => str_arg(args, 0)?,
            _ => None,
        };
        let strip_set = |c: char| chars.map_or(c.is_whitespace(), |set| set.contains(c));
        return Ok(match method {
            "strip" => Value::from(s.trim_matches(strip_set)),
            "lstrip" => Value::from(s.trim_start_matches(strip_set)),
            "rstrip" => Value::from(s.trim_end_matches(strip_set)),
            "upper" => Value::from(s.to_uppercase()),
            "lower" => Value::from(s.to_lowercase()),
            "startswith" | "endswith" => {
                let test = |p: &str| {
                    if method == "startswith" {
                        s.starts_with(p)
                    } else {
                        s.ends_with(p)
                    }
                };
                let arg = args.first().ok_or_else(unknown_method)?;
                if let Some(p) = arg.as_str() {
                    Value::from(test(p))
                } else {
                    let mut any = false;
                    for p in arg.try_iter()? {
                        any |= p.as_str().is_some_and(test);
                    }
                    Value::from(any)
                }
            }
            "split" => {
                let parts: Vec<Value> = match chars {
                    Some(sep) => s.split(sep).map(Value::from).collect(),
                    None => s.split_whitespace().map(Value::from).collect(),
                };
                Value::from(parts)
            }
            "replace" => {
                let (from, to) = (str_arg(args, 0)?, str_arg(args, 1)?);
                match (from, to) {
                    (Some(from), Some(to)) => Value::from(s.replace(from, to)),
                    _ => return Err(unknown_method()),
                }
            }
            _ => return Err(unknown_method()),
        });
    }
    if value.kind() == ValueKind::Map {
        return match method {
            "items" => state.apply_filter("items", std::slice::from_ref(value)),
            "keys" => Ok(Value::from(value.try_iter()?.collect::<Vec<_>>())),
            "values" => {
                let mut out = Vec::new();
                for key in value.try_iter()? {
                    out.push(value.get_item(&key)?);
                }
                Ok(Value::from(out))
            }
            "get" => {
                let key = args.first().ok_or_else(unknown_method)?;
                let found = value.get_item(key)?;
                Ok(if found.is_undefined() {
                    args.get(1).cloned().unwrap_or(Value::from(()))
                } else {
                    found
                })
            }
            _ => Err(unknown_method()),
        };
    }
    Err(unknown_method())
}
