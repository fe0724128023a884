//! Tokenizers built from GGUF metadata (no `tokenizer.json`, no network): byte-level BPE from
//! `tokenizer.ggml.tokens` / `merges` / `token_type`, the pre-tokenizer `tokenizer.ggml.pre`
//! names, special and added tokens, and the chat template; or read from a Hugging Face
//! `tokenizer.json` ([`Tokenizer::from_hf_json`]), which [`Tokenizer::to_hf_json`] writes.
//!
//! Token types (`tokenizer.ggml.token_type`): 1 normal, 2 unknown, 3 control (special: matched
//! whole in the input text, skipped by [`Tokenizer::decode_skip_special`]), 4 user-defined
//! (matched whole in the input, kept when decoding), 5 unused (padding ids, never produced by
//! encoding), 6 byte.

mod chat;
mod pretokenizer;

use std::collections::HashSet;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::AddedToken;

pub use chat::{ChatMessage, ChatTemplate};
pub use pretokenizer::{QWEN2_PATTERN, SUPPORTED_PRE};

use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, Metadata};

/// GGUF token type of a control (special) token.
pub const TOKEN_TYPE_CONTROL: i64 = 3;
/// GGUF token type of a user-defined (added, non-special) token.
pub const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// What a Hugging Face model folder says of its tokenizer outside `tokenizer.json`: special ids
/// (`config.json`), whether prompts start with BOS and the chat template
/// (`tokenizer_config.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HfTokenizerSettings {
    /// The BOS id.
    pub bos_id: Option<u32>,
    /// The (first) EOS id.
    pub eos_id: Option<u32>,
    /// `add_bos_token`.
    pub add_bos: bool,
    /// `chat_template` (Jinja source).
    pub chat_template: Option<String>,
}

/// A byte-level BPE tokenizer with its special ids and chat template.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    tokens: Vec<String>,
    special: HashSet<u32>,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    add_bos: bool,
    chat_template: Option<ChatTemplate>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.tokens.len())
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .field("add_bos", &self.add_bos)
            .field("chat_template", &self.chat_template.is_some())
            .finish()
    }
}

fn tok_err(what: &str) -> impl Fn(tokenizers::Error) -> ModelError + '_ {
    move |e| ModelError::Tokenizer(format!("{what}: {e}"))
}

impl Tokenizer {
    /// The tokenizer embedded in a GGUF file. See [`Tokenizer::from_metadata`].
    ///
    /// # Errors
    /// As [`Tokenizer::from_metadata`].
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        Self::from_metadata(file.metadata())
    }

    /// Builds the tokenizer from GGUF metadata: `tokenizer.ggml.model` must be `gpt2`
    /// (byte-level BPE); `tokens` and `merges` are required; `token_type`, `pre`,
    /// `bos_token_id`, `eos_token_id`, `add_bos_token` and `tokenizer.chat_template` are
    /// optional.
    ///
    /// # Errors
    /// [`ModelError::MissingMetadata`] / [`ModelError::MetadataType`] for absent or mistyped
    /// keys; [`ModelError::Tokenizer`] for another tokenizer model, an unsupported `pre`, a
    /// malformed merge, a duplicate token, lengths that disagree or ids out of range;
    /// [`ModelError::ChatTemplate`] when the template does not parse.
    pub fn from_metadata(md: &Metadata) -> Result<Self> {
        let model = md.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(ModelError::Tokenizer(format!(
                "tokenizer.ggml.model `{model}` is not supported (only `gpt2`, byte-level BPE)"
            )));
        }
        let tokens = md.get_str_array("tokenizer.ggml.tokens")?;
        let n = tokens.len();
        let types = match md.get_opt::<Vec<i64>>("tokenizer.ggml.token_type")? {
            Some(t) if t.len() != n => {
                return Err(ModelError::Tokenizer(format!(
                    "tokenizer.ggml.token_type has {} entries but there are {n} tokens",
                    t.len()
                )))
            }
            Some(t) => t,
            None => vec![1; n],
        };
        let mut vocab = Vocab::default();
        for (id, token) in tokens.iter().enumerate() {
            if vocab.insert(token.clone(), id as u32).is_some() {
                return Err(ModelError::Tokenizer(format!(
                    "token {token:?} occurs twice (second at id {id})"
                )));
            }
        }
        let merges = md
            .get_str_array("tokenizer.ggml.merges")?
            .iter()
            .enumerate()
            .map(|(i, m)| match m.split_once(' ') {
                Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_owned(), b.to_owned())),
                _ => Err(ModelError::Tokenizer(format!(
                    "merge {i} {m:?} is not two tokens separated by a space"
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(tok_err("building the BPE model"))?;

        let pre = md
            .get_opt::<&str>("tokenizer.ggml.pre")?
            .unwrap_or("default");
        let (normalizer, pre_tokenizer) = pretokenizer::for_pre(pre)?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner
            .with_normalizer(normalizer)
            .map_err(tok_err("setting the normalizer"))?;
        inner.with_pre_tokenizer(Some(pre_tokenizer));
        inner.with_decoder(Some(ByteLevelDecoder::default()));

        let mut special = HashSet::new();
        let mut added = Vec::new();
        for (id, ty) in types.iter().enumerate() {
            if *ty == TOKEN_TYPE_CONTROL || *ty == TOKEN_TYPE_USER_DEFINED {
                let is_special = *ty == TOKEN_TYPE_CONTROL;
                if is_special {
                    special.insert(id as u32);
                }
                added.push(AddedToken::from(tokens[id].clone(), is_special).normalized(false));
            }
        }
        inner
            .add_tokens(added)
            .map_err(tok_err("adding special tokens"))?;

        let id_key = |key: &str| -> Result<Option<u32>> {
            match md.get_opt::<u32>(key)? {
                Some(id) if id as usize >= n => Err(ModelError::Tokenizer(format!(
                    "{key} is {id} but there are only {n} tokens"
                ))),
                other => Ok(other),
            }
        };
        let bos_id = id_key("tokenizer.ggml.bos_token_id")?;
        let eos_id = id_key("tokenizer.ggml.eos_token_id")?;
        let add_bos = md
            .get_opt::<bool>("tokenizer.ggml.add_bos_token")?
            .unwrap_or(false);
        if add_bos && bos_id.is_none() {
            return Err(ModelError::Tokenizer(
                "tokenizer.ggml.add_bos_token is true but there is no bos_token_id".into(),
            ));
        }
        let token_str = |id: Option<u32>| id.map_or("", |i| tokens[i as usize].as_str());
        let chat_template = md
            .get_opt::<&str>("tokenizer.chat_template")?
            .map(|source| ChatTemplate::new(source, token_str(bos_id), token_str(eos_id)))
            .transpose()?;
        Ok(Self {
            inner,
            tokens: tokens.to_vec(),
            special,
            bos_id,
            eos_id,
            add_bos,
            chat_template,
        })
    }

    /// A tokenizer from a Hugging Face `tokenizer.json` (`json`, read by the `tokenizers` crate
    /// itself) with what the folder's `config.json` / `tokenizer_config.json` say of it
    /// (`settings`). Ids `0..n` must each have a token (vocabulary and added tokens together);
    /// added tokens marked `special` are the special ones.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] when the JSON does not parse as a tokenizer, an id below the
    /// largest has no token, or a BOS/EOS id is outside the vocabulary;
    /// [`ModelError::ChatTemplate`] when the template does not parse.
    pub fn from_hf_json(json: &[u8], settings: &HfTokenizerSettings) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_bytes(json).map_err(tok_err("tokenizer.json"))?;
        let vocab = inner.get_vocab(true);
        let n = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
        let mut slots: Vec<Option<String>> = vec![None; n];
        for (token, id) in vocab {
            slots[id as usize] = Some(token);
        }
        let tokens = slots
            .into_iter()
            .enumerate()
            .map(|(id, t)| {
                t.ok_or_else(|| {
                    ModelError::Tokenizer(format!(
                        "tokenizer.json has no token for id {id} (of 0..{n}): ids must be \
                         contiguous"
                    ))
                })
            })
            .collect::<Result<Vec<String>>>()?;
        let special = inner
            .get_added_tokens_decoder()
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(&id, _)| id)
            .collect();
        for (what, id) in [("BOS", settings.bos_id), ("EOS", settings.eos_id)] {
            if let Some(id) = id.filter(|&id| id as usize >= n) {
                return Err(ModelError::Tokenizer(format!(
                    "{what} id {id} is outside the {n} tokens of tokenizer.json"
                )));
            }
        }
        if settings.add_bos && settings.bos_id.is_none() {
            return Err(ModelError::Tokenizer(
                "add_bos_token is true but there is no BOS token".into(),
            ));
        }
        let token_str = |id: Option<u32>| id.map_or("", |i| tokens[i as usize].as_str());
        let chat_template = settings
            .chat_template
            .as_deref()
            .map(|source| {
                ChatTemplate::new(
                    source,
                    token_str(settings.bos_id),
                    token_str(settings.eos_id),
                )
            })
            .transpose()?;
        Ok(Self {
            inner,
            tokens,
            special,
            bos_id: settings.bos_id,
            eos_id: settings.eos_id,
            add_bos: settings.add_bos,
            chat_template,
        })
    }

    /// This tokenizer as a Hugging Face `tokenizer.json` (normalizer, pre-tokenizer, BPE
    /// vocabulary and merges, added tokens, decoder), which [`Tokenizer::from_hf_json`] and
    /// the `tokenizers` library read back to the same encoding.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] when serialisation fails.
    pub fn to_hf_json(&self) -> Result<String> {
        self.inner
            .to_string(true)
            .map_err(tok_err("writing tokenizer.json"))
    }

    /// Whether [`Tokenizer::encode_prompt`] puts BOS first.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// Encodes `text` without adding BOS. Special and user-defined token strings in the text
    /// (e.g. `<|im_start|>`) become their single ids.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] when the tokenizer fails.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode_fast(text, false)
            .map_err(tok_err("encoding"))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Encodes a prompt: [`Tokenizer::encode`], preceded by BOS when the file's
    /// `tokenizer.ggml.add_bos_token` is true (false for SmolLM2 and Qwen2.5).
    ///
    /// # Errors
    /// As [`Tokenizer::encode`].
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if let (true, Some(bos)) = (self.add_bos, self.bos_id) {
            ids.push(bos);
        }
        ids.extend(self.encode(text)?);
        Ok(ids)
    }

    /// Decodes `ids` to text, special tokens included as their strings. Byte sequences that
    /// are not valid UTF-8 (a token boundary inside a character) decode to U+FFFD.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] naming an id outside the vocabulary.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.decode_impl(ids, false)
    }

    /// Decodes `ids` to text, leaving out special (control) tokens.
    ///
    /// # Errors
    /// As [`Tokenizer::decode`].
    pub fn decode_skip_special(&self, ids: &[u32]) -> Result<String> {
        self.decode_impl(ids, true)
    }

    fn decode_impl(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.tokens.len()) {
            return Err(ModelError::Tokenizer(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.tokens.len()
            )));
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(tok_err("decoding"))
    }

    /// The number of token ids (the model's vocabulary size, padding ids included).
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The stored string of token `id` (byte-level alphabet, e.g. `Ġworld`), if in range.
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of the token whose stored string is `token` (e.g. `<|im_end|>`), if any.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Whether `id` is a control (special) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.contains(&id)
    }

    /// `tokenizer.ggml.bos_token_id`, if set.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// `tokenizer.ggml.eos_token_id`, if set: generation stops there (`<|im_end|>` for the
    /// SmolLM2 and Qwen2.5 instruct models).
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// The chat template, when the file has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Renders `messages` with the file's chat template (see [`ChatTemplate::render`]).
    ///
    /// # Errors
    /// [`ModelError::ChatTemplate`] when the file has no template or rendering fails.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.chat_template
            .as_ref()
            .ok_or_else(|| {
                ModelError::ChatTemplate("the file has no tokenizer.chat_template".into())
            })?
            .render(messages, add_generation_prompt)
    }
}
