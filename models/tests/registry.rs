//! The model registry: the pinned table parses, names resolve, missing files name the fetch
//! command.

use specdec_models::{registry, ModelError};

#[test]
fn registry_lists_the_pinned_files() {
    let names: Vec<&str> = registry::entries()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "smollm2-135m",
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-1.5b",
            "humaneval",
            "mtbench",
            "sharegpt"
        ]
    );
    for e in registry::entries() {
        assert_eq!(e.sha256.len(), 64, "{}", e.name);
        assert!(e
            .sha256
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert!(e.size > 0, "{}", e.name);
        assert_eq!(registry::entry(&e.fetch).unwrap().name, e.name);
    }
    assert_eq!(registry::entry("qwen-1.5b").unwrap().parts, Some(22));
    assert_eq!(registry::entry("qwen-0.5b").unwrap().size, 491_400_064);
}

#[test]
fn missing_files_name_the_fetch_command() {
    let mut e = registry::entry("qwen-1.5b").unwrap().clone();
    e.file = "no-such-file.gguf".into();
    let err = e.locate().unwrap_err();
    assert!(matches!(err, ModelError::ModelNotFound(_)));
    assert!(
        err.to_string()
            .contains("run `scripts/fetch-models.sh qwen2.5-coder-1.5b`"),
        "{err}"
    );
    let err = registry::resolve("no-such-model-or-file").unwrap_err();
    assert!(matches!(err, ModelError::ModelNotFound(_)));
    let text = err.to_string();
    assert!(
        text.contains("no-such-model-or-file") && text.contains("smollm2-135m"),
        "{text}"
    );
    // a path to an existing file resolves to itself
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/registry.rs");
    assert_eq!(registry::resolve(here.to_str().unwrap()).unwrap(), here);
}

#[test]
fn cached_files_verify() {
    // Hash only the small files (SmolLM2 ~0.1 s, HumanEval); the fetch script hashed the rest.
    for name in ["smollm2-135m", "humaneval"] {
        if let Some(path) = registry::cached_for_test(name) {
            let e = registry::entry(name).unwrap();
            assert_eq!(registry::resolve(name).unwrap(), path);
            assert_eq!(e.verify_sha256().unwrap(), path);
        }
    }
}

/// A scratch folder for one test.
fn scratch(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("specdec-registry-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_same_size_corrupted_file_is_refused_naming_it_and_both_hashes() {
    let dir = scratch("corrupt");
    let hashes = dir.join("hashes");
    let file = dir.join("model.gguf");
    let good = b"pretend weights, 32 bytes long!!".to_vec();
    std::fs::write(&file, &good).unwrap();
    let mut entry = registry::entry("smollm2-135m").unwrap().clone();
    entry.file = file.to_string_lossy().into_owned(); // absolute: cache_dir().join keeps it
    entry.size = good.len() as u64;
    entry.sha256 = registry::sha256_of_file(&file).unwrap();
    assert_eq!(entry.verified_with(&hashes).unwrap(), file);
    // one byte flipped, same size: refused with the file and both hashes named
    let mut bad = good.clone();
    bad[7] ^= 1;
    std::fs::write(&file, &bad).unwrap();
    let err = entry.verified_with(&hashes).unwrap_err();
    let actual = registry::sha256_of_file(&file).unwrap();
    assert!(matches!(err, ModelError::HashMismatch(_)), "{err}");
    let text = err.to_string();
    for word in [
        file.to_str().unwrap(),
        &entry.sha256,
        &actual,
        "fetch-models.sh smollm2",
    ] {
        assert!(text.contains(word), "`{word}` not in: {text}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn hashes_are_computed_once_and_remembered_by_size_and_mtime() {
    let dir = scratch("cache");
    let hashes = dir.join("hashes");
    let file = dir.join("data.bin");
    std::fs::write(&file, b"first version").unwrap();
    let first = registry::sha256_cached(&file, &hashes).unwrap();
    assert_eq!(first, registry::sha256_of_file(&file).unwrap());
    let records: Vec<_> = std::fs::read_dir(&hashes).unwrap().collect();
    assert_eq!(records.len(), 1, "one record, no temporary left behind");
    // the record is what answers next time: doctor it and the doctored hash comes back
    let record = records[0].as_ref().unwrap().path();
    let text = std::fs::read_to_string(&record).unwrap();
    let doctored = text.replace(&first, &"0".repeat(64));
    std::fs::write(&record, &doctored).unwrap();
    assert_eq!(
        registry::sha256_cached(&file, &hashes).unwrap(),
        "0".repeat(64)
    );
    // a new version of the file (other size, new mtime) is hashed again
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&file, b"second, longer version").unwrap();
    let second = registry::sha256_cached(&file, &hashes).unwrap();
    assert_eq!(second, registry::sha256_of_file(&file).unwrap());
    assert_ne!(second, first);
    // an unwritable cache costs a hash, never an error
    let blocked = dir.join("not-a-dir");
    std::fs::write(&blocked, b"").unwrap();
    assert_eq!(registry::sha256_cached(&file, &blocked).unwrap(), second);
    std::fs::remove_dir_all(&dir).unwrap();
}
