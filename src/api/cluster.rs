//! `agentry.v1.Cluster` handlers: convert, call the cluster service, convert
//! back. The HTTP facade calls these same handlers.

use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use super::grpc::principal;
use crate::consensus::LinkFault;
use crate::convert::{audit_query_from_pb, audit_to_pb};
use crate::pb::{self, cluster_server::Cluster};
use crate::service::{
    AuditLog, BackupPart, CheckReport, ClusterService, ClusterView, MemberState, ServiceError,
};

/// The chunks of a backup file on the wire.
pub type BackupChunks =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::BackupChunk, Status>> + Send>>;

/// The `agentry.v1.Cluster` service.
#[derive(Clone)]
pub struct ClusterApi {
    service: ClusterService,
    audit: Arc<AuditLog>,
}

impl ClusterApi {
    pub fn new(service: ClusterService, audit: Arc<AuditLog>) -> Self {
        Self { service, audit }
    }
}

fn rfc3339(unix: u64) -> String {
    i64::try_from(unix)
        .ok()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .map(crate::domain::time::format)
        .unwrap_or_default()
}

fn view_to_pb(v: ClusterView) -> pb::ClusterStatus {
    let n = v.node;
    pb::ClusterStatus {
        node: Some(pb::NodeState {
            id: n.node_id,
            raft_addr: n.raft_addr,
            role: n.role.as_str().into(),
            term: n.term,
            commit_index: n.commit_index,
            applied_index: n.applied_index,
            last_log_index: n.last_log_index,
            snapshot_index: n.snapshot_index.unwrap_or(0),
            purged_index: n.purged_index.unwrap_or(0),
            snapshots_built: n.snapshots_built,
            snapshots_installed: n.snapshots_installed,
            last_snapshot_at: n.last_snapshot_unix.map(rfc3339).unwrap_or_default(),
            initialized: n.initialized,
            cluster_id: n.cluster_id.unwrap_or_default(),
        }),
        leader_id: v.leader_id.unwrap_or(0),
        leader_raft_addr: v.leader_addr.unwrap_or_default(),
        members: v
            .members
            .into_iter()
            .map(|m| pb::MemberStatus {
                id: m.id,
                raft_addr: m.raft_addr,
                role: if m.voter { "voter" } else { "learner" }.into(),
                leader: m.leader,
                matched_index: m.matched_index,
                lag: m.lag,
                refused: m.refused,
                unreachable: m.unreachable,
            })
            .collect(),
        replication_known: v.replication_known,
    }
}

fn report_to_pb(r: CheckReport) -> pb::ClusterCheckReport {
    pb::ClusterCheckReport {
        index: r.index,
        revision: r.revision,
        outcome: r.outcome.as_str().into(),
        members: r
            .members
            .into_iter()
            .map(|m| {
                let (state, differing, error) = match m.state {
                    MemberState::Agrees => ("agrees", Vec::new(), String::new()),
                    MemberState::Differs(sections) => ("differs", sections, String::new()),
                    MemberState::Unanswered(why) => ("unanswered", Vec::new(), why),
                };
                pb::MemberCheck {
                    id: m.id,
                    raft_addr: m.raft_addr,
                    role: if m.voter { "voter" } else { "learner" }.into(),
                    state: state.into(),
                    differing,
                    error,
                    sections: m
                        .sections
                        .into_iter()
                        .map(|s| pb::SectionDigest {
                            name: s.name,
                            entries: s.entries,
                            sha256: s.sha256,
                        })
                        .collect(),
                    took_ms: m.took_ms,
                }
            })
            .collect(),
    }
}

impl ClusterApi {
    async fn answer<T>(&self, req: &Request<T>) -> Result<Response<pb::ClusterStatus>, Status> {
        let view = self.service.status(principal(req).as_ref()).await?;
        Ok(Response::new(view_to_pb(view)))
    }
}

#[tonic::async_trait]
impl Cluster for ClusterApi {
    #[tracing::instrument(name = "grpc.Cluster.Status", skip_all)]
    async fn status(
        &self,
        req: Request<pb::ClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        self.answer(&req).await
    }

    #[tracing::instrument(name = "grpc.Cluster.Initialize", skip_all)]
    async fn initialize(
        &self,
        req: Request<pb::InitializeRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        let members = req
            .get_ref()
            .members
            .iter()
            .map(|m| (m.id, m.raft_addr.clone()))
            .collect();
        self.service
            .initialize(principal(&req).as_ref(), members)
            .await?;
        self.answer(&req).await
    }

    #[tracing::instrument(name = "grpc.Cluster.AddLearner", skip_all, fields(id = req.get_ref().id))]
    async fn add_learner(
        &self,
        req: Request<pb::AddLearnerRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        let r = req.get_ref();
        self.service
            .add_learner(
                principal(&req).as_ref(),
                r.id,
                r.raft_addr.clone(),
                r.wait_caught_up,
            )
            .await?;
        self.answer(&req).await
    }

    #[tracing::instrument(name = "grpc.Cluster.Promote", skip_all, fields(id = req.get_ref().id))]
    async fn promote(
        &self,
        req: Request<pb::PromoteRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        self.service
            .promote(principal(&req).as_ref(), req.get_ref().id)
            .await?;
        self.answer(&req).await
    }

    #[tracing::instrument(name = "grpc.Cluster.Remove", skip_all, fields(id = req.get_ref().id))]
    async fn remove(
        &self,
        req: Request<pb::RemoveRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        self.service
            .remove(principal(&req).as_ref(), req.get_ref().id)
            .await?;
        self.answer(&req).await
    }

    #[tracing::instrument(name = "grpc.Cluster.TransferLeader", skip_all, fields(id = req.get_ref().id))]
    async fn transfer_leader(
        &self,
        req: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        let to = Some(req.get_ref().id).filter(|id| *id != 0);
        self.service
            .transfer_leader(principal(&req).as_ref(), to)
            .await?;
        self.answer(&req).await
    }

    #[tracing::instrument(name = "grpc.Cluster.SetFaults", skip_all)]
    async fn set_faults(
        &self,
        req: Request<pb::SetFaultsRequest>,
    ) -> Result<Response<pb::SetFaultsResponse>, Status> {
        let rules = req
            .get_ref()
            .faults
            .iter()
            .map(|f| {
                (
                    f.peer,
                    LinkFault {
                        blocked: f.blocked,
                        drop_rate: f.drop_rate,
                        delay: Duration::from_millis(u64::from(f.delay_ms)),
                    },
                )
            })
            .collect();
        self.service.set_faults(principal(&req).as_ref(), rules)?;
        Ok(Response::new(pb::SetFaultsResponse {}))
    }

    type BackupStream = BackupChunks;

    #[tracing::instrument(name = "grpc.Cluster.Backup", skip_all)]
    async fn backup(
        &self,
        req: Request<pb::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        use futures::StreamExt;
        let parts = self.service.backup(principal(&req).as_ref()).await?;
        // The summary is in the file's own end line; a failure after the
        // stream began ends it with the error, so a client never mistakes a
        // cut backup for a whole one (its end line and checksum are missing).
        let chunks = tokio_stream::wrappers::ReceiverStream::new(parts).filter_map(|part| async {
            match part {
                BackupPart::Chunk(data) => Some(Ok(pb::BackupChunk { data })),
                BackupPart::Done(_) => None,
                BackupPart::Failed(e) => Some(Err(Status::from(e))),
            }
        });
        Ok(Response::new(Box::pin(chunks)))
    }

    #[tracing::instrument(name = "grpc.Cluster.Check", skip_all)]
    async fn check(
        &self,
        req: Request<pb::ClusterCheckRequest>,
    ) -> Result<Response<pb::ClusterCheckReport>, Status> {
        let report = self.service.check(principal(&req).as_ref()).await?;
        Ok(Response::new(report_to_pb(report)))
    }

    #[tracing::instrument(name = "grpc.Cluster.ListAudit", skip_all)]
    async fn list_audit(
        &self,
        req: Request<pb::ListAuditRequest>,
    ) -> Result<Response<pb::ListAuditResponse>, Status> {
        let who = principal(&req);
        let r = req.into_inner();
        let query = audit_query_from_pb(&r).map_err(ServiceError::from)?;
        let size = if r.page_size == 0 {
            100
        } else {
            r.page_size as usize
        };
        let (entries, next_page_token) =
            self.audit.list(who.as_ref(), &query, &r.page_token, size)?;
        Ok(Response::new(pb::ListAuditResponse {
            entries: entries.iter().map(audit_to_pb).collect(),
            next_page_token,
        }))
    }
}
