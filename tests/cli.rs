//! The `specdec` command as a user meets it: errors are messages with their causes and never a
//! backtrace (even with `RUST_BACKTRACE=1`), `version` names the commit built in, and
//! `generate`'s flags are checked before any model loads.

use std::process::Command;

fn specdec<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_specdec"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the specdec binary runs")
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn errors_are_messages_not_backtraces() {
    let out = specdec(&["run", "/nonexistent/experiment.toml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains("/nonexistent/experiment.toml"), "{err}");
    assert!(!err.to_lowercase().contains("backtrace"), "{err}");
    assert!(
        !err.contains("at src/") && !err.contains("panicked"),
        "{err}"
    );
}

#[test]
fn version_names_the_built_in_commit_and_crates() {
    let out = specdec(&["version"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("specdec "), "{text}");
    assert!(text.contains("git commit "), "{text}");
    for krate in ["specdec-harness", "specdec-models", "tokenizers", "serde"] {
        assert!(text.contains(krate), "{krate} missing: {text}");
    }
}

#[test]
fn serve_checks_its_config_and_flags_before_loading() {
    let dir = std::env::temp_dir().join(format!("specdec-serve-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("serve.toml");
    std::fs::write(
        &config,
        "[models]\ntarget = \"smollm2-135m\"\n[[methods]]\nname = \"ngram-k3\"\n\
         drafter = { kind = \"ngram\", n = 3 }\npolicy = { kind = \"fixed\", k = 3 }\n\
         [sampling]\ntemperature = 1.0\n",
    )
    .unwrap();
    let path = config.display().to_string();
    let cases: [(&[&str], &str); 6] = [
        (&["serve"], "CONFIG file or --target"),
        (
            &["serve", "--target", "smollm2-135m", "--tp", "0"],
            "tensor_parallel = 0",
        ),
        (
            &[
                "generate",
                "-m",
                "no-such-model",
                "-p",
                "hi",
                "--tp",
                "1000000",
            ],
            "tensor_parallel = 1000000 is not in 1..=64",
        ),
        (&["serve", &path], "`sampling`"),
        (&["serve", &path, "--k", "3"], "--k"),
        (
            &["serve", "/nonexistent/serve.toml"],
            "/nonexistent/serve.toml",
        ),
    ];
    for (args, want) in cases {
        let out = specdec(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(want),
            "{args:?}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn generate_checks_its_flags_before_loading() {
    // max tokens 0: nothing at all on stdout, no model needed
    let out = specdec(&["generate", "-m", "no-such-model", "-p", "hi", "-n", "0"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    // bad sampling values are refused by name, before any loading line
    for (flag, value, named) in [
        ("--top-p", "1.5", "top_p"),
        ("--top-k", "0", "top_k"),
        ("--min-p", "1.5", "min_p"),
        ("--repetition-penalty", "0", "repetition"),
    ] {
        let out = specdec(&["generate", "-m", "no-such-model", "-p", "hi", flag, value]);
        assert_eq!(out.status.code(), Some(1), "{flag}");
        let err = stderr(&out);
        assert!(
            err.contains(named) && !err.contains("loading"),
            "{flag}: {err}"
        );
    }
    // a missing model: a message naming it, after the loading line
    let out = specdec(&["generate", "-m", "no-such-model", "-p", "hi", "-n", "4"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("loading no-such-model") && err.contains("no-such-model"),
        "{err}"
    );
    assert!(!err.to_lowercase().contains("backtrace"), "{err}");
    // an unreadable --replay file and a --steps file that cannot be written: named, before
    // any loading line
    for (flag, path) in [
        ("--replay", "/nonexistent/steps.jsonl"),
        ("--steps", "/nonexistent/dir/steps.jsonl"),
    ] {
        let out = specdec(&["generate", "-m", "no-such-model", "-p", "hi", flag, path]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{flag}: {err}");
        assert!(
            err.contains(path) && !err.contains("loading"),
            "{flag}: {err}"
        );
    }
    // the prompt from a file that is not there: named
    let out = specdec(&["generate", "-m", "x", "-f", "/nonexistent/prompt.txt"]);
    assert!(
        stderr(&out).contains("/nonexistent/prompt.txt"),
        "{}",
        stderr(&out)
    );
}

/// With SmolLM2 in the cache: `--json` prints one JSON object with the text, tokens, timings,
/// acceptance and τ; the prompt comes from stdin.
#[test]
fn generate_json_on_smollm2() {
    if specdec_models::registry::cached_for_test("smollm2-135m").is_none() {
        return;
    }
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_specdec"))
        .args([
            "generate",
            "-m",
            "smollm2-135m",
            "-n",
            "8",
            "-t",
            "2",
            "--json",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"What is the capital of France?")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["tokens"], 8, "{v}");
    assert!(!v["text"].as_str().unwrap().trim().is_empty(), "{v}");
    for key in ["ttft_s", "prefill_s", "tau", "acceptance", "elapsed_s"] {
        assert!(v.get(key).is_some(), "{key}: {v}");
    }
}

/// With SmolLM2 in the cache: `auto` at T = 1 chooses its budgets from the timings of the
/// moment; `--replay` of a run's `--steps` record gives that run's text again, decision for
/// decision.
#[test]
fn generate_replay_repeats_a_sampled_auto_run_on_smollm2() {
    if specdec_models::registry::cached_for_test("smollm2-135m").is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("specdec-cli-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (first, second) = (dir.join("first.jsonl"), dir.join("second.jsonl"));
    // one sampled auto run of SmolLM2 with `seed`, then `extra`
    let args = |seed: &'static str, extra: &[&str]| -> Vec<String> {
        let base = [
            "generate",
            "-m",
            "smollm2-135m",
            "--method",
            "auto",
            "--temperature",
            "1",
            "--seed",
            seed,
            "-n",
            "32",
            "-t",
            "2",
            "--no-chat",
            "-p",
            "def fibonacci(n):",
        ];
        base.iter().chain(extra).map(|a| a.to_string()).collect()
    };
    let run = |extra: &[&str]| {
        let mut extra = extra.to_vec();
        extra.push("--json");
        let args = args("11", &extra);
        let out = specdec(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["text"].as_str().unwrap().to_string()
    };
    let decisions = |path: &std::path::Path| -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|line| {
                serde_json::from_str::<serde_json::Value>(line).unwrap()["decision"].clone()
            })
            .collect()
    };
    let recorded = run(&["--steps", first.to_str().unwrap()]);
    let replayed = run(&[
        "--replay",
        first.to_str().unwrap(),
        "--steps",
        second.to_str().unwrap(),
    ]);
    assert_eq!(replayed, recorded);
    let (a, b) = (decisions(&first), decisions(&second));
    assert!(
        !a.is_empty() && a.iter().all(|d| d.is_object() || d.is_string()),
        "{a:?}"
    );
    assert_eq!(a, b);
    // another seed does not replay: refused, naming the step where it diverged
    let out = specdec(&args("12", &["--replay", first.to_str().unwrap()]));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("replay diverged at request 0 step"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `specdec export-hf` writes a folder that `generate --target DIR` runs (the SmolLM2 answer of
/// ../shared/MODELS.md), refuses to write into it again, and refuses an unknown dtype.
#[test]
fn export_hf_writes_a_folder_generate_runs() {
    if specdec_models::registry::cached_for_test("smollm2-135m").is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("specdec-cli-hf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let folder = dir.to_str().unwrap();
    let out = specdec(&["export-hf", "smollm2-135m", folder, "--dtype", "bf16"]);
    assert!(out.status.success(), "{}", stderr(&out));
    for file in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
    ] {
        assert!(dir.join(file).is_file(), "{file}");
    }
    let out = specdec(&["export-hf", "smollm2-135m", folder]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not empty"), "{}", stderr(&out));
    let out = specdec(&[
        "generate",
        "--target",
        folder,
        "--method",
        "plain",
        "-n",
        "12",
        "-t",
        "2",
        "--json",
        "--prompt",
        "What is the capital of France?",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let text = v["text"].as_str().unwrap();
    assert!(text.contains("Paris"), "{v}");
    std::fs::remove_dir_all(&dir).unwrap();
    let out = specdec(&["export-hf", "smollm2-135m", folder, "--dtype", "q4"]);
    assert_eq!(out.status.code(), Some(2), "clap refuses the value");
    assert!(stderr(&out).contains("q4"), "{}", stderr(&out));
}

/// With SmolLM2 in the cache: `specdec serve` as a process, stopped by SIGTERM while a request
/// runs: the request is answered in full, and the process exits 0 with the port closed.
#[test]
fn serve_drains_on_sigterm() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpStream;
    if specdec_models::registry::cached_for_test("smollm2-135m").is_none() {
        return;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_specdec"))
        .args([
            "serve",
            "--target",
            "smollm2-135m",
            "--method",
            "ngram",
            "--port",
            "0",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("specdec serve starts");
    // the first line names the address; the second says the models are loaded
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines.next().expect("a first line").unwrap();
    let addr = first
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {first}"))
        .to_string();
    let ready = lines.next().expect("a ready line").unwrap();
    assert!(ready.contains("ready"), "{ready}");
    let request = std::thread::spawn({
        let addr = addr.clone();
        move || {
            let mut stream = TcpStream::connect(&addr).unwrap();
            let body =
                r#"{"model":"smollm2-135m","prompt":"1, 2, 3,","max_tokens":96,"temperature":0}"#;
            write!(
                stream,
                "POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).unwrap();
            response
        }
    });
    // SIGTERM once the request runs (its prompt is in: the metrics count it)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the request never ran"
        );
        let mut stream = TcpStream::connect(&addr).unwrap();
        write!(stream, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut metrics = String::new();
        stream.read_to_string(&mut metrics).unwrap();
        if metrics.contains("specdec_running_sequences 1") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let response = request.join().unwrap();
    assert!(
        response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"),
        "{response}"
    );
    // answered in full: the whole body with its usage, not a cut connection
    assert!(
        response.contains("\"finish_reason\"") && response.contains("\"completion_tokens\""),
        "{response}"
    );
    let status = child.wait().unwrap();
    assert!(status.success(), "exit status {status}");
    assert!(
        TcpStream::connect(&addr).is_err(),
        "nothing listens after the drain"
    );
}
