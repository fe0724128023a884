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
            .contains("run `scripts/fetch-models.sh qwen-1.5b`"),
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
