//! Runs of the agents the gateway hosts: a ChatRequest starts a run whose
//! events (RunStarted, WaitForInput, TextOutput, RunCompleted) record the
//! invocation through the gateway; ResumeWithInput and CancelRequest move
//! it on. Runs live in this node's memory, belong to the principal that
//! started them, and are forgotten an hour after they complete.
//!
//! A run waits for input in two cases: the operation's schema requires
//! members the request lacks (asked for by name, merged into the input on
//! resume), or an A2A agent's task ended `input-required` (its question is
//! asked as `input`, and the answer continues the same task).
//!
//! Runs are node memory that any caller can claim, so none is held for
//! ever: a run nobody answers completes with an error after the configured
//! wait (`gateway.run_input_wait_secs`), and one caller keeps at most
//! [`MAX_OPEN_PER_CALLER`] runs open, so a client that starts runs and
//! walks away cannot take the node's whole table from everyone else. An
//! anonymous caller is counted by its address (IPv6 by /64), as rate
//! limits and stream slots count it, so one anonymous client cannot take
//! the allowance of every other, and anonymous callers together keep at
//! most [`MAX_OPEN_ANONYMOUS`], so a flood from many addresses leaves the
//! rest of the table to callers with credentials.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Map, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::request::{chat_input, missing, Chat};
use super::{bad_request, not_found, ApEvents, Result};
use crate::domain::invoke::{select_operation, Target};
use crate::domain::{AgentRecord, Principal, Protocol};
use crate::gateway::transport::a2a::{self, Continuation};
use crate::gateway::transport::Event;
use crate::service::error::ServiceError;
use crate::service::invocation::{
    call_binding, InvocationService, InvokeRequest, Invoked, Outcome,
};

/// Completed runs are kept this long for get_events and runs/{id}.
const KEEP_COMPLETED: Duration = Duration::from_secs(3600);
/// Runs kept at most on one node.
const MAX_RUNS: usize = 10_000;
/// Runs one caller may have open (running or waiting) on one node.
const MAX_OPEN_PER_CALLER: usize = MAX_RUNS / 10;
/// Runs every anonymous caller together may have open on one node: many
/// addresses are cheap, and the rest of the table stays for callers with
/// credentials.
const MAX_OPEN_ANONYMOUS: usize = MAX_RUNS / 2;
/// The key an A2A agent's question is asked under.
const A2A_ANSWER_KEY: &str = "input";

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
enum Pending {
    /// The operation's input so far; the keys asked for are merged in.
    Members {
        input: Map<String, Value>,
        operation: Option<String>,
    },
    /// An A2A task's question; the answer is the next message of the task.
    Task {
        continues: Continuation,
        operation: Option<String>,
    },
}

struct RunState {
    events: Vec<Value>,
    /// About what `events` hold in memory (`domain::json::json_bytes`).
    bytes: usize,
    status: Status,
    finish_reason: Option<String>,
    completed_at: Option<Instant>,
    task: Option<JoinHandle<()>>,
    pending: Option<Pending>,
    agent_authorization: Option<String>,
}

/// Whose allowance of open runs a run counts against.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Holder {
    Principal(String),
    /// An anonymous caller's address, IPv6 by /64 (`listener::client_key`).
    Address(IpAddr),
    /// An anonymous caller in the process itself (no connection).
    Anonymous,
}

/// One run of a gateway-hosted agent.
pub(super) struct Run {
    id: String,
    thread_id: String,
    agent_id: String,
    agent_name: String,
    owner: Option<Principal>,
    holder: Holder,
    state: Mutex<RunState>,
    /// The number of events so far, for live readers.
    published: watch::Sender<usize>,
}

impl Run {
    /// A new run of `record`'s agent, running, with no events yet, started
    /// by `owner` from `client` (its address as `listener::client_key`
    /// gives it).
    fn new(
        thread_id: String,
        record: &AgentRecord,
        owner: Option<Principal>,
        client: Option<IpAddr>,
        agent_authorization: Option<String>,
    ) -> Arc<Self> {
        let holder = match (&owner, client) {
            (Some(p), _) => Holder::Principal(p.name.clone()),
            (None, Some(ip)) => Holder::Address(ip),
            (None, None) => Holder::Anonymous,
        };
        Arc::new(Run {
            id: uuid::Uuid::new_v4().to_string(),
            thread_id,
            agent_id: record.metadata.id.clone(),
            agent_name: record.metadata.name.clone(),
            owner,
            holder,
            state: Mutex::new(RunState {
                events: Vec::new(),
                bytes: 0,
                status: Status::Running,
                finish_reason: None,
                completed_at: None,
                task: None,
                pending: None,
                agent_authorization,
            }),
            published: watch::channel(0).0,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RunState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the run is this principal's run of this agent.
    fn belongs_to(&self, agent_id: &str, principal: Option<&Principal>) -> bool {
        self.agent_id == agent_id
            && self.owner.as_ref().map(|p| &p.name) == principal.map(|p| &p.name)
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
        st.bytes += crate::domain::json::json_bytes(&event);
        st.events.push(event.clone());
        let n = st.events.len();
        drop(st);
        self.published.send_replace(n);
        event
    }

    fn fail(&self, error: Value) {
        self.publish(
            "RunCompleted",
            "assistant",
            json!({"finish_reason": "error", "error": error}),
        );
    }

    /// Stops to ask for `keys` (key → what to ask), to resume with
    /// `pending`; completes the run with an error if no answer comes
    /// within `wait`.
    fn wait_for_input(
        self: &Arc<Self>,
        pending: Pending,
        keys: Map<String, Value>,
        wait: Duration,
    ) {
        {
            let mut st = self.lock();
            st.status = Status::Waiting;
            st.pending = Some(pending);
        }
        let asked = self.publish("WaitForInput", "assistant", json!({"request_keys": keys}));
        let Some(asked) = asked["id"].as_u64() else {
            return;
        };
        // A forgotten run is not kept alive by its timer.
        let run = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let Some(run) = run.upgrade() else {
                return;
            };
            {
                // Still waiting on this question: nothing was answered since.
                let mut st = run.lock();
                if st.status != Status::Waiting || st.events.len() as u64 != asked + 1 {
                    return;
                }
                st.pending = None;
            }
            run.fail(json!({"message": format!(
                "no input arrived within {} s; the run has ended",
                wait.as_secs()
            )}));
        });
    }

    pub(super) fn status_json(&self) -> Value {
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

    pub(super) fn events_after(&self, since: Option<i64>) -> Vec<Value> {
        let st = self.lock();
        let from = since.map_or(0, |s| usize::try_from(s + 1).unwrap_or(0));
        st.events.iter().skip(from).cloned().collect()
    }
}

/// Runs and threads of gateway-hosted agents on this node.
pub struct ApRuns {
    runs: Mutex<HashMap<String, Arc<Run>>>,
    /// thread id → run ids in order.
    threads: Mutex<HashMap<String, Vec<String>>>,
    /// How long a run waits for input it asked for.
    input_wait: Duration,
    /// What the runs' events may hold in memory together
    /// (`gateway.runs_max_bytes`).
    max_bytes: usize,
}

impl ApRuns {
    pub fn new(input_wait: Duration, max_bytes: usize) -> Self {
        Self {
            runs: Mutex::default(),
            threads: Mutex::default(),
            input_wait,
            max_bytes,
        }
    }

    fn get(&self, id: &str) -> Option<Arc<Run>> {
        self.runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    /// Adds a run, forgetting completed runs past their time (and the
    /// oldest completed ones when the node holds too many, or their events
    /// more than `max_bytes`: an agent answering in megabytes would
    /// otherwise have the node keep ten thousand such answers for an
    /// hour). A node whose open runs alone hold that much takes no more
    /// until some complete. A caller with
    /// [`MAX_OPEN_PER_CALLER`] runs open is told to finish some first, and
    /// so is an anonymous caller once anonymous callers together hold
    /// [`MAX_OPEN_ANONYMOUS`].
    fn insert(&self, run: Arc<Run>) -> Result<()> {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        let by_address = matches!(run.holder, Holder::Address(_));
        let (mut open, mut anonymous) = (0, 0);
        for r in runs.values() {
            let theirs = r.holder == run.holder;
            let counted = theirs || (by_address && matches!(r.holder, Holder::Address(_)));
            if counted && r.lock().status != Status::Completed {
                open += usize::from(theirs);
                anonymous += usize::from(matches!(r.holder, Holder::Address(_)));
            }
        }
        if open >= MAX_OPEN_PER_CALLER {
            return Err(ServiceError::RateLimited {
                message: format!(
                    "{open} of your Agent Protocol runs are still open on this node; let them complete or cancel some first"
                ),
                retry_after: 5,
            });
        }
        if by_address && anonymous >= MAX_OPEN_ANONYMOUS {
            return Err(ServiceError::RateLimited {
                message: format!(
                    "anonymous callers already have {anonymous} Agent Protocol runs open on this node, the most they may have together; authenticate, or retry later"
                ),
                retry_after: 5,
            });
        }
        let before = runs.len();
        runs.retain(|_, r| {
            r.lock()
                .completed_at
                .is_none_or(|t| t.elapsed() < KEEP_COMPLETED)
        });
        let mut held: usize = runs.values().map(|r| r.lock().bytes).sum();
        if runs.len() >= MAX_RUNS || held > self.max_bytes {
            let mut completed: Vec<_> = runs
                .iter()
                .filter_map(|(id, r)| {
                    let st = r.lock();
                    st.completed_at.map(|t| (t, id.clone(), st.bytes))
                })
                .collect();
            completed.sort_unstable();
            for (_, id, bytes) in completed {
                if runs.len() < MAX_RUNS && held <= self.max_bytes {
                    break;
                }
                runs.remove(&id);
                // Saturating: a run that completed since `held` was summed
                // may count a last event that sum did not.
                held = held.saturating_sub(bytes);
            }
        }
        let full = runs.len() >= MAX_RUNS;
        let heavy = held > self.max_bytes;
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if runs.len() < before {
            // Threads list only runs still kept.
            threads.retain(|_, ids| {
                ids.retain(|id| runs.contains_key(id));
                !ids.is_empty()
            });
        }
        if full {
            return Err(ServiceError::Overloaded {
                message: format!("this node already runs {MAX_RUNS} Agent Protocol runs"),
                retry_after: Some(5),
            });
        }
        if heavy {
            return Err(ServiceError::Overloaded {
                message: format!(
                    "the Agent Protocol runs open on this node hold {held} bytes of events, more than it keeps ({} bytes, gateway.runs_max_bytes); retry once some complete",
                    self.max_bytes
                ),
                retry_after: Some(5),
            });
        }
        threads
            .entry(run.thread_id.clone())
            .or_default()
            .push(run.id.clone());
        runs.insert(run.id.clone(), run);
        Ok(())
    }

    /// The principal's runs of the agent in one thread, in order.
    pub(super) fn thread_runs(
        &self,
        thread: &str,
        agent_id: &str,
        principal: Option<&Principal>,
    ) -> Vec<Arc<Run>> {
        let ids = self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(thread)
            .cloned()
            .unwrap_or_default();
        ids.iter()
            .filter_map(|id| self.get(id))
            .filter(|r| r.belongs_to(agent_id, principal))
            .collect()
    }

    /// The principal's threads with the agent, each with its run ids.
    pub(super) fn threads(
        &self,
        agent_id: &str,
        principal: Option<&Principal>,
    ) -> Vec<(String, Vec<String>)> {
        let all: Vec<(String, Vec<String>)> = self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(t, ids)| (t.clone(), ids.clone()))
            .collect();
        let mut mine: Vec<_> = all
            .into_iter()
            .filter(|(_, ids)| {
                ids.iter()
                    .filter_map(|id| self.get(id))
                    .any(|r| r.belongs_to(agent_id, principal))
            })
            .collect();
        mine.sort();
        mine
    }

    /// The principal's run of the agent.
    pub(super) fn own(
        &self,
        run_id: &str,
        agent_id: &str,
        principal: Option<&Principal>,
    ) -> Result<Arc<Run>> {
        self.get(run_id)
            .filter(|r| r.belongs_to(agent_id, principal))
            .ok_or_else(|| not_found("run", run_id))
    }
}

/// The operation a run calls, through the binding the gateway would use.
fn target<'a>(record: &'a AgentRecord, operation: Option<&'a str>) -> Result<Target<'a>> {
    select_operation(
        &record.metadata,
        call_binding(&record.metadata, &[]),
        operation,
    )
    .map_err(|e| bad_request(&e.pointer, e.message))
}

impl InvocationService {
    /// Starts a run of a gateway-hosted agent; returns it and RunStarted.
    pub(super) fn start_run(
        &self,
        principal: Option<&Principal>,
        client: Option<IpAddr>,
        record: &AgentRecord,
        chat: Chat,
        auth: Option<String>,
    ) -> Result<(Arc<Run>, Value)> {
        let Chat {
            input,
            thread_id,
            operation,
        } = chat;
        let target = target(record, operation.as_deref())?;
        let runs = self.ap_runs();
        let thread_id = match thread_id {
            Some(t) => {
                if runs
                    .thread_runs(&t, &record.metadata.id, principal)
                    .is_empty()
                {
                    return Err(not_found("thread", &t));
                }
                t
            }
            None => uuid::Uuid::new_v4().to_string(),
        };
        let (input, missing) = chat_input(target.inputs, input);
        let run = Run::new(thread_id, record, principal.cloned(), client, auth);
        runs.insert(run.clone())?;
        let started = run.publish("RunStarted", "system", json!({}));
        let operation = target.name().map(String::from);
        if missing.is_empty() {
            self.execute(&run, Value::Object(input), operation, None);
        } else {
            run.wait_for_input(
                Pending::Members { input, operation },
                missing,
                runs.input_wait,
            );
        }
        Ok((run, started))
    }

    /// Calls the agent through the gateway in a task of its own; the run's
    /// events tell how it went.
    fn execute(
        &self,
        run: &Arc<Run>,
        input: Value,
        operation: Option<String>,
        continues: Option<Continuation>,
    ) {
        let service = self.clone();
        let r = run.clone();
        let auth = run.lock().agent_authorization.clone();
        let task = tokio::spawn(async move {
            let req = InvokeRequest {
                agent_id: r.agent_id.clone(),
                body: input.to_string().into(),
                operation: operation.clone(),
                agent_authorization: auth,
                continues,
                ..Default::default()
            };
            match service
                .invoke(r.owner.as_ref(), req)
                .await
                .map(|i| i.outcome)
            {
                Ok(Outcome::Single(answer)) if (200..300).contains(&answer.status) => {
                    answered(&r, &answer, operation, service.ap_runs().input_wait);
                }
                Ok(Outcome::Single(answer)) => {
                    let body: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
                    r.fail(json!({"status": answer.status, "body": body}));
                }
                Ok(Outcome::Batch(_)) => r.fail(json!({"message": "unexpected batch"})),
                Err(e) => r.fail(json!({"message": e.to_string()})),
            }
        });
        run.lock().task = Some(task);
    }

    pub(super) fn cancel_run(
        &self,
        principal: Option<&Principal>,
        record: &AgentRecord,
        run_id: &str,
    ) -> Result<Value> {
        let run = self.ap_runs().own(run_id, &record.metadata.id, principal)?;
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

    pub(super) fn resume_run(
        &self,
        principal: Option<&Principal>,
        record: &AgentRecord,
        run_id: &str,
        keys: Map<String, Value>,
    ) -> Result<Value> {
        let run = self.ap_runs().own(run_id, &record.metadata.id, principal)?;
        let not_waiting =
            || ServiceError::Conflict(format!("run '{run_id}' is not waiting for input"));
        let pending = {
            let mut st = run.lock();
            if st.status != Status::Waiting {
                return Err(not_waiting());
            }
            st.status = Status::Running;
            st.pending.take()
        };
        match pending.ok_or_else(not_waiting)? {
            Pending::Members {
                mut input,
                operation,
            } => {
                input.extend(keys);
                let target = target(record, operation.as_deref())?;
                let still = missing(target.inputs, &input);
                if still.is_empty() {
                    self.execute(&run, Value::Object(input), operation, None);
                } else {
                    run.wait_for_input(
                        Pending::Members { input, operation },
                        still,
                        self.ap_runs().input_wait,
                    );
                }
            }
            Pending::Task {
                continues,
                operation,
            } => {
                // The answer alone is the next message's text (or data);
                // several keys go as one data part.
                let answer = match keys.get(A2A_ANSWER_KEY) {
                    Some(Value::String(text)) if keys.len() == 1 => json!({ "text": text }),
                    Some(v @ Value::Object(_)) if keys.len() == 1 => v.clone(),
                    _ => Value::Object(keys),
                };
                self.execute(&run, answer, operation, Some(continues));
            }
        }
        Ok(run.status_json())
    }
}

/// A successful answer: its text out, then the run completes, or (an A2A
/// task that asks something) waits for the caller's answer.
fn answered(run: &Arc<Run>, answer: &Invoked, operation: Option<String>, wait: Duration) {
    let text = String::from_utf8_lossy(&answer.body).into_owned();
    run.publish("TextOutput", "assistant", json!({"content": text}));
    let asks = (answer.protocol == Protocol::A2a.as_str())
        .then(|| serde_json::from_slice::<Value>(&answer.body).ok())
        .flatten()
        .and_then(|json| a2a::input_request(&json));
    match asks {
        Some(ask) => {
            let question = if ask.question.is_empty() {
                "the agent needs more input".to_string()
            } else {
                ask.question
            };
            run.wait_for_input(
                Pending::Task {
                    continues: ask.continuation,
                    operation,
                },
                Map::from_iter([(A2A_ANSWER_KEY.to_string(), json!(question))]),
                wait,
            );
        }
        None => {
            run.publish(
                "RunCompleted",
                "assistant",
                json!({"finish_reason": "success", "result": text}),
            );
        }
    }
}

/// A run's events after `since`, then each new one, ending after
/// RunCompleted.
pub(super) fn follow(run: Arc<Run>, since: Option<i64>) -> ApEvents {
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
    use crate::domain::Role;

    fn run(owner: &str, thread: &str) -> Arc<Run> {
        let owner = Principal::new(owner, Role::Publisher);
        run_by(Some(owner), None, thread)
    }

    fn run_by(owner: Option<Principal>, client: Option<IpAddr>, thread: &str) -> Arc<Run> {
        let metadata = serde_json::from_value(json!({
            "id": "echo", "name": "Echo", "description": "Echoes its input."
        }))
        .unwrap();
        let record = AgentRecord {
            metadata,
            envelope: Default::default(),
        };
        Run::new(thread.into(), &record, owner, client, None)
    }

    fn ask(run: &Arc<Run>, wait: Duration) {
        run.publish("RunStarted", "system", json!({}));
        let pending = Pending::Members {
            input: Map::new(),
            operation: None,
        };
        let keys = Map::from_iter([("text".to_string(), json!("What text?"))]);
        run.wait_for_input(pending, keys, wait);
    }

    #[tokio::test]
    async fn a_run_nobody_answers_ends_with_an_error_and_an_answered_one_does_not() {
        let wait = Duration::from_millis(50);
        let ignored = run("alice", "t1");
        ask(&ignored, wait);
        let answered = run("alice", "t2");
        ask(&answered, wait);
        // What resume does first: the run leaves the waiting state.
        {
            let mut st = answered.lock();
            st.status = Status::Running;
            st.pending.take();
        }
        tokio::time::sleep(wait * 4).await;

        let st = ignored.lock();
        assert_eq!(st.status, Status::Completed);
        assert_eq!(st.finish_reason.as_deref(), Some("error"));
        let last = st.events.last().unwrap();
        assert_eq!(last["type"], "RunCompleted");
        assert!(
            last["error"]["message"]
                .as_str()
                .unwrap()
                .contains("no input arrived"),
            "{last}"
        );
        assert!(st.pending.is_none());
        drop(st);
        let st = answered.lock();
        assert_eq!(st.status, Status::Running);
        assert_eq!(st.events.len(), 2, "no event after WaitForInput");
    }

    /// Completes one of the runs whose holder `held_by` accepts.
    fn complete_one(runs: &ApRuns, held_by: impl Fn(&Holder) -> bool) {
        let run = runs
            .runs
            .lock()
            .unwrap()
            .values()
            .find(|r| held_by(&r.holder))
            .cloned()
            .unwrap();
        run.publish(
            "RunCompleted",
            "assistant",
            json!({"finish_reason": "success"}),
        );
    }

    #[test]
    fn one_caller_holds_at_most_its_share_of_open_runs() {
        let runs = ApRuns::new(Duration::from_secs(600), usize::MAX);
        for i in 0..MAX_OPEN_PER_CALLER {
            runs.insert(run("alice", &format!("t{i}"))).unwrap();
        }
        let refused = runs.insert(run("alice", "more")).unwrap_err();
        assert!(
            matches!(refused, ServiceError::RateLimited { retry_after: 5, .. }),
            "{refused:?}"
        );
        // Others are not held back by alice's runs.
        runs.insert(run("bob", "b")).unwrap();
        // One of alice's completes: she may start another.
        complete_one(&runs, |h| *h == Holder::Principal("alice".into()));
        runs.insert(run("alice", "more")).unwrap();
    }

    #[test]
    fn anonymous_callers_hold_open_runs_by_address() {
        let runs = ApRuns::new(Duration::from_secs(600), usize::MAX);
        let (one, other): (IpAddr, IpAddr) =
            ("192.0.2.1".parse().unwrap(), "2001:db8::".parse().unwrap());
        for i in 0..MAX_OPEN_PER_CALLER {
            runs.insert(run_by(None, Some(one), &format!("t{i}")))
                .unwrap();
        }
        assert!(runs.insert(run_by(None, Some(one), "more")).is_err());
        // Another address, an in-process caller and a principal each have
        // their own allowance.
        runs.insert(run_by(None, Some(other), "other")).unwrap();
        runs.insert(run_by(None, None, "in-process")).unwrap();
        runs.insert(run("alice", "alice")).unwrap();
    }

    #[test]
    fn anonymous_callers_together_hold_at_most_their_share_of_runs() {
        let runs = ApRuns::new(Duration::from_secs(600), usize::MAX);
        let address = |i: usize| IpAddr::from([10, 0, (i >> 8) as u8, i as u8]);
        // Filled directly: through `insert`, each would scan the table.
        {
            let mut table = runs.runs.lock().unwrap();
            for i in 0..MAX_OPEN_ANONYMOUS {
                let r = run_by(None, Some(address(i)), &format!("t{i}"));
                table.insert(r.id.clone(), r);
            }
        }
        let refused = runs
            .insert(run_by(None, Some(address(MAX_OPEN_ANONYMOUS)), "more"))
            .unwrap_err();
        assert!(
            matches!(&refused, ServiceError::RateLimited { retry_after: 5, message } if message.contains("anonymous callers already have")),
            "{refused:?}"
        );
        // Callers with credentials, and in-process ones, are not held back.
        runs.insert(run("alice", "alice")).unwrap();
        runs.insert(run_by(None, None, "in-process")).unwrap();
        // One anonymous run completes: another anonymous caller may start one.
        complete_one(&runs, |h| matches!(h, Holder::Address(_)));
        runs.insert(run_by(None, Some(address(MAX_OPEN_ANONYMOUS)), "more"))
            .unwrap();
    }

    /// The runs' events are bounded in bytes: past the bound the oldest
    /// completed runs go (and their threads), and while open runs alone
    /// hold more, no run is started.
    #[test]
    fn runs_hold_at_most_their_bytes_of_events() {
        let runs = ApRuns::new(Duration::from_secs(600), 1 << 20);
        let answer = |r: &Arc<Run>, kb: usize| {
            r.publish(
                "TextOutput",
                "assistant",
                json!({"content": "x".repeat(kb << 10)}),
            );
        };
        let mut ids = Vec::new();
        for i in 0..4 {
            let r = run("alice", &format!("t{i}"));
            runs.insert(r.clone()).unwrap();
            answer(&r, 300);
            r.publish(
                "RunCompleted",
                "assistant",
                json!({"finish_reason": "success"}),
            );
            ids.push(r.id.clone());
        }
        // 1.2 MB of events: the next run makes the oldest go, only it.
        let open = run("bob", "open");
        runs.insert(open.clone()).unwrap();
        assert!(runs.get(&ids[0]).is_none(), "the oldest completed run went");
        assert!(!runs.threads.lock().unwrap().contains_key("t0"));
        assert!(ids[1..].iter().all(|id| runs.get(id).is_some()));

        // An open run past the bound with the rest: the completed runs
        // go, and then no more runs are taken while it holds too much.
        answer(&open, 1100);
        let refused = runs.insert(run("carol", "c")).unwrap_err();
        assert!(
            matches!(&refused, ServiceError::Overloaded { message, .. } if message.contains("runs_max_bytes")),
            "{refused:?}"
        );
        assert!(ids.iter().all(|id| runs.get(id).is_none()));
        assert!(runs.get(&open.id).is_some(), "an open run is never dropped");
        open.publish(
            "RunCompleted",
            "assistant",
            json!({"finish_reason": "success"}),
        );
        runs.insert(run("carol", "c")).unwrap();
        assert!(runs.get(&open.id).is_none(), "completed, it made room");
    }

    #[test]
    fn forgotten_runs_leave_their_threads() {
        let runs = ApRuns::new(Duration::from_secs(600), usize::MAX);
        let mut oldest = None;
        // Filled directly: through `insert`, each would scan the table.
        for i in 0..MAX_RUNS {
            let r = run(&format!("caller{i}"), &format!("t{i}"));
            r.publish(
                "RunCompleted",
                "assistant",
                json!({"finish_reason": "success"}),
            );
            oldest.get_or_insert_with(|| r.id.clone());
            let mut threads = runs.threads.lock().unwrap();
            threads.insert(r.thread_id.clone(), vec![r.id.clone()]);
            runs.runs.lock().unwrap().insert(r.id.clone(), r);
        }
        let oldest = oldest.unwrap();
        assert!(runs.threads.lock().unwrap().contains_key("t0"));
        // The table is full: the oldest completed run makes room, and its
        // thread goes with it.
        runs.insert(run("alice", "new")).unwrap();
        assert!(runs.get(&oldest).is_none());
        let threads = runs.threads.lock().unwrap();
        assert!(!threads.contains_key("t0"));
        assert_eq!(threads.len(), MAX_RUNS);
        assert!(threads.contains_key("new"));
    }
}
