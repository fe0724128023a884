//! The feature cache: it holds the target's own tapped features (bf16), an interrupted build
//! continues after the last complete sequence and ends byte-identical to an uninterrupted one,
//! and a cache of other sequences or another key is refused.

mod common;

use common::{greedy_sequences, key, target, temp_dir};
use half::bf16;
use specdec_models::llama::{Architecture, LlamaModel, LlamaOptions};
use specdec_models::LanguageModel;
use specdec_train::FeatureCache;

const FILES: [&str; 3] = ["tokens.u32", "features.bf16", "lengths.u32"];

#[test]
fn cached_features_are_the_targets_and_an_interrupted_build_resumes() {
    let dir = temp_dir("cache");
    let t = target(Architecture::Llama, 5);
    let sequences = greedy_sequences(&t, 6, 3, 9, 2);
    let k = key(&t, &sequences);
    let (full, stats) = FeatureCache::build(&dir.join("full"), &k, &t, &sequences, false).unwrap();
    assert_eq!((stats.resumed_from, stats.sequences), (0, 6));
    assert_eq!(stats.tokens, 6 * 12);
    assert_eq!(
        (full.len(), full.total_tokens(), full.hidden()),
        (6, 72, 256)
    );
    assert_eq!(full.size_bytes(), 72 * (4 + 2 * 256));

    // The rows are the target's last-block features, rounded to bf16.
    let mut model = LlamaModel::from_gguf(t.file(), LlamaOptions::default()).unwrap();
    model.tap_features(&[t.config().n_layers - 1]).unwrap();
    for (i, tokens) in sequences.iter().enumerate() {
        let seq = model.new_sequence().unwrap();
        let f = model.prefill(seq, tokens).unwrap().unwrap();
        let want: Vec<f32> = f
            .as_slice()
            .iter()
            .map(|&v| bf16::from_f32(v).to_f32())
            .collect();
        assert_eq!(full.tokens(i).unwrap(), *tokens);
        assert_eq!(full.features(i).unwrap(), want, "sequence {i}");
        model.release(seq).unwrap();
    }

    // An interrupted build: two complete sequences, a third half written (its tokens and part
    // of its features, a torn length), the cache not marked complete.
    let part = dir.join("part");
    std::fs::create_dir_all(&part).unwrap();
    let read = |name: &str| std::fs::read(dir.join("full").join(name)).unwrap();
    let kept: usize = sequences[..2].iter().map(Vec::len).sum();
    let third = sequences[2].len();
    std::fs::write(
        part.join("tokens.u32"),
        &read("tokens.u32")[..(kept + third) * 4],
    )
    .unwrap();
    std::fs::write(
        part.join("features.bf16"),
        &read("features.bf16")[..kept * 512 + 100],
    )
    .unwrap();
    std::fs::write(part.join("lengths.u32"), &read("lengths.u32")[..2 * 4 + 2]).unwrap();
    let meta = String::from_utf8(read("meta.json")).unwrap();
    assert!(meta.contains("\"complete\": true"));
    std::fs::write(
        part.join("meta.json"),
        meta.replace("\"complete\": true", "\"complete\": false"),
    )
    .unwrap();
    assert!(
        FeatureCache::open(&part, &k).is_err(),
        "an incomplete cache does not open"
    );
    let (resumed, stats) = FeatureCache::build(&part, &k, &t, &sequences, false).unwrap();
    assert_eq!((stats.resumed_from, stats.sequences), (2, 4));
    assert_eq!(resumed.len(), 6);
    for name in FILES {
        assert_eq!(
            std::fs::read(part.join(name)).unwrap(),
            read(name),
            "{name} after resuming"
        );
    }
    // A complete cache is reused as is.
    let (_, stats) = FeatureCache::build(&part, &k, &t, &sequences, false).unwrap();
    assert_eq!((stats.resumed_from, stats.sequences), (6, 0));

    // Other sequences under the same key, or another key, are refused.
    let mut other = sequences.clone();
    other[0][1] ^= 1;
    let err = FeatureCache::build(&part, &k, &t, &other, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("stale"), "{err}");
    let mut k2 = k.clone();
    k2.max_len += 1;
    let err = FeatureCache::build(&part, &k2, &t, &sequences, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("delete the folder"), "{err}");
    assert!(FeatureCache::open(&part, &k2).is_err());
}
