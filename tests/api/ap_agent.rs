//! A small but real Agent Protocol (AP, supercog-ai/agent-protocol, draft
//! 2025) agent for the gateway tests: an HTTP server on a loopback port of
//! its own serving one agent, "researcher", at `/agents/researcher`, with
//! the AP REST surface (`/describe`, `/run`, `/get_events`,
//! `/stream_request`, `/runs/{run_id}`, `/threads`) and the discovery list
//! at `/`.
//!
//! A ChatRequest starts a run that publishes a scripted event sequence in a
//! background task (text, a `web_search` tool call and its result, then
//! `RunCompleted`), ~20 ms apart. An input containing "ask me" pauses the
//! run with `WaitForInput` until a `ResumeWithInput`; one containing
//! "forever" emits `TextOutput` every 50 ms until a `CancelRequest`.
//!
//! Every run keeps its events in order (ids 0, 1, ... within the run);
//! followers (`get_events?stream=true`, `stream_request`) read from that log
//! and are woken by a per-run `watch` channel, so they never miss or repeat
//! an event and a client going away does not affect the run. Appending is
//! refused once a run has completed, so a cancelled run's task cannot add
//! anything after its `RunCompleted`.
//!
//! The tests at the bottom check the server itself against the document.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use tokio::sync::{oneshot, watch};
use tokio::task::AbortHandle;
use uuid::Uuid;

/// The agent's name (also the `agent` field of its events).
const NAME: &str = "researcher";
/// The agent's path; every AP endpoint but `/` is relative to it.
const PATH: &str = "/agents/researcher";
/// Pacing of the scripted research run.
const STEP: Duration = Duration::from_millis(20);
/// Pacing of the "forever" run.
const TICK: Duration = Duration::from_millis(50);

/// A running AP agent server.
pub struct ApAgent {
    /// `http://127.0.0.1:<port>/agents/researcher`
    pub base: String,
    pub port: u16,
    pub state: Arc<ApState>,
}

/// What the agent holds: its runs and threads, and a request count.
pub struct ApState {
    requests: AtomicUsize,
    book: Mutex<Book>,
}

#[derive(Default)]
struct Book {
    /// Runs by id; never removed.
    runs: HashMap<String, Run>,
    /// Run ids in the order the runs started.
    run_order: Vec<String>,
    /// Threads in the order they started.
    threads: Vec<Thread>,
}

struct Thread {
    id: String,
    /// Its runs in the order they started.
    runs: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Status {
    Running,
    Waiting,
    Completed,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Waiting => "waiting",
            Status::Completed => "completed",
        }
    }
}

struct Run {
    id: String,
    thread_id: String,
    /// The ChatRequest body that started the run, as received.
    request: Value,
    status: Status,
    finish_reason: Option<String>,
    cancelled: bool,
    /// The run's events; an event's `id` is its index here.
    events: Vec<Value>,
    /// The number of events, bumped on every append to wake followers.
    published: watch::Sender<usize>,
    /// The run's background task, aborted on cancel.
    task: Option<AbortHandle>,
    /// Set while the run waits for input: where ResumeWithInput's topic goes.
    resume: Option<oneshot::Sender<String>>,
}

impl Run {
    /// Appends an event of `kind` with the Event base fields followed by
    /// `fields`, updates the status it implies and wakes followers. None
    /// (and nothing appended) once the run has completed.
    fn push(&mut self, kind: &str, role: &str, fields: Value) -> Option<Value> {
        if self.status == Status::Completed {
            return None;
        }
        let mut event = json!({
            "id": self.events.len(),
            "run_id": self.id,
            "thread_id": self.thread_id,
            "agent": NAME,
            "type": kind,
            "role": role,
            "depth": 0,
        });
        if let (Some(base), Value::Object(own)) = (event.as_object_mut(), fields) {
            base.extend(own);
        }
        match kind {
            "WaitForInput" => self.status = Status::Waiting,
            "RunCompleted" => {
                self.status = Status::Completed;
                self.finish_reason = event["finish_reason"].as_str().map(String::from);
            }
            _ => {}
        }
        self.events.push(event.clone());
        self.published.send_replace(self.events.len());
        Some(event)
    }

    /// The `GET /runs/{run_id}` object.
    fn status_json(&self) -> Value {
        json!({
            "run_id": self.id,
            "thread_id": self.thread_id,
            "status": self.status.as_str(),
            "finish_reason": self.finish_reason,
            "events": self.events.len(),
        })
    }
}

/// An RFC 9457 problem answer.
struct Problem(StatusCode, String);

impl Problem {
    fn bad_request(detail: impl Into<String>) -> Self {
        Problem(StatusCode::BAD_REQUEST, detail.into())
    }
    fn unknown_run(run_id: &str) -> Self {
        Problem(StatusCode::NOT_FOUND, format!("no run {run_id}"))
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let Problem(status, detail) = self;
        let body = json!({
            "type": "about:blank",
            "title": status.canonical_reason().unwrap_or("Error"),
            "status": status.as_u16(),
            "detail": detail,
        });
        (
            status,
            [("content-type", "application/problem+json")],
            body.to_string(),
        )
            .into_response()
    }
}

/// An AP Request, as `/run` and `/stream_request` accept it.
enum ApRequest {
    Chat {
        input: String,
        thread_id: Option<String>,
        body: Value,
    },
    Cancel {
        run_id: String,
    },
    Resume {
        run_id: String,
        topic: String,
    },
}

/// A member that must be a string when present (null counts as absent).
fn opt_string(obj: &Map<String, Value>, name: &str) -> Result<Option<String>, Problem> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(Problem::bad_request(format!("`{name}` must be a string"))),
    }
}

fn string(obj: &Map<String, Value>, name: &str) -> Result<String, Problem> {
    opt_string(obj, name)?.ok_or_else(|| Problem::bad_request(format!("`{name}` is required")))
}

/// A member that must be an object when present (null counts as absent).
fn opt_object<'a>(
    obj: &'a Map<String, Value>,
    name: &str,
) -> Result<Option<&'a Map<String, Value>>, Problem> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(_) => Err(Problem::bad_request(format!("`{name}` must be an object"))),
    }
}

/// Reads a Request body. Its type is the `type` member; without one, a
/// body with `input` is a ChatRequest.
fn parse_request(body: &[u8]) -> Result<ApRequest, Problem> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| Problem::bad_request(format!("the body is not JSON: {e}")))?;
    let Some(obj) = value.as_object() else {
        return Err(Problem::bad_request("a Request is a JSON object"));
    };
    // The members every Request may carry.
    opt_string(obj, "logging_level")?;
    opt_object(obj, "request_metadata")?;
    let kind = match obj.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        None if obj.contains_key("input") => "ChatRequest",
        None => return Err(Problem::bad_request("the Request has no `type`")),
        Some(_) => return Err(Problem::bad_request("`type` must be a string")),
    };
    match kind {
        "ChatRequest" => {
            let input = string(obj, "input")?;
            let thread_id = opt_string(obj, "thread_id")?;
            opt_object(obj, "run_context")?;
            Ok(ApRequest::Chat {
                input,
                thread_id,
                body: value.clone(),
            })
        }
        "CancelRequest" => Ok(ApRequest::Cancel {
            run_id: string(obj, "run_id")?,
        }),
        "ResumeWithInput" => {
            let run_id = string(obj, "run_id")?;
            let keys = opt_object(obj, "request_keys")?
                .ok_or_else(|| Problem::bad_request("`request_keys` is required"))?;
            let topic = string(keys, "topic")
                .map_err(|_| Problem::bad_request("`request_keys.topic` must be a string"))?;
            Ok(ApRequest::Resume { run_id, topic })
        }
        other => Err(Problem::bad_request(format!(
            "unsupported Request type {other:?}"
        ))),
    }
}

/// A boolean query parameter: `true`/`false` in any case (the AP examples
/// write `wait=True`), or `1`/`0`.
fn flag(params: &HashMap<String, String>, name: &str) -> Result<bool, Problem> {
    match params.get(name).map(|v| v.to_ascii_lowercase()).as_deref() {
        None | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") => Ok(true),
        Some(other) => Err(Problem::bad_request(format!(
            "`{name}` must be true or false, not {other:?}"
        ))),
    }
}

impl ApState {
    /// Requests received on any route (unknown ones included).
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Run ids in the order the runs started.
    pub fn run_ids(&self) -> Vec<String> {
        self.book().run_order.clone()
    }

    /// Whether a CancelRequest stopped this run.
    pub fn was_cancelled(&self, run_id: &str) -> bool {
        self.book().runs.get(run_id).is_some_and(|r| r.cancelled)
    }

    /// The run's events so far.
    pub fn events(&self, run_id: &str) -> Vec<Value> {
        self.book()
            .runs
            .get(run_id)
            .map(|r| r.events.clone())
            .unwrap_or_default()
    }

    /// The ChatRequest body that started the run, as received (to check
    /// what a proxy forwarded: `run_context`, `request_metadata`, ...).
    pub fn request(&self, run_id: &str) -> Option<Value> {
        self.book().runs.get(run_id).map(|r| r.request.clone())
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap()
    }

    /// Appends an event to a run; None once the run has completed.
    fn publish(&self, run_id: &str, kind: &str, role: &str, fields: Value) -> Option<Value> {
        self.book().runs.get_mut(run_id)?.push(kind, role, fields)
    }

    /// Starts a run for a ChatRequest, on `thread_id` when that thread
    /// exists and on a new thread otherwise; returns its RunStarted event.
    fn start_run(self: &Arc<Self>, input: String, thread_id: Option<String>, body: Value) -> Value {
        let run_id = Uuid::new_v4().to_string();
        let mut book = self.book();
        let thread = match thread_id.and_then(|t| book.threads.iter().position(|th| th.id == t)) {
            Some(i) => i,
            None => {
                book.threads.push(Thread {
                    id: Uuid::new_v4().to_string(),
                    runs: Vec::new(),
                });
                book.threads.len() - 1
            }
        };
        book.threads[thread].runs.push(run_id.clone());
        let mut run = Run {
            id: run_id.clone(),
            thread_id: book.threads[thread].id.clone(),
            request: body,
            status: Status::Running,
            finish_reason: None,
            cancelled: false,
            events: Vec::new(),
            published: watch::channel(0).0,
            task: None,
            resume: None,
        };
        let started = run
            .push("RunStarted", "system", json!({}))
            .expect("a new run is running");
        // Spawned under the lock: the task's first append waits for it, so
        // the run is in the book before the task can touch it.
        let (state, id) = (self.clone(), run_id.clone());
        let task = if input.contains("ask me") {
            tokio::spawn(ask_then_research(state, id))
        } else if input.contains("forever") {
            tokio::spawn(work_forever(state, id))
        } else {
            tokio::spawn(research(state, id, input))
        };
        run.task = Some(task.abort_handle());
        book.runs.insert(run_id.clone(), run);
        book.run_order.push(run_id);
        started
    }

    /// Stops a run that has not completed; returns its final RunCompleted.
    fn cancel(&self, run_id: &str) -> Result<Value, Problem> {
        let mut book = self.book();
        let run = book
            .runs
            .get_mut(run_id)
            .ok_or_else(|| Problem::unknown_run(run_id))?;
        if run.status == Status::Completed {
            return Err(Problem(
                StatusCode::CONFLICT,
                format!("run {run_id} has already completed"),
            ));
        }
        if let Some(task) = run.task.take() {
            task.abort();
        }
        run.resume = None;
        run.cancelled = true;
        Ok(run
            .push(
                "RunCompleted",
                "system",
                json!({"finish_reason": "canceled"}),
            )
            .expect("checked above that the run has not completed"))
    }

    /// Resumes a run waiting for input; returns its status object.
    fn resume(&self, run_id: &str, topic: String) -> Result<Value, Problem> {
        let mut book = self.book();
        let run = book
            .runs
            .get_mut(run_id)
            .ok_or_else(|| Problem::unknown_run(run_id))?;
        if run.status != Status::Waiting {
            return Err(Problem(
                StatusCode::CONFLICT,
                format!(
                    "run {run_id} is {}, not waiting for input",
                    run.status.as_str()
                ),
            ));
        }
        let resume = run.resume.take().expect("a waiting run has a resume slot");
        run.status = Status::Running;
        // The receiver only goes away with an aborted (cancelled, so
        // completed) task, which was ruled out above.
        let _ = resume.send(topic);
        Ok(run.status_json())
    }

    /// A follower of the run's events from index `next` on; None for an
    /// unknown run.
    fn follow(self: &Arc<Self>, run_id: &str, next: usize) -> Option<Follower> {
        let published = self.book().runs.get(run_id)?.published.subscribe();
        Some(Follower {
            state: self.clone(),
            run_id: run_id.to_string(),
            next,
            published,
            done: false,
        })
    }
}

/// The scripted research run: text, a web search and its result, a
/// summary, then RunCompleted. Stops as soon as the run is cancelled.
async fn research(state: Arc<ApState>, run_id: String, input: String) {
    let summary = format!("Found 3 sources about {input}.");
    let steps = [
        (
            "TextOutput",
            "assistant",
            json!({"content": format!("Researching: {input}")}),
        ),
        (
            "ToolCall",
            "assistant",
            json!({"function_name": "web_search", "args": {"query": input}}),
        ),
        (
            "ToolResult",
            "tool",
            json!({"function_name": "web_search", "text_result": "3 results"}),
        ),
        ("TextOutput", "assistant", json!({"content": summary})),
        (
            "RunCompleted",
            "assistant",
            json!({"finish_reason": "success", "result": summary}),
        ),
    ];
    for (kind, role, fields) in steps {
        tokio::time::sleep(STEP).await;
        if state.publish(&run_id, kind, role, fields).is_none() {
            return;
        }
    }
}

/// Asks for a topic with WaitForInput, then researches the topic that
/// ResumeWithInput supplies.
async fn ask_then_research(state: Arc<ApState>, run_id: String) {
    tokio::time::sleep(STEP).await;
    let (resume, resumed) = oneshot::channel();
    {
        // The event and the resume slot go in together, so a run seen
        // waiting always has somewhere to send its input.
        let mut book = state.book();
        let Some(run) = book.runs.get_mut(&run_id) else {
            return;
        };
        let asked = json!({"request_keys": {"topic": "Which topic should I research?"}});
        if run.push("WaitForInput", "assistant", asked).is_none() {
            return;
        }
        run.resume = Some(resume);
    }
    // An error means the run was cancelled while waiting.
    if let Ok(topic) = resumed.await {
        research(state, run_id, topic).await;
    }
}

/// "still working" every 50 ms until cancelled.
async fn work_forever(state: Arc<ApState>, run_id: String) {
    loop {
        tokio::time::sleep(TICK).await;
        let fields = json!({"content": "still working"});
        if state
            .publish(&run_id, "TextOutput", "assistant", fields)
            .is_none()
        {
            return;
        }
    }
}

/// Reads a run's events in order, waiting for new ones, until the one
/// after RunCompleted.
struct Follower {
    state: Arc<ApState>,
    run_id: String,
    /// Index of the next event to hand out.
    next: usize,
    published: watch::Receiver<usize>,
    done: bool,
}

impl Follower {
    async fn next_event(&mut self) -> Option<Value> {
        while !self.done {
            let (event, completed) = {
                let book = self.state.book();
                let run = &book.runs[&self.run_id];
                (
                    run.events.get(self.next).cloned(),
                    run.status == Status::Completed,
                )
            };
            match event {
                Some(event) => {
                    self.next += 1;
                    self.done = event["type"] == "RunCompleted";
                    return Some(event);
                }
                // Completed and nothing left: RunCompleted was before `since`.
                None if completed => self.done = true,
                // Any append after subscribing marks the channel changed, so
                // one made since the read above is not missed.
                None => self.done = self.published.changed().await.is_err(),
            }
        }
        None
    }

    /// The events as SSE: `event: <type>`, `id: <id>`, `data: <event JSON>`.
    fn into_sse(self) -> Response {
        let events = futures::stream::unfold(self, |mut follower| async move {
            let event = follower.next_event().await?;
            let sse = SseEvent::default()
                .event(event["type"].as_str().unwrap_or_default())
                .id(event["id"].to_string())
                .data(event.to_string());
            Some((Ok::<_, Infallible>(sse), follower))
        });
        Sse::new(events).into_response()
    }
}

async fn discovery() -> Json<Value> {
    Json(json!([[NAME, PATH]]))
}

async fn describe() -> Json<Value> {
    Json(json!({
        "name": NAME,
        "purpose": "Researches a topic on the web and summarises what it found.",
        "endpoints": ["/describe", "/run", "/get_events", "/stream_request", "/runs", "/threads"],
        "operations": [{
            "name": "chat",
            "description": "Ask a research question.",
            "input_schema": {
                "type": "object",
                "properties": {"input": {"type": "string"}},
                "required": ["input"]
            },
            "output_schema": {"type": "object", "properties": {"output": {"type": "string"}}}
        }],
        "tools": ["web_search"]
    }))
}

/// `POST /run?wait=`: 200 with an event (or status object) when waiting,
/// else 202 with no body.
async fn run(
    State(state): State<Arc<ApState>>,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Result<Response, Problem> {
    let wait = flag(&params, "wait")?;
    let answer = match parse_request(&body)? {
        ApRequest::Chat {
            input,
            thread_id,
            body,
        } => state.start_run(input, thread_id, body),
        ApRequest::Cancel { run_id } => state.cancel(&run_id)?,
        ApRequest::Resume { run_id, topic } => state.resume(&run_id, topic)?,
    };
    Ok(if wait {
        Json(answer).into_response()
    } else {
        StatusCode::ACCEPTED.into_response()
    })
}

/// `GET /get_events/{run_id}?stream=&since=`, or all events of a thread
/// (JSON only) for `GET /get_events/{thread_id}`.
async fn get_events(
    State(state): State<Arc<ApState>>,
    Path(id): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, Problem> {
    let stream = flag(&params, "stream")?;
    let since = params
        .get("since")
        .map(|s| s.parse::<i64>())
        .transpose()
        .map_err(|_| Problem::bad_request("`since` must be an event id"))?;
    // The first event wanted: the one after `since`, else the first.
    let next = since.map_or(0, |n| usize::try_from(n.saturating_add(1)).unwrap_or(0));
    let book = state.book();
    if let Some(run) = book.runs.get(&id) {
        if !stream {
            let events = run.events.get(next..).unwrap_or_default();
            return Ok(Json(events).into_response());
        }
        drop(book);
        let follower = state.follow(&id, next).expect("runs are never removed");
        return Ok(follower.into_sse());
    }
    let Some(thread) = book.threads.iter().find(|t| t.id == id) else {
        return Err(Problem(
            StatusCode::NOT_FOUND,
            format!("no run or thread {id}"),
        ));
    };
    if stream || since.is_some() {
        return Err(Problem::bad_request(
            "a thread's events are served whole, as JSON (no `stream`, no `since`)",
        ));
    }
    let events: Vec<&Value> = thread
        .runs
        .iter()
        .flat_map(|r| &book.runs[r].events)
        .collect();
    Ok(Json(events).into_response())
}

/// `POST /stream_request`: a ChatRequest run streamed as SSE to its end.
async fn stream_request(
    State(state): State<Arc<ApState>>,
    body: Bytes,
) -> Result<Response, Problem> {
    let ApRequest::Chat {
        input,
        thread_id,
        body,
    } = parse_request(&body)?
    else {
        return Err(Problem::bad_request(
            "stream_request takes a ChatRequest; send other Requests to /run",
        ));
    };
    let started = state.start_run(input, thread_id, body);
    let run_id = started["run_id"].as_str().unwrap_or_default();
    let follower = state.follow(run_id, 0).expect("the run just started");
    Ok(follower.into_sse())
}

async fn run_status(
    State(state): State<Arc<ApState>>,
    Path(run_id): Path<String>,
) -> Result<Json<Value>, Problem> {
    let book = state.book();
    let run = book
        .runs
        .get(&run_id)
        .ok_or_else(|| Problem::unknown_run(&run_id))?;
    Ok(Json(run.status_json()))
}

async fn threads(State(state): State<Arc<ApState>>) -> Json<Value> {
    let book = state.book();
    let threads: Vec<Value> = book
        .threads
        .iter()
        .map(|t| json!({"thread_id": t.id, "runs": t.runs}))
        .collect();
    Json(Value::Array(threads))
}

async fn not_found() -> Problem {
    Problem(StatusCode::NOT_FOUND, "no such endpoint".into())
}

async fn count_requests(
    State(state): State<Arc<ApState>>,
    request: Request,
    next: Next,
) -> Response {
    state.requests.fetch_add(1, Ordering::SeqCst);
    next.run(request).await
}

impl ApAgent {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(ApState {
            requests: AtomicUsize::new(0),
            book: Mutex::new(Book::default()),
        });
        let agent = Router::new()
            .route("/describe", get(describe))
            .route("/run", post(run))
            .route("/get_events/{id}", get(get_events))
            .route("/stream_request", post(stream_request))
            .route("/runs/{run_id}", get(run_status))
            .route("/threads", get(threads));
        let app = Router::new()
            .route("/", get(discovery))
            .nest(PATH, agent)
            .fallback(not_found)
            .layer(middleware::from_fn_with_state(
                state.clone(),
                count_requests,
            ))
            .with_state(state.clone());
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            base: format!("http://127.0.0.1:{port}{PATH}"),
            port,
            state,
        }
    }
}

// ---------------------------------------------------------------------------
// The server against the AP document.

/// How long any single wait in these tests may take.
const PATIENCE: Duration = Duration::from_secs(5);

/// One SSE message.
#[derive(Debug)]
struct Frame {
    event: String,
    id: String,
    data: Value,
}

/// Parses one SSE message block (`field: value` lines).
fn parse_frame(block: &str) -> Option<Frame> {
    let (mut event, mut id, mut data) = (String::new(), String::new(), Vec::new());
    for line in block.lines() {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => event = value.to_string(),
            "id" => id = value.to_string(),
            "data" => data.push(value),
            _ => {} // comments (empty field) and retry
        }
    }
    if data.is_empty() {
        return None;
    }
    let data = serde_json::from_str(&data.join("\n")).expect("SSE data is an event as JSON");
    Some(Frame { event, id, data })
}

/// Parses a whole SSE body.
fn parse_sse(text: &str) -> Vec<Frame> {
    text.split("\n\n").filter_map(parse_frame).collect()
}

/// Reads SSE messages one at a time from a response as they arrive.
struct SseReader {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl SseReader {
    fn new(resp: reqwest::Response) -> Self {
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        Self {
            resp,
            buf: Vec::new(),
        }
    }

    /// The next message; None when the stream has ended.
    async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                if let Some(frame) = parse_frame(std::str::from_utf8(&block).unwrap()) {
                    return Some(frame);
                }
                continue;
            }
            let chunk = tokio::time::timeout(PATIENCE, self.resp.chunk())
                .await
                .expect("the SSE stream stalled")
                .unwrap()?;
            self.buf.extend_from_slice(&chunk);
        }
    }

    /// Messages up to and including the first of type `kind`.
    async fn until(&mut self, kind: &str) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some(frame) = self.next().await {
            let last = frame.event == kind;
            frames.push(frame);
            if last {
                return frames;
            }
        }
        panic!("the stream ended before {kind}: {frames:?}");
    }
}

/// A test client of one agent.
struct Ap {
    http: reqwest::Client,
    base: String,
}

impl Ap {
    fn new(agent: &ApAgent) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: agent.base.clone(),
        }
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
    }

    async fn get_json(&self, path: &str) -> Value {
        let resp = self.get(path).await;
        assert_eq!(resp.status(), 200, "GET {path}");
        resp.json().await.unwrap()
    }

    async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// `POST /run?wait=true`, expecting 200; the answer.
    async fn run_wait(&self, request: Value) -> Value {
        let resp = self.post("/run?wait=true", &request).await;
        assert_eq!(resp.status(), 200, "{request}");
        resp.json().await.unwrap()
    }

    async fn follow(&self, run_id: &str, since: Option<u64>) -> SseReader {
        let since = since.map(|n| format!("&since={n}")).unwrap_or_default();
        SseReader::new(
            self.get(&format!("/get_events/{run_id}?stream=true{since}"))
                .await,
        )
    }
}

/// Asserts a problem+json answer with `status`.
async fn assert_problem(resp: reqwest::Response, status: u16) {
    assert_eq!(resp.status(), status);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "application/problem+json"
    );
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["status"], status);
    assert!(body["detail"].is_string());
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// The Event base fields, checked on every event of a run.
fn assert_base(event: &Value, id: usize, run_id: &str, thread_id: &str) {
    assert_eq!(event["id"], id, "{event}");
    assert_eq!(event["run_id"], run_id, "{event}");
    assert_eq!(event["thread_id"], thread_id, "{event}");
    assert_eq!(event["agent"], "researcher", "{event}");
    assert_eq!(event["depth"], 0, "{event}");
}

#[tokio::test]
async fn ap_agent_describes_itself_and_refuses_bad_requests() {
    let agent = ApAgent::start().await;
    let ap = Ap::new(&agent);

    let root = reqwest::get(format!("http://127.0.0.1:{}/", agent.port))
        .await
        .unwrap();
    assert_eq!(root.status(), 200);
    assert_eq!(
        root.json::<Value>().await.unwrap(),
        json!([["researcher", "/agents/researcher"]])
    );

    let d = ap.get_json("/describe").await;
    assert_eq!(d["name"], "researcher");
    assert!(d["purpose"].as_str().unwrap().starts_with("Researches"));
    assert_eq!(
        d["endpoints"],
        json!([
            "/describe",
            "/run",
            "/get_events",
            "/stream_request",
            "/runs",
            "/threads"
        ])
    );
    assert_eq!(d["operations"][0]["name"], "chat");
    assert_eq!(
        d["operations"][0]["input_schema"]["required"],
        json!(["input"])
    );
    assert_eq!(
        d["operations"][0]["output_schema"]["properties"]["output"]["type"],
        "string"
    );
    assert_eq!(d["tools"], json!(["web_search"]));

    // Malformed Requests.
    let raw = ap
        .http
        .post(format!("{}/run", ap.base))
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_problem(raw, 400).await;
    for bad in [
        json!({}),
        json!([1]),
        json!({"type": "DanceRequest", "input": "x"}),
        json!({"input": 5}),
        json!({"type": "ChatRequest"}),
        json!({"input": "x", "thread_id": 7}),
        json!({"input": "x", "run_context": "ctx"}),
        json!({"type": "CancelRequest"}),
        json!({"type": "ResumeWithInput", "run_id": "r", "request_keys": {"other": "x"}}),
    ] {
        assert_problem(ap.post("/run?wait=true", &bad).await, 400).await;
    }
    assert_problem(
        ap.post("/run?wait=maybe", &json!({"input": "x"})).await,
        400,
    )
    .await;
    assert_problem(
        ap.post(
            "/stream_request",
            &json!({"type": "CancelRequest", "run_id": "r"}),
        )
        .await,
        400,
    )
    .await;
    assert!(agent.state.run_ids().is_empty());

    // Unknown runs.
    assert_problem(ap.get("/get_events/nope").await, 404).await;
    assert_problem(ap.get("/get_events/nope?stream=true").await, 404).await;
    assert_problem(ap.get("/runs/nope").await, 404).await;
    let cancel = json!({"type": "CancelRequest", "run_id": "nope"});
    assert_problem(ap.post("/run?wait=true", &cancel).await, 404).await;
    let resume =
        json!({"type": "ResumeWithInput", "run_id": "nope", "request_keys": {"topic": "t"}});
    assert_problem(ap.post("/run", &resume).await, 404).await;
    assert_problem(ap.get("/nowhere").await, 404).await;

    assert_eq!(ap.get_json("/threads").await, json!([]));
    // root, describe, 1 + 9 + 1 + 1 bad, 6 unknown, threads.
    assert_eq!(agent.state.requests(), 21);
}

#[tokio::test]
async fn ap_agent_chat_runs_polled_and_threads() {
    let agent = ApAgent::start().await;
    let ap = Ap::new(&agent);

    let request = json!({
        "type": "ChatRequest",
        "input": "tide pools",
        "run_context": {"user_context": {"user": "ana"}},
        "request_metadata": {"current_time": "2025-03-01T10:00:00Z"},
    });
    let started = ap.run_wait(request.clone()).await;
    let run_id = started["run_id"].as_str().unwrap().to_string();
    let thread_id = started["thread_id"].as_str().unwrap().to_string();
    Uuid::parse_str(&run_id).unwrap();
    Uuid::parse_str(&thread_id).unwrap();
    assert_base(&started, 0, &run_id, &thread_id);
    assert_eq!(started["type"], "RunStarted");
    assert_eq!(started["role"], "system");
    assert_eq!(agent.state.run_ids(), [run_id.as_str()]);
    assert_eq!(agent.state.request(&run_id), Some(request));

    // Poll with `since` until RunCompleted; each poll returns only newer events.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut events: Vec<Value> = Vec::new();
    while events.last().is_none_or(|e| e["type"] != "RunCompleted") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no RunCompleted: {events:?}"
        );
        let path = match events.last() {
            Some(last) => format!("/get_events/{run_id}?stream=false&since={}", last["id"]),
            None => format!("/get_events/{run_id}"),
        };
        let Value::Array(new) = ap.get_json(&path).await else {
            panic!("get_events returns an array");
        };
        events.extend(new);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        types(&events),
        [
            "RunStarted",
            "TextOutput",
            "ToolCall",
            "ToolResult",
            "TextOutput",
            "RunCompleted"
        ]
    );
    for (i, event) in events.iter().enumerate() {
        assert_base(event, i, &run_id, &thread_id);
    }
    assert_eq!(events[0], started);
    assert_eq!(events[1]["role"], "assistant");
    assert_eq!(events[1]["content"], "Researching: tide pools");
    assert_eq!(events[2]["role"], "assistant");
    assert_eq!(events[2]["function_name"], "web_search");
    assert_eq!(events[2]["args"], json!({"query": "tide pools"}));
    assert_eq!(events[3]["role"], "tool");
    assert_eq!(events[3]["function_name"], "web_search");
    assert_eq!(events[3]["text_result"], "3 results");
    assert_eq!(events[4]["content"], "Found 3 sources about tide pools.");
    assert_eq!(events[5]["role"], "assistant");
    assert_eq!(events[5]["finish_reason"], "success");
    assert_eq!(events[5]["result"], "Found 3 sources about tide pools.");
    assert_eq!(agent.state.events(&run_id), events);
    assert_eq!(
        ap.get_json(&format!("/get_events/{run_id}?since=3")).await,
        json!(events[4..])
    );
    assert_eq!(
        ap.get_json(&format!("/runs/{run_id}")).await,
        json!({"run_id": run_id, "thread_id": thread_id, "status": "completed",
               "finish_reason": "success", "events": 6})
    );
    assert!(!agent.state.was_cancelled(&run_id));
    let cancel = json!({"type": "CancelRequest", "run_id": run_id});
    assert_problem(ap.post("/run?wait=true", &cancel).await, 409).await;

    // A second run on the same thread (fire and forget), followed to its end.
    let resp = ap
        .post(
            "/run",
            &json!({"input": "rock pools", "thread_id": thread_id}),
        )
        .await;
    assert_eq!(resp.status(), 202);
    assert_eq!(resp.text().await.unwrap(), "");
    let second = agent.state.run_ids()[1].clone();
    let frames = ap.follow(&second, None).await.until("RunCompleted").await;
    assert!(frames
        .iter()
        .all(|f| f.data["thread_id"] == thread_id.as_str()));
    assert_eq!(
        frames[4].data["content"],
        "Found 3 sources about rock pools."
    );

    // An unknown thread id starts a new thread.
    let third = ap
        .run_wait(json!({"input": "x", "thread_id": "no-such-thread"}))
        .await;
    assert_ne!(third["thread_id"], "no-such-thread");
    assert_ne!(third["thread_id"], thread_id.as_str());
    let third_run = third["run_id"].as_str().unwrap();
    ap.follow(third_run, None).await.until("RunCompleted").await;

    assert_eq!(
        ap.get_json("/threads").await,
        json!([{"thread_id": thread_id, "runs": [run_id, second]},
               {"thread_id": third["thread_id"], "runs": [third_run]}])
    );
    // A thread's events: its runs' events, in order.
    let all = ap.get_json(&format!("/get_events/{thread_id}")).await;
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), 12);
    assert_eq!(all[..6], events[..]);
    assert!(all[6..].iter().all(|e| e["run_id"] == second.as_str()));
    assert_problem(
        ap.get(&format!("/get_events/{thread_id}?stream=true"))
            .await,
        400,
    )
    .await;
}

#[tokio::test]
async fn ap_agent_streams_requests_and_events() {
    let agent = ApAgent::start().await;
    let ap = Ap::new(&agent);

    let resp = ap
        .post("/stream_request", &json!({"input": "comets"}))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let frames = parse_sse(&resp.text().await.unwrap());
    let events: Vec<Value> = frames.iter().map(|f| f.data.clone()).collect();
    assert_eq!(
        types(&events),
        [
            "RunStarted",
            "TextOutput",
            "ToolCall",
            "ToolResult",
            "TextOutput",
            "RunCompleted"
        ]
    );
    let run_id = agent.state.run_ids()[0].clone();
    let thread_id = events[0]["thread_id"].as_str().unwrap();
    for (i, frame) in frames.iter().enumerate() {
        assert_eq!(frame.event, frame.data["type"].as_str().unwrap());
        assert_eq!(frame.id, i.to_string());
        assert_base(&frame.data, i, &run_id, thread_id);
    }
    assert_eq!(events[5]["result"], "Found 3 sources about comets.");
    assert_eq!(agent.state.events(&run_id), events);

    // Stored events after `since`, then the end; nothing after RunCompleted.
    let mut tail = ap.follow(&run_id, Some(3)).await;
    let ids: Vec<_> = [tail.next().await.unwrap(), tail.next().await.unwrap()]
        .iter()
        .map(|f| f.data["id"].clone())
        .collect();
    assert_eq!(ids, [4, 5]);
    assert!(tail.next().await.is_none());
    assert!(ap.follow(&run_id, Some(5)).await.next().await.is_none());

    // A follower that goes away mid-run does not disturb the run or others.
    let started = ap.run_wait(json!({"input": "meteors"})).await;
    let run_id = started["run_id"].as_str().unwrap();
    let mut early = ap.follow(run_id, None).await;
    assert_eq!(early.next().await.unwrap().event, "RunStarted");
    drop(early);
    let frames = ap.follow(run_id, None).await.until("RunCompleted").await;
    assert_eq!(frames.len(), 6);
    assert_eq!(frames[5].data["finish_reason"], "success");
}

#[tokio::test]
async fn ap_agent_waits_for_input_and_resumes() {
    let agent = ApAgent::start().await;
    let ap = Ap::new(&agent);

    let started = ap.run_wait(json!({"input": "please ask me first"})).await;
    let run_id = started["run_id"].as_str().unwrap();
    let mut events = ap.follow(run_id, None).await;
    let frames = events.until("WaitForInput").await;
    assert_eq!(frames.len(), 2);
    let wait = &frames[1].data;
    assert_eq!(wait["id"], 1);
    assert_eq!(wait["role"], "assistant");
    assert_eq!(
        wait["request_keys"],
        json!({"topic": "Which topic should I research?"})
    );
    let status = ap.get_json(&format!("/runs/{run_id}")).await;
    assert_eq!(status["status"], "waiting");
    assert_eq!(status["finish_reason"], Value::Null);

    let resume = json!({"type": "ResumeWithInput", "run_id": run_id,
                        "request_keys": {"topic": "coral reefs"}});
    let answer = ap.run_wait(resume.clone()).await;
    assert_eq!(answer["run_id"], run_id);
    assert_eq!(answer["status"], "running");
    assert_eq!(answer["events"], 2);
    assert_problem(ap.post("/run?wait=true", &resume).await, 409).await;

    // The same stream carries on after the pause.
    let rest = events.until("RunCompleted").await;
    let rest: Vec<Value> = rest.into_iter().map(|f| f.data).collect();
    assert_eq!(
        types(&rest),
        [
            "TextOutput",
            "ToolCall",
            "ToolResult",
            "TextOutput",
            "RunCompleted"
        ]
    );
    assert_eq!(rest[0]["id"], 2);
    assert_eq!(rest[0]["content"], "Researching: coral reefs");
    assert_eq!(rest[1]["args"], json!({"query": "coral reefs"}));
    assert_eq!(rest[4]["result"], "Found 3 sources about coral reefs.");
    assert!(events.next().await.is_none());
    assert_problem(ap.post("/run", &resume).await, 409).await;
}

#[tokio::test]
async fn ap_agent_cancels_runs() {
    let agent = ApAgent::start().await;
    let ap = Ap::new(&agent);

    let started = ap.run_wait(json!({"input": "work forever"})).await;
    let run_id = started["run_id"].as_str().unwrap();
    let mut events = ap.follow(run_id, None).await;
    assert_eq!(events.next().await.unwrap().event, "RunStarted");
    for _ in 0..2 {
        let tick = events.next().await.unwrap();
        assert_eq!(tick.event, "TextOutput");
        assert_eq!(tick.data["content"], "still working");
    }

    let cancel = json!({"type": "CancelRequest", "run_id": run_id});
    let done = ap.run_wait(cancel.clone()).await;
    assert_eq!(done["type"], "RunCompleted");
    assert_eq!(done["finish_reason"], "canceled");
    assert_eq!(done["run_id"], run_id);
    assert!(agent.state.was_cancelled(run_id));

    // The open stream ends with that RunCompleted.
    let rest = events.until("RunCompleted").await;
    assert_eq!(rest.last().unwrap().data, done);
    assert!(events.next().await.is_none());
    let status = ap.get_json(&format!("/runs/{run_id}")).await;
    assert_eq!(status["status"], "completed");
    assert_eq!(status["finish_reason"], "canceled");
    assert_problem(ap.post("/run?wait=true", &cancel).await, 409).await;

    // The task has stopped: a few ticks later there is still nothing new.
    let count = agent.state.events(run_id).len();
    assert_eq!(done["id"], count - 1);
    tokio::time::sleep(3 * TICK).await;
    assert_eq!(agent.state.events(run_id).len(), count);

    // A run waiting for input can be cancelled too (fire and forget).
    let started = ap.run_wait(json!({"input": "ask me"})).await;
    let waiting = started["run_id"].as_str().unwrap();
    let mut events = ap.follow(waiting, None).await;
    events.until("WaitForInput").await;
    let cancel = json!({"type": "CancelRequest", "run_id": waiting});
    assert_eq!(ap.post("/run", &cancel).await.status(), 202);
    let last = events.until("RunCompleted").await.pop().unwrap();
    assert_eq!(last.data["finish_reason"], "canceled");
    assert!(agent.state.was_cancelled(waiting));
    let resume = json!({"type": "ResumeWithInput", "run_id": waiting,
                        "request_keys": {"topic": "t"}});
    assert_problem(ap.post("/run", &resume).await, 409).await;
}
