//! The Agent Protocol surface (AP, 2025 edition): every agent in the
//! registry answers AP's routes at its own path, `/agents/{id}`.
//!
//! An agent that speaks AP (an `agent-protocol` binding) is proxied: its
//! runs, threads and events are its own, passed through the outbound guard
//! with the agent's credentials. Any other agent runs in the gateway: a
//! ChatRequest becomes RunStarted, the invocation through the gateway,
//! TextOutput with the agent's JSON answer, and RunCompleted. Input the
//! operation's schema requires but the request lacks is asked for with
//! WaitForInput and supplied with ResumeWithInput (AP's human in the
//! loop); CancelRequest aborts the call. These runs live in this node's
//! memory, belong to the principal that started them, and are forgotten an
//! hour after they complete.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::StreamExt;
use serde_json::{json, Map, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::error::ServiceError;
use super::invocation::{call_binding, InvocationService, InvokeRequest, Outcome};
use crate::domain::invoke::select_operation;
use crate::domain::resolve::preferred_binding;
use crate::domain::{AgentRecord, Principal};
use crate::gateway::transport::{self, ap_url, Event, Started};

type Result<T> = std::result::Result<T, ServiceError>;

/// Completed runs are kept this long for get_events and runs/{id}.
const KEEP_COMPLETED: Duration = Duration::from_secs(3600);
/// Runs kept at most on one node.
const MAX_RUNS: usize = 10_000;

/// A JSON answer and the HTTP status it goes out with.
#[derive(Debug, Clone)]
pub struct ApAnswer {
    pub status: u16,
    pub json: Value,
}

impl ApAnswer {
    fn ok(json: Value) -> Self {
        Self { status: 200, json }
    }
}

/// Events of a run as they come (or a proxied agent's).
pub type ApEvents = BoxStream<'static, Result<Event>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Running,
    Waiting,
    Completed,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Waiting => "waiting",
            Self::Completed => "completed",
        }
    }
}

/// What a waiting run resumes with.
struct Pending {
    input: Map<String, Value>,
    operation: Option<String>,
}

struct RunState {
    events: Vec<Value>,
    status: Status,
    finish_reason: Option<String>,
    completed_at: Option<Instant>,
    task: Option<JoinHandle<()>>,
    pending: Option<Pending>,
    agent_authorization: Option<String>,
}

/// One run of a gateway-hosted agent.
struct Run {
    id: String,
    thread_id: String,
    agent_id: String,
    agent_name: String,
    owner: Option<Principal>,
    state: Mutex<RunState>,
    /// The number of events so far, for live readers.
    published: watch::Sender<usize>,
}

impl Run {
    fn lock(&self) -> std::sync::MutexGuard<'_, RunState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends an event with AP's base fields; returns it.
    fn publish(&self, kind: &str, role: &str, fields: Value) -> Value {
        let mut st = self.lock();
        let mut event = json!({
            "id": st.events.len(),
            "run_id": self.id,
            "thread_id": self.thread_id,
            "agent": self.agent_name,
            "type": kind,
            "role": role,
            "depth": 0,
        });
        if let (Value::Object(e), Value::Object(f)) = (&mut event, fields) {
            e.extend(f);
        }
        if kind == "RunCompleted" {
            st.status = Status::Completed;
            st.finish_reason = event["finish_reason"].as_str().map(String::from);
            st.completed_at = Some(Instant::now());
        }
        st.events.push(event.clone());
        let n = st.events.len();
        drop(st);
        self.published.send_replace(n);
        event
    }

    fn status_json(&self) -> Value {
        let st = self.lock();
        json!({
            "run_id": self.id,
            "thread_id": self.thread_id,
            "agent": self.agent_id,
            "status": st.status.as_str(),
            "finish_reason": st.finish_reason,
            "events": st.events.len(),
        })
    }

    fn events_after(&self, since: Option<i64>) -> Vec<Value> {
        let st = self.lock();
        let from = since.map_or(0, |s| usize::try_from(s + 1).unwrap_or(0));
        st.events.iter().skip(from).cloned().collect()
    }
}

/// Runs and threads of gateway-hosted agents on this node.
#[derive(Default)]
pub struct ApRuns {
    runs: Mutex<HashMap<String, Arc<Run>>>,
    /// thread id → run ids in order.
    threads: Mutex<HashMap<String, Vec<String>>>,
}

impl ApRuns {
    fn get(&self, id: &str) -> Option<Arc<Run>> {
        self.runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    /// Adds a run, forgetting completed runs past their time (and the
    /// oldest completed ones when the node holds too many).
    fn insert(&self, run: Arc<Run>) -> Result<()> {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        runs.retain(|_, r| {
            r.lock()
                .completed_at
                .is_none_or(|t| t.elapsed() < KEEP_COMPLETED)
        });
        if runs.len() >= MAX_RUNS {
            let oldest = runs
                .iter()
                .filter_map(|(id, r)| r.lock().completed_at.map(|t| (t, id.clone())))
                .min();
            match oldest {
                Some((_, id)) => {
                    runs.remove(&id);
                }
                None => {
                    return Err(ServiceError::Overloaded {
                        message: format!("this node already runs {MAX_RUNS} Agent Protocol runs"),
                        retry_after: Some(5),
                    })
                }
            }
        }
        self.threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(run.thread_id.clone())
            .or_default()
            .push(run.id.clone());
        runs.insert(run.id.clone(), run);
        Ok(())
    }

    fn thread_runs(&self, thread: &str) -> Vec<Arc<Run>> {
        let ids = self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(thread)
            .cloned()
            .unwrap_or_default();
        ids.iter().filter_map(|id| self.get(id)).collect()
    }
}

fn same_principal(a: Option<&Principal>, b: Option<&Principal>) -> bool {
    a.map(|p| &p.name) == b.map(|p| &p.name)
}

fn not_found(what: &str, id: &str) -> ServiceError {
    ServiceError::NotFound(format!("{what} '{id}' not found"))
}

fn bad_request(pointer: &str, message: impl Into<String>) -> ServiceError {
    let message = message.into();
    ServiceError::InvalidRequest {
        field: Some(pointer.into()),
        message: format!("{pointer}: {message}"),
    }
}

/// AP's request types.
enum ApRequest {
    Chat {
        input: Option<Value>,
        thread_id: Option<String>,
        operation: Option<String>,
    },
    Cancel {
        run_id: String,
    },
    Resume {
        run_id: String,
        keys: Map<String, Value>,
    },
}

fn parse_request(v: &Value) -> Result<ApRequest> {
    let Value::Object(m) = v else {
        return Err(bad_request("", "an AP Request must be a JSON object"));
    };
    let text = |k: &str| m.get(k).and_then(Value::as_str).map(String::from);
    let run_id = || text("run_id").ok_or_else(|| bad_request("/run_id", "is required"));
    let kind = text("type").unwrap_or_else(|| "ChatRequest".into());
    match kind.as_str() {
        "ChatRequest" => Ok(ApRequest::Chat {
            input: m.get("input").cloned(),
            thread_id: text("thread_id"),
            operation: text("operation"),
        }),
        "CancelRequest" => Ok(ApRequest::Cancel { run_id: run_id()? }),
        "ResumeWithInput" => Ok(ApRequest::Resume {
            run_id: run_id()?,
            keys: match m.get("request_keys") {
                Some(Value::Object(k)) => k.clone(),
                _ => {
                    return Err(bad_request(
                        "/request_keys",
                        "must be an object of key → value",
                    ))
                }
            },
        }),
        other => Err(bad_request(
            "/type",
            format!(
                "'{other}' is not a request type (ChatRequest, CancelRequest, ResumeWithInput)"
            ),
        )),
    }
}

/// The operation's input from a chat request: an object as it is; text
/// that is a JSON object; else text for the schema's only string property
/// (or `input` when there is no schema). Returns it with the required
/// members still missing (key → what to ask).
fn chat_input(
    schema: Option<&Value>,
    input: Option<Value>,
) -> (Map<String, Value>, Map<String, Value>) {
    let props = schema
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object);
    let map = match input {
        Some(Value::Object(m)) => m,
        Some(Value::String(s)) => match serde_json::from_str::<Value>(&s) {
            Ok(Value::Object(m)) => m,
            _ => {
                let strings: Vec<&String> = props
                    .map(|p| {
                        p.iter()
                            .filter(|(_, v)| v.get("type") == Some(&json!("string")))
                            .map(|(k, _)| k)
                            .collect()
                    })
                    .unwrap_or_default();
                let key = match (schema, strings.as_slice()) {
                    (None, _) => Some("input".to_string()),
                    (_, [one]) => Some((*one).clone()),
                    _ => None,
                };
                key.map(|k| Map::from_iter([(k, json!(s))]))
                    .unwrap_or_default()
            }
        },
        _ => Map::new(),
    };
    (map.clone(), missing(schema, &map))
}

fn missing(schema: Option<&Value>, map: &Map<String, Value>) -> Map<String, Value> {
    let props = schema.and_then(|s| s.get("properties"));
    schema
        .and_then(|s| s.get("required"))
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(Value::as_str)
                .filter(|k| !map.contains_key(*k))
                .map(|k| {
                    let p = props.and_then(|p| p.get(k));
                    let ask = p
                        .and_then(|p| p.get("description"))
                        .or_else(|| p.and_then(|p| p.get("type")))
                        .and_then(Value::as_str)
                        .unwrap_or("a value");
                    (k.to_string(), json!(ask))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The AgentDescriptor of a gateway-hosted agent.
fn descriptor(record: &AgentRecord) -> Value {
    let m = &record.metadata;
    let operations: Vec<Value> = if m.operations.is_empty() {
        vec![json!({"name": "default", "description": m.description,
            "input_schema": m.inputs, "output_schema": m.outputs})]
    } else {
        m.operations
            .iter()
            .map(|o| {
                json!({"name": o.name, "description": o.description.clone().unwrap_or_default(),
                    "input_schema": o.inputs.as_ref().or(m.inputs.as_ref()),
                    "output_schema": o.outputs.as_ref().or(m.outputs.as_ref())})
            })
            .collect()
    };
    json!({
        "name": m.name,
        "purpose": m.description,
        "endpoints": ["/describe", "/run", "/get_events", "/stream_request", "/runs", "/threads"],
        "operations": operations,
        "tools": [],
    })
}

/// The AP binding of an agent that speaks AP.
fn ap_endpoint(record: &AgentRecord) -> Option<String> {
    preferred_binding(&record.metadata.bindings, |b| {
        b.known_protocol() == Some(crate::domain::Protocol::AgentProtocol)
    })
    .map(|b| b.endpoint.clone())
}

/// A proxied agent's events as our events; a whole answer (a refusal)
/// becomes the error that ends them.
fn started_events(started: Started) -> Result<ApEvents> {
    match started {
        Started::Events(e) => Ok(e.map(|e| e.map_err(ServiceError::from)).boxed()),
        Started::Whole(a) if a.status >= 400 => Err(ServiceError::BadUpstream(format!(
            "the AP agent refused with {}: {}",
            a.status,
            String::from_utf8_lossy(&a.body)
                .chars()
                .take(300)
                .collect::<String>()
        ))),
        Started::Whole(a) => Ok(futures::stream::iter([Ok(Event {
            event: a.json["type"].as_str().unwrap_or("message").to_string(),
            data: a.json.to_string(),
            id: None,
        })])
        .boxed()),
    }
}

impl InvocationService {
    /// AP's discovery list: `[name, path]` for every agent the gateway can
    /// run (the WoA document's agents).
    pub async fn ap_agents(&self, principal: Option<&Principal>) -> Result<Value> {
        self.registry().require_reader(principal)?;
        let doc = self.woa().document(self.registry()).await?;
        let list: Vec<Value> = doc
            .agents
            .iter()
            .map(|(id, name)| {
                let path: String = url::form_urlencoded::byte_serialize(id.as_bytes()).collect();
                json!([name, format!("/agents/{path}")])
            })
            .collect();
        Ok(Value::Array(list))
    }

    /// A proxied GET, or None when the agent runs here.
    async fn ap_proxy_get(
        &self,
        record: &AgentRecord,
        route: &str,
        auth: Option<String>,
    ) -> Result<Option<ApAnswer>> {
        let Some(base) = ap_endpoint(record) else {
            return Ok(None);
        };
        let url = ap_url(&base, route)?;
        let resp = self
            .ap_send(
                record,
                reqwest::Method::GET,
                &url,
                None,
                auth,
                "application/json",
            )
            .await?;
        let a = transport::whole_answer(self.outbound(), resp, &url).await?;
        Ok(Some(ApAnswer {
            status: a.status,
            json: a.json,
        }))
    }

    /// One request to a proxied AP agent, with the agent's credentials.
    async fn ap_send(
        &self,
        record: &AgentRecord,
        method: reqwest::Method,
        url: &url::Url,
        body: Option<&Value>,
        auth: Option<String>,
        accept: &str,
    ) -> Result<reqwest::Response> {
        let headers = self.credentials_for(
            record,
            &InvokeRequest {
                agent_authorization: auth,
                ..Default::default()
            },
        )?;
        Ok(transport::exchange(self.outbound(), method, url, body, &headers, accept).await?)
    }

    /// `describe`: the AgentDescriptor.
    pub async fn ap_describe(&self, principal: Option<&Principal>, id: &str) -> Result<ApAnswer> {
        self.registry().require_reader(principal)?;
        let record = self.agent(principal, id).await?;
        if let Some(a) = self.ap_proxy_get(&record, "describe", None).await? {
            return Ok(a);
        }
        Ok(ApAnswer::ok(descriptor(&record)))
    }

    fn require_runner(&self, principal: Option<&Principal>) -> Result<()> {
        self.require_caller(principal)
    }

    /// `run`: a ChatRequest, CancelRequest or ResumeWithInput. With `wait`
    /// the answer carries the response event (RunStarted, or RunCompleted
    /// for a cancel); without, 202.
    pub async fn ap_run(
        &self,
        principal: Option<&Principal>,
        id: &str,
        request: Value,
        wait: bool,
        auth: Option<String>,
    ) -> Result<ApAnswer> {
        self.require_runner(principal)?;
        let record = self.agent(principal, id).await?;
        if let Some(base) = ap_endpoint(&record) {
            let _permit = self.permit(&record.metadata.id)?;
            let mut url = ap_url(&base, "run")?;
            url.query_pairs_mut()
                .append_pair("wait", if wait { "true" } else { "false" });
            let resp = self
                .ap_send(
                    &record,
                    reqwest::Method::POST,
                    &url,
                    Some(&request),
                    auth,
                    "application/json",
                )
                .await?;
            let a = transport::whole_answer(self.outbound(), resp, &url).await?;
            return Ok(ApAnswer {
                status: a.status,
                json: a.json,
            });
        }
        let event = match parse_request(&request)? {
            ApRequest::Chat {
                input,
                thread_id,
                operation,
            } => {
                self.start_run(principal, &record, input, thread_id, operation, auth)?
                    .1
            }
            ApRequest::Cancel { run_id } => self.cancel_run(principal, &record, &run_id)?,
            ApRequest::Resume { run_id, keys } => {
                self.resume_run(principal, &record, &run_id, keys)?
            }
        };
        Ok(if wait {
            ApAnswer::ok(event)
        } else {
            ApAnswer {
                status: 202,
                json: Value::Null,
            }
        })
    }

    /// Starts a run of a gateway-hosted agent; returns it and RunStarted.
    fn start_run(
        &self,
        principal: Option<&Principal>,
        record: &AgentRecord,
        input: Option<Value>,
        thread_id: Option<String>,
        operation: Option<String>,
        auth: Option<String>,
    ) -> Result<(Arc<Run>, Value)> {
        let target = select_operation(
            &record.metadata,
            call_binding(&record.metadata, &[]),
            operation.as_deref(),
        )
        .map_err(|e| bad_request(&e.pointer, e.message))?;
        let runs = self.ap_runs();
        let thread_id = match thread_id {
            Some(t) => {
                let known = runs.thread_runs(&t);
                if !known.iter().any(|r| {
                    r.agent_id == record.metadata.id && same_principal(r.owner.as_ref(), principal)
                }) {
                    return Err(not_found("thread", &t));
                }
                t
            }
            None => uuid::Uuid::new_v4().to_string(),
        };
        let (input, missing) = chat_input(target.inputs, input);
        let run = Arc::new(Run {
            id: uuid::Uuid::new_v4().to_string(),
            thread_id,
            agent_id: record.metadata.id.clone(),
            agent_name: record.metadata.name.clone(),
            owner: principal.cloned(),
            state: Mutex::new(RunState {
                events: Vec::new(),
                status: Status::Running,
                finish_reason: None,
                completed_at: None,
                task: None,
                pending: None,
                agent_authorization: auth,
            }),
            published: watch::channel(0).0,
        });
        runs.insert(run.clone())?;
        let started = run.publish("RunStarted", "system", json!({}));
        let operation = target.name().map(String::from);
        if missing.is_empty() {
            self.execute(&run, input, operation);
        } else {
            self.wait_for_input(&run, input, operation, missing);
        }
        Ok((run, started))
    }

    fn wait_for_input(
        &self,
        run: &Arc<Run>,
        input: Map<String, Value>,
        operation: Option<String>,
        keys: Map<String, Value>,
    ) {
        {
            let mut st = run.lock();
            st.status = Status::Waiting;
            st.pending = Some(Pending { input, operation });
        }
        run.publish("WaitForInput", "assistant", json!({"request_keys": keys}));
    }

    /// Calls the agent through the gateway in a task of its own; the run's
    /// events tell how it went.
    fn execute(&self, run: &Arc<Run>, input: Map<String, Value>, operation: Option<String>) {
        let service = self.clone();
        let r = run.clone();
        let auth = run.lock().agent_authorization.clone();
        let task = tokio::spawn(async move {
            let req = InvokeRequest {
                agent_id: r.agent_id.clone(),
                body: Value::Object(input).to_string().into(),
                operation,
                agent_authorization: auth,
                ..Default::default()
            };
            match service
                .invoke(r.owner.as_ref(), req)
                .await
                .map(|i| i.outcome)
            {
                Ok(Outcome::Single(answer)) if (200..300).contains(&answer.status) => {
                    let text = String::from_utf8_lossy(&answer.body).into_owned();
                    r.publish("TextOutput", "assistant", json!({"content": text}));
                    r.publish(
                        "RunCompleted",
                        "assistant",
                        json!({"finish_reason": "success", "result": text}),
                    );
                }
                Ok(Outcome::Single(answer)) => {
                    let body: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
                    r.publish(
                        "RunCompleted",
                        "assistant",
                        json!({"finish_reason": "error", "error": {"status": answer.status, "body": body}}),
                    );
                }
                Ok(Outcome::Batch(_)) => {
                    r.publish(
                        "RunCompleted",
                        "assistant",
                        json!({"finish_reason": "error", "error": {"message": "unexpected batch"}}),
                    );
                }
                Err(e) => {
                    r.publish(
                        "RunCompleted",
                        "assistant",
                        json!({"finish_reason": "error", "error": {"message": e.to_string()}}),
                    );
                }
            }
        });
        run.lock().task = Some(task);
    }

    /// The caller's run of this agent.
    fn own_run(
        &self,
        principal: Option<&Principal>,
        record: &AgentRecord,
        run_id: &str,
    ) -> Result<Arc<Run>> {
        self.ap_runs()
            .get(run_id)
            .filter(|r| {
                r.agent_id == record.metadata.id && same_principal(r.owner.as_ref(), principal)
            })
            .ok_or_else(|| not_found("run", run_id))
    }

    fn cancel_run(
        &self,
        principal: Option<&Principal>,
        record: &AgentRecord,
        run_id: &str,
    ) -> Result<Value> {
        let run = self.own_run(principal, record, run_id)?;
        let task = {
            let mut st = run.lock();
            if st.status == Status::Completed {
                return Err(ServiceError::Conflict(format!(
                    "run '{run_id}' has already completed"
                )));
            }
            st.pending = None;
            st.task.take()
        };
        // Aborting drops the call in flight, and with it the connection.
        if let Some(t) = task {
            t.abort();
        }
        Ok(run.publish(
            "RunCompleted",
            "assistant",
            json!({"finish_reason": "canceled"}),
        ))
    }

    fn resume_run(
        &self,
        principal: Option<&Principal>,
        record: &AgentRecord,
        run_id: &str,
        keys: Map<String, Value>,
    ) -> Result<Value> {
        let run = self.own_run(principal, record, run_id)?;
        let pending = {
            let mut st = run.lock();
            if st.status != Status::Waiting {
                return Err(ServiceError::Conflict(format!(
                    "run '{run_id}' is not waiting for input"
                )));
            }
            st.status = Status::Running;
            st.pending.take()
        };
        let Some(Pending {
            mut input,
            operation,
        }) = pending
        else {
            return Err(ServiceError::Conflict(format!(
                "run '{run_id}' is not waiting for input"
            )));
        };
        input.extend(keys);
        let target = select_operation(
            &record.metadata,
            call_binding(&record.metadata, &[]),
            operation.as_deref(),
        )
        .map_err(|e| bad_request(&e.pointer, e.message))?;
        let still = missing(target.inputs, &input);
        if still.is_empty() {
            self.execute(&run, input, operation);
        } else {
            self.wait_for_input(&run, input, operation, still);
        }
        Ok(run.status_json())
    }

    /// `get_events` (polling): a run's events after `since`, or all events
    /// of a thread.
    pub async fn ap_events(
        &self,
        principal: Option<&Principal>,
        id: &str,
        run_id: &str,
        since: Option<i64>,
    ) -> Result<ApAnswer> {
        self.require_runner(principal)?;
        let record = self.agent(principal, id).await?;
        let mut route = format!("get_events/{}", encode(run_id));
        if let Some(s) = since {
            route.push_str(&format!("?since={s}"));
        }
        if let Some(a) = self.ap_proxy_get(&record, &route, None).await? {
            return Ok(a);
        }
        if let Ok(run) = self.own_run(principal, &record, run_id) {
            return Ok(ApAnswer::ok(Value::Array(run.events_after(since))));
        }
        let thread: Vec<Value> = self
            .ap_runs()
            .thread_runs(run_id)
            .iter()
            .filter(|r| {
                r.agent_id == record.metadata.id && same_principal(r.owner.as_ref(), principal)
            })
            .flat_map(|r| r.events_after(None))
            .collect();
        if thread.is_empty() {
            return Err(not_found("run", run_id));
        }
        Ok(ApAnswer::ok(Value::Array(thread)))
    }

    /// `get_events?stream=true`: the events after `since`, then live ones
    /// until RunCompleted.
    pub async fn ap_stream_events(
        &self,
        principal: Option<&Principal>,
        id: &str,
        run_id: &str,
        since: Option<i64>,
    ) -> Result<ApEvents> {
        self.require_runner(principal)?;
        let record = self.agent(principal, id).await?;
        if let Some(base) = ap_endpoint(&record) {
            let mut url = ap_url(&base, &format!("get_events/{}", encode(run_id)))?;
            url.query_pairs_mut().append_pair("stream", "true");
            if let Some(s) = since {
                url.query_pairs_mut().append_pair("since", &s.to_string());
            }
            let resp = self
                .ap_send(
                    &record,
                    reqwest::Method::GET,
                    &url,
                    None,
                    None,
                    "text/event-stream",
                )
                .await?;
            return started_events(transport::events_or_answer(self.outbound(), resp, &url).await?);
        }
        let run = self.own_run(principal, &record, run_id)?;
        Ok(follow(run, since))
    }

    /// `stream_request`: starts a run and streams its events.
    pub async fn ap_stream_request(
        &self,
        principal: Option<&Principal>,
        id: &str,
        request: Value,
        auth: Option<String>,
    ) -> Result<ApEvents> {
        self.require_runner(principal)?;
        let record = self.agent(principal, id).await?;
        if let Some(base) = ap_endpoint(&record) {
            let permit = self.permit(&record.metadata.id)?;
            let url = ap_url(&base, "stream_request")?;
            let resp = self
                .ap_send(
                    &record,
                    reqwest::Method::POST,
                    &url,
                    Some(&request),
                    auth,
                    "text/event-stream",
                )
                .await?;
            let events =
                started_events(transport::events_or_answer(self.outbound(), resp, &url).await?)?;
            return Ok(events
                .map(move |e| {
                    let _held = &permit;
                    e
                })
                .boxed());
        }
        let ApRequest::Chat {
            input,
            thread_id,
            operation,
        } = parse_request(&request)?
        else {
            return Err(bad_request("/type", "stream_request takes a ChatRequest"));
        };
        let (run, _) = self.start_run(principal, &record, input, thread_id, operation, auth)?;
        Ok(follow(run, None))
    }

    /// `runs/{run_id}`: a run's status.
    pub async fn ap_run_status(
        &self,
        principal: Option<&Principal>,
        id: &str,
        run_id: &str,
    ) -> Result<ApAnswer> {
        self.require_runner(principal)?;
        let record = self.agent(principal, id).await?;
        if let Some(a) = self
            .ap_proxy_get(&record, &format!("runs/{}", encode(run_id)), None)
            .await?
        {
            return Ok(a);
        }
        Ok(ApAnswer::ok(
            self.own_run(principal, &record, run_id)?.status_json(),
        ))
    }

    /// `threads`: the caller's threads with this agent and their runs.
    pub async fn ap_threads(&self, principal: Option<&Principal>, id: &str) -> Result<ApAnswer> {
        self.require_runner(principal)?;
        let record = self.agent(principal, id).await?;
        if let Some(a) = self.ap_proxy_get(&record, "threads", None).await? {
            return Ok(a);
        }
        let runs = self.ap_runs();
        let mut threads: Vec<(String, Vec<String>)> = runs
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(t, ids)| (t.clone(), ids.clone()))
            .collect();
        threads.retain(|(_, ids)| {
            ids.iter().filter_map(|id| runs.get(id)).any(|r| {
                r.agent_id == record.metadata.id && same_principal(r.owner.as_ref(), principal)
            })
        });
        threads.sort();
        Ok(ApAnswer::ok(Value::Array(
            threads
                .into_iter()
                .map(|(t, ids)| json!({"thread_id": t, "runs": ids}))
                .collect(),
        )))
    }
}

fn encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// A run's events after `since`, then each new one, ending after
/// RunCompleted.
fn follow(run: Arc<Run>, since: Option<i64>) -> ApEvents {
    let next = since.map_or(0, |s| usize::try_from(s + 1).unwrap_or(0));
    let rx = run.published.subscribe();
    futures::stream::unfold(
        (run, rx, next, false),
        |(run, mut rx, next, done)| async move {
            if done {
                return None;
            }
            loop {
                let event = run.lock().events.get(next).cloned();
                if let Some(e) = event {
                    let last = e["type"] == "RunCompleted";
                    let item = Event {
                        event: e["type"].as_str().unwrap_or("message").to_string(),
                        id: Some(next.to_string()),
                        data: e.to_string(),
                    };
                    return Some((Ok(item), (run, rx, next + 1, last)));
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        },
    )
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_text_fills_the_only_string_property_or_is_asked_for() {
        let schema = json!({"type": "object",
            "properties": {"text": {"type": "string"}, "target_language": {"type": "string", "description": "Which language?"}},
            "required": ["text", "target_language"]});
        let (m, missing) = chat_input(Some(&schema), Some(json!(r#"{"text": "hi"}"#)));
        assert_eq!(m, Map::from_iter([("text".into(), json!("hi"))]));
        assert_eq!(
            missing,
            Map::from_iter([("target_language".into(), json!("Which language?"))])
        );
        let one =
            json!({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]});
        let (m, missing) = chat_input(Some(&one), Some(json!("what is AP?")));
        assert_eq!(m["q"], "what is AP?");
        assert!(missing.is_empty());
        let (m, _) = chat_input(None, Some(json!("free text")));
        assert_eq!(m["input"], "free text");
    }

    #[test]
    fn requests_are_told_apart_by_type() {
        assert!(matches!(
            parse_request(&json!({"input": "x"})),
            Ok(ApRequest::Chat { .. })
        ));
        assert!(matches!(
            parse_request(&json!({"type": "CancelRequest", "run_id": "r"})),
            Ok(ApRequest::Cancel { .. })
        ));
        assert!(parse_request(&json!({"type": "CancelRequest"})).is_err());
        assert!(parse_request(
            &json!({"type": "ResumeWithInput", "run_id": "r", "request_keys": 1})
        )
        .is_err());
        assert!(parse_request(&json!({"type": "Dance"})).is_err());
        assert!(parse_request(&json!([1])).is_err());
    }
}
