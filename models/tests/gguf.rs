//! GGUF reader tests: writer round trips, every malformed-file error, a proptest fuzz of the
//! parser, and the real model files when cached.

use proptest::prelude::*;
use specdec_models::gguf::{Array, GgufFile, GgufWriter, QuantType, Value, ValueType};
use specdec_models::{registry, ModelError};

/// A small valid file: one key of every value type (nested array included), three tensors of
/// different types, alignment 64.
fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", "llama")
        .alignment(64)
        .metadata("u8", 7u8)
        .metadata("i8", -7i8)
        .metadata("u16", 700u16)
        .metadata("i16", -700i16)
        .metadata("u32", 70_000u32)
        .metadata("i32", -70_000i32)
        .metadata("f32", 1.5f32)
        .metadata("bool", true)
        .metadata("u64", 1u64 << 40)
        .metadata("i64", -(1i64 << 40))
        .metadata("f64", 0.25f64)
        .metadata("tokens", vec!["a", "Ġb", "<|im_end|>"])
        .metadata("types", vec![1i32, 1, 3])
        .metadata("scores", vec![0.5f32, -1.0, 2.0])
        .metadata(
            "nested",
            Array::Array(vec![Array::U8(vec![1, 2]), Array::String(vec!["x".into()])]),
        );
    let f32_values: Vec<f32> = (0..6).map(|i| i as f32 * 0.5).collect();
    w.tensor_f32("norm.weight", &[6], &f32_values);
    // two Q8_0 blocks (34 bytes each) of a [32, 2] matrix
    w.tensor("q8.weight", &[32, 2], 8, (0..68).map(|i| i as u8).collect());
    w.tensor(
        "f16.weight",
        &[2, 2, 1],
        1,
        vec![0, 60, 0, 188, 0, 0, 0, 64],
    );
    w
}

fn gguf_error(result: Result<GgufFile, ModelError>) -> String {
    match result {
        Err(ModelError::Gguf { reason, .. }) => reason,
        Err(other) => panic!("expected a GGUF format error, got {other}"),
        Ok(_) => panic!("expected a GGUF format error, got a parsed file"),
    }
}

#[test]
fn round_trip_of_every_value_type_and_tensor() {
    let file = GgufFile::from_bytes(sample_writer().to_bytes()).unwrap();
    let md = file.metadata();
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 64);
    assert_eq!(file.data_offset() % 64, 0);
    assert_eq!(file.architecture().unwrap(), "llama");
    assert_eq!(md.get("u8"), Some(&Value::U8(7)));
    assert_eq!(md.get("i8"), Some(&Value::I8(-7)));
    assert_eq!(md.get("u16"), Some(&Value::U16(700)));
    assert_eq!(md.get("i16"), Some(&Value::I16(-700)));
    assert_eq!(md.get_u32("u32").unwrap(), 70_000);
    assert_eq!(md.get("i32"), Some(&Value::I32(-70_000)));
    assert_eq!(md.get_f32("f32").unwrap(), 1.5);
    assert!(md.get_bool("bool").unwrap());
    assert_eq!(md.get_u64("u64").unwrap(), 1 << 40);
    assert_eq!(md.get("i64"), Some(&Value::I64(-(1 << 40))));
    assert_eq!(md.get_f32("f64").unwrap(), 0.25);
    assert_eq!(
        md.get_str_array("tokens").unwrap(),
        ["a", "Ġb", "<|im_end|>"]
    );
    assert_eq!(md.get_int_array("types").unwrap(), [1, 1, 3]);
    assert_eq!(md.get_f32_array("scores").unwrap(), [0.5, -1.0, 2.0]);
    let nested = md.get_array("nested").unwrap();
    assert_eq!(nested.element_type(), ValueType::Array);
    assert_eq!(
        nested,
        &Array::Array(vec![Array::U8(vec![1, 2]), Array::String(vec!["x".into()])])
    );
    // keys keep file order
    let keys: Vec<&str> = md.entries().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        &keys[..3],
        ["general.architecture", "general.alignment", "u8"]
    );

    assert_eq!(file.tensors().len(), 3);
    let norm = file.tensor("norm.weight").unwrap();
    assert_eq!(norm.quant_type(), QuantType::F32);
    assert_eq!(norm.shape(), [6]);
    let back: Vec<f32> = norm
        .data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(back, [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
    let q8 = file.tensor("q8.weight").unwrap();
    assert_eq!(q8.quant_type(), QuantType::Q8_0);
    assert_eq!((q8.info.n_elements(), q8.info.n_rows()), (64, 2));
    assert_eq!(q8.data, (0..68).map(|i| i as u8).collect::<Vec<_>>());
    let f16 = file.tensor("f16.weight").unwrap();
    assert_eq!(
        (f16.quant_type(), f16.shape()),
        (QuantType::F16, &[2, 2, 1][..])
    );
    assert_eq!(f16.data, [0, 60, 0, 188, 0, 0, 0, 64]);
    for t in file.tensors() {
        assert_eq!(
            (t.offset - file.data_offset()) % 64,
            0,
            "{} misaligned",
            t.name
        );
    }
    assert_eq!(norm.to_f32_vec().unwrap(), back);
    assert_eq!(f16.to_f32_vec().unwrap(), [1.0, -1.0, 0.0, 2.0]);
    assert_eq!(q8.row_bytes(1).unwrap(), &q8.data[34..]);
    assert!(q8
        .row_bytes(2)
        .unwrap_err()
        .to_string()
        .contains("has 2 rows, asked for row 2"));
}

#[test]
fn q8_0_tensor_dequantises_blocks_built_by_hand() {
    // one Q8_0 block: d = 0.5 (f16 0x3800), quants -16..16
    let mut block = vec![0x00, 0x38];
    block.extend((-16i8..16).map(|q| q as u8));
    let mut w = GgufWriter::new();
    w.tensor("q", &[32], QuantType::Q8_0.ggml_id(), block);
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let values = file.tensor("q").unwrap().to_f32_vec().unwrap();
    let expected: Vec<f32> = (-16..16).map(|q| q as f32 * 0.5).collect();
    assert_eq!(values, expected);
}

#[test]
fn accessors_name_the_missing_key_and_wrong_types() {
    let file = GgufFile::from_bytes(sample_writer().to_bytes()).unwrap();
    let md = file.metadata();
    let err = md.get_u32("llama.block_count").unwrap_err();
    assert!(matches!(&err, ModelError::MissingMetadata { key, .. } if key == "llama.block_count"));
    assert!(err.to_string().contains("llama.block_count"), "{err}");
    let err = md.get_str("u32").unwrap_err();
    assert!(
        err.to_string()
            .contains("`u32` is u32 70000, expected string"),
        "{err}"
    );
    // integers widen and narrow when the value fits, and refuse when it does not
    assert_eq!(md.get_u64("u8").unwrap(), 7);
    let err = md.get_as::<u8>("u16").unwrap_err().to_string();
    assert!(err.contains("`u16` is u16 700, expected u8"), "{err}");
    assert!(md.get_u32("i32").is_err());
    assert_eq!(md.get_as::<i64>("i32").unwrap(), -70_000);
    assert!(md.get_str_array("types").is_err());
    assert_eq!(md.get_opt::<u32>("absent").unwrap(), None);
    let err = file.tensor("output.weight").unwrap_err();
    assert!(matches!(&err, ModelError::MissingTensor { name, .. } if name == "output.weight"));
}

#[test]
fn header_errors_are_named() {
    let good = sample_writer().to_bytes();
    let mut bad = good.clone();
    bad[0] = b'X';
    assert!(gguf_error(GgufFile::from_bytes(bad)).contains("bad magic"));
    for version in [1u32, 4, u32::MAX] {
        let mut bad = good.clone();
        bad[4..8].copy_from_slice(&version.to_le_bytes());
        let reason = gguf_error(GgufFile::from_bytes(bad));
        assert!(
            reason.contains(&format!("unsupported GGUF version {version}")),
            "{reason}"
        );
    }
    let mut bad = good.clone();
    bad[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // metadata count
    assert!(gguf_error(GgufFile::from_bytes(bad)).contains("metadata entries cannot fit"));
    let mut bad = good.clone();
    bad[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes()); // tensor count
    assert!(gguf_error(GgufFile::from_bytes(bad)).contains("tensor-table entries cannot fit"));
    let mut bad = good.clone();
    bad[24..32].copy_from_slice(&(1u64 << 50).to_le_bytes()); // first key's length
    assert!(gguf_error(GgufFile::from_bytes(bad)).contains("cannot fit"));
    // first value's type tag follows the 8-byte length and the 20-byte key
    let tag_at = 24 + 8 + "general.architecture".len();
    let mut bad = good.clone();
    bad[tag_at..tag_at + 4].copy_from_slice(&13u32.to_le_bytes());
    assert!(gguf_error(GgufFile::from_bytes(bad)).contains("unknown value type 13"));
}

#[test]
fn every_truncation_is_an_error() {
    let good = sample_writer().to_bytes();
    for len in 0..good.len() {
        let err = GgufFile::from_bytes(good[..len].to_vec()).unwrap_err();
        assert!(
            matches!(err, ModelError::Gguf { .. }),
            "prefix {len}: {err}"
        );
    }
}

#[test]
fn tensor_table_errors_are_named() {
    let with = |f: &dyn Fn(&mut GgufWriter)| {
        let mut w = GgufWriter::new();
        w.metadata("general.architecture", "llama");
        f(&mut w);
        GgufFile::from_bytes(w.to_bytes())
    };
    let reason = gguf_error(with(&|w| {
        w.tensor("t", &[256], 10, vec![0; 84]);
    }));
    assert!(
        reason.contains("tensor `t`") && reason.contains("10"),
        "{reason}"
    );
    let reason = gguf_error(with(&|w| {
        w.tensor("t", &[48], 8, vec![0; 68]);
    }));
    assert!(
        reason.contains("not a multiple of the Q8_0 block length 32"),
        "{reason}"
    );
    let reason = gguf_error(with(&|w| {
        w.tensor("t", &[1, 1, 1, 1, 1], 0, vec![0; 4]);
    }));
    assert!(reason.contains("5 dimensions"), "{reason}");
    let reason = gguf_error(with(&|w| {
        w.tensor("t", &[4], 0, vec![0; 12]);
    }));
    assert!(reason.contains("runs past the end of the file"), "{reason}");
    let reason = gguf_error(with(&|w| {
        w.tensor_f32("t", &[1], &[1.0])
            .tensor_f32("t", &[1], &[2.0]);
    }));
    assert!(reason.contains("occurs twice"), "{reason}");
    let reason = gguf_error(with(&|w| {
        w.metadata("general.architecture", "qwen2");
    }));
    assert!(
        reason.contains("`general.architecture` occurs twice"),
        "{reason}"
    );
    let reason = gguf_error(with(&|w| {
        w.metadata("general.alignment", 48u32);
    }));
    assert!(reason.contains("not a power of two"), "{reason}");
    let reason = gguf_error(with(&|w| {
        w.tensor_f32("t", &[usize::MAX / 2, 4], &[]);
    }));
    assert!(reason.contains("too many"), "{reason}");
}

/// Where the GGML type of the tensor `name` is stored in a writer's output (its offset follows).
fn type_position(bytes: &[u8], name: &str) -> usize {
    let needle: Vec<u8> = [&(name.len() as u64).to_le_bytes()[..], name.as_bytes()].concat();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("tensor name in table");
    let n_dims = u32::from_le_bytes(bytes[at + needle.len()..][..4].try_into().unwrap()) as usize;
    at + needle.len() + 4 + 8 * n_dims
}

/// Rewrites the stored offset of the tensor `name` of a writer's output.
fn patch_offset(bytes: &mut [u8], name: &str, offset: u64) {
    let off_at = type_position(bytes, name) + 4;
    bytes[off_at..off_at + 8].copy_from_slice(&offset.to_le_bytes());
}

#[test]
fn offsets_out_of_bounds_misaligned_or_overlapping_are_errors() {
    let mut w = GgufWriter::new();
    w.tensor_f32("a", &[8], &[0.0; 8])
        .tensor_f32("b", &[8], &[0.0; 8]);
    let good = w.to_bytes();
    assert!(GgufFile::from_bytes(good.clone()).is_ok());
    let mut bad = good.clone();
    patch_offset(&mut bad, "b", 1 << 40);
    assert!(gguf_error(GgufFile::from_bytes(bad)).contains("runs past the end"));
    let mut bad = good.clone();
    patch_offset(&mut bad, "b", u64::MAX - 31);
    assert!(gguf_error(GgufFile::from_bytes(bad)).contains("runs past the end"));
    let mut bad = good.clone();
    patch_offset(&mut bad, "b", 4);
    assert!(gguf_error(GgufFile::from_bytes(bad)).contains("not a multiple of the alignment 32"));
    let mut bad = good;
    patch_offset(&mut bad, "b", 0);
    assert!(gguf_error(GgufFile::from_bytes(bad)).contains("overlap"));
}

/// Rewrites the stored GGML type of the tensor `name` of a writer's output.
fn patch_type(bytes: &mut [u8], name: &str, type_id: u32) {
    let type_at = type_position(bytes, name);
    bytes[type_at..type_at + 4].copy_from_slice(&type_id.to_le_bytes());
}

#[test]
fn a_gap_of_the_alignment_or_more_between_spans_is_an_error() {
    // an F32 norm flipped to F16 in the header: its span halves, leaving a gap before the next
    // tensor (issue 19: it ran and printed garbage)
    let mut w = GgufWriter::new();
    w.tensor_f32("a", &[8], &[0.0; 8])
        .tensor_f32("norm.weight", &[16], &[1.0; 16])
        .tensor_f32("c", &[8], &[0.0; 8]);
    let good = w.to_bytes();
    assert!(GgufFile::from_bytes(good.clone()).is_ok());
    let mut bad = good;
    patch_type(&mut bad, "norm.weight", 1);
    let reason = gguf_error(GgufFile::from_bytes(bad));
    assert!(
        reason.contains("32 unused bytes")
            && reason.contains("`norm.weight`")
            && reason.contains("`c`"),
        "{reason}"
    );
    // a first tensor that does not start the data section
    let mut shifted = GgufWriter::new();
    shifted
        .tensor_f32("a", &[8], &[0.0; 8])
        .tensor_f32("c", &[8], &[0.0; 8]);
    let mut bytes = shifted.to_bytes();
    patch_offset(&mut bytes, "a", 32);
    patch_offset(&mut bytes, "c", 64);
    bytes.extend_from_slice(&[0; 64]);
    let reason = gguf_error(GgufFile::from_bytes(bytes));
    assert!(
        reason.contains("start of the data section") && reason.contains("`a`"),
        "{reason}"
    );
    // padding shorter than the alignment is what writers leave: accepted
    let mut w = GgufWriter::new();
    w.tensor_f32("odd", &[3], &[0.0; 3])
        .tensor_f32("next", &[8], &[0.0; 8]);
    assert!(GgufFile::from_bytes(w.to_bytes()).is_ok());
}

#[test]
fn open_maps_a_written_file_and_reports_missing_files() {
    let dir = std::env::temp_dir().join(format!("specdec-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.gguf");
    sample_writer().write(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.bytes(), &sample_writer().to_bytes()[..]);
    assert_eq!(file.tensor("q8.weight").unwrap().data.len(), 68);
    let err = GgufFile::open(dir.join("absent.gguf")).unwrap_err();
    assert!(matches!(err, ModelError::Io { .. }) && err.to_string().contains("absent.gguf"));
    std::fs::remove_dir_all(&dir).unwrap();
}

proptest! {
    // 512 cases in CI, `$SPECDEC_FUZZ_CASES` by scripts/fuzz.sh; pinned seed
    #![proptest_config(ProptestConfig {
        cases: std::env::var("SPECDEC_FUZZ_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(512),
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed_0019),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Random bytes (behind a valid magic and version half the time) never panic.
    #[test]
    fn random_bytes_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 0..512), valid_head in any::<bool>()) {
        if valid_head && bytes.len() >= 8 {
            bytes[..4].copy_from_slice(b"GGUF");
            bytes[4..8].copy_from_slice(&3u32.to_le_bytes());
        }
        let _ = GgufFile::from_bytes(bytes);
    }

    /// A valid file with a few bytes overwritten, then possibly truncated, parses or fails
    /// cleanly, never panics; a successful parse keeps every tensor inside the file.
    #[test]
    fn corrupted_valid_files_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = sample_writer().to_bytes();
        for (at, byte) in edits {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        let len = bytes.len();
        if let Ok(file) = GgufFile::from_bytes(bytes) {
            for t in file.tensors() {
                prop_assert!(t.offset + t.n_bytes <= len);
                prop_assert_eq!(file.tensor(&t.name).unwrap().data.len(), t.n_bytes);
            }
        }
    }
}

#[test]
fn real_smollm2_header() {
    let Some(path) = registry::cached_for_test("smollm2-135m") else {
        return;
    };
    let file = GgufFile::open(path).unwrap();
    let md = file.metadata();
    assert_eq!(file.architecture().unwrap(), "llama");
    assert_eq!(md.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(md.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(md.get_u32("llama.feed_forward_length").unwrap(), 1536);
    assert_eq!(md.get_u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(md.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(
        md.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49_152
    );
    let embd = file.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (embd.quant_type(), embd.shape()),
        (QuantType::Q8_0, &[576, 49_152][..])
    );
    let q = file.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(
        (q.quant_type(), q.shape()),
        (QuantType::Q4_1, &[576, 576][..])
    );
    assert!(
        !file.has_tensor("output.weight"),
        "SmolLM2 ties its head to the embeddings"
    );
    // 30 layers x 9 tensors + embedding + final norm
    assert_eq!(file.tensors().len(), 30 * 9 + 2);
}

#[test]
fn real_qwen_half_b_header() {
    let Some(path) = registry::cached_for_test("qwen2.5-coder-0.5b") else {
        return;
    };
    let file = GgufFile::open(path).unwrap();
    let md = file.metadata();
    assert_eq!(file.architecture().unwrap(), "qwen2");
    assert_eq!(md.get_u32("qwen2.block_count").unwrap(), 24);
    assert_eq!(md.get_u32("qwen2.embedding_length").unwrap(), 896);
    assert_eq!(md.get_u32("qwen2.feed_forward_length").unwrap(), 4864);
    assert_eq!(md.get_u32("qwen2.attention.head_count").unwrap(), 14);
    assert_eq!(md.get_u32("qwen2.attention.head_count_kv").unwrap(), 2);
    assert_eq!(
        md.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        151_936
    );
    let bias = file.tensor("blk.0.attn_q.bias").unwrap();
    assert_eq!(
        (bias.quant_type(), bias.shape()),
        (QuantType::F32, &[896][..])
    );
    assert!(file.has_tensor("output.weight") || file.has_tensor("token_embd.weight"));
}
