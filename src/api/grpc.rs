//! The gRPC core: thin tonic handlers that convert, call the service, and
//! convert back. The HTTP facade calls these same handlers in-process.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::auth::Identity;
use crate::convert::{change_kind_to_pb, record_to_pb, sharing_from_pb, status_from_pb};
use crate::domain::filter::{HardFilters, ALL_BUT_DELETED};
use crate::domain::{AgentMetadata, Principal};
use crate::pb::{self, registry_server::Registry};
use crate::service::{Consistency, ListQuery, RegistryService, ServiceError};

/// The `agentry.v1.Registry` service.
#[derive(Clone)]
pub struct RegistryApi {
    service: RegistryService,
}

impl RegistryApi {
    pub fn new(service: RegistryService) -> Self {
        Self { service }
    }

    pub fn service(&self) -> &RegistryService {
        &self.service
    }

    /// The wire form of a record, `expired` going by the agent's lease when
    /// it holds one (`domain::lease`), as discovery does.
    fn record_pb(
        &self,
        r: &crate::domain::AgentRecord,
        now: time::OffsetDateTime,
    ) -> pb::AgentRecord {
        let lease = self.service.reader().leases().expiry_unix(&r.metadata.id);
        leased_record_pb(r, lease, now)
    }
}

/// The caller, as placed in the request extensions by authentication.
pub(crate) fn principal<T>(req: &Request<T>) -> Option<Principal> {
    req.extensions().get::<Identity>().and_then(|i| i.0.clone())
}

/// The caller's address as allowances count it (IPv6 by /64); none for a
/// request made in the process itself.
pub(crate) fn client_address<T>(req: &Request<T>) -> Option<std::net::IpAddr> {
    req.extensions()
        .get::<crate::listener::Peer>()
        .map(|p| crate::listener::client_key(p.remote.ip()))
}

fn consistency(v: i32) -> Result<Consistency, ServiceError> {
    match pb::ReadConsistency::try_from(v) {
        Ok(pb::ReadConsistency::Unspecified | pb::ReadConsistency::Local) => Ok(Consistency::Local),
        Ok(pb::ReadConsistency::Linearizable) => Ok(Consistency::Linearizable),
        Err(_) => Err(ServiceError::InvalidRequest {
            field: Some("/consistency".into()),
            message: format!("/consistency: unknown value {v}"),
        }),
    }
}

/// The page token of a ranked search's page starting at `offset` (the
/// rank, not an id: ranked pages are cut from the best `top` by size).
fn ranked_token(offset: usize) -> String {
    format!("r{offset}")
}

/// The rank a ranked search's page token starts at; none for the first.
fn ranked_offset(token: &str) -> Result<usize, ServiceError> {
    if token.is_empty() {
        return Ok(0);
    }
    token
        .strip_prefix('r')
        .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| ServiceError::InvalidRequest {
            field: Some("/page_token".into()),
            message: "/page_token: not a token of a ranked search".into(),
        })
}

/// The metadata of a Register or Update request, which must be present.
fn required_metadata(m: Option<pb::AgentMetadata>) -> Result<AgentMetadata, ServiceError> {
    let m = m.ok_or_else(|| ServiceError::InvalidRequest {
        field: Some("/metadata".into()),
        message: "metadata is required".into(),
    })?;
    Ok(m.try_into()?)
}

fn now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

#[tonic::async_trait]
impl Registry for RegistryApi {
    #[tracing::instrument(name = "grpc.Register", skip_all)]
    async fn register(
        &self,
        req: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        let who = principal(&req);
        let req = req.into_inner();
        let metadata = required_metadata(req.metadata)?;
        let sharing = sharing_from_pb(req.visibility, &req.readers).map_err(ServiceError::from)?;
        let (change, created) = self
            .service
            .register(who.as_ref(), metadata, sharing)
            .await?;
        Ok(Response::new(pb::RegisterResponse {
            record: Some(self.record_pb(&change.record, now())),
            created,
        }))
    }

    #[tracing::instrument(name = "grpc.Get", skip_all)]
    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
        let who = principal(&req);
        let req = req.into_inner();
        let (record, applied_revision, lease) = self
            .service
            .get_leased(who.as_ref(), &req.id, consistency(req.consistency)?)
            .await?;
        Ok(Response::new(pb::GetResponse {
            record: Some(leased_record_pb(&record, lease, now())),
            applied_revision,
        }))
    }

    #[tracing::instrument(name = "grpc.Update", skip_all)]
    async fn update(
        &self,
        req: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let who = principal(&req);
        let req = req.into_inner();
        let metadata = required_metadata(req.metadata)?;
        let sharing = sharing_from_pb(req.visibility, &req.readers).map_err(ServiceError::from)?;
        let change = self
            .service
            .update(
                who.as_ref(),
                &req.id,
                metadata,
                sharing,
                req.expected_revision,
            )
            .await?;
        Ok(Response::new(pb::UpdateResponse {
            record: Some(self.record_pb(&change.record, now())),
        }))
    }

    #[tracing::instrument(name = "grpc.Delete", skip_all)]
    async fn delete(
        &self,
        req: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let who = principal(&req);
        let req = req.into_inner();
        let revision = self
            .service
            .delete(who.as_ref(), &req.id, req.expected_revision)
            .await?;
        Ok(Response::new(pb::DeleteResponse {
            id: req.id,
            revision,
        }))
    }

    #[tracing::instrument(name = "grpc.SetStatus", skip_all)]
    async fn set_status(
        &self,
        req: Request<pb::SetStatusRequest>,
    ) -> Result<Response<pb::SetStatusResponse>, Status> {
        let who = principal(&req);
        let req = req.into_inner();
        let status = status_from_pb(req.status, "/status")
            .map_err(ServiceError::from)?
            .ok_or_else(|| ServiceError::InvalidRequest {
                field: Some("/status".into()),
                message: "/status: must be one of active, deprecated, inactive, deleted".into(),
            })?;
        let change = self
            .service
            .set_status(
                who.as_ref(),
                &req.id,
                status,
                req.reason,
                req.expected_revision,
            )
            .await?;
        Ok(Response::new(pb::SetStatusResponse {
            record: Some(self.record_pb(&change.record, now())),
        }))
    }

    #[tracing::instrument(name = "grpc.List", skip_all)]
    async fn list(
        &self,
        req: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let who = principal(&req);
        let req = req.into_inner();
        let statuses = req
            .statuses
            .iter()
            .enumerate()
            .map(|(i, s)| {
                status_from_pb(*s, &format!("/statuses/{i}"))?.ok_or_else(|| {
                    crate::domain::FieldError::new(
                        format!("/statuses/{i}"),
                        "must not be unspecified",
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(ServiceError::from)?;
        // AIDIP: no status filter lists every status but deleted.
        let filter = HardFilters {
            capabilities: req.capabilities,
            required_tags: req.tags,
            languages: req.languages,
            statuses: if statuses.is_empty() {
                ALL_BUT_DELETED.to_vec()
            } else {
                statuses
            },
            publisher: req.publisher,
            owner: req.owner,
            allow_stale: req.include_expired,
            ..Default::default()
        };
        let consistency = consistency(req.consistency)?;
        let now = now();
        if !req.query.trim().is_empty() {
            // The search's own check names `/top`, its JSON member.
            if req.page_size > crate::service::MAX_PAGE_SIZE {
                return Err(ServiceError::InvalidRequest {
                    field: Some("/page_size".into()),
                    message: format!(
                        "/page_size: must be at most {}",
                        crate::service::MAX_PAGE_SIZE
                    ),
                }
                .into());
            }
            let top = match req.page_size {
                0 => 10,
                n => n as usize,
            };
            let offset = ranked_offset(&req.page_token)?;
            let page = self
                .service
                .ranked_search(who.as_ref(), &req.query, filter, top, offset, consistency)
                .await?;
            return Ok(Response::new(pb::ListResponse {
                total_count: page.matched as u64,
                records: page
                    .records
                    .iter()
                    .map(|(r, _)| self.record_pb(r, now))
                    .collect(),
                scores: page.records.iter().map(|(_, s)| f64::from(*s)).collect(),
                next_page_token: page.next_offset.map(ranked_token).unwrap_or_default(),
                applied_revision: page.applied_revision,
            }));
        }
        let query = ListQuery {
            filter,
            page_size: req.page_size,
            page_token: req.page_token,
            consistency,
        };
        let page = self.service.list(who.as_ref(), query).await?;
        Ok(Response::new(pb::ListResponse {
            records: page
                .records
                .iter()
                .map(|r| self.record_pb(r, now))
                .collect(),
            next_page_token: page.next_page_token,
            total_count: page.total_count,
            applied_revision: page.applied_revision,
            scores: Vec::new(),
        }))
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchResponse, Status>> + Send>>;

    #[tracing::instrument(name = "grpc.Watch", skip_all)]
    async fn watch(
        &self,
        req: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let who = principal(&req);
        let changes = self
            .service
            .watch(who.as_ref(), req.get_ref().from_revision)?;
        let stream = changes.map(|c| {
            c.map(|c| pb::WatchResponse {
                revision: c.revision,
                kind: change_kind_to_pb(c.kind) as i32,
                record: Some(record_to_pb(&c.record, now())),
            })
            .map_err(Status::from)
        });
        Ok(Response::new(Box::pin(stream)))
    }

    #[tracing::instrument(name = "grpc.Refresh", skip_all)]
    async fn refresh(
        &self,
        req: Request<pb::RefreshRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let who = principal(&req);
        let req = req.into_inner();
        let state = self
            .service
            .refresh_agent(who.as_ref(), &req.id, req.ttl_seconds, req.lease)
            .await?;
        Ok(Response::new(lease_to_pb(state)))
    }

    #[tracing::instrument(name = "grpc.RefreshLease", skip_all)]
    async fn refresh_lease(
        &self,
        req: Request<pb::RefreshLeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let who = principal(&req);
        let req = req.into_inner();
        let state = self
            .service
            .refresh_lease(who.as_ref(), &req.lease, req.ttl_seconds)
            .await?;
        Ok(Response::new(lease_to_pb(state)))
    }

    #[tracing::instrument(name = "grpc.GetLease", skip_all)]
    async fn get_lease(
        &self,
        req: Request<pb::GetLeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let who = principal(&req);
        let req = req.into_inner();
        let state = self
            .service
            .get_lease(who.as_ref(), &req.lease, consistency(req.consistency)?)
            .await?;
        Ok(Response::new(lease_to_pb(state)))
    }

    #[tracing::instrument(name = "grpc.RevokeLease", skip_all)]
    async fn revoke_lease(
        &self,
        req: Request<pb::RevokeLeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let who = principal(&req);
        let state = self
            .service
            .revoke_lease(who.as_ref(), &req.get_ref().lease)
            .await?;
        Ok(Response::new(lease_to_pb(state)))
    }
}

fn lease_to_pb(s: crate::domain::lease::LeaseState) -> pb::LeaseResponse {
    pb::LeaseResponse {
        id: s.agent,
        lease: s.lease,
        ttl_seconds: s.ttl_seconds,
        expires_at: time::OffsetDateTime::from_unix_timestamp(s.expires_unix)
            .map(crate::domain::time::format)
            .unwrap_or_default(),
        agents: s.agents,
    }
}

/// The wire form of a record, `expired` going by `lease` (the expiry its
/// lease gives it, when it holds one), as discovery does.
fn leased_record_pb(
    r: &crate::domain::AgentRecord,
    lease: Option<i64>,
    now: time::OffsetDateTime,
) -> pb::AgentRecord {
    let mut out = record_to_pb(r, now);
    if let (Some(t), Some(e)) = (lease, out.envelope.as_mut()) {
        e.expired = t <= now.unix_timestamp();
    }
    out
}
