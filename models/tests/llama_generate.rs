//! End-to-end generation with the real tokenizer and chat template.

mod common;

use common::{gguf, greedy, load};
use specdec_models::tokenizer::{ChatMessage, Tokenizer};

#[test]
fn smollm2_greedy_knows_the_capital_of_france() {
    let Some(file) = gguf("smollm2-135m") else {
        return;
    };
    let tokenizer = Tokenizer::from_gguf(&file).unwrap();
    let text = tokenizer
        .apply_chat_template(&[ChatMessage::user("What is the capital of France?")], true)
        .unwrap();
    let prompt = tokenizer.encode_prompt(&text).unwrap();
    let mut model = load(&file);
    let answer = greedy(&mut model, &prompt, 20);
    let answer = tokenizer.decode_skip_special(&answer).unwrap();
    eprintln!("prompt {text:?} -> {answer:?}");
    assert!(answer.contains("Paris"), "answer: {answer:?}");
}
