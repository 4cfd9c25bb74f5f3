//! `agentry.v1.AgentProtocol` handlers: every agent as an Agent Protocol
//! agent. The HTTP facade (`GET /ap`, `/agents/{id}/describe`, `run`,
//! `get_events`, `stream_request`, `runs`, `threads`) calls these same
//! handlers.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use serde_json::Value;
use tonic::{Request, Response, Status};

use super::grpc::{client_address, principal};
use super::invocation::{error_event, InvocationApi};
use crate::pb::{self, agent_protocol_server::AgentProtocol};
use crate::service::{ApEvents, ApReply, ServiceError};

/// A reply's status and JSON text (empty when it has no body): the
/// gateway's own documents are 200, an accepted request 202, and a proxied
/// agent's answer keeps the status the agent gave.
fn status_and_json(reply: ApReply) -> (u32, String) {
    match reply {
        ApReply::Document(json) => (200, json.to_string()),
        ApReply::Accepted => (202, String::new()),
        ApReply::Relayed { status, json } if json.is_null() => (u32::from(status), String::new()),
        ApReply::Relayed { status, json } => (u32::from(status), json.to_string()),
    }
}

fn document(reply: ApReply) -> Response<pb::ApDocument> {
    let (status, json) = status_and_json(reply);
    Response::new(pb::ApDocument { json, status })
}

fn request_json(text: &str) -> Result<Value, ServiceError> {
    crate::domain::json::parse_json(text.as_bytes()).map_err(|e| ServiceError::InvalidRequest {
        field: Some(String::new()),
        message: format!("the AP request is not valid JSON: {e}"),
    })
}

fn some(s: String) -> Option<String> {
    Some(s).filter(|s| !s.is_empty())
}

/// A stream of AP events as the handlers return it.
pub type ApEventStream = Pin<Box<dyn Stream<Item = Result<pb::ApEvent, Status>> + Send>>;

/// AP events on the wire; a failure after the stream began is its last
/// event, in the one error body.
fn event_stream(events: ApEvents) -> ApEventStream {
    Box::pin(futures::stream::unfold(
        (events, false),
        |(mut events, over)| async move {
            if over {
                return None;
            }
            match events.next().await? {
                Ok(e) => Some((
                    Ok(pb::ApEvent {
                        r#type: e.event,
                        json: e.data,
                        id: e.id.unwrap_or_default(),
                    }),
                    (events, false),
                )),
                Err(e) => {
                    let ev = error_event(&e);
                    Some((
                        Ok(pb::ApEvent {
                            r#type: ev.event,
                            json: ev.data,
                            id: String::new(),
                        }),
                        (events, true),
                    ))
                }
            }
        },
    ))
}

#[tonic::async_trait]
impl AgentProtocol for InvocationApi {
    #[tracing::instrument(name = "grpc.ap.ListAgents", skip_all)]
    async fn list_agents(
        &self,
        req: Request<pb::ApListRequest>,
    ) -> Result<Response<pb::ApDocument>, Status> {
        let who = principal(&req);
        let list = self.service().ap_agents(who.as_ref()).await?;
        Ok(document(ApReply::Document(list)))
    }

    #[tracing::instrument(name = "grpc.ap.Describe", skip_all)]
    async fn describe(
        &self,
        req: Request<pb::ApAgentRef>,
    ) -> Result<Response<pb::ApDocument>, Status> {
        let who = principal(&req);
        Ok(document(
            self.service()
                .ap_describe(who.as_ref(), &req.get_ref().agent_id)
                .await?,
        ))
    }

    #[tracing::instrument(name = "grpc.ap.Run", skip_all)]
    async fn run(
        &self,
        req: Request<pb::ApRunRequest>,
    ) -> Result<Response<pb::ApRunReply>, Status> {
        let who = principal(&req);
        let client = client_address(&req);
        let r = req.into_inner();
        let request = request_json(&r.request)?;
        let a = self
            .service()
            .ap_run(
                who.as_ref(),
                client,
                &r.agent_id,
                request,
                r.wait,
                some(r.agent_authorization),
            )
            .await?;
        let (status, json) = status_and_json(a);
        Ok(Response::new(pb::ApRunReply { status, json }))
    }

    #[tracing::instrument(name = "grpc.ap.GetEvents", skip_all)]
    async fn get_events(
        &self,
        req: Request<pb::ApEventsRequest>,
    ) -> Result<Response<pb::ApDocument>, Status> {
        let who = principal(&req);
        let r = req.into_inner();
        Ok(document(
            self.service()
                .ap_events(who.as_ref(), &r.agent_id, &r.run_id, r.since)
                .await?,
        ))
    }

    type StreamEventsStream = ApEventStream;

    #[tracing::instrument(name = "grpc.ap.StreamEvents", skip_all)]
    async fn stream_events(
        &self,
        req: Request<pb::ApEventsRequest>,
    ) -> Result<Response<Self::StreamEventsStream>, Status> {
        let who = principal(&req);
        let r = req.into_inner();
        let events = self
            .service()
            .ap_stream_events(who.as_ref(), &r.agent_id, &r.run_id, r.since)
            .await?;
        Ok(Response::new(event_stream(events)))
    }

    type StreamRequestStream = ApEventStream;

    #[tracing::instrument(name = "grpc.ap.StreamRequest", skip_all)]
    async fn stream_request(
        &self,
        req: Request<pb::ApRunRequest>,
    ) -> Result<Response<Self::StreamRequestStream>, Status> {
        let who = principal(&req);
        let client = client_address(&req);
        let r = req.into_inner();
        let request = request_json(&r.request)?;
        let events = self
            .service()
            .ap_stream_request(
                who.as_ref(),
                client,
                &r.agent_id,
                request,
                some(r.agent_authorization),
            )
            .await?;
        Ok(Response::new(event_stream(events)))
    }

    #[tracing::instrument(name = "grpc.ap.GetRun", skip_all)]
    async fn get_run(
        &self,
        req: Request<pb::ApRunRef>,
    ) -> Result<Response<pb::ApDocument>, Status> {
        let who = principal(&req);
        let r = req.get_ref();
        Ok(document(
            self.service()
                .ap_run_status(who.as_ref(), &r.agent_id, &r.run_id)
                .await?,
        ))
    }

    #[tracing::instrument(name = "grpc.ap.ListThreads", skip_all)]
    async fn list_threads(
        &self,
        req: Request<pb::ApAgentRef>,
    ) -> Result<Response<pb::ApDocument>, Status> {
        let who = principal(&req);
        Ok(document(
            self.service()
                .ap_threads(who.as_ref(), &req.get_ref().agent_id)
                .await?,
        ))
    }
}
