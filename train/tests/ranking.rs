//! `specdec rank-vocab` on SmolLM2's tokenizer (real file, no forward) and a small
//! ShareGPT-format file: the end-of-generation ids first, then the ids by count; the file
//! written reads back; bad options are refused before any work.

mod common;

use specdec_models::tokenizer::ChatMessage;
use specdec_models::{registry, VocabRanking};
use specdec_train::{rank_vocab, RankVocabOptions};

/// `true` when SmolLM2 is cached; `false` (skip) when it is not and skipping is allowed; panics
/// naming the fetch command otherwise.
fn have_smollm2() -> bool {
    let entry = registry::entry("smollm2-135m").expect("registered");
    if entry.locate().is_ok() {
        return true;
    }
    if std::env::var("SPECDEC_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        return false;
    }
    panic!("smollm2-135m is not cached: run `scripts/fetch-models.sh smollm2`");
}

#[test]
fn a_ranking_puts_the_ends_first_then_the_frequent_ids() {
    if !have_smollm2() {
        return;
    }
    let dir = common::temp_dir("rank-vocab");
    let data = dir.join("chats.json");
    std::fs::write(
        &data,
        format!(
            r#"[{{"id": "a", "conversations": [{{"from": "human", "value": "{zebras}"}},
                                             {{"from": "gpt", "value": "ok!"}}]}},
                {{"id": "b", "conversations": [{{"from": "human", "value": "zebra?"}}]}}]"#,
            zebras = ["zebra"; 20].join(" ")
        ),
    )
    .unwrap();
    let options = RankVocabOptions {
        target: "smollm2-135m".into(),
        data: data.display().to_string(),
        conversations: 10,
        data_seed: 0,
        max_len: 2048,
        out: Some(dir.join("ranking.json")),
    };
    let report = rank_vocab(&options).unwrap();
    assert_eq!(report.conversations, 2);
    let ranking = VocabRanking::read(&report.path).unwrap();
    assert_eq!(ranking, report.ranking);
    assert_eq!(ranking.vocab_size, 49152);
    // SmolLM2's <|im_end|> (its EOS, 2) and <|endoftext|> (0) lead
    assert_eq!(ranking.ids[..2], [2, 0]);
    // then the ids by count: " zebra" (19 times) occurs more often than any template token
    let file = specdec_models::gguf::GgufFile::open(
        registry::entry("smollm2-135m").unwrap().locate().unwrap(),
    )
    .unwrap();
    let tokenizer = specdec_models::tokenizer::Tokenizer::from_gguf(&file).unwrap();
    let text = tokenizer
        .apply_chat_template(&[ChatMessage::user("zebra zebra")], false)
        .unwrap();
    let tokens = tokenizer.encode_prompt(&text).unwrap();
    let zebra = tokenizer.encode(" zebra").unwrap();
    assert_eq!(zebra.len(), 1, "{zebra:?}");
    assert!(tokens.contains(&zebra[0]));
    assert_eq!(ranking.ids[2], zebra[0], "{:?}", &ranking.ids[..8]);
    assert!(ranking.tokens_counted > tokens.len() as u64);
    assert!(report.summary().contains("draft_vocab_ranking"));

    // refused before any work
    let err = rank_vocab(&RankVocabOptions {
        conversations: 0,
        ..options.clone()
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("conversations"), "{err}");
    let err = rank_vocab(&RankVocabOptions {
        data: dir.join("none.json").display().to_string(),
        ..options
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("none.json"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
