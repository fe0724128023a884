//! Tokenizers built from GGUF metadata: the real SmolLM2 and Qwen2.5 vocabularies (skipped with
//! a message when not fetched), chat templates, and errors on synthetic metadata.

use std::sync::OnceLock;

use specdec_models::gguf::{GgufFile, GgufWriter};
use specdec_models::registry;
use specdec_models::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use specdec_models::ModelError;

fn load(name: &str) -> Option<Tokenizer> {
    let path = registry::cached_for_test(name)?;
    Some(Tokenizer::from_gguf(&GgufFile::open(path).unwrap()).unwrap())
}

fn smollm2() -> Option<&'static Tokenizer> {
    static T: OnceLock<Option<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| load("smollm2-135m")).as_ref()
}

fn qwen() -> Option<&'static Tokenizer> {
    static T: OnceLock<Option<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| load("qwen2.5-coder-0.5b")).as_ref()
}

fn humaneval_prompts() -> Option<Vec<String>> {
    let path = registry::cached_for_test("humaneval")?;
    let text = std::fs::read_to_string(path).unwrap();
    Some(
        text.lines()
            .map(|line| {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                v["prompt"].as_str().unwrap().to_owned()
            })
            .collect(),
    )
}

#[test]
fn smollm2_known_ids() {
    let Some(t) = smollm2() else { return };
    assert_eq!(t.vocab_size(), 49_152);
    assert_eq!(t.encode("Hello world").unwrap(), [19556, 905]);
    assert_eq!(
        t.encode("def fibonacci(n):").unwrap(),
        [1604, 3987, 46477, 24, 94, 727]
    );
    // smollm splits digits individually
    let ids = t.encode("x = 12345").unwrap();
    assert_eq!(t.decode(&ids).unwrap(), "x = 12345");
    let digits = ids
        .iter()
        .filter(|&&id| {
            t.token_str(id).unwrap().len() == 1
                && t.token_str(id).unwrap().chars().all(|c| c.is_ascii_digit())
        })
        .count();
    assert_eq!(digits, 5, "{ids:?}");
    assert_eq!((t.bos_id(), t.eos_id()), (Some(1), Some(2)));
    assert_eq!(t.token_str(2), Some("<|im_end|>"));
    assert_eq!(
        t.encode_prompt("Hello world").unwrap(),
        [19556, 905],
        "add_bos_token is false"
    );
}

#[test]
fn qwen_known_ids() {
    let Some(t) = qwen() else { return };
    assert_eq!(t.vocab_size(), 151_936);
    assert_eq!(t.encode("Hello world").unwrap(), [9707, 1879]);
    assert_eq!(
        t.encode("def fibonacci(n):").unwrap(),
        [750, 75698, 1445, 1648]
    );
    assert_eq!((t.bos_id(), t.eos_id()), (Some(151_643), Some(151_645)));
    assert_eq!(t.token_id("<|im_end|>"), Some(151_645));
    // the qwen2 pattern splits digits one by one and keeps "\n\n" together
    let ids = t.encode("a 2024\n\nb").unwrap();
    let strs: Vec<&str> = ids.iter().map(|&i| t.token_str(i).unwrap()).collect();
    assert_eq!(strs, ["a", "Ġ", "2", "0", "2", "4", "ĊĊ", "b"]);
    // NFC: a decomposed é encodes like the composed one
    assert_eq!(
        t.encode("cafe\u{301}").unwrap(),
        t.encode("caf\u{e9}").unwrap()
    );
}

#[test]
fn special_tokens_are_single_ids_and_skippable() {
    for t in [smollm2(), qwen()].into_iter().flatten() {
        let im_start = t.token_id("<|im_start|>").unwrap();
        let im_end = t.token_id("<|im_end|>").unwrap();
        assert!(t.is_special(im_start) && t.is_special(im_end));
        let ids = t.encode("<|im_start|>user\nHi<|im_end|>").unwrap();
        assert_eq!(ids.first(), Some(&im_start));
        assert_eq!(ids.last(), Some(&im_end));
        assert_eq!(t.decode(&ids).unwrap(), "<|im_start|>user\nHi<|im_end|>");
        assert_eq!(t.decode_skip_special(&ids).unwrap(), "user\nHi");
        let err = t.decode(&[t.vocab_size() as u32]).unwrap_err();
        assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    }
}

#[test]
fn humaneval_prompts_round_trip() {
    let Some(prompts) = humaneval_prompts() else {
        return;
    };
    assert_eq!(prompts.len(), 164);
    for t in [smollm2(), qwen()].into_iter().flatten() {
        let mut total = 0;
        for p in &prompts {
            let ids = t.encode(p).unwrap();
            assert_eq!(&t.decode(&ids).unwrap(), p);
            total += ids.len();
        }
        // BPE compresses code: between an eighth and a half as many tokens as bytes
        let chars: usize = prompts.iter().map(|p| p.len()).sum();
        assert!(
            total < chars / 2 && total > chars / 8,
            "{total} tokens for {chars} bytes"
        );
    }
}

#[test]
fn chatml_rendering_of_a_question() {
    let question = [ChatMessage::user("What is the capital of France?")];
    if let Some(t) = smollm2() {
        let text = t.apply_chat_template(&question, true).unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
             Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        let ids = t.encode(&text).unwrap();
        assert_eq!(ids[0], 1);
        assert_eq!(t.decode(&ids).unwrap(), text);
        let with_system = [ChatMessage::system("Be brief."), question[0].clone()];
        let text = t.apply_chat_template(&with_system, false).unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is the capital of \
             France?<|im_end|>\n"
        );
    }
    if let Some(t) = qwen() {
        let text = t.apply_chat_template(&question, true).unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
             assistant.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        let ids = t.encode(&text).unwrap();
        assert_eq!(ids[0], 151_644);
        let conversation = [
            question[0].clone(),
            ChatMessage::assistant("Paris."),
            ChatMessage::user("And of Italy?"),
        ];
        let text = t.apply_chat_template(&conversation, true).unwrap();
        assert!(text.contains("<|im_start|>assistant\nParis.<|im_end|>\n<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\n"), "{text}");
    }
}

#[test]
fn templates_get_python_methods_and_raise_exception() {
    let source = "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}\
        {{ raise_exception('bad role ' + m.role) }}{% endif %}\
        [{{ m.content.strip() }}|{{ m.content.lstrip('x ').upper() }}|\
        {{ m.content.strip().startswith(('h', 'w')) }}|{{ m.content.split(',') | length }}]\
        {% endfor %}{{ bos_token }}{% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}\
        {{ {'a': 1}.get('b', 'none') }}";
    let t = ChatTemplate::new(source, "<s>", "</s>").unwrap();
    let out = t
        .render(&[ChatMessage::user("  hello, world  ")], false)
        .unwrap();
    assert_eq!(out, "[hello, world|HELLO, WORLD  |True|2]<s>a=1none");
    let err = t.render(&[ChatMessage::system("x")], false).unwrap_err();
    assert!(err.to_string().contains("bad role system"), "{err}");
    let err = ChatTemplate::new("{% if %}", "", "").unwrap_err();
    assert!(matches!(err, ModelError::ChatTemplate(_)));
}

/// A minimal byte-level tokenizer in GGUF metadata: the letters a, b, the merge "a b", and two
/// special tokens.
fn tiny_metadata(edit: impl FnOnce(&mut GgufWriter)) -> Result<Tokenizer, ModelError> {
    let mut w = GgufWriter::new();
    w.metadata("tokenizer.ggml.model", "gpt2")
        .metadata("tokenizer.ggml.pre", "gpt2")
        .metadata(
            "tokenizer.ggml.tokens",
            vec!["a", "b", "ab", "Ġ", "<s>", "</s>"],
        )
        .metadata("tokenizer.ggml.token_type", vec![1i32, 1, 1, 1, 3, 3])
        .metadata("tokenizer.ggml.merges", vec!["a b"])
        .metadata("tokenizer.ggml.bos_token_id", 4u32)
        .metadata("tokenizer.ggml.add_bos_token", true);
    edit(&mut w);
    build(&w)
}

fn build(w: &GgufWriter) -> Result<Tokenizer, ModelError> {
    Tokenizer::from_gguf(&GgufFile::from_bytes(w.to_bytes())?)
}

#[test]
fn tiny_tokenizer_and_its_errors() {
    let t = tiny_metadata(|_| {}).unwrap();
    assert_eq!(t.encode("abba").unwrap(), [2, 1, 0]);
    assert_eq!(t.encode_prompt("ab</s>").unwrap(), [4, 2, 5]);
    assert_eq!(t.decode(&[4, 2, 3, 0]).unwrap(), "<s>ab a");
    let reason = |e: ModelError| e.to_string();
    let e = tiny_metadata(|w| {
        w.metadata("tokenizer.ggml.model", "llama");
    })
    .unwrap_err();
    assert!(matches!(e, ModelError::Gguf { .. }), "duplicate key: {e}");
    let mut w = GgufWriter::new();
    w.metadata("tokenizer.ggml.model", "llama");
    let e = build(&w).unwrap_err();
    assert!(reason(e).contains("`llama` is not supported"));
    let mut w = GgufWriter::new();
    w.metadata("tokenizer.ggml.model", "gpt2")
        .metadata("tokenizer.ggml.pre", "falcon")
        .metadata("tokenizer.ggml.tokens", vec!["a"])
        .metadata("tokenizer.ggml.merges", Vec::<String>::new());
    let e = build(&w).unwrap_err();
    assert!(reason(e).contains("tokenizer.ggml.pre `falcon` is not supported"));
    let mut w = GgufWriter::new();
    w.metadata("tokenizer.ggml.model", "gpt2")
        .metadata("tokenizer.ggml.tokens", vec!["a", "b"])
        .metadata("tokenizer.ggml.merges", vec!["ab"]);
    let e = build(&w).unwrap_err();
    assert!(reason(e).contains("merge 0 \"ab\" is not two tokens"));
    let mut w = GgufWriter::new();
    w.metadata("tokenizer.ggml.model", "gpt2")
        .metadata("tokenizer.ggml.tokens", vec!["a", "a"])
        .metadata("tokenizer.ggml.merges", Vec::<String>::new());
    let e = build(&w).unwrap_err();
    assert!(reason(e).contains("occurs twice"));
    let mut w = GgufWriter::new();
    w.metadata("tokenizer.ggml.model", "gpt2")
        .metadata("tokenizer.ggml.tokens", vec!["a"])
        .metadata("tokenizer.ggml.merges", Vec::<String>::new())
        .metadata("tokenizer.ggml.eos_token_id", 7u32);
    let e = build(&w).unwrap_err();
    assert!(reason(e).contains("eos_token_id is 7 but there are only 1 tokens"));
    let mut w = GgufWriter::new();
    w.metadata("tokenizer.ggml.model", "gpt2");
    let e = build(&w).unwrap_err();
    assert!(
        matches!(e, ModelError::MissingMetadata { ref key, .. } if key == "tokenizer.ggml.tokens")
    );
}

/// The reference fixture (scripts/reference-logits.py): transformers' tokenizer, built from the
/// same GGUF files, gave these ids; ours must agree, and our chat template must render the
/// same ChatML text.
#[test]
fn ids_and_chat_text_match_the_transformers_reference() {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/reference_logits.json")).unwrap();
    let models = fixture["models"].as_object().unwrap();
    assert_eq!(models.len(), 2);
    for (name, tokenizer) in [("smollm2-135m", smollm2()), ("qwen2.5-coder-0.5b", qwen())] {
        let prompts = models[name]["prompts"].as_array().unwrap();
        assert_eq!(prompts.len(), 4, "{name}");
        for p in prompts {
            let text = p["text"].as_str().unwrap();
            let ids: Vec<u32> = p["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            // the fixture itself is consistent: one position per input token, top-k sorted
            let positions = p["positions"].as_array().unwrap();
            assert_eq!(positions.len(), ids.len());
            for pos in positions {
                let top: Vec<f64> = pos["top_logits"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap())
                    .collect();
                assert!(top.windows(2).all(|w| w[0] >= w[1]));
                assert!(pos["logsumexp"].as_f64().unwrap() >= top[0]);
            }
            let Some(t) = tokenizer else { continue };
            assert_eq!(t.encode(text).unwrap(), ids, "{name} {}", p["name"]);
            if p["name"] == "chat_capital" {
                let rendered = t
                    .apply_chat_template(
                        &[ChatMessage::user("What is the capital of France?")],
                        true,
                    )
                    .unwrap();
                assert_eq!(rendered, text, "{name}");
                let greedy = p["greedy_text"].as_str().unwrap();
                assert!(greedy.contains("Paris"), "{name}: {greedy}");
            }
        }
    }
}

#[test]
fn tokenizer_and_file_can_be_shared_across_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Tokenizer>();
    shared::<ChatTemplate>();
    shared::<GgufFile>();
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 128, ..Default::default() })]

    /// Any text round-trips through SmolLM2's tokenizer (no normalizer) exactly, and through
    /// Qwen's up to NFC (exactly for ASCII); encoding the decoded text is stable.
    #[test]
    fn arbitrary_text_round_trips(text in "(\\PC|[ \t\n]){0,48}", ascii in "[ -~\t\n]{0,48}") {
        if let Some(t) = smollm2() {
            for s in [&text, &ascii] {
                proptest::prop_assert_eq!(&t.decode(&t.encode(s).unwrap()).unwrap(), s);
            }
        }
        if let Some(t) = qwen() {
            proptest::prop_assert_eq!(&t.decode(&t.encode(&ascii).unwrap()).unwrap(), &ascii);
            let once = t.decode(&t.encode(&text).unwrap()).unwrap();
            let twice = t.decode(&t.encode(&once).unwrap()).unwrap();
            proptest::prop_assert_eq!(once, twice);
        }
    }
}
