//! The OpenAI request bodies, read field by field from JSON so that every bad field is a 400
//! naming it (`param`), and the error body OpenAI clients expect:
//! `{"error": {"message", "type", "param", "code"}}`.
//!
//! Fields this server does not act on are ignored when they ask for nothing (`user`,
//! `logprobs: null`, penalties of 0) and refused when they ask for what it cannot do (`n` > 1,
//! `best_of` > 1, `echo`, `logprobs`, non-zero penalties), rather than silently dropped.

use serde_json::{json, Map, Value};

use super::sample::SamplingParams;

/// The most stop strings a request may give (OpenAI's limit).
pub const MAX_STOPS: usize = 4;

/// An HTTP error with an OpenAI-style body.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `rate_limit_error`, `server_error`, ...
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()),
            code: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// What a completion request asks for, before tokenizing.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    /// Token ids given directly (`prompt: [1, 2, 3]`).
    Ids(Vec<u32>),
    /// Chat messages (role, content), rendered with the model's template.
    Chat(Vec<(String, String)>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub model: String,
    pub prompt: Prompt,
    /// None: as many as the context allows (chat) or 16 (completions, OpenAI's default).
    pub max_tokens: Option<u64>,
    pub sampling: SamplingParams,
    /// Whether the request named a temperature above 0 (greedy otherwise... or by default).
    pub temperature_given: bool,
    pub stop: Vec<String>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub stream_usage: bool,
    /// `ignore_eos` (vLLM's and llama.cpp's extension): generate past the end-of-sequence
    /// token up to `max_tokens`, as serving benchmarks ask for fixed output lengths.
    pub ignore_eos: bool,
}

fn type_error(param: &str, want: &str, got: &Value) -> ApiError {
    let got = match got {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    ApiError::bad(param, format!("'{param}' must be {want}, not {got}")).with_code("invalid_type")
}

/// The field `name` if present and not null.
fn field<'a>(o: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    o.get(name).filter(|v| !v.is_null())
}

fn number(o: &Map<String, Value>, name: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
    let Some(v) = field(o, name) else {
        return Ok(None);
    };
    let x = v.as_f64().ok_or_else(|| type_error(name, "a number", v))?;
    if !(lo..=hi).contains(&x) {
        return Err(ApiError::bad(
            name,
            format!("'{name}' is {x}; it must be between {lo} and {hi}"),
        ));
    }
    Ok(Some(x))
}

fn integer(o: &Map<String, Value>, name: &str) -> Result<Option<u64>, ApiError> {
    let Some(v) = field(o, name) else {
        return Ok(None);
    };
    match v.as_u64() {
        Some(n) => Ok(Some(n)),
        None if v.as_i64().is_some() => Err(ApiError::bad(
            name,
            format!("'{name}' is {v}; it must be at least 0"),
        )),
        None => Err(type_error(name, "a non-negative integer", v)),
    }
}

fn boolean(o: &Map<String, Value>, name: &str) -> Result<bool, ApiError> {
    match field(o, name) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(type_error(name, "a boolean", v)),
    }
}

fn unsupported(param: &str, what: &str) -> ApiError {
    ApiError::bad(param, format!("{what} is not supported by this server"))
        .with_code("unsupported_parameter")
}

/// Parses a `/v1/completions` (`chat` false) or `/v1/chat/completions` body.
pub fn parse(body: &[u8], chat: bool) -> Result<Request, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad("body", format!("the body is not valid JSON: {e}")).with_code("invalid_json")
    })?;
    let Value::Object(o) = &v else {
        return Err(type_error("body", "a JSON object", &v));
    };
    let model = match field(o, "model") {
        Some(Value::String(s)) => s.clone(),
        Some(v) => return Err(type_error("model", "a string", v)),
        None => return Err(ApiError::bad("model", "'model' is required")),
    };
    let prompt = if chat {
        Prompt::Chat(messages(o)?)
    } else {
        completion_prompt(o)?
    };
    if let Some(n) = integer(o, "n")? {
        if n != 1 {
            return Err(unsupported("n", &format!("n = {n} (more than one choice)")));
        }
    }
    if let Some(n) = integer(o, "best_of")? {
        if n != 1 {
            return Err(unsupported("best_of", &format!("best_of = {n}")));
        }
    }
    if boolean(o, "echo")? {
        return Err(unsupported("echo", "echo"));
    }
    match field(o, "logprobs") {
        None | Some(Value::Bool(false)) => {}
        Some(_) => return Err(unsupported("logprobs", "logprobs")),
    }
    for p in ["frequency_penalty", "presence_penalty"] {
        if number(o, p, -2.0, 2.0)?.is_some_and(|x| x != 0.0) {
            return Err(unsupported(p, p));
        }
    }
    let max_tokens = match integer(o, "max_completion_tokens")? {
        Some(n) if chat => Some(n),
        _ => integer(o, "max_tokens")?,
    };
    let temperature = number(o, "temperature", 0.0, 2.0)?;
    let top_p = number(o, "top_p", 0.0, 1.0)?;
    if top_p == Some(0.0) {
        return Err(ApiError::bad("top_p", "'top_p' must be above 0"));
    }
    let top_k = integer(o, "top_k")?.unwrap_or(0);
    let seed = match field(o, "seed") {
        None => None,
        // OpenAI's seeds are signed 64-bit: any integer is a seed.
        Some(v) => Some(
            v.as_u64()
                .or_else(|| v.as_i64().map(|i| i as u64))
                .ok_or_else(|| type_error("seed", "an integer", v))?,
        ),
    };
    let stop = match field(o, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            if a.len() > MAX_STOPS {
                return Err(ApiError::bad(
                    "stop",
                    format!("'stop' has {} strings; at most {MAX_STOPS}", a.len()),
                ));
            }
            a.iter()
                .map(|s| match s {
                    Value::String(s) => Ok(s.clone()),
                    v => Err(type_error("stop", "a string or an array of strings", v)),
                })
                .collect::<Result<_, _>>()?
        }
        Some(v) => return Err(type_error("stop", "a string or an array of strings", v)),
    };
    let stream = boolean(o, "stream")?;
    let ignore_eos = boolean(o, "ignore_eos")?;
    let stream_usage = match field(o, "stream_options") {
        None => false,
        Some(Value::Object(so)) => boolean(so, "include_usage")?,
        Some(v) => return Err(type_error("stream_options", "an object", v)),
    };
    Ok(Request {
        model,
        prompt,
        max_tokens,
        sampling: SamplingParams {
            // OpenAI's default temperature is 1.
            temperature: temperature.unwrap_or(1.0) as f32,
            top_k: usize::try_from(top_k).unwrap_or(usize::MAX),
            top_p: top_p.unwrap_or(1.0) as f32,
            seed: seed.unwrap_or(0),
        },
        temperature_given: temperature.is_some(),
        stop,
        stream,
        stream_usage,
        ignore_eos,
    })
    .map(|mut r| {
        if seed.is_none() {
            r.sampling.seed = fresh_seed();
        }
        r
    })
}

/// A seed for a request that gave none: different per request.
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ COUNTER
        .fetch_add(1, Ordering::Relaxed)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn completion_prompt(o: &Map<String, Value>) -> Result<Prompt, ApiError> {
    let bad = |v: &Value| {
        type_error(
            "prompt",
            "a string, an array of one string, or token ids",
            v,
        )
    };
    match field(o, "prompt") {
        None => Err(ApiError::bad("prompt", "'prompt' is required")),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(a)) => match a.as_slice() {
            [Value::String(s)] => Ok(Prompt::Text(s.clone())),
            [Value::String(_), _, ..] => Err(unsupported("prompt", "more than one prompt")),
            items => items
                .iter()
                .map(|x| {
                    x.as_u64()
                        .and_then(|i| u32::try_from(i).ok())
                        .ok_or_else(|| bad(x))
                })
                .collect::<Result<Vec<u32>, _>>()
                .map(Prompt::Ids),
        },
        Some(v) => Err(bad(v)),
    }
}

fn messages(o: &Map<String, Value>) -> Result<Vec<(String, String)>, ApiError> {
    let list = match field(o, "messages") {
        None => return Err(ApiError::bad("messages", "'messages' is required")),
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::bad("messages", "'messages' is empty"))
        }
        Some(Value::Array(a)) => a,
        Some(v) => return Err(type_error("messages", "an array", v)),
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let p = format!("messages[{i}]");
            let Value::Object(m) = m else {
                return Err(type_error(&p, "an object", m));
            };
            let role = match field(m, "role") {
                Some(Value::String(r)) => r.clone(),
                Some(v) => return Err(type_error(&format!("{p}.role"), "a string", v)),
                None => return Err(ApiError::bad(&format!("{p}.role"), "'role' is required")),
            };
            let content = match field(m, "content") {
                None => String::new(),
                Some(Value::String(s)) => s.clone(),
                // The content-parts form: text parts only.
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for (j, part) in parts.iter().enumerate() {
                        let pp = format!("{p}.content[{j}]");
                        match (part.get("type"), part.get("text")) {
                            (Some(Value::String(t)), Some(Value::String(s))) if t == "text" => {
                                text.push_str(s)
                            }
                            _ => return Err(unsupported(&pp, "a content part other than text")),
                        }
                    }
                    text
                }
                Some(v) => {
                    return Err(type_error(
                        &format!("{p}.content"),
                        "a string or an array of text parts",
                        v,
                    ))
                }
            };
            Ok((role, content))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str, chat: bool) -> ApiError {
        parse(body.as_bytes(), chat).unwrap_err()
    }

    #[test]
    fn reads_a_completion_and_a_chat() {
        let r = parse(
            br#"{"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"stop":"x","seed":-1,
                 "stream":true,"stream_options":{"include_usage":true},"user":"u","n":1,
                 "ignore_eos":true}"#,
            false,
        )
        .unwrap();
        assert_eq!(r.prompt, Prompt::Text("hi".into()));
        assert_eq!(r.max_tokens, Some(5));
        assert!(r.sampling.is_greedy() && r.temperature_given);
        assert_eq!(r.sampling.seed, u64::MAX);
        assert_eq!(r.stop, ["x"]);
        assert!(r.stream && r.stream_usage && r.ignore_eos);
        let r = parse(
            br#"{"model":"m","messages":[{"role":"system","content":"s"},
                 {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
                 "max_completion_tokens":3,"max_tokens":9,"top_p":0.5,"top_k":4}"#,
            true,
        )
        .unwrap();
        assert_eq!(
            r.prompt,
            Prompt::Chat(vec![
                ("system".into(), "s".into()),
                ("user".into(), "ab".into())
            ])
        );
        assert_eq!(r.max_tokens, Some(3));
        assert_eq!((r.sampling.top_p, r.sampling.top_k), (0.5, 4));
        assert_eq!(r.sampling.temperature, 1.0);
        assert!(!r.temperature_given);
        let r = parse(br#"{"model":"m","prompt":[3,4]}"#, false).unwrap();
        assert_eq!(r.prompt, Prompt::Ids(vec![3, 4]));
    }

    #[test]
    fn every_bad_field_is_a_400_naming_it() {
        let cases: &[(&str, bool, &str)] = &[
            ("{", false, "body"),
            ("[1]", false, "body"),
            (r#"{"prompt":"x"}"#, false, "model"),
            (r#"{"model":3,"prompt":"x"}"#, false, "model"),
            (r#"{"model":"m"}"#, false, "prompt"),
            (r#"{"model":"m","prompt":{"a":1}}"#, false, "prompt"),
            (r#"{"model":"m","prompt":[-1]}"#, false, "prompt"),
            (r#"{"model":"m","prompt":["a","b"]}"#, false, "prompt"),
            (
                r#"{"model":"m","prompt":"x","max_tokens":"5"}"#,
                false,
                "max_tokens",
            ),
            (
                r#"{"model":"m","prompt":"x","max_tokens":-5}"#,
                false,
                "max_tokens",
            ),
            (
                r#"{"model":"m","prompt":"x","max_tokens":1.5}"#,
                false,
                "max_tokens",
            ),
            (
                r#"{"model":"m","prompt":"x","temperature":3}"#,
                false,
                "temperature",
            ),
            (
                r#"{"model":"m","prompt":"x","temperature":"hot"}"#,
                false,
                "temperature",
            ),
            (r#"{"model":"m","prompt":"x","top_p":0}"#, false, "top_p"),
            (r#"{"model":"m","prompt":"x","n":2}"#, false, "n"),
            (
                r#"{"model":"m","prompt":"x","stream":"yes"}"#,
                false,
                "stream",
            ),
            (r#"{"model":"m","prompt":"x","stop":[1]}"#, false, "stop"),
            (
                r#"{"model":"m","prompt":"x","stop":["a","b","c","d","e"]}"#,
                false,
                "stop",
            ),
            (r#"{"model":"m","prompt":"x","seed":"s"}"#, false, "seed"),
            (
                r#"{"model":"m","prompt":"x","ignore_eos":1}"#,
                false,
                "ignore_eos",
            ),
            (r#"{"model":"m","prompt":"x","echo":true}"#, false, "echo"),
            (
                r#"{"model":"m","prompt":"x","logprobs":2}"#,
                false,
                "logprobs",
            ),
            (
                r#"{"model":"m","prompt":"x","presence_penalty":1}"#,
                false,
                "presence_penalty",
            ),
            (r#"{"model":"m"}"#, true, "messages"),
            (r#"{"model":"m","messages":[]}"#, true, "messages"),
            (r#"{"model":"m","messages":"hi"}"#, true, "messages"),
            (r#"{"model":"m","messages":[1]}"#, true, "messages[0]"),
            (
                r#"{"model":"m","messages":[{"content":"x"}]}"#,
                true,
                "messages[0].role",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":5}]}"#,
                true,
                "messages[0].content",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
                true,
                "messages[0].content[0]",
            ),
        ];
        for (body, chat, param) in cases {
            let e = err(body, *chat);
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(*param), "{body}: {}", e.message);
            let b = e.body();
            assert!(b["error"]["message"].is_string() && b["error"]["type"].is_string());
            assert!(b["error"].get("param").is_some() && b["error"].get("code").is_some());
        }
    }
}
