//! `mlxcel serve` over real HTTP on loopback, against the committed llama-bf16 fixture: the
//! OpenAI response shapes and SSE framing, bad input, bounded queue, concurrency equal to
//! running alone, and blocks freed when a client drops mid-stream.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/parity/llama-bf16")
}

const MODEL: &str = "llama-bf16";

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(extra: &[&str]) -> Server {
    serve_model(&fixture(), extra)
}

/// `mlxcel serve` of the model at `model` (a folder or a GGUF file) on a free loopback port.
fn serve_model(model: &std::path::Path, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlxcel"))
        .args(["serve", "-m", model.to_str().unwrap(), "--device", "cpu", "--port", "0"])
        .args(extra)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("mlxcel starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("the server prints its address").unwrap();
        if let Some(rest) = line.split("on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    // Keep draining stderr so the server never blocks on it.
    std::thread::spawn(move || for _ in lines {});
    Server { child, addr }
}

struct Reply {
    status: u16,
    headers: String,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let nl = raw.windows(2).position(|w| w == b"\r\n").expect("chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..nl]).unwrap().trim(), 16).unwrap();
        raw = &raw[nl + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

fn send(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a header block");
    let headers = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let status = headers[9..12].parse().unwrap();
    let rest = &raw[split + 4..];
    let body = if headers.contains("transfer-encoding: chunked") {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    Reply { status, headers, body }
}

fn post(addr: &str, path: &str, body: &Value) -> Reply {
    send(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

/// `data:` payloads of an SSE body, checking the framing of every event.
fn events(body: &str) -> Vec<String> {
    assert!(body.ends_with("data: [DONE]\n\n"), "ends with [DONE]: {body:?}");
    body.split_terminator("\n\n")
        .map(|e| {
            assert!(
                e.starts_with("data: ") && !e.contains('\n'),
                "one data line per event: {e:?}"
            );
            e["data: ".len()..].to_string()
        })
        .collect()
}

/// The streamed text and the final chunk's finish reason.
fn stream_text(body: &str, chat: bool) -> (String, String, Vec<Value>) {
    let evs = events(body);
    assert_eq!(evs.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = evs[..evs.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let mut text = String::new();
    let mut finish = String::new();
    for c in &chunks {
        let Some(choice) = c["choices"].get(0) else { continue };
        let piece = if chat {
            &choice["delta"]["content"]
        } else {
            &choice["text"]
        };
        text.push_str(piece.as_str().unwrap_or(""));
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, finish, chunks)
}

fn chat_body(content: &str, max_tokens: u64, stream: bool) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    })
}

fn health(addr: &str) -> Value {
    send(addr, "GET", "/health", &[], b"").json()
}

#[test]
fn chat_and_text_completions_have_the_openai_shapes() {
    let s = serve(&[]);
    let r = post(&s.addr, "/v1/chat/completions", &chat_body("hello there", 8, false));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let u = &v["usage"];
    assert!(u["prompt_tokens"].as_u64().unwrap() > 2);
    let done = u["completion_tokens"].as_u64().unwrap();
    assert!((1..=8).contains(&done));
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + done
    );
    let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(finish == "length" && done == 8 || finish == "stop", "{v}");

    // The same request streamed gives the same text, in OpenAI's chunk sequence.
    let r = post(&s.addr, "/v1/chat/completions", &chat_body("hello there", 8, true));
    assert_eq!(r.status, 200);
    assert!(r.headers.contains("content-type: text/event-stream"), "{}", r.headers);
    let (streamed, sfinish, chunks) = stream_text(&r.text(), true);
    assert_eq!(streamed, text);
    assert_eq!(sfinish, finish);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c["choices"][0]["finish_reason"].is_null()));
    assert!(chunks.iter().all(|c| c.get("usage").is_none()), "no usage unless asked");

    // stream_options.include_usage: a last chunk with empty choices and the counts.
    let mut body = chat_body("hello there", 8, true);
    body["stream_options"] = json!({"include_usage": true});
    let (_, _, chunks) = stream_text(&post(&s.addr, "/v1/chat/completions", &body).text(), true);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"], *u);

    // Text completions, with max_completion_tokens, both ways.
    let body = json!({"model": MODEL, "prompt": "once upon", "max_completion_tokens": 6, "temperature": 0});
    let v = post(&s.addr, "/v1/completions", &body).json();
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 6);
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let (streamed, _, chunks) = stream_text(&post(&s.addr, "/v1/completions", &sbody).text(), false);
    assert_eq!(streamed, text);
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));

    // top_k 1 at temperature 1 can only draw the argmax: the greedy text, whatever the seed.
    let mut k1 = body.clone();
    k1["temperature"] = json!(1.0);
    k1["top_k"] = json!(1);
    k1["seed"] = json!(7);
    let v = post(&s.addr, "/v1/completions", &k1).json();
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), text, "top_k 1 is greedy");

    let m = send(&s.addr, "GET", "/v1/models", &[], b"").json();
    assert_eq!(m["data"][0]["id"], MODEL);
    let h = health(&s.addr);
    assert_eq!(h["status"], "ok");
    // The engine publishes its counters after the step that finished the last request, which
    // may be just after that request's response went out.
    wait_all_blocks_free(&s.addr);
}

/// Waits (up to 5 s) until /health reports every KV block free; returns that report.
fn wait_all_blocks_free(addr: &str) -> Value {
    let start = Instant::now();
    loop {
        let h = health(addr);
        if h["free_blocks"] == h["total_blocks"] {
            return h;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "blocks never came back: {h}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn logprobs_come_in_each_api_s_shape_streamed_or_not() {
    let s = serve(&[]);
    let mut body = chat_body("tell me something", 6, false);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(2);
    let r = post(&s.addr, "/v1/chat/completions", &body).json();
    let content = r["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs.content")
        .clone();
    assert_eq!(
        content.len() as u64,
        r["usage"]["completion_tokens"].as_u64().unwrap(),
        "{r}"
    );
    for e in &content {
        let lp = e["logprob"].as_f64().unwrap();
        let top = e["top_logprobs"].as_array().unwrap();
        assert!(lp <= 0.0 && top.len() == 2, "{e}");
        // Greedy: the chosen token is the most likely one.
        assert_eq!(
            (&top[0]["token"], top[0]["logprob"].as_f64().unwrap()),
            (&e["token"], lp),
            "{e}"
        );
        assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64(), "{e}");
        assert!(e["bytes"].is_array(), "{e}");
    }
    // Streamed, the same entries arrive spread over the chunks.
    body["stream"] = json!(true);
    let raw = post(&s.addr, "/v1/chat/completions", &body);
    let (_, _, chunks) = stream_text(&raw.text(), true);
    let streamed: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(streamed, content);
    // Without the switch: null, as OpenAI sends.
    let plain = post(
        &s.addr,
        "/v1/chat/completions",
        &chat_body("tell me something", 2, false),
    )
    .json();
    assert!(plain["choices"][0]["logprobs"].is_null());

    let text = post(
        &s.addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "once upon", "max_tokens": 5, "temperature": 0, "logprobs": 1}),
    )
    .json();
    let lp = &text["choices"][0]["logprobs"];
    let n = text["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    for field in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        assert_eq!(lp[field].as_array().map(Vec::len), Some(n), "{field}: {text}");
    }
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(
        offsets.windows(2).all(|w| w[0] <= w[1]) && offsets[0] == 0,
        "{offsets:?}"
    );
    assert!(lp["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t.as_object().unwrap().len() == 1));
    wait_all_blocks_free(&s.addr);
}

#[test]
fn stop_strings_cut_the_text_and_end_with_stop() {
    let s = serve(&[]);
    let full = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": "the", "max_tokens": 24, "temperature": 0, "ignore_eos": true}),
    );
    let full = full.json()["choices"][0]["text"].as_str().unwrap().to_string();
    // Stop at a piece of text from the middle of the greedy completion.
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() > 8, "{full:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let at = full.find(&stop).unwrap();
    for stream in [false, true] {
        let body = json!({"prompt": "the", "max_tokens": 24, "temperature": 0, "ignore_eos": true, "stop": [stop], "stream": stream});
        let r = post(&s.addr, "/v1/completions", &body);
        let (text, finish) = if stream {
            let (t, f, _) = stream_text(&r.text(), false);
            (t, f)
        } else {
            let v = r.json();
            (
                v["choices"][0]["text"].as_str().unwrap().to_string(),
                v["choices"][0]["finish_reason"].as_str().unwrap().to_string(),
            )
        };
        assert_eq!(text, full[..at], "stream {stream}, stop {stop:?}");
        assert_eq!(finish, "stop");
    }
}

#[test]
fn bad_requests_get_openai_errors_with_the_right_status() {
    let s = serve(&[
        "--api-key",
        "sk-test",
        "--max-body-bytes",
        "4096",
        "--max-context",
        "64",
    ]);
    let auth = [
        ("Authorization", "Bearer sk-test"),
        ("Content-Type", "application/json"),
    ];
    let call = |path: &str, body: &str| send(&s.addr, "POST", path, &auth, body.as_bytes());
    let chat = "/v1/chat/completions";
    let long = "word ".repeat(100);
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (chat, "{not json".into(), 400, "not valid JSON"),
        (chat, "[1, 2]".into(), 400, "JSON object"),
        (chat, r#"{"messages": "hi"}"#.into(), 400, "invalid request"),
        (
            chat,
            r#"{"messages": [{"role": "user", "content": 5}]}"#.into(),
            400,
            "invalid request",
        ),
        (
            chat,
            r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "3"}"#.into(),
            400,
            "invalid request",
        ),
        (chat, r#"{"messages": []}"#.into(), 400, "must not be empty"),
        (
            chat,
            r#"{"messages": [{"role": "wizard", "content": "hi"}]}"#.into(),
            400,
            "unknown message role",
        ),
        (
            chat,
            r#"{"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}"#.into(),
            404,
            "does not exist",
        ),
        (
            chat,
            r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}"#.into(),
            400,
            "at least 1",
        ),
        (
            chat,
            r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}"#.into(),
            400,
            "at least 1",
        ),
        (
            chat,
            r#"{"messages": [{"role": "user", "content": "hi"}], "n": 3}"#.into(),
            400,
            "n = 1",
        ),
        (
            chat,
            r#"{"messages": [{"role": "user", "content": "hi"}], "temperature": 9}"#.into(),
            400,
            "temperature",
        ),
        (
            chat,
            r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}"#.into(),
            400,
            "exceeds the context",
        ),
        (
            chat,
            json!({"messages": [{"role": "user", "content": long}]}).to_string(),
            400,
            "context",
        ),
        ("/v1/completions", r#"{"prompt": [1, 99999]}"#.into(), 400, "outside"),
        ("/v1/completions", r#"{"max_tokens": 3}"#.into(), 400, "invalid request"),
        (
            chat,
            format!(
                r#"{{"messages": [{{"role": "user", "content": "{}"}}]}}"#,
                "x".repeat(5000)
            ),
            413,
            "exceeds 4096 bytes",
        ),
        ("/v1/nothing", "{}".into(), 404, "no such route"),
    ];
    for (path, body, status, needle) in cases {
        let r = call(path, &body);
        assert_eq!(r.status, status, "{path} {body:.80}: {}", r.text());
        let e = r.json();
        let msg = e["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("an OpenAI error body: {e}"));
        assert!(msg.contains(needle), "{body:.80}: {msg}");
        assert!(e["error"]["type"].is_string(), "{e}");
    }
    // Without the key, or with a wrong one: 401 on every API route.
    let body = chat_body("hi", 2, false).to_string();
    for headers in [
        vec![],
        vec![("Authorization", "Bearer nope")],
        vec![("Authorization", "sk-test")],
    ] {
        let r = send(&s.addr, "POST", chat, &headers, body.as_bytes());
        assert_eq!(r.status, 401, "{headers:?}");
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
        assert_eq!(send(&s.addr, "GET", "/v1/models", &headers, b"").status, 401);
    }
    let mut ok = chat_body("hi", 2, false);
    ok["model"] = json!(null);
    assert_eq!(
        call(chat, &ok.to_string()).status,
        200,
        "the key and no model name are fine"
    );
    let h = wait_all_blocks_free(&s.addr);
    assert_eq!(h["in_flight"], 0);
}

/// Opens a streaming completion and reads until its first content chunk.
fn open_stream(addr: &str, body: &Value) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.to_string();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data: {") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    s
}

fn long_stream() -> Value {
    json!({"prompt": "a long story", "max_tokens": 200, "temperature": 0, "ignore_eos": true, "stream": true})
}

/// Closes a running request's connection through `close` (`before`: the health read while it
/// ran) and waits for every block: true where the server counted the request dropped
/// (cancelled, not finished), false where it ran to its end before the server heard of the
/// close (a stalled HTTP thread on a busy machine), a try that shows nothing.
fn closed_and_dropped(addr: &str, before: &Value, close: impl FnOnce(), what: &str) -> bool {
    close();
    let h = wait_all_blocks_free(addr);
    assert_eq!(h["in_flight"], 0);
    assert_eq!(h["running"], 0);
    let steps = h["steps"].as_u64().unwrap() - before["steps"].as_u64().unwrap();
    let dropped = h["dropped"].as_u64().unwrap() - before["dropped"].as_u64().unwrap();
    eprintln!("{what} closed: blocks back {steps} steps later (dropped {dropped})");
    // The engine frees a gone receiver's blocks within one step (worker.rs tests that without
    // a socket); the socket's news itself takes as long as hyper and tokio take on this
    // machine, so the steps printed are no bound (CI saw 4 on two busy cores).
    assert!(dropped <= 1, "{h}");
    dropped == 1
}

#[test]
fn a_client_that_drops_mid_stream_frees_its_blocks() {
    let s = serve(&[]);
    let conclusive = (0..5).any(|_| {
        let stream = open_stream(&s.addr, &long_stream());
        let h = health(&s.addr);
        assert!(
            h["free_blocks"].as_u64() < h["total_blocks"].as_u64(),
            "the stream holds blocks: {h}"
        );
        closed_and_dropped(&s.addr, &h, || drop(stream), "stream")
    });
    assert!(
        conclusive,
        "every try's stream ran to its end before the server saw the close"
    );
}

#[test]
fn a_client_that_drops_a_non_streaming_request_frees_its_blocks() {
    let s = serve(&[]);
    // 240 tokens: most of the fixture's 256-position context.
    let body = json!({"prompt": "a long story", "max_tokens": 240, "temperature": 0, "ignore_eos": true}).to_string();
    let conclusive = (0..5).any(|_| {
        let mut c = TcpStream::connect(&s.addr).unwrap();
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            s.addr,
            body.len()
        );
        c.write_all(req.as_bytes()).unwrap();
        let start = Instant::now();
        let h = loop {
            let h = health(&s.addr);
            if h["running"] == 1 {
                break h;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the request never started: {h}"
            );
            std::thread::sleep(Duration::from_millis(1));
        };
        closed_and_dropped(&s.addr, &h, || drop(c), "non-streaming request")
    });
    assert!(
        conclusive,
        "every try's request ran to its end before the server saw the close"
    );
    // The control: the same request kept open runs all its steps, and is not counted dropped.
    let before = health(&s.addr);
    let r = post(&s.addr, "/v1/completions", &serde_json::from_str(&body).unwrap());
    assert_eq!(r.json()["usage"]["completion_tokens"], 240);
    let after = wait_all_blocks_free(&s.addr);
    let more = after["steps"].as_u64().unwrap() - before["steps"].as_u64().unwrap();
    assert!(more >= 239, "the control ran {more} steps");
    assert_eq!(after["dropped"], before["dropped"]);
}

#[test]
fn a_full_queue_answers_429_and_recovers() {
    let s = serve(&["--max-queue", "1"]);
    let stream = open_stream(&s.addr, &long_stream());
    let r = post(&s.addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 2}));
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");
    drop(stream);
    let start = Instant::now();
    loop {
        let r = post(&s.addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 2}));
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 429);
        assert!(start.elapsed() < Duration::from_secs(20), "the slot never came back");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sixty_four_concurrent_streams_each_equal_the_request_alone() {
    let s = serve(&["--max-batch-size", "64"]);
    let prompts: Vec<String> = (0..8)
        .map(|i| {
            format!(
                "story {i}: the {} went",
                ["cat", "dog", "sun", "sea", "car", "owl", "map", "key"][i]
            )
        })
        .collect();
    let body = |p: &str| json!({"model": MODEL, "prompt": p, "max_tokens": 12, "temperature": 0, "ignore_eos": true, "stream": true});
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| stream_text(&post(&s.addr, "/v1/completions", &body(p)).text(), false).0)
        .collect();
    let start = Instant::now();
    let watcher = {
        let addr = s.addr.clone();
        std::thread::spawn(move || {
            // Counted only once the streams are in flight: before that, the counters may
            // still show the last solo request's step.
            let (mut most, mut began) = (0, false);
            while start.elapsed() < Duration::from_secs(120) {
                let h = health(&addr);
                let in_flight = h["in_flight"].as_u64().unwrap();
                began |= in_flight > 0;
                if began {
                    most = most.max(h["running"].as_u64().unwrap());
                }
                if began && in_flight == 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            most
        })
    };
    let threads: Vec<_> = (0..64)
        .map(|i| {
            let (addr, b) = (s.addr.clone(), body(&prompts[i % 8]));
            std::thread::spawn(move || {
                let r = post(&addr, "/v1/completions", &b);
                assert_eq!(r.status, 200, "{}", r.text());
                let (text, finish, chunks) = stream_text(&r.text(), false);
                assert_eq!(finish, "length");
                (text, chunks.len())
            })
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        let (text, _) = t.join().expect("stream thread");
        assert_eq!(text, alone[i % 8], "stream {i}");
    }
    let took = start.elapsed();
    assert!(took < Duration::from_secs(120), "64 streams took {took:?}");
    let most = watcher.join().unwrap();
    eprintln!("64 streams × 12 tokens in {took:?}, at most {most} running together");
    assert!(
        most > 8,
        "the streams were batched, not served one by one ({most} together)"
    );
    let h = wait_all_blocks_free(&s.addr);
    assert_eq!(h["in_flight"], 0);
    assert_eq!(h["preemptions"], 0, "a pool this size never preempts");
}

/// Raw SSE framing as curl receives it. Skips where curl is missing, unless `MLXCEL_REQUIRE_CURL`
/// is set (.ci/run sets it), where that fails.
#[test]
fn curl_sees_exact_sse_framing() {
    if Command::new("curl").arg("--version").output().is_err() {
        assert!(
            std::env::var("MLXCEL_REQUIRE_CURL").is_err(),
            "MLXCEL_REQUIRE_CURL is set but curl is not installed"
        );
        eprintln!("curl not installed: skipping the curl SSE check");
        return;
    }
    let s = serve(&[]);
    let out = Command::new("curl")
        .args(["-sN", "--max-time", "60", "-H", "Content-Type: application/json", "-d"])
        .arg(chat_body("hello", 5, true).to_string())
        .arg(format!("http://{}/v1/chat/completions", s.addr))
        .output()
        .unwrap();
    assert!(out.status.success());
    let body = String::from_utf8(out.stdout).unwrap();
    let (_, finish, chunks) = stream_text(&body, true);
    assert!(!finish.is_empty());
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["delta"], json!({}));
}

/// The official `openai` Python client. It runs where `MLXCEL_OPENAI_PYTHON` names a Python
/// with `openai` installed (.ci/run makes one); `MLXCEL_REQUIRE_OPENAI=1` makes a missing one fail.
#[test]
fn the_openai_python_client_works_unchanged() {
    let python = std::env::var("MLXCEL_OPENAI_PYTHON").ok().or_else(|| {
        let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/openai-venv/bin/python");
        venv.exists().then(|| venv.to_string_lossy().into_owned())
    });
    let Some(python) = python else {
        assert!(
            std::env::var("MLXCEL_REQUIRE_OPENAI").is_err(),
            "MLXCEL_REQUIRE_OPENAI is set but no MLXCEL_OPENAI_PYTHON"
        );
        eprintln!("no Python with openai (set MLXCEL_OPENAI_PYTHON): skipping the openai client check");
        return;
    };
    let s = serve(&["--api-key", "sk-openai"]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/serve_openai.py");
    let out = Command::new(python)
        .arg(script)
        .args([format!("http://{}/v1", s.addr), "sk-openai".into(), MODEL.into()])
        .output()
        .unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{o}\n{e}");
    assert!(o.contains("openai client: all checks passed"), "{o}\n{e}");
}

/// The default model, a GGUF file (`scripts/get-models.sh smollm2`), served with its own
/// tokenizer and chat template: the greedy reply and the prompt's token count equal what
/// `mlxcel generate` gives for the same message. Skipped when the file is missing, unless
/// MLXCEL_REQUIRE_MODELS lists it (CI).
#[test]
fn a_gguf_model_serves_with_its_own_tokenizer_and_template() {
    let name = "smollm2-135m-instruct";
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(name)
        .join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        let required = std::env::var("MLXCEL_REQUIRE_MODELS").unwrap_or_default();
        assert!(
            !required.split(',').any(|m| m.trim() == name || m.trim() == "all"),
            "{} is missing and MLXCEL_REQUIRE_MODELS asks for it",
            path.display()
        );
        return eprintln!("skipping: {} not found (scripts/get-models.sh smollm2)", path.display());
    }
    let message = "What is the capital of France?";
    let server = serve_model(&path, &["--max-batch-size", "2", "--max-context", "256"]);
    let body = json!({
        "model": "SmolLM2-135M-Instruct.Q4_1",
        "messages": [{"role": "user", "content": message}],
        "max_tokens": 12,
        "temperature": 0,
    });
    let r = post(&server.addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let served = r.json();
    assert_eq!(served["model"], "SmolLM2-135M-Instruct.Q4_1");
    let out = Command::new(env!("CARGO_BIN_EXE_mlxcel"))
        .args(["generate", "-m", path.to_str().unwrap(), "--device", "cpu"])
        .args(["-p", message, "-n", "12", "--temp", "0", "--json"])
        .output()
        .expect("mlxcel generate runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let generated: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        served["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
        generated["prompt_tokens"].as_array().unwrap().len(),
        "the same chat template and tokenizer"
    );
    let text = served["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!text.trim().is_empty(), "{served}");
    assert_eq!(text, generated["text"].as_str().unwrap(), "the greedy reply");
}
