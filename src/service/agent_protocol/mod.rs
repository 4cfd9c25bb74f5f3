//! The Agent Protocol surface (AP, 2025 edition): every agent in the
//! registry answers AP's routes at its own path, `/agents/{id}`.
//!
//! An agent that speaks AP (an `agent-protocol` binding) is proxied
//! (`proxy`): its runs, threads and events are its own. Any other agent
//! runs in the gateway (`runs`): a ChatRequest becomes RunStarted, the
//! invocation through the gateway, TextOutput with the agent's JSON answer,
//! and RunCompleted; input still needed is asked for with WaitForInput and
//! supplied with ResumeWithInput (AP's human in the loop); CancelRequest
//! aborts the call. `request` reads AP's documents.
//!
//! The service answers with typed replies (`ApReply`); the API layer
//! turns them into statuses.

mod proxy;
mod request;
mod runs;

use std::net::IpAddr;

use futures::stream::BoxStream;
use serde_json::{json, Value};

use self::proxy::ap_endpoint;
use self::request::{descriptor, parse_request, ApRequest};
pub use self::runs::ApRuns;
use super::error::ServiceError;
use super::invocation::InvocationService;
use crate::domain::Principal;
use crate::gateway::transport::Event;

type Result<T> = std::result::Result<T, ServiceError>;

/// What an AP route answers.
#[derive(Debug, Clone)]
pub enum ApReply {
    /// A document of the gateway's own.
    Document(Value),
    /// The request was taken; the run's events tell the rest.
    Accepted,
    /// A proxied AP agent's answer, with the status it gave.
    Relayed { status: u16, json: Value },
}

/// Events of a run as they come (or a proxied agent's).
pub type ApEvents = BoxStream<'static, Result<Event>>;

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

fn encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
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
            .map(|(id, name)| json!([name, format!("/agents/{}", encode(id))]))
            .collect();
        Ok(Value::Array(list))
    }

    /// `describe`: the AgentDescriptor.
    pub async fn ap_describe(&self, principal: Option<&Principal>, id: &str) -> Result<ApReply> {
        self.registry().require_reader(principal)?;
        let record = self.agent(principal, id).await?;
        match ap_endpoint(&record) {
            Some(base) => self.proxy_get(&record, &base, "describe").await,
            None => Ok(ApReply::Document(descriptor(&record))),
        }
    }

    /// `run`: a ChatRequest, CancelRequest or ResumeWithInput. With `wait`
    /// the answer carries the response event (RunStarted, RunCompleted
    /// for a cancel, the run's status after a resume); without, it is
    /// only accepted. `client` is the caller's address
    /// (`listener::client_key`): an anonymous caller's open runs count
    /// against it.
    pub async fn ap_run(
        &self,
        principal: Option<&Principal>,
        client: Option<IpAddr>,
        id: &str,
        request: Value,
        wait: bool,
        auth: Option<String>,
    ) -> Result<ApReply> {
        self.require_caller(principal)?;
        let record = self.agent(principal, id).await?;
        if let Some(base) = ap_endpoint(&record) {
            return self.proxy_run(&record, &base, &request, wait, auth).await;
        }
        let event = match parse_request(&request)? {
            ApRequest::Chat(chat) => self.start_run(principal, client, &record, chat, auth)?.1,
            ApRequest::Cancel { run_id } => self.cancel_run(principal, &record, &run_id)?,
            ApRequest::Resume { run_id, keys } => {
                self.resume_run(principal, &record, &run_id, keys)?
            }
        };
        Ok(if wait {
            ApReply::Document(event)
        } else {
            ApReply::Accepted
        })
    }

    /// `get_events` (polling): a run's events after `since`, or all events
    /// of a thread.
    pub async fn ap_events(
        &self,
        principal: Option<&Principal>,
        id: &str,
        run_id: &str,
        since: Option<i64>,
    ) -> Result<ApReply> {
        self.require_caller(principal)?;
        let record = self.agent(principal, id).await?;
        if let Some(base) = ap_endpoint(&record) {
            let mut route = format!("get_events/{}", encode(run_id));
            if let Some(s) = since {
                route.push_str(&format!("?since={s}"));
            }
            return self.proxy_get(&record, &base, &route).await;
        }
        let runs = self.ap_runs();
        let agent = &record.metadata.id;
        if let Ok(run) = runs.own(run_id, agent, principal) {
            return Ok(ApReply::Document(Value::Array(run.events_after(since))));
        }
        let thread: Vec<Value> = runs
            .thread_runs(run_id, agent, principal)
            .iter()
            .flat_map(|r| r.events_after(None))
            .collect();
        if thread.is_empty() {
            return Err(not_found("run", run_id));
        }
        Ok(ApReply::Document(Value::Array(thread)))
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
        self.require_caller(principal)?;
        let record = self.agent(principal, id).await?;
        if let Some(base) = ap_endpoint(&record) {
            return self
                .proxy_stream_events(&record, &base, run_id, since)
                .await;
        }
        let run = self.ap_runs().own(run_id, &record.metadata.id, principal)?;
        Ok(runs::follow(run, since))
    }

    /// `stream_request`: starts a run and streams its events (`client` as
    /// for `ap_run`).
    pub async fn ap_stream_request(
        &self,
        principal: Option<&Principal>,
        client: Option<IpAddr>,
        id: &str,
        request: Value,
        auth: Option<String>,
    ) -> Result<ApEvents> {
        self.require_caller(principal)?;
        let record = self.agent(principal, id).await?;
        if let Some(base) = ap_endpoint(&record) {
            return self
                .proxy_stream_request(&record, &base, &request, auth)
                .await;
        }
        let ApRequest::Chat(chat) = parse_request(&request)? else {
            return Err(bad_request("/type", "stream_request takes a ChatRequest"));
        };
        let (run, _) = self.start_run(principal, client, &record, chat, auth)?;
        Ok(runs::follow(run, None))
    }

    /// `runs/{run_id}`: a run's status.
    pub async fn ap_run_status(
        &self,
        principal: Option<&Principal>,
        id: &str,
        run_id: &str,
    ) -> Result<ApReply> {
        self.require_caller(principal)?;
        let record = self.agent(principal, id).await?;
        if let Some(base) = ap_endpoint(&record) {
            return self
                .proxy_get(&record, &base, &format!("runs/{}", encode(run_id)))
                .await;
        }
        let run = self.ap_runs().own(run_id, &record.metadata.id, principal)?;
        Ok(ApReply::Document(run.status_json()))
    }

    /// `threads`: the caller's threads with this agent and their runs.
    pub async fn ap_threads(&self, principal: Option<&Principal>, id: &str) -> Result<ApReply> {
        self.require_caller(principal)?;
        let record = self.agent(principal, id).await?;
        if let Some(base) = ap_endpoint(&record) {
            return self.proxy_get(&record, &base, "threads").await;
        }
        let threads = self.ap_runs().threads(&record.metadata.id, principal);
        Ok(ApReply::Document(Value::Array(
            threads
                .into_iter()
                .map(|(t, ids)| json!({"thread_id": t, "runs": ids}))
                .collect(),
        )))
    }
}
