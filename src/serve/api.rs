//! OpenAI request bodies, their validation, and error bodies.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

/// An OpenAI-style error: `{"error": {"message", "type", "param", "code"}}` with its status.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn status(mut self, status: StatusCode) -> ApiError {
        self.status = status;
        self
    }

    pub fn server(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    pub fn body(&self) -> Value {
        json!({ "error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// `stop`: one string or up to four.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Debug, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Fields chat and text completions share.
#[derive(Deserialize, Debug)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<i64>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    /// vLLM's extension: generate through end-of-sequence tokens (benchmarks).
    #[serde(default)]
    pub ignore_eos: bool,
    /// vLLM's (and mlx-lm's) sampling extensions: -1 or 0 is off.
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// OpenAI's penalties, refused rather than ignored when asked for.
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Chat: `true` with `top_logprobs` alternatives (0 to 20); completions: the number of
    /// alternatives (0 to 5).
    pub logprobs: Option<Logprobs>,
    pub top_logprobs: Option<i64>,
}

/// `logprobs`: a switch (chat) or a count (completions).
#[derive(Deserialize, Debug, Clone, Copy)]
#[serde(untagged)]
pub enum Logprobs {
    On(bool),
    Top(i64),
}

/// Message content: a string, or text parts `[{"type": "text", "text": ...}]`.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize, Debug)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Deserialize, Debug)]
pub struct Message {
    pub role: String,
    pub content: Option<Content>,
}

#[derive(Deserialize, Debug)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    #[serde(flatten)]
    pub common: Common,
}

/// `prompt`: a string, one string in a list, or token ids.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
}

#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    #[serde(flatten)]
    pub common: Common,
}

/// The validated generation settings of a request.
#[derive(Debug, Clone)]
pub struct Settings {
    /// None: what the context leaves.
    pub max_tokens: Option<usize>,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
    /// Report each token's log-probability with this many alternatives.
    pub logprobs: Option<usize>,
}

/// Parses `body` as `T`, turning serde's message into a 400.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("the request body is not valid JSON: {e}"), None))?;
    if !value.is_object() {
        return Err(ApiError::invalid("the request body must be a JSON object", None));
    }
    serde_json::from_value(value).map_err(|e| ApiError::invalid(format!("invalid request: {e}"), None))
}

impl Common {
    /// The request's settings, checked; `chat` says which API's form `logprobs` takes.
    pub fn settings(&self, chat: bool) -> Result<Settings, ApiError> {
        let max = self.max_completion_tokens.or(self.max_tokens);
        let param = if self.max_completion_tokens.is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        let max_tokens = match max {
            Some(m) if m <= 0 => {
                return Err(ApiError::invalid(
                    format!("{param} must be at least 1, got {m}"),
                    Some(param),
                ))
            }
            Some(m) => Some(m as usize),
            None => None,
        };
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid(
                format!("temperature must be in [0, 2], got {temperature}"),
                Some("temperature"),
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid(
                format!("top_p must be in (0, 1], got {top_p}"),
                Some("top_p"),
            ));
        }
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => k as usize,
            Some(k) => {
                return Err(ApiError::invalid(
                    format!("top_k must be -1 (off) or positive, got {k}"),
                    Some("top_k"),
                ))
            }
        };
        let min_p = self.min_p.unwrap_or(0.0);
        if !(0.0..1.0).contains(&min_p) {
            return Err(ApiError::invalid(
                format!("min_p must be in [0, 1), got {min_p}"),
                Some("min_p"),
            ));
        }
        let repetition_penalty = self.repetition_penalty.unwrap_or(1.0);
        if !(repetition_penalty > 0.0 && repetition_penalty.is_finite()) {
            return Err(ApiError::invalid(
                format!("repetition_penalty must be > 0, got {repetition_penalty}"),
                Some("repetition_penalty"),
            ));
        }
        for (value, name) in [
            (self.presence_penalty, "presence_penalty"),
            (self.frequency_penalty, "frequency_penalty"),
        ] {
            if value.is_some_and(|v| v != 0.0) {
                return Err(ApiError::invalid(
                    format!("{name} is not supported (use repetition_penalty)"),
                    Some(name),
                ));
            }
        }
        let logprobs = self.logprobs_setting(chat)?;
        if let Some(n) = self.n.filter(|&n| n != 1) {
            return Err(ApiError::invalid(
                format!("only n = 1 is supported, got {n}"),
                Some("n"),
            ));
        }
        let stop = match &self.stop {
            None => vec![],
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > 4 || stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid("stop takes up to 4 non-empty strings", Some("stop")));
        }
        let include_usage = self.stream_options.as_ref().is_some_and(|o| o.include_usage);
        if self.stream_options.is_some() && !self.stream {
            return Err(ApiError::invalid(
                "stream_options is only allowed with stream: true",
                Some("stream_options"),
            ));
        }
        Ok(Settings {
            max_tokens,
            temperature,
            top_p,
            top_k,
            min_p,
            repetition_penalty,
            seed: self.seed.map(|s| s as u64),
            stop,
            stream: self.stream,
            include_usage,
            ignore_eos: self.ignore_eos,
            logprobs,
        })
    }

    fn logprobs_setting(&self, chat: bool) -> Result<Option<usize>, ApiError> {
        let (limit, param) = if chat { (20, "top_logprobs") } else { (5, "logprobs") };
        let top = match (chat, self.logprobs, self.top_logprobs) {
            (true, Some(Logprobs::On(true)), top) => top.unwrap_or(0),
            (true, None | Some(Logprobs::On(false)), None) => return Ok(None),
            (true, None | Some(Logprobs::On(false)), Some(_)) => {
                return Err(ApiError::invalid(
                    "top_logprobs needs logprobs: true",
                    Some("top_logprobs"),
                ))
            }
            (true, Some(Logprobs::Top(_)), _) => {
                return Err(ApiError::invalid("logprobs must be true or false", Some("logprobs")))
            }
            (false, _, Some(_)) => {
                return Err(ApiError::invalid(
                    "top_logprobs is a chat parameter: completions take logprobs: N",
                    Some("top_logprobs"),
                ))
            }
            (false, None | Some(Logprobs::On(false)), None) => return Ok(None),
            (false, Some(Logprobs::Top(n)), None) => n,
            (false, Some(Logprobs::On(true)), None) => {
                return Err(ApiError::invalid(
                    "logprobs of a completion is a count of alternatives (0 to 5)",
                    Some("logprobs"),
                ))
            }
        };
        if !(0..=limit).contains(&top) {
            return Err(ApiError::invalid(
                format!("{param} must be in [0, {limit}], got {top}"),
                Some(param),
            ));
        }
        Ok(Some(top as usize))
    }
}

impl ChatRequest {
    /// `(role, text)` per message, checked.
    pub fn messages(&self) -> Result<Vec<(String, String)>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid("messages must not be empty", Some("messages")));
        }
        self.messages
            .iter()
            .map(|m| {
                if !matches!(m.role.as_str(), "system" | "developer" | "user" | "assistant" | "tool") {
                    return Err(ApiError::invalid(
                        format!("unknown message role '{}'", m.role),
                        Some("messages"),
                    ));
                }
                let text = match &m.content {
                    None => String::new(),
                    Some(Content::Text(t)) => t.clone(),
                    Some(Content::Parts(parts)) => {
                        let mut text = String::new();
                        for p in parts {
                            match (p.kind.as_str(), &p.text) {
                                ("text", Some(t)) => text.push_str(t),
                                _ => {
                                    return Err(ApiError::invalid(
                                        format!("message parts of type '{}' are not supported", p.kind),
                                        Some("messages"),
                                    ))
                                }
                            }
                        }
                        text
                    }
                };
                let role = if m.role == "developer" {
                    "system"
                } else {
                    m.role.as_str()
                };
                Ok((role.to_string(), text))
            })
            .collect()
    }
}

/// Text released by a stream with stop strings: everything that cannot be the start of one.
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops,
            pending: String::new(),
        }
    }

    /// Adds `piece`; returns the text now safe to send and whether a stop string was hit
    /// (the stop string and what follows are dropped).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.pending.push_str(piece);
        if let Some(at) = self.stops.iter().filter_map(|s| self.pending.find(s.as_str())).min() {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Hold back the longest tail that a stop string starts with.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if self.pending.ends_with(&s[..i]) {
                    keep = keep.max(i);
                }
            }
        }
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// What is held back, at the end of the stream.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_matcher_holds_back_possible_starts_and_cuts_at_the_stop() {
        let mut m = StopMatcher::new(vec!["END".into(), "\n\n".into()]);
        assert_eq!(m.push("hello E"), ("hello ".into(), false));
        assert_eq!(m.push("N"), (String::new(), false));
        assert_eq!(m.push("x"), ("ENx".into(), false));
        assert_eq!(m.push(" a\n"), (" a".into(), false));
        assert_eq!(m.push("\nrest"), (String::new(), true));
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("abcENDdef"), ("abc".into(), true));
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("abE"), ("ab".into(), false));
        assert_eq!(m.finish(), "E");
    }

    #[test]
    fn stop_matcher_without_stops_passes_everything() {
        let mut m = StopMatcher::new(vec![]);
        assert_eq!(m.push("é∑"), ("é∑".into(), false));
    }

    #[test]
    fn sampling_extensions_are_read_and_off_values_accepted() {
        let r: CompletionRequest = parse(
            br#"{"prompt":"x","top_k":5,"min_p":0.1,"repetition_penalty":1.2,"presence_penalty":0,"logprobs":false}"#,
        )
        .unwrap();
        let s = r.common.settings(false).unwrap();
        assert_eq!((s.top_k, s.min_p, s.repetition_penalty), (5, 0.1, 1.2));
        let r: CompletionRequest = parse(br#"{"prompt":"x","top_k":-1}"#).unwrap();
        let s = r.common.settings(false).unwrap();
        assert_eq!((s.top_k, s.min_p, s.repetition_penalty), (0, 0.0, 1.0));
    }

    #[test]
    fn logprobs_take_each_api_s_form() {
        let chat = |extra: &str| {
            let body = format!(r#"{{"messages":[{{"role":"user","content":"hi"}}]{extra}}}"#);
            parse::<ChatRequest>(body.as_bytes())
                .unwrap()
                .common
                .settings(true)
                .unwrap()
                .logprobs
        };
        assert_eq!(chat(""), None);
        assert_eq!(chat(r#","logprobs":true"#), Some(0));
        assert_eq!(chat(r#","logprobs":true,"top_logprobs":20"#), Some(20));
        let text = |extra: &str| {
            let body = format!(r#"{{"prompt":"x"{extra}}}"#);
            parse::<CompletionRequest>(body.as_bytes())
                .unwrap()
                .common
                .settings(false)
                .unwrap()
                .logprobs
        };
        assert_eq!(text(r#","logprobs":3"#), Some(3));
        assert_eq!(text(r#","logprobs":0"#), Some(0));
        assert_eq!(text(r#","logprobs":null"#), None);
    }

    #[test]
    fn settings_reject_bad_values() {
        let bad = [
            r#"{"prompt":"x","max_tokens":0}"#,
            r#"{"prompt":"x","max_completion_tokens":-3}"#,
            r#"{"prompt":"x","temperature":3}"#,
            r#"{"prompt":"x","top_p":0}"#,
            r#"{"prompt":"x","n":2}"#,
            r#"{"prompt":"x","stop":["a","b","c","d","e"]}"#,
            r#"{"prompt":"x","stream_options":{"include_usage":true}}"#,
            r#"{"prompt":"x","top_k":-2}"#,
            r#"{"prompt":"x","min_p":1}"#,
            r#"{"prompt":"x","repetition_penalty":0}"#,
            r#"{"prompt":"x","presence_penalty":0.5}"#,
            r#"{"prompt":"x","frequency_penalty":-1}"#,
            r#"{"prompt":"x","logprobs":true}"#,
            r#"{"prompt":"x","logprobs":6}"#,
            r#"{"prompt":"x","logprobs":-1}"#,
            r#"{"prompt":"x","top_logprobs":2}"#,
        ];
        for body in bad {
            let r: CompletionRequest = parse(body.as_bytes()).unwrap();
            let e = r.common.settings(false).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert!(e.param.is_some(), "{body}");
        }
        let msgs = r#""messages":[{"role":"user","content":"hi"}]"#;
        for extra in [
            r#""top_logprobs":3"#,
            r#""logprobs":false,"top_logprobs":1"#,
            r#""logprobs":true,"top_logprobs":21"#,
            r#""logprobs":2"#,
        ] {
            let body = format!("{{{msgs},{extra}}}");
            let r: ChatRequest = parse(body.as_bytes()).unwrap();
            let e = r.common.settings(true).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
        }
        for body in [
            r#"{"prompt":"x""#,
            r#"[1]"#,
            r#"{"prompt":5}"#,
            r#"{"prompt":"x","stream":"yes"}"#,
        ] {
            assert_eq!(
                parse::<CompletionRequest>(body.as_bytes()).unwrap_err().status,
                400,
                "{body}"
            );
        }
    }
}
