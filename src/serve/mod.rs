//! `mlxcel serve`: an OpenAI-compatible HTTP server over the batched engine. The handlers are
//! a thin adapter: validate, tokenize, hand the prompt to the engine thread, turn tokens into
//! JSON or server-sent events.

mod api;
mod worker;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context, Result};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use mlxcel_engine::batcher::{Batcher, Event, SeqParams};
use mlxcel_engine::blocks::BlockPool;
use mlxcel_engine::chat::ChatMessage;
use mlxcel_engine::paged::PagedEngine;
use mlxcel_engine::sampler::TokenLogprobs;
use mlxcel_engine::scheduler::Scheduler;
use mlxcel_engine::tokenizer::{StreamDecoder, Tokenizer};
use mlxcel_engine::SamplerSettings;
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::cli::{Global, ServeArgs};
use api::{ApiError, Settings, StopMatcher};

struct AppState {
    model_id: String,
    tokenizer: Arc<Tokenizer>,
    api_key: Option<String>,
    /// Largest prompt + completion one sequence may need (the pool's size, at most the context).
    max_sequence: usize,
    max_body: usize,
    max_in_flight: usize,
    in_flight: AtomicUsize,
    next_id: AtomicU64,
    submit: Mutex<mpsc::Sender<worker::Submit>>,
    stats: Arc<worker::Stats>,
    created: u64,
}

/// Holds one of the bounded request slots until dropped.
struct Slot(Arc<AppState>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The flags that must be positive, checked before the model loads.
fn validate(args: &ServeArgs) -> Result<()> {
    crate::cli::at_least_one(&[
        (Some(args.max_batch_size), "--max-batch-size"),
        (Some(args.block_size), "--block-size"),
        (Some(args.max_queue), "--max-queue"),
        (Some(args.prefill_chunk), "--prefill-chunk"),
        (Some(args.max_prefill_tokens), "--max-prefill-tokens"),
        (Some(args.max_step_graphs), "--max-step-graphs"),
        (Some(args.max_body_bytes), "--max-body-bytes"),
        (args.max_context, "--max-context"),
        (args.max_kv_tokens, "--max-kv-tokens"),
    ])
}

pub fn command(global: &Global, args: ServeArgs) -> Result<()> {
    let dir = global.model.as_deref().context("--model is required")?;
    validate(&args)?;
    let backend = crate::backend(global.device)?;
    let tokenizer =
        crate::generate::tokenizer(dir, args.tokenizer.as_deref()).context("serve needs the model's tokenizer")?;
    let (policy, _) = crate::dtype::resolve(global.dtype.as_deref(), Some(dir))?;
    let (model, plan) = crate::progress::load_model(dir, policy, backend.name())?;
    let dtype = plan.activation_dtype(&model);
    let max_context = args.max_context.unwrap_or(model.spec.max_position);
    let kv_tokens = args
        .max_kv_tokens
        .unwrap_or_else(|| args.max_batch_size.saturating_mul(max_context).min(1 << 16));
    let blocks = kv_tokens / args.block_size;
    ensure!(
        blocks > 0,
        "--block-size {} is larger than the KV cache of {kv_tokens} tokens ({})",
        args.block_size,
        match args.max_kv_tokens {
            Some(_) => "--max-kv-tokens",
            None => "by default --max-batch-size × the context, at most 65536",
        }
    );
    let engine = PagedEngine::new(model, backend.as_ref(), dtype, blocks, args.block_size, max_context)?
        .with_max_graphs(args.max_step_graphs);
    let sched = Scheduler::new(
        BlockPool::new(blocks, args.block_size),
        args.max_batch_size,
        args.prefill_chunk,
    )
    .with_prefill_tokens(args.max_prefill_tokens);
    let batcher = Batcher::new(sched, engine);
    let stats = Arc::new(worker::Stats::default());
    let (tx, rx) = mpsc::channel();
    let worker_stats = stats.clone();
    std::thread::Builder::new()
        .name("mlxcel-engine".into())
        .spawn(move || worker::run(batcher, rx, worker_stats))?;
    // The folder's name, or a GGUF file's without its extension.
    let name = if dir.is_file() {
        dir.file_stem()
    } else {
        dir.file_name()
    };
    let model_id = name.map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
    let state = Arc::new(AppState {
        model_id,
        tokenizer: Arc::new(tokenizer),
        api_key: args.api_key.clone(),
        max_sequence: max_context.min(blocks * args.block_size),
        max_body: args.max_body_bytes,
        max_in_flight: args.max_queue,
        in_flight: AtomicUsize::new(0),
        next_id: AtomicU64::new(1),
        submit: Mutex::new(tx),
        stats,
        created: now(),
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .fallback(not_found)
        .with_state(state.clone());
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .with_context(|| format!("--host {} --port {}: not an address", args.host, args.port))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("listening on {addr}"))?;
        let local = listener.local_addr()?;
        // Tests and scripts wait for this line.
        eprintln!(
            "mlxcel: serving {} on http://{local} ({} KV blocks of {} tokens, batch ≤ {})",
            state.model_id, blocks, args.block_size, args.max_batch_size
        );
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .context("serving")
    })
}

async fn not_found() -> ApiError {
    ApiError::invalid("no such route", None)
        .status(StatusCode::NOT_FOUND)
        .with_code("not_found")
}

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.api_key else { return Ok(()) };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given == Some(key.as_str()) {
        Ok(())
    } else {
        Err(ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "missing or incorrect API key (Authorization: Bearer KEY)".into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
        })
    }
}

async fn health(State(state): State<Arc<AppState>>) -> Json<Value> {
    let s = &state.stats;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    Json(json!({
        "status": "ok",
        "model": state.model_id,
        "steps": get(&s.steps),
        "free_blocks": get(&s.free_blocks),
        "total_blocks": get(&s.total_blocks),
        "running": get(&s.running),
        "waiting": get(&s.waiting),
        "preemptions": get(&s.preemptions),
        "dropped": get(&s.dropped),
        "in_flight": state.in_flight.load(Ordering::SeqCst),
    }))
}

async fn models(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&state, &headers) {
        return e.into_response();
    }
    Json(json!({
        "object": "list",
        "data": [{ "id": state.model_id, "object": "model", "created": state.created, "owned_by": "mlxcel" }],
    }))
    .into_response()
}

/// Which endpoint a request came in on: decides the JSON shapes.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Text,
}

async fn chat(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    handle(state, headers, body, Kind::Chat)
        .await
        .unwrap_or_else(|e| e.into_response())
}

async fn completions(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    handle(state, headers, body, Kind::Text)
        .await
        .unwrap_or_else(|e| e.into_response())
}

async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|_| {
        ApiError::invalid(format!("the request body exceeds {limit} bytes"), None)
            .status(StatusCode::PAYLOAD_TOO_LARGE)
            .with_code("request_too_large")
    })
}

fn check_model(state: &AppState, model: &Option<String>) -> Result<(), ApiError> {
    match model {
        Some(m) if *m != state.model_id => Err(ApiError::invalid(
            format!("the model '{m}' does not exist; this server has '{}'", state.model_id),
            Some("model"),
        )
        .status(StatusCode::NOT_FOUND)
        .with_code("model_not_found")),
        _ => Ok(()),
    }
}

fn encode(state: &AppState, body: &[u8], kind: Kind) -> Result<(Vec<u32>, Settings), ApiError> {
    let tok = &state.tokenizer;
    let bad = |e: anyhow::Error| ApiError::invalid(format!("{e:#}"), None);
    match kind {
        Kind::Chat => {
            let r: api::ChatRequest = api::parse(body)?;
            check_model(state, &r.common.model)?;
            let settings = r.common.settings(true)?;
            let messages: Vec<ChatMessage> = r
                .messages()?
                .into_iter()
                .map(|(role, text)| ChatMessage::new(role, text))
                .collect();
            let ids = if tok.has_chat_template() {
                tok.encode_chat(&messages).map_err(bad)?
            } else {
                let text: Vec<String> = messages.iter().map(|m| m.content.clone()).collect();
                tok.encode(&text.join("\n")).map_err(bad)?
            };
            Ok((ids, settings))
        }
        Kind::Text => {
            let r: api::CompletionRequest = api::parse(body)?;
            check_model(state, &r.common.model)?;
            let settings = r.common.settings(false)?;
            let ids = match &r.prompt {
                api::Prompt::Text(t) => tok.encode(t).map_err(bad)?,
                api::Prompt::Texts(v) if v.len() == 1 => tok.encode(&v[0]).map_err(bad)?,
                api::Prompt::Texts(v) if v.is_empty() => {
                    return Err(ApiError::invalid("the prompt list is empty", Some("prompt")))
                }
                api::Prompt::Texts(_) => {
                    return Err(ApiError::invalid(
                        "only one prompt per request is supported",
                        Some("prompt"),
                    ))
                }
                api::Prompt::Tokens(ids) => {
                    let vocab = tok.vocab_size() as i64;
                    ids.iter()
                        .map(|&t| {
                            (0..vocab).contains(&t).then_some(t as u32).ok_or_else(|| {
                                ApiError::invalid(format!("prompt token {t} is outside 0..{vocab}"), Some("prompt"))
                            })
                        })
                        .collect::<Result<_, _>>()?
                }
            };
            Ok((ids, settings))
        }
    }
}

async fn handle(state: Arc<AppState>, headers: HeaderMap, body: Body, kind: Kind) -> Result<Response, ApiError> {
    let received = std::time::Instant::now();
    authorize(&state, &headers)?;
    let body = read_body(body, state.max_body).await?;
    let (prompt, settings) = encode(&state, &body, kind)?;
    if prompt.is_empty() {
        return Err(ApiError::invalid("the prompt encodes to no tokens", Some("prompt")));
    }
    let limit = state.max_sequence;
    if prompt.len() >= limit {
        return Err(ApiError::invalid(
            format!(
                "the prompt has {} tokens; this server's context is {limit} tokens",
                prompt.len()
            ),
            Some("messages"),
        )
        .with_code("context_length_exceeded"));
    }
    let max_tokens = settings.max_tokens.unwrap_or(limit - prompt.len());
    if prompt.len() + max_tokens > limit {
        return Err(ApiError::invalid(
            format!(
                "the prompt ({} tokens) plus max_tokens {max_tokens} exceeds the context of {limit} tokens",
                prompt.len()
            ),
            Some("max_tokens"),
        )
        .with_code("context_length_exceeded"));
    }
    if state.in_flight.fetch_add(1, Ordering::SeqCst) >= state.max_in_flight {
        state.in_flight.fetch_sub(1, Ordering::SeqCst);
        return Err(ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "the server is at its limit of {} requests; retry later",
                state.max_in_flight
            ),
            kind: "rate_limit_error",
            param: None,
            code: Some("rate_limit_exceeded"),
        });
    }
    let slot = Slot(state.clone());
    let (tx, rx) = unbounded_channel();
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let seed = settings.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ id
    });
    let params = SeqParams {
        max_tokens,
        sampler: SamplerSettings {
            temperature: settings.temperature,
            top_k: settings.top_k,
            top_p: settings.top_p,
            min_p: settings.min_p,
            repetition_penalty: settings.repetition_penalty,
            seed,
            ..SamplerSettings::default()
        },
        eos: if settings.ignore_eos {
            vec![]
        } else {
            state.tokenizer.eos_ids().to_vec()
        },
        logprobs: settings.logprobs,
    };
    let submit = worker::Submit {
        id,
        received,
        prompt: prompt.clone(),
        params,
        events: tx,
    };
    state
        .submit
        .lock()
        .map_err(|_| ApiError::server("the engine thread is gone"))?
        .send(submit)
        .map_err(|_| ApiError::server("the engine thread is gone"))?;
    let job = Job {
        state: state.clone(),
        kind,
        id: format!("{}-{id}", if kind == Kind::Chat { "chatcmpl" } else { "cmpl" }),
        created: now(),
        prompt_tokens: prompt.len(),
        settings,
    };
    if job.settings.stream {
        Ok(stream(job, rx, slot))
    } else {
        let r = complete(job, rx).await;
        drop(slot);
        r
    }
}

struct Job {
    state: Arc<AppState>,
    kind: Kind,
    id: String,
    created: u64,
    prompt_tokens: usize,
    settings: Settings,
}

impl Job {
    fn usage(&self, completion: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        })
    }

    /// `choices[0].logprobs` for `lps` (null when the request did not ask): chat's `content`
    /// list, or the completions API's parallel lists. `offset` counts the text before them.
    fn logprobs(&self, lps: &[TokenLogprobs], offset: &mut usize) -> Value {
        if self.settings.logprobs.is_none() {
            return Value::Null;
        }
        let tok = &self.state.tokenizer;
        let text = |id: u32| tok.decode(&[id]).unwrap_or_default();
        // JSON has no -inf: OpenAI reports -9999 for tokens the distribution rules out.
        let finite = |lp: f32| lp.max(-9999.0);
        match self.kind {
            Kind::Chat => {
                let entry = |id: u32, lp: f32| {
                    let t = text(id);
                    json!({ "token": t, "logprob": finite(lp), "bytes": t.as_bytes() })
                };
                let content: Vec<Value> = lps
                    .iter()
                    .map(|l| {
                        let mut e = entry(l.token, l.logprob);
                        e["top_logprobs"] = l.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
                        e
                    })
                    .collect();
                json!({ "content": content, "refusal": null })
            }
            Kind::Text => {
                let (mut tokens, mut values, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
                for l in lps {
                    let t = text(l.token);
                    offsets.push(*offset);
                    *offset += t.len();
                    tokens.push(t);
                    values.push(finite(l.logprob));
                    let top: serde_json::Map<String, Value> =
                        l.top.iter().map(|&(id, lp)| (text(id), json!(finite(lp)))).collect();
                    tops.push(top);
                }
                json!({ "tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets })
            }
        }
    }

    /// One streamed chunk: `delta` text (chat, with the role in the first) or `text`, with the
    /// log-probabilities of the tokens it carries.
    fn chunk(&self, text: Option<&str>, first: bool, finish: Option<&str>, logprobs: Value) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(t) = text {
                    delta.insert("content".into(), t.into());
                }
                json!({ "index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish })
            }
            Kind::Text => {
                json!({ "index": 0, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish })
            }
        };
        let mut obj = json!({
            "id": self.id,
            "object": if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.state.model_id,
            "choices": [choice],
        });
        if self.settings.include_usage {
            obj["usage"] = Value::Null;
        }
        obj
    }
}

/// Tokens of one request turned into text, stopping at EOS, length or a stop string.
struct Collector {
    /// Decodes a window of the latest ids each token, not all of them (which made a long
    /// completion's text quadratic in its length).
    text: StreamDecoder<Arc<Tokenizer>>,
    stops: StopMatcher,
    tokens: usize,
    /// Log-probabilities of tokens not yet passed on.
    logprobs: Vec<TokenLogprobs>,
}

enum Step {
    Text(String),
    Done { text: String, finish: &'static str },
    Error(String),
}

impl Collector {
    fn new(tok: Arc<Tokenizer>, stops: Vec<String>) -> Collector {
        Collector {
            text: StreamDecoder::new(tok),
            stops: StopMatcher::new(stops),
            tokens: 0,
            logprobs: Vec::new(),
        }
    }

    fn on(&mut self, ev: Event) -> Step {
        match ev {
            Event::Token(id, lp) => {
                self.logprobs.extend(lp);
                self.tokens += 1;
                match self.text.push(id) {
                    Err(e) => Step::Error(format!("{e:#}")),
                    Ok(piece) => match self.stops.push(&piece) {
                        (text, true) => Step::Done { text, finish: "stop" },
                        (text, false) => Step::Text(text),
                    },
                }
            }
            Event::Finished(reason) => {
                // Whatever the last ids leave (a trailing partial character comes out as U+FFFD).
                let rest = self.text.finish().unwrap_or_default();
                let (mut text, hit) = self.stops.push(&rest);
                if !hit {
                    text.push_str(&self.stops.finish());
                }
                let finish = if hit { "stop" } else { reason.as_str() };
                Step::Done { text, finish }
            }
            Event::Failed(e) => Step::Error(e),
        }
    }
}

async fn complete(job: Job, mut rx: UnboundedReceiver<Event>) -> Result<Response, ApiError> {
    let mut c = Collector::new(job.state.tokenizer.clone(), job.settings.stop.clone());
    let mut text = String::new();
    let mut lps = Vec::new();
    let finish = loop {
        let Some(ev) = rx.recv().await else {
            return Err(ApiError::server("the engine dropped the request"));
        };
        let step = c.on(ev);
        lps.append(&mut c.logprobs);
        match step {
            Step::Text(t) => text.push_str(&t),
            Step::Done { text: t, finish } => {
                text.push_str(&t);
                break finish;
            }
            Step::Error(e) => return Err(ApiError::server(e)),
        }
    };
    let logprobs = job.logprobs(&lps, &mut 0);
    // Dropping the receiver cancels the sequence if it is still running (stop string).
    drop(rx);
    let choice = match job.kind {
        Kind::Chat => json!({
            "index": 0,
            "message": { "role": "assistant", "content": text },
            "logprobs": logprobs,
            "finish_reason": finish,
        }),
        Kind::Text => json!({ "index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish }),
    };
    Ok(Json(json!({
        "id": job.id,
        "object": if job.kind == Kind::Chat { "chat.completion" } else { "text_completion" },
        "created": job.created,
        "model": job.state.model_id,
        "choices": [choice],
        "usage": job.usage(c.tokens),
    }))
    .into_response())
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn stream(job: Job, mut rx: UnboundedReceiver<Event>, slot: Slot) -> Response {
    let (out, body_rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::convert::Infallible>>(64);
    tokio::spawn(async move {
        let _slot = slot;
        let mut c = Collector::new(job.state.tokenizer.clone(), job.settings.stop.clone());
        let mut first = true;
        let mut offset = 0;
        if job.kind == Kind::Chat {
            // OpenAI opens with the role and empty content.
            if out
                .send(Ok(sse(&job.chunk(Some(""), true, None, Value::Null))))
                .await
                .is_err()
            {
                return;
            }
            first = false;
        }
        loop {
            let ev = tokio::select! {
                _ = out.closed() => return, // the client is gone; dropping rx cancels the sequence
                ev = rx.recv() => ev,
            };
            let Some(ev) = ev else { return };
            // A chunk carries the log-probabilities of the tokens since the last one (text a
            // stop string may still claim waits, and so do they).
            let step = c.on(ev);
            let (chunks, done) = match step {
                Step::Text(t) if t.is_empty() => (vec![], false),
                Step::Text(t) => {
                    let lp = job.logprobs(&std::mem::take(&mut c.logprobs), &mut offset);
                    (vec![job.chunk(Some(&t), first, None, lp)], false)
                }
                Step::Done { text, finish } => {
                    let mut v = Vec::new();
                    let mut lp = job.logprobs(&std::mem::take(&mut c.logprobs), &mut offset);
                    if !text.is_empty() {
                        v.push(job.chunk(Some(&text), first, None, std::mem::take(&mut lp)));
                    }
                    v.push(job.chunk(None, false, Some(finish), lp));
                    if job.settings.include_usage {
                        let mut u = job.chunk(None, false, None, Value::Null);
                        u["choices"] = json!([]);
                        u["usage"] = job.usage(c.tokens);
                        v.push(u);
                    }
                    (v, true)
                }
                Step::Error(e) => {
                    let err = ApiError::server(e).body();
                    (vec![err], true)
                }
            };
            for chunk in chunks {
                first = false;
                if out.send(Ok(sse(&chunk))).await.is_err() {
                    return;
                }
            }
            if done {
                let _ = out.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
                return;
            }
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(body_rx));
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .expect("static headers")
}
