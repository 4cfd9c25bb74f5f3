//! Agents that speak AP themselves: every route is passed to the agent's
//! own AP endpoint through the outbound guard, with the agent's
//! credentials, and its answers come back as it gave them.

use futures::StreamExt;
use serde_json::Value;

use super::{ApEvents, ApReply, Result};
use crate::domain::resolve::preferred_binding;
use crate::domain::{AgentRecord, Binding, Protocol};
use crate::gateway::transport::{self, ap_url, Event, Started};
use crate::service::error::ServiceError;
use crate::service::invocation::{InvocationService, InvokeRequest};

/// The AP binding of an agent that speaks AP, or None when the gateway
/// runs the agent.
fn ap_binding(record: &AgentRecord) -> Option<&Binding> {
    preferred_binding(&record.metadata.bindings, |b| {
        b.known_protocol() == Some(Protocol::AgentProtocol)
    })
}

/// The AP endpoint of an agent that speaks AP, or None when the gateway
/// runs the agent.
pub(super) fn ap_endpoint(record: &AgentRecord) -> Option<String> {
    ap_binding(record).map(|b| b.endpoint.clone())
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
    /// One request to the agent's AP endpoint, with the agent's
    /// credentials (configured, or the caller's Agent-Authorization).
    async fn ap_send(
        &self,
        record: &AgentRecord,
        method: reqwest::Method,
        url: &url::Url,
        body: Option<&Value>,
        auth: Option<String>,
        accept: &str,
    ) -> Result<reqwest::Response> {
        let mut c = self.credentials_for(
            record,
            &InvokeRequest {
                agent_authorization: auth,
                ..Default::default()
            },
        )?;
        if let Some(binding) = ap_binding(record) {
            c = c.with_binding(&record.metadata.id, binding)?;
        }
        let (headers, bearer) = c.headers().await?;
        let resp = transport::exchange(&c.outbound, method, url, body, &headers, accept).await?;
        c.answered(bearer, resp.status().as_u16()).await;
        Ok(resp)
    }

    /// One request whose answer is a whole JSON document, passed on with
    /// the agent's status.
    async fn relayed(
        &self,
        record: &AgentRecord,
        method: reqwest::Method,
        url: &url::Url,
        body: Option<&Value>,
        auth: Option<String>,
    ) -> Result<ApReply> {
        let resp = self
            .ap_send(record, method, url, body, auth, "application/json")
            .await?;
        let a = transport::whole_answer(self.outbound(), resp, url).await?;
        Ok(ApReply::Relayed {
            status: a.status,
            json: a.json,
        })
    }

    /// One request whose answer is an event stream (or a refusal).
    async fn events(
        &self,
        record: &AgentRecord,
        method: reqwest::Method,
        url: &url::Url,
        body: Option<&Value>,
        auth: Option<String>,
    ) -> Result<ApEvents> {
        let resp = self
            .ap_send(record, method, url, body, auth, "text/event-stream")
            .await?;
        started_events(transport::events_or_answer(self.outbound(), resp, url).await?)
    }

    /// A GET of `route` under the agent's AP endpoint.
    pub(super) async fn proxy_get(
        &self,
        record: &AgentRecord,
        base: &str,
        route: &str,
    ) -> Result<ApReply> {
        let url = ap_url(base, route)?;
        self.relayed(record, reqwest::Method::GET, &url, None, None)
            .await
    }

    /// `run`, holding one of the agent's in-flight permits.
    pub(super) async fn proxy_run(
        &self,
        record: &AgentRecord,
        base: &str,
        request: &Value,
        wait: bool,
        auth: Option<String>,
    ) -> Result<ApReply> {
        let _permit = self.permit(&record.metadata.id)?;
        let mut url = ap_url(base, "run")?;
        url.query_pairs_mut()
            .append_pair("wait", if wait { "true" } else { "false" });
        self.relayed(record, reqwest::Method::POST, &url, Some(request), auth)
            .await
    }

    /// `get_events?stream=true`.
    pub(super) async fn proxy_stream_events(
        &self,
        record: &AgentRecord,
        base: &str,
        run_id: &str,
        since: Option<i64>,
    ) -> Result<ApEvents> {
        let mut url = ap_url(base, &format!("get_events/{}", super::encode(run_id)))?;
        url.query_pairs_mut().append_pair("stream", "true");
        if let Some(s) = since {
            url.query_pairs_mut().append_pair("since", &s.to_string());
        }
        self.events(record, reqwest::Method::GET, &url, None, None)
            .await
    }

    /// `stream_request`; the agent's permit is held while the events flow.
    pub(super) async fn proxy_stream_request(
        &self,
        record: &AgentRecord,
        base: &str,
        request: &Value,
        auth: Option<String>,
    ) -> Result<ApEvents> {
        let permit = self.permit(&record.metadata.id)?;
        let url = ap_url(base, "stream_request")?;
        let events = self
            .events(record, reqwest::Method::POST, &url, Some(request), auth)
            .await?;
        Ok(events
            .map(move |e| {
                let _held = &permit;
                e
            })
            .boxed())
    }
}
