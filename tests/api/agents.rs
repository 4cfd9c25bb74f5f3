//! Small real agents for the gateway tests: an HTTP server on a loopback
//! port of its own with AIDIP REST agents (echo, slow, failing, streaming,
//! ...), a WoA host document and invocation route, and an A2A Agent Card.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde_json::{json, Value};

/// What the agents saw.
#[derive(Default)]
pub struct Seen {
    /// Calls that reached any agent.
    pub calls: AtomicUsize,
    /// The counting agent's count.
    pub count: AtomicUsize,
    /// Set when an endless stream's client went away.
    pub cancelled: AtomicBool,
    /// Headers of the last call: idempotency key, API key, authorization.
    pub last_headers: Mutex<Vec<(String, String)>>,
    /// The last WoA envelope received.
    pub last_envelope: Mutex<Value>,
    /// The WoA document served (replaceable by a test).
    pub woa: Mutex<Value>,
    /// GETs of the WoA document, and how many were answered 304.
    pub woa_fetches: AtomicUsize,
    pub woa_not_modified: AtomicUsize,
}

pub struct Agents {
    /// `http://127.0.0.1:<port>`
    pub base: String,
    pub port: u16,
    pub seen: Arc<Seen>,
}

#[derive(Clone)]
struct S {
    seen: Arc<Seen>,
    port: u16,
}

fn record(s: &S, headers: &HeaderMap) {
    s.seen.calls.fetch_add(1, Ordering::SeqCst);
    let keep = ["idempotency-key", "x-api-key", "authorization"];
    *s.seen.last_headers.lock().unwrap() = headers
        .iter()
        .filter(|(k, _)| keep.contains(&k.as_str()))
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
}

fn problem(status: u16, detail: &str) -> Response {
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/problem+json")],
        json!({"type": "about:blank", "title": "Refused", "status": status, "detail": detail})
            .to_string(),
    )
        .into_response()
}

async fn echo(State(s): State<S>, headers: HeaderMap, Json(v): Json<Value>) -> Response {
    record(&s, &headers);
    Json(json!({"echo": v})).into_response()
}

async fn bad_output(State(s): State<S>, headers: HeaderMap) -> Response {
    record(&s, &headers);
    Json(json!({"unexpected": 1})).into_response()
}

async fn slow(State(s): State<S>, headers: HeaderMap) -> Response {
    record(&s, &headers);
    tokio::time::sleep(Duration::from_secs(5)).await;
    Json(json!({"late": true})).into_response()
}

async fn fail(State(s): State<S>, headers: HeaderMap) -> Response {
    record(&s, &headers);
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "stack trace with secrets",
    )
        .into_response()
}

async fn busy(State(s): State<S>, headers: HeaderMap) -> Response {
    record(&s, &headers);
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [("retry-after", "7")],
        "busy",
    )
        .into_response()
}

async fn html(State(s): State<S>, headers: HeaderMap) -> Response {
    record(&s, &headers);
    ([("content-type", "text/html")], "<html>hello</html>").into_response()
}

async fn huge(State(s): State<S>, headers: HeaderMap) -> Response {
    record(&s, &headers);
    Json(json!({"blob": "x".repeat(200 * 1024)})).into_response()
}

async fn refuse(State(s): State<S>, headers: HeaderMap) -> Response {
    record(&s, &headers);
    problem(422, "the text is too long for this agent")
}

/// What `/keyed` asks for when it refuses a call's key.
pub const KEYED_CHALLENGE: &str = r#"ApiKey realm="keyed agent", header="X-API-Key""#;

async fn keyed(State(s): State<S>, headers: HeaderMap) -> Response {
    record(&s, &headers);
    match headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        Some("agent-secret") => Json(json!({"ok": true})).into_response(),
        _ => {
            let mut refused = problem(401, "missing or wrong X-API-Key");
            refused.headers_mut().insert(
                "www-authenticate",
                HeaderValue::from_static(KEYED_CHALLENGE),
            );
            refused
        }
    }
}

async fn count(State(s): State<S>, headers: HeaderMap) -> Response {
    record(&s, &headers);
    let n = s.seen.count.fetch_add(1, Ordering::SeqCst) + 1;
    Json(json!({"count": n})).into_response()
}

async fn redirect(State(s): State<S>, headers: HeaderMap) -> Response {
    record(&s, &headers);
    (
        StatusCode::TEMPORARY_REDIRECT,
        [("location", format!("http://127.0.0.1:{}/echo", s.port))],
    )
        .into_response()
}

async fn stream(State(s): State<S>, headers: HeaderMap) -> Response {
    record(&s, &headers);
    let events = futures::stream::iter(["a", "b", "c"]).then(|t| async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        Ok::<_, Infallible>(Event::default().event("token").data(t).id(t))
    });
    Sse::new(events).into_response()
}

/// Sets `cancelled` when the stream (and so the connection) is dropped.
struct OnDrop(Arc<Seen>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.cancelled.store(true, Ordering::SeqCst);
    }
}

async fn endless(State(s): State<S>, headers: HeaderMap) -> Response {
    record(&s, &headers);
    let guard = OnDrop(s.seen.clone());
    let events = futures::stream::unfold((guard, 0u64), |(guard, n)| async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Some((
            Ok::<_, Infallible>(Event::default().event("tick").data(n.to_string())),
            (guard, n + 1),
        ))
    });
    Sse::new(events).into_response()
}

/// An event stream whose first event never ends: one `data` line that
/// goes on for ever.
async fn flood(State(s): State<S>, headers: HeaderMap) -> Response {
    record(&s, &headers);
    let line = axum::body::Bytes::from("x".repeat(16 * 1024));
    let body = futures::stream::once(async { axum::body::Bytes::from_static(b"data: ") })
        .chain(futures::stream::repeat(line))
        .map(Ok::<_, Infallible>);
    (
        [("content-type", "text/event-stream")],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

async fn woa_invoke(
    State(s): State<S>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(env): Json<Value>,
) -> Response {
    record(&s, &headers);
    *s.seen.last_envelope.lock().unwrap() = env.clone();
    if env["agent"] != json!(id) {
        return problem(400, "the envelope names another agent");
    }
    if id == "refuser" {
        return problem(409, "this agent refuses everything");
    }
    Json(json!({"summary": format!("summary of {}", env["input"]["text"].as_str().unwrap_or(""))}))
        .into_response()
}

/// The WoA document with a strong ETag of its text; a matching
/// If-None-Match gets 304 (and is counted).
async fn woa_doc(State(s): State<S>, headers: HeaderMap) -> Response {
    use std::hash::{Hash, Hasher};
    let text = s.seen.woa.lock().unwrap().to_string();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    let etag = format!("\"{:x}\"", h.finish());
    s.seen.woa_fetches.fetch_add(1, Ordering::SeqCst);
    if headers.get("if-none-match").and_then(|v| v.to_str().ok()) == Some(etag.as_str()) {
        s.seen.woa_not_modified.fetch_add(1, Ordering::SeqCst);
        return (StatusCode::NOT_MODIFIED, [("etag", etag)]).into_response();
    }
    (
        [
            ("content-type", "application/woa+json".to_string()),
            ("etag", etag),
            ("cache-control", "max-age=1".to_string()),
        ],
        text,
    )
        .into_response()
}

async fn agent_card(State(s): State<S>) -> Response {
    Json(a2a_card(s.port)).into_response()
}

/// An A2A Agent Card as a real A2A server publishes it (v0.3 fields).
pub fn a2a_card(port: u16) -> Value {
    json!({
        "protocolVersion": "0.3.0",
        "name": "Currency Agent",
        "description": "Converts amounts between currencies using daily reference rates.",
        "url": format!("http://127.0.0.1:{port}/a2a/v1"),
        "preferredTransport": "JSONRPC",
        "additionalInterfaces": [
            {"url": format!("http://127.0.0.1:{port}/a2a/v1"), "transport": "JSONRPC"},
            {"url": format!("http://127.0.0.1:{port}/a2a/rest"), "transport": "HTTP+JSON"}
        ],
        "provider": {"organization": "Example Finance", "url": "https://finance.example"},
        "version": "1.2.0",
        "capabilities": {"streaming": true, "pushNotifications": false},
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "security": [{"bearer": []}],
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": [{
            "id": "convert_currency",
            "name": "Currency conversion",
            "description": "Converts an amount from one currency to another.",
            "tags": ["currency", "finance"],
            "examples": ["How much is 100 USD in EUR?", "Convert 50 GBP to JPY"]
        }]
    })
}

/// The WoA document the test host serves at first: a summarizer over
/// REST, a refusing agent, and one with only a private transport.
pub fn woa_document(port: u16) -> Value {
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"text": {"type": "string"}, "max_words": {"type": "integer", "minimum": 10}},
        "required": ["text"]
    });
    json!({
        "woa_version": "1",
        "agents": [
            {
                "id": "summarizer",
                "name": "Document Summarizer",
                "description": "Summarizes English text.",
                "version": "1.0.0",
                "capabilities": ["https://example.com/capability/summarization"],
                "inputs": schema,
                "outputs": {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]},
                "transports": ["rest", "com.example.carrier-pigeon"],
                "operations": [{"name": "default", "description": "Default summarization operation."}]
            },
            {
                "id": "refuser",
                "name": "Refuser",
                "description": "Refuses every request.",
                "inputs": {"type": "object"},
                "outputs": {"type": "object"},
                "transports": ["rest"]
            },
            {
                "id": "pigeon_only",
                "name": "Pigeon",
                "description": "Reachable by private transport only.",
                "inputs": {"type": "object"},
                "outputs": {"type": "object"},
                "transports": ["com.example.carrier-pigeon"]
            }
        ],
        "transports": {
            "rest": {"base": format!("http://127.0.0.1:{port}"), "invoke_path": "/woa/agents/{agent_id}/invoke"},
            "com.example.carrier-pigeon": {"loft": "north"}
        }
    })
}

impl Agents {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Seen::default());
        *seen.woa.lock().unwrap() = woa_document(port);
        let state = S {
            seen: seen.clone(),
            port,
        };
        let app = Router::new()
            .route("/echo", post(echo))
            .route("/bad-output", post(bad_output))
            .route("/slow", post(slow))
            .route("/fail", post(fail))
            .route("/busy", post(busy))
            .route("/html", post(html))
            .route("/huge", post(huge))
            .route("/refuse", post(refuse))
            .route("/keyed", post(keyed))
            .route("/count", post(count))
            .route("/redirect", post(redirect))
            .route("/stream", post(stream))
            .route("/endless", post(endless))
            .route("/flood", post(flood))
            .route("/woa/agents/{id}/invoke", post(woa_invoke))
            .route("/.well-known/woa.json", get(woa_doc))
            .route("/.well-known/agent-card.json", get(agent_card))
            .with_state(state);
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            base: format!("http://127.0.0.1:{port}"),
            port,
            seen,
        }
    }

    pub fn calls(&self) -> usize {
        self.seen.calls.load(Ordering::SeqCst)
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.seen
            .last_headers
            .lock()
            .unwrap()
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}
