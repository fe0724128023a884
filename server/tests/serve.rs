//! `specdec serve` end to end on 127.0.0.1 with SmolLM2-135M and raw HTTP/1.0 (bounded in count
//! and time): health after loading, the model list, greedy completions through the server equal
//! `specdec generate`'s text, streamed text equals non-streamed, 32 concurrent clients get what
//! they get alone, a stop string cuts the text, the usage carries the speculation counts, bad
//! requests get a 4xx naming the problem and the server stays healthy, and stopping drains.
//!
//! Needs the SmolLM2 GGUF in the cache (`scripts/fetch-models.sh smollm2`); skipped without it
//! unless `SPECDEC_REQUIRE_MODELS` names it (scripts/test.sh sets it).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use specdec_harness::generate::{generate, GenerateOptions};
use specdec_models::registry;
use specdec_server::{start, RunningServer, ServeOptions};

const MODEL: &str = "smollm2-135m";

/// Whether the model is cached (a missing one skips, unless `SPECDEC_REQUIRE_MODELS` names it).
fn have_model() -> bool {
    registry::cached_for_test(MODEL).is_some()
}

/// One HTTP/1.0 exchange (the body ends when the server closes): status and body.
fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .expect("read the response");
    let response = String::from_utf8(response).expect("UTF-8 response");
    let (head, body) = response.split_once("\r\n\r\n").expect("a header block");
    let status = head[9..12].parse().expect("a status code");
    (status, body.to_string())
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = http(addr, "POST", path, &body.to_string());
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, value)
}

/// The `data:` payloads of a server-sent event stream.
fn events(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        .map(str::to_string)
        .collect()
}

fn ready_server(method: &str) -> RunningServer {
    let mut options = ServeOptions::new(MODEL);
    options.method = method.into();
    options.k = 3;
    options.port = 0;
    options.batch_size = 4;
    let server = start(&options).expect("the server starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !server.is_ready() {
        assert!(server.load_error().is_none(), "{:?}", server.load_error());
        assert!(
            Instant::now() < deadline,
            "the models did not load in 120 s"
        );
        let (status, _) = http(server.addr, "GET", "/health", "");
        // 503 while loading; 200 only if loading finished since `is_ready` was asked
        assert!(
            status == 503 || (status == 200 && server.is_ready()),
            "health before loading: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

fn greedy(prompt: &str, max_tokens: usize) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
}

#[test]
fn the_server_answers_like_generate_and_refuses_bad_requests() {
    if !have_model() {
        return;
    }
    let server = ready_server("ngram");
    let addr = server.addr;
    let (status, body) = http(addr, "GET", "/health", "");
    assert_eq!((status, body.trim()), (200, "ok"));
    let (status, models) = http(addr, "GET", "/v1/models", "");
    assert_eq!(status, 200);
    assert!(models.contains(&format!("\"id\":\"{MODEL}\"")), "{models}");

    // greedy through the server = specdec generate, same method
    let prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n";
    let (status, body) = post(addr, "/v1/completions", &greedy(prompt, 40));
    assert_eq!(status, 200, "{body}");
    let served = body["choices"][0]["text"].as_str().unwrap().to_string();
    let mut expected = Vec::new();
    let options = GenerateOptions {
        target: MODEL.into(),
        draft: None,
        method: "ngram".into(),
        k: 3,
        prompt: prompt.into(),
        temperature: 0.0,
        top_k: None,
        top_p: None,
        min_p: None,
        penalties: Default::default(),
        max_tokens: 40,
        chat: Some(false),
        seed: 0,
        device: "cpu".into(),
        head: None,
        kv_memory: None,
        kv_dtype: None,
        tensor_parallel: 1,
        steps_out: None,
        replay: None,
    };
    let summary = generate(&options, &mut expected, &mut |_| {}).unwrap();
    // generate ends its output with a newline of its own
    let expected = String::from_utf8(expected).unwrap();
    assert_eq!(served, expected.strip_suffix('\n').unwrap());
    let usage = &body["usage"];
    assert_eq!(usage["completion_tokens"], summary.tokens);
    let accepted = usage["completion_tokens_details"]["accepted_prediction_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(usage["speculative"]["drafts_accepted"], accepted);
    assert!(usage["speculative"]["target_passes"].as_u64().unwrap() >= 1);

    // streamed = non-streamed; the stream ends with [DONE] and carries the usage when asked
    let mut stream_req = greedy(prompt, 40);
    stream_req["stream"] = json!(true);
    stream_req["stream_options"] = json!({"include_usage": true});
    let (status, raw) = http(addr, "POST", "/v1/completions", &stream_req.to_string());
    assert_eq!(status, 200, "{raw}");
    let payloads = events(&raw);
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"), "{raw}");
    let chunks: Vec<Value> = payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0).and_then(|ch| ch["text"].as_str()))
        .collect();
    assert_eq!(streamed, served);
    assert_eq!(
        chunks.last().unwrap()["usage"]["completion_tokens"],
        summary.tokens
    );

    // 32 concurrent clients: each gets what it gets alone (batch invariance through the server)
    let starts = [
        "The capital of France is",
        "import numpy as np\n",
        "Once upon a time",
        "1, 2, 3,",
    ];
    let prompts: Vec<String> = (0..32).map(|i| format!("{} {i}", starts[i % 4])).collect();
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| post(addr, "/v1/completions", &greedy(p, 12)).1["choices"][0]["text"].to_string())
        .collect();
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| s.spawn(move || post(addr, "/v1/completions", &greedy(p, 12))))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                let (status, body) = h.join().unwrap();
                assert_eq!(status, 200, "{body}");
                body["choices"][0]["text"].to_string()
            })
            .collect()
    });
    assert_eq!(together, alone);

    // sampled requests with seeds of their own share the batch, and each samples as alone
    let sampled = |i: usize| {
        json!({"model": MODEL, "prompt": prompts[i], "max_tokens": 12, "temperature": 1.0,
               "seed": 1000 + i})
    };
    let steps = || metric(addr, "specdec_engine_steps_total");
    let before = steps();
    let alone: Vec<String> = (0..8)
        .map(|i| post(addr, "/v1/completions", &sampled(i)).1["choices"][0]["text"].to_string())
        .collect();
    let steps_alone = steps() - before;
    let before = steps();
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| s.spawn(move || post(addr, "/v1/completions", &sampled(i))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().1["choices"][0]["text"].to_string())
            .collect()
    });
    let steps_together = steps() - before;
    assert_eq!(together, alone);
    assert!(
        steps_together < 0.75 * steps_alone,
        "seeded requests did not share steps: {steps_together} together, {steps_alone} alone"
    );

    // a stop string: the text is cut before it
    let full = served.clone();
    let stop = full.chars().skip(10).take(3).collect::<String>();
    let mut stopped = greedy(prompt, 40);
    stopped["stop"] = json!(stop);
    let (status, body) = post(addr, "/v1/completions", &stopped);
    assert_eq!(status, 200);
    let cut = body["choices"][0]["text"].as_str().unwrap();
    assert_eq!(cut, &full[..full.find(&stop).unwrap()]);
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    // the engine stopped there: no target pass past the stop (each pass emits a token at least)
    let usage = &body["usage"];
    assert!(
        usage["speculative"]["target_passes"].as_u64() <= usage["completion_tokens"].as_u64()
            && usage["completion_tokens"].as_u64() < Some(40),
        "{usage}"
    );

    // chat completions, streamed and not
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "What is 2 + 2?"}],
                      "max_tokens": 16, "temperature": 0});
    let (status, body) = post(addr, "/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{body}");
    let answer = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!answer.is_empty());
    let mut chat_stream = chat.clone();
    chat_stream["stream"] = json!(true);
    let (_, raw) = http(
        addr,
        "POST",
        "/v1/chat/completions",
        &chat_stream.to_string(),
    );
    let streamed: String = events(&raw)
        .iter()
        .filter(|p| *p != "[DONE]")
        .filter_map(|p| {
            let v: Value = serde_json::from_str(p).unwrap();
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(streamed, answer);

    // bad requests: a 4xx naming the problem, and the server stays healthy
    let bad = [
        ("{not json", 400, "not valid JSON"),
        (
            r#"{"model":"smollm2-135m","prompt":"x","max_tokens":-1}"#,
            400,
            "max_tokens",
        ),
        (
            r#"{"model":"smollm2-135m","prompt":"x","max_tokens":100000000}"#,
            400,
            "limit",
        ),
        (
            r#"{"model":"smollm2-135m","prompt":"x","max_tokens":9000}"#,
            400,
            "context of 8192",
        ),
        (r#"{"model":"smollm2-135m","prompt":"x","n":3}"#, 400, "`n`"),
        (r#"{"model":"gpt-4","prompt":"x"}"#, 404, "gpt-4"),
        (r#"{"model":"smollm2-135m","messages":[]}"#, 400, "empty"),
    ];
    for (body, want_status, want) in bad {
        let path = if body.contains("messages") {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let (status, text) = http(addr, "POST", path, body);
        assert_eq!(status, want_status, "{body}: {text}");
        assert!(text.contains(want), "{body}: {text}");
    }
    // a request past the context, sent beside a good one, fails alone
    let (good, too_long) = std::thread::scope(|scope| {
        let good = scope.spawn(|| post(addr, "/v1/completions", &greedy("def add(a, b):", 8)));
        let too_long = scope.spawn(|| {
            let mut body = greedy("def add(a, b):", 8);
            body["max_tokens"] = json!(9000);
            post(addr, "/v1/completions", &body)
        });
        (good.join().unwrap(), too_long.join().unwrap())
    });
    assert_eq!(good.0, 200, "{}", good.1);
    assert_eq!(too_long.0, 400, "{}", too_long.1);
    // a named workload learns apart and decodes the same text; a serving run keeps 64 apart
    // (one request at other settings starts a new run, whose names are counted afresh)
    let (status, body) = post(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "x", "max_tokens": 1, "temperature": 0.5}),
    );
    assert_eq!(status, 200, "{body}");
    let mut named = greedy(prompt, 40);
    named["workload"] = json!("code:python");
    let (status, body) = post(addr, "/v1/completions", &named);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"].as_str(), Some(served.as_str()));
    for i in 1..=specdec_harness::engine::MAX_WORKLOADS {
        let mut body = greedy("def add(a, b):", 1);
        body["workload"] = json!(format!("w{i}"));
        let (status, answer) = post(addr, "/v1/completions", &body);
        match i < specdec_harness::engine::MAX_WORKLOADS {
            true => assert_eq!(status, 200, "workload {i}: {answer}"),
            false => {
                assert_eq!(status, 400, "workload {i}: {answer}");
                let message = answer["error"]["message"].as_str().unwrap_or_default();
                assert!(message.contains("workload `w64`"), "{answer}");
            }
        }
    }
    let (status, body) = post(addr, "/v1/completions", &named);
    assert_eq!(status, 200, "a known workload still runs: {body}");
    let (status, _) = http(addr, "GET", "/health", "");
    assert_eq!(status, 200, "healthy after bad requests");
    let (_, metrics) = http(addr, "GET", "/metrics", "");
    assert!(
        metrics.contains("specdec_requests_total{outcome=\"refused\"} 9"),
        "{metrics}"
    );
    assert!(
        metrics.contains("specdec_time_to_first_token_seconds_count"),
        "{metrics}"
    );
    server.stop().expect("the server drains and stops");
    assert!(
        TcpStream::connect(addr).is_err(),
        "nothing listens after stop"
    );
}

/// The value of the unlabelled metric `name` in a `/metrics` text.
fn metric(addr: SocketAddr, name: &str) -> f64 {
    let (_, text) = http(addr, "GET", "/metrics", "");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .parse()
        .unwrap()
}

/// Polls until `done()` or `seconds` pass; whether it became true.
fn eventually(seconds: u64, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn requests_join_a_running_batch_and_a_cancelled_stream_frees_its_kv() {
    if !have_model() {
        return;
    }
    let server = ready_server("ngram");
    let addr = server.addr;
    assert_eq!(metric(addr, "specdec_kv_blocks_used"), 0.0);
    // a short request sent while a long one decodes joins its batch and ends first
    std::thread::scope(|scope| {
        let long = scope.spawn(|| post(addr, "/v1/completions", &greedy("1, 2, 3,", 240)));
        assert!(
            eventually(60, || metric(addr, "specdec_running_sequences") >= 1.0),
            "the long request never ran"
        );
        let (status, short) = post(addr, "/v1/completions", &greedy("The capital of", 4));
        assert_eq!(status, 200, "{short}");
        assert!(
            !long.is_finished(),
            "the short request waited for the long one's batch to end"
        );
        let (status, long) = long.join().unwrap();
        assert_eq!(status, 200, "{long}");
    });
    assert!(eventually(5, || metric(addr, "specdec_kv_blocks_used") == 0.0));

    // a stream whose client goes away: dropped at the next step, its KV blocks freed
    let mut stream = TcpStream::connect(addr).unwrap();
    let mut body = greedy("1, 2, 3,", 2000);
    body["stream"] = json!(true);
    let body = body.to_string();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    while seen.windows(5).filter(|w| w == b"data:").count() < 3 {
        let n = stream.read(&mut buffer).expect("the stream sends");
        assert!(n > 0, "the stream ended early");
        seen.extend_from_slice(&buffer[..n]);
    }
    assert!(metric(addr, "specdec_kv_blocks_used") > 0.0);
    let steps_at_cancel = metric(addr, "specdec_engine_steps_total");
    drop(stream);
    assert!(
        eventually(20, || metric(addr, "specdec_kv_blocks_used") == 0.0),
        "the cancelled stream's KV blocks were not freed"
    );
    let steps_after = metric(addr, "specdec_engine_steps_total");
    let (_, text) = http(addr, "GET", "/metrics", "");
    assert!(
        text.contains("specdec_requests_total{outcome=\"cancelled\"} 1"),
        "{text}"
    );
    // it stopped long before its 2000 tokens (the server notices a closed socket when a
    // write to it fails, a few steps later at most)
    assert!(
        steps_after - steps_at_cancel < 64.0,
        "{steps_at_cancel} steps when the client left, {steps_after} when its blocks came back"
    );
    assert_eq!(metric(addr, "specdec_running_sequences"), 0.0);
    server.stop().unwrap();
}

#[test]
fn an_api_key_is_required_when_set_and_a_bad_model_fails_to_load() {
    if !have_model() {
        return;
    }
    let mut options = ServeOptions::new("/nonexistent/model.gguf");
    options.port = 0;
    let server = start(&options).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.load_error().is_none() {
        assert!(Instant::now() < deadline, "no load error");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(server
        .load_error()
        .unwrap()
        .contains("/nonexistent/model.gguf"));
    let (status, body) = http(server.addr, "GET", "/health", "");
    assert_eq!(status, 500, "{body}");
    server.stop().unwrap();

    let mut options = ServeOptions::new(MODEL);
    options.port = 0;
    options.api_key = Some("sekrit".into());
    let server = start(&options).unwrap();
    while !server.is_ready() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, body) = http(
        server.addr,
        "POST",
        "/v1/completions",
        &greedy("x", 2).to_string(),
    );
    assert_eq!(status, 401, "{body}");
    let mut stream = TcpStream::connect(server.addr).unwrap();
    let body = greedy("Hello", 2).to_string();
    write!(
        stream,
        "POST /v1/completions HTTP/1.0\r\nAuthorization: Bearer sekrit\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(
        response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"),
        "{response}"
    );
    server.stop().unwrap();
}

/// The official `openai` Python client (installed by `scripts/setup.d/30-openai.sh`, which
/// exports `SPECDEC_OPENAI_PYTHON`) against the server: completions, chat, streamed chat, a
/// refused request, the model list.
#[test]
fn the_official_openai_client_works_against_the_server() {
    if !have_model() {
        return;
    }
    let python = match std::env::var("SPECDEC_OPENAI_PYTHON") {
        Ok(p) => p,
        Err(_) if std::env::var("SPECDEC_SKIP_OPENAI_TEST").as_deref() == Ok("1") => {
            eprintln!("SKIPPED (SPECDEC_SKIP_OPENAI_TEST=1): the openai client test did not run");
            return;
        }
        Err(_) => panic!(
            "SPECDEC_OPENAI_PYTHON is not set: run the suite with scripts/test.sh (it installs \
             the openai client into a venv), or `source scripts/setup.d/30-openai.sh`; set \
             SPECDEC_SKIP_OPENAI_TEST=1 to skip on purpose"
        ),
    };
    let server = ready_server("ngram");
    let addr = server.addr;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_client.py");
    let output = std::process::Command::new(python)
        .args([script, &format!("http://{addr}/v1"), MODEL])
        .output()
        .expect("python runs");
    assert!(
        output.status.success(),
        "the client failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let got: Value = serde_json::from_slice(&output.stdout).expect("one JSON line");
    let (_, raw) = post(
        addr,
        "/v1/completions",
        &greedy("The capital of France is", 16),
    );
    assert_eq!(got["completion"], raw["choices"][0]["text"]);
    assert_eq!(got["completion_tokens"], raw["usage"]["completion_tokens"]);
    assert!(!got["chat"].as_str().unwrap().is_empty());
    assert_eq!(got["chat"], got["chat_streamed"]);
    assert_eq!(got["refused_status"], 400);
    assert_eq!(got["models"], json!([MODEL]));
    server.stop().unwrap();
}
