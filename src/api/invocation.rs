//! `agentry.v1.Gateway` handlers: the gateway's calls and imports. The
//! HTTP facade (`POST /agents/{id}/invoke`, `POST /import/*`) calls these
//! same handlers.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::error::{detail_of, problem_body};
use super::grpc::principal;
use crate::pb::{self, gateway_server::Gateway};
use crate::service::{
    ImportFormat, ImportReport, InvocationService, InvokeRequest, Invoked, Outcome, OutputCheck,
    ServiceError,
};

/// The `agentry.v1.Gateway` service.
#[derive(Clone)]
pub struct InvocationApi {
    service: InvocationService,
}

impl InvocationApi {
    pub fn new(service: InvocationService) -> Self {
        Self { service }
    }

    pub fn service(&self) -> &InvocationService {
        &self.service
    }
}

fn invoke_request(r: pb::InvokeRequest) -> InvokeRequest {
    let some = |s: String| Some(s).filter(|s| !s.is_empty());
    InvokeRequest {
        agent_id: r.agent_id,
        body: r.body.into(),
        operation: some(r.operation),
        protocols: r.protocols,
        idempotency_key: some(r.idempotency_key),
        agent_authorization: some(r.agent_authorization),
        continues: None,
    }
}

fn check_to_pb(c: &OutputCheck) -> pb::OutputCheck {
    match c {
        OutputCheck::Valid => pb::OutputCheck {
            state: "valid".into(),
            ..Default::default()
        },
        OutputCheck::Invalid { pointer, message } => pb::OutputCheck {
            state: "invalid".into(),
            pointer: pointer.clone(),
            message: message.clone(),
        },
        OutputCheck::Unchecked => pb::OutputCheck {
            state: "unchecked".into(),
            ..Default::default()
        },
    }
}

fn result_to_pb(i: &Invoked) -> pb::InvokeResult {
    pb::InvokeResult {
        status: u32::from(i.status),
        body: i.body.to_vec(),
        content_type: i.content_type.clone(),
        output_check: Some(check_to_pb(&i.output_check)),
        protocol: i.protocol.clone(),
        endpoint: i.endpoint.clone(),
        error: None,
        agent_challenge: i.challenge.clone().unwrap_or_default(),
    }
}

/// A failed batch element: its error in the one error body, naming the
/// invocation it belongs to (`instance`).
fn failed_to_pb(e: &ServiceError, instance: &str) -> pb::InvokeResult {
    let detail = detail_of(&super::error::to_status(e));
    pb::InvokeResult {
        status: detail.http_status,
        body: problem_body(&detail, instance).to_string().into_bytes(),
        content_type: "application/problem+json".into(),
        output_check: Some(check_to_pb(&OutputCheck::Unchecked)),
        protocol: String::new(),
        endpoint: String::new(),
        error: Some(detail),
        agent_challenge: String::new(),
    }
}

/// The error event that ends a stream which failed after it began.
pub fn error_event(e: &ServiceError) -> pb::InvokeEvent {
    let detail = detail_of(&super::error::to_status(e));
    pb::InvokeEvent {
        event: "error".into(),
        data: problem_body(&detail, "").to_string(),
        id: String::new(),
    }
}

fn report_to_pb(r: ImportReport) -> pb::ImportResponse {
    let problem = |(agent_id, transport, reason): (String, String, String)| pb::ImportProblem {
        agent_id,
        transport,
        reason,
    };
    pb::ImportResponse {
        url: r.url,
        agents: r
            .agents
            .into_iter()
            .map(|(id, outcome)| pb::ImportedAgent { id, outcome })
            .collect(),
        skipped: r.skipped.into_iter().map(problem).collect(),
        unsupported_transports: r.unsupported.into_iter().map(problem).collect(),
        not_modified: r.not_modified,
        registries: r
            .registries
            .into_iter()
            .map(|(identifier, display_name, url)| pb::CatalogRegistry {
                identifier,
                display_name,
                url,
            })
            .collect(),
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::InvokeEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Gateway for InvocationApi {
    #[tracing::instrument(name = "grpc.Invoke", skip_all)]
    async fn invoke(
        &self,
        req: Request<pb::InvokeRequest>,
    ) -> Result<Response<pb::InvokeResponse>, Status> {
        let who = principal(&req);
        let instance = format!(
            "/agents/{}/invoke",
            url::form_urlencoded::byte_serialize(req.get_ref().agent_id.as_bytes())
                .collect::<String>()
        );
        let done = self
            .service
            .invoke(who.as_ref(), invoke_request(req.into_inner()))
            .await?;
        let mut resp = pb::InvokeResponse {
            replayed: done.replayed,
            ..Default::default()
        };
        match &done.outcome {
            Outcome::Single(i) => {
                resp.retry_after = i.retry_after;
                resp.result = Some(result_to_pb(i));
            }
            Outcome::Batch(items) => {
                resp.is_batch = true;
                resp.batch = items
                    .iter()
                    .map(|r| match r {
                        Ok(i) => result_to_pb(i),
                        Err(e) => failed_to_pb(e, &instance),
                    })
                    .collect();
            }
        }
        Ok(Response::new(resp))
    }

    type InvokeStreamStream = EventStream;

    #[tracing::instrument(name = "grpc.InvokeStream", skip_all)]
    async fn invoke_stream(
        &self,
        req: Request<pb::InvokeRequest>,
    ) -> Result<Response<Self::InvokeStreamStream>, Status> {
        let who = principal(&req);
        let events = self
            .service
            .invoke_stream(who.as_ref(), invoke_request(req.into_inner()))
            .await?;
        // A failure after the stream began is its last event, in the one
        // error body, so gRPC and SSE clients read the same thing.
        let stream = futures::stream::unfold((events, false), |(mut events, over)| async move {
            if over {
                return None;
            }
            match events.next().await? {
                Ok(e) => Some((
                    Ok(pb::InvokeEvent {
                        event: e.event,
                        data: e.data,
                        id: e.id.unwrap_or_default(),
                    }),
                    (events, false),
                )),
                Err(e) => Some((Ok(error_event(&e)), (events, true))),
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    #[tracing::instrument(name = "grpc.Import", skip_all)]
    async fn import(
        &self,
        req: Request<pb::ImportRequest>,
    ) -> Result<Response<pb::ImportResponse>, Status> {
        let who = principal(&req);
        let r = req.into_inner();
        let format =
            ImportFormat::parse(&r.format).ok_or_else(|| ServiceError::InvalidRequest {
                field: Some("/format".into()),
                message: format!(
                    "/format: '{}' is not one of woa, a2a, agent-protocol, ai-catalog",
                    r.format
                ),
            })?;
        let report = self.service.import(who.as_ref(), format, &r.url).await?;
        Ok(Response::new(report_to_pb(report)))
    }
}
