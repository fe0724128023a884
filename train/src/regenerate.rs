//! Self-distillation data: the target's own answers to the training prompts
//! ([`regenerate`]).
//!
//! A head drafts for the target's own text, not for the text of the data set: training on the
//! target's greedy continuations removes that shift (Medusa-2's self-distillation). Each
//! conversation's first user turn (with any system turn before it) is rendered with the chat
//! template's generation prompt, and the target continues it greedily to `max_len` tokens in
//! all or to its end of sequence, many prompts per forward.

use specdec_kernels::TreeTopology;
use specdec_models::llama::{LlamaModel, LlamaOptions};
use specdec_models::tokenizer::{ChatMessage, Tokenizer};
use specdec_models::{LanguageModel, SeqId, SequenceStep};

use crate::error::{ModelContext, Result};
use crate::progress::Progress;
use crate::sharegpt::{to_messages, Conversation};
use crate::target::FrozenTarget;

/// Prompts decoded together in one forward.
pub const REGENERATE_BATCH: usize = 8;

/// The generation prompt of `conversation`: its turns up to its first user turn, rendered with
/// the template's generation prompt; `None` when it has no user turn or does not render.
pub fn first_turn_prompt(conversation: &Conversation, tokenizer: &Tokenizer) -> Option<String> {
    let messages = to_messages(conversation);
    let first_user = messages.iter().position(|m| m.role == "user")?;
    let turns: Vec<ChatMessage> = messages[..=first_user].to_vec();
    tokenizer.apply_chat_template(&turns, true).ok()
}

/// The target's greedy continuations of `prompts` (token ids), each cut to `max_len` tokens in
/// all (prompt included; a prompt of `max_len` or more is cut to `max_len / 2` first), ending at
/// an end-of-sequence token (kept) or at `max_len`. Returns prompt + continuation per prompt,
/// in order.
///
/// # Errors
/// The target's errors.
pub fn regenerate(
    target: &FrozenTarget,
    prompts: &[Vec<u32>],
    max_len: usize,
    show_progress: bool,
) -> Result<Vec<Vec<u32>>> {
    let context = || "regenerating answers".to_string();
    let options = LlamaOptions {
        kv_capacity_tokens: REGENERATE_BATCH * (max_len + 16),
        ..LlamaOptions::default()
    };
    let mut model = LlamaModel::from_gguf(target.file(), options).model_context(context)?;
    let eos = model.eos_ids().to_vec();
    let mut bar = Progress::new(
        show_progress,
        prompts.len() as u64,
        "regenerating",
        "answers",
        "{msg:>14} [{bar:40}] {pos}/{len} answers ({elapsed}, eta {eta})",
    );
    let mut out = Vec::with_capacity(prompts.len());
    for group in prompts.chunks(REGENERATE_BATCH) {
        // (sequence, tokens so far, finished)
        let mut live: Vec<(SeqId, Vec<u32>, bool)> = Vec::with_capacity(group.len());
        for prompt in group {
            let mut tokens = prompt.clone();
            if tokens.len() >= max_len {
                tokens.truncate((max_len / 2).max(1));
            }
            let seq = model.new_sequence().model_context(context)?;
            if tokens.len() > 1 {
                model
                    .prefill(seq, &tokens[..tokens.len() - 1])
                    .model_context(context)?;
            }
            live.push((seq, tokens, false));
        }
        while live.iter().any(|(_, _, done)| !*done) {
            let chain = TreeTopology::chain(1);
            let active: Vec<usize> = (0..live.len()).filter(|&i| !live[i].2).collect();
            let last: Vec<[u32; 1]> = active
                .iter()
                .map(|&i| [*live[i].1.last().expect("non-empty")])
                .collect();
            let steps: Vec<SequenceStep<'_>> = active
                .iter()
                .zip(&last)
                .map(|(&i, token)| SequenceStep::chain(live[i].0, token, &chain))
                .collect();
            let logits = model.forward(&steps).model_context(context)?;
            for (&i, row) in active.iter().zip(&logits) {
                model.commit(live[i].0, &[0]).model_context(context)?;
                let next = row.argmax(0);
                let (_, tokens, done) = &mut live[i];
                tokens.push(next);
                *done = eos.contains(&next) || tokens.len() >= max_len;
            }
        }
        for (seq, tokens, _) in live {
            model.release(seq).model_context(context)?;
            out.push(tokens);
            bar.inc();
        }
    }
    bar.finish();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use specdec_models::llama::Architecture;

    use super::*;
    use crate::synthetic::{greedy_sequences, synthetic_target};

    #[test]
    fn batched_regeneration_equals_decoding_each_prompt_alone() {
        let target = synthetic_target(Architecture::Qwen2, 3).unwrap();
        // ten prompts of 4 tokens, continued to 14 tokens one at a time
        let alone = greedy_sequences(&target, 10, 4, 10, 5).unwrap();
        let prompts: Vec<Vec<u32>> = alone.iter().map(|s| s[..4].to_vec()).collect();
        let eos = 63; // the synthetic vocabulary's end of sequence
        let batched = regenerate(&target, &prompts, 14, false).unwrap();
        assert_eq!(batched.len(), 10);
        for (b, a) in batched.iter().zip(&alone) {
            // identical up to an end of sequence, where regeneration stops
            let end = a.iter().position(|&t| t == eos).map_or(a.len(), |i| i + 1);
            assert_eq!(b, &a[..end]);
        }
        // a prompt as long as the budget is halved first
        let long = regenerate(&target, &[vec![1; 14]], 14, false).unwrap();
        assert_eq!(long[0][..7], [1; 7]);
        assert!(long[0].len() <= 14);
    }
}
