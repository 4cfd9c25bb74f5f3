//! Refreshing agents and shared leases (`domain::lease`).
//!
//! Refreshes are the bulk of a large directory's writes (100k agents kept
//! alive every 30 s are 3,300 a second), so each one must cost little more
//! than its share of a log entry. The `Refresher` gathers the refreshes that
//! arrive while earlier ones are being committed into one `Command::Refresh`
//! entry: a lone refresh is proposed at once, and under load a batch grows by
//! itself with the time a commit takes. Every caller is answered after its
//! entry is committed and applied, with its own outcome.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tracing::{info_span, Instrument};

use super::error::ServiceError;
use super::registry::{require_writer, RegistryService};
use crate::consensus::batcher::{gather, Limits};
use crate::consensus::{Command, CommandResult, RaftNode, WriteError};
use crate::domain::lease::{self, LeaseState, Refresh, RefreshTarget};
use crate::domain::write::Rejection;
use crate::domain::Principal;

/// Most refreshes in one entry (a few dozen bytes each).
const MAX_BATCH: usize = 1024;
/// Entries of refreshes being committed at once. One in flight would leave
/// the log idle while its answers are sent; more only make batches smaller.
const IN_FLIGHT: usize = 4;
/// Refreshes waiting for a batch before callers are told to slow down.
const QUEUE: usize = 16 * MAX_BATCH;

type Result<T> = std::result::Result<T, ServiceError>;
type Outcome = std::result::Result<LeaseState, Failure>;

enum Failure {
    Rejected(Rejection),
    Write(WriteError),
    Other(String),
}

impl From<Failure> for ServiceError {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Rejected(r) => r.into(),
            Failure::Write(e) => e.into(),
            Failure::Other(m) => ServiceError::Internal(m),
        }
    }
}

struct Waiting {
    refresh: Refresh,
    reply: oneshot::Sender<Outcome>,
}

/// Gathers refreshes into batched log entries. Cheap to clone.
#[derive(Clone)]
pub struct Refresher {
    queue: mpsc::Sender<Waiting>,
}

impl Refresher {
    /// Starts the batcher; it ends when the last `Refresher` is dropped.
    pub fn start(node: RaftNode) -> Self {
        let (queue, rx) = mpsc::channel(QUEUE);
        let limits = Limits {
            items: MAX_BATCH,
            bytes: usize::MAX,
        };
        let propose = move |batch: Vec<Waiting>| {
            let node = node.clone();
            let span = info_span!("refresh_entry", refreshes = batch.len());
            async move { commit(&node, batch).await }.instrument(span)
        };
        tokio::spawn(
            gather(
                rx,
                Arc::new(Semaphore::new(IN_FLIGHT)),
                limits,
                |_| 0,
                propose,
            )
            .instrument(info_span!("refresh_batcher")),
        );
        Self { queue }
    }

    async fn refresh(&self, refresh: Refresh) -> Result<LeaseState> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .try_send(Waiting { refresh, reply })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => ServiceError::Unavailable {
                    message: "too many refreshes are waiting to be committed; retry shortly".into(),
                    leader: None,
                },
                mpsc::error::TrySendError::Closed(_) => {
                    ServiceError::Internal("the refresh batcher has stopped".into())
                }
            })?;
        match answer.await {
            Ok(outcome) => outcome.map_err(ServiceError::from),
            Err(_) => Err(ServiceError::Internal(
                "the refresh batcher dropped the request".into(),
            )),
        }
    }
}

async fn commit(node: &RaftNode, batch: Vec<Waiting>) {
    let (refreshes, replies): (Vec<Refresh>, Vec<_>) =
        batch.into_iter().map(|w| (w.refresh, w.reply)).unzip();
    crate::metrics::observe_refresh_batch(refreshes.len());
    let command = Command::Refresh {
        refreshes,
        now: crate::domain::time::now(),
    };
    let outcomes: Vec<Outcome> = match node.write(command).await {
        Ok(CommandResult::Leases(results)) if results.len() == replies.len() => results
            .into_iter()
            .map(|r| r.map_err(Failure::Rejected))
            .collect(),
        Ok(other) => replies
            .iter()
            .map(|_| {
                Err(Failure::Other(format!(
                    "a refresh entry produced {other:?}"
                )))
            })
            .collect(),
        Err(e) => replies
            .iter()
            .map(|_| Err(Failure::Write(e.clone())))
            .collect(),
    };
    for (reply, outcome) in replies.into_iter().zip(outcomes) {
        // A caller that went away needs no answer.
        let _ = reply.send(outcome);
    }
}

fn checked_ttl(ttl_seconds: Option<u32>) -> Result<Option<u32>> {
    if let Some(ttl) = ttl_seconds {
        lease::validate_ttl(ttl).map_err(|m| ServiceError::InvalidRequest {
            field: Some("/ttl_seconds".into()),
            message: format!("/ttl_seconds: {m}"),
        })?;
    }
    Ok(ttl_seconds)
}

fn checked_name(name: &str, field: &str) -> Result<()> {
    lease::validate_name(name).map_err(|m| ServiceError::InvalidRequest {
        field: Some(field.into()),
        message: format!("{field}: {m}"),
    })
}

impl RegistryService {
    /// Moves an agent's expiry to now + TTL without touching its record, or
    /// joins it to the shared lease `lease`.
    #[tracing::instrument(skip_all, fields(agent_id = %id))]
    pub async fn refresh_agent(
        &self,
        principal: Option<&Principal>,
        id: &str,
        ttl_seconds: Option<u32>,
        lease: Option<String>,
    ) -> Result<LeaseState> {
        super::audit::begin("refresh", Some(id));
        let principal = require_writer(principal)?;
        crate::domain::validate::validate_id(id, "/id")?;
        if let Some(name) = &lease {
            checked_name(name, "/lease")?;
            if ttl_seconds.is_some() {
                return Err(ServiceError::InvalidRequest {
                    field: Some("/ttl_seconds".into()),
                    message: "/ttl_seconds: an agent on a shared lease has the lease's TTL; \
                              refresh the lease to change it"
                        .into(),
                });
            }
        }
        let refresh = Refresh {
            target: RefreshTarget::Agent {
                id: id.to_string(),
                lease,
            },
            ttl_seconds: checked_ttl(ttl_seconds)?,
            principal: principal.clone(),
        };
        self.refresher()
            .refresh(refresh)
            .await
            .map_err(|e| self.unseen(principal, id, e))
    }

    /// Keeps the shared lease `name` alive (making it on first use); every
    /// agent joined to it stays fresh.
    #[tracing::instrument(skip_all, fields(lease = %name))]
    pub async fn refresh_lease(
        &self,
        principal: Option<&Principal>,
        name: &str,
        ttl_seconds: Option<u32>,
    ) -> Result<LeaseState> {
        super::audit::begin("refresh_lease", Some(name));
        let principal = require_writer(principal)?;
        checked_name(name, "/lease")?;
        let refresh = Refresh {
            target: RefreshTarget::Lease {
                name: name.to_string(),
            },
            ttl_seconds: checked_ttl(ttl_seconds)?,
            principal: principal.clone(),
        };
        self.refresher().refresh(refresh).await
    }

    /// Revokes the shared lease `name`: the agents it held expire now.
    #[tracing::instrument(skip_all, fields(lease = %name))]
    pub async fn revoke_lease(
        &self,
        principal: Option<&Principal>,
        name: &str,
    ) -> Result<LeaseState> {
        super::audit::begin("revoke_lease", Some(name));
        let principal = require_writer(principal)?;
        checked_name(name, "/lease")?;
        let command = Command::RevokeLease {
            name: name.to_string(),
            principal: principal.clone(),
            now: crate::domain::time::now(),
        };
        match super::audit::propose(self.node(), command).await? {
            CommandResult::Leases(mut r) if r.len() == 1 => r.remove(0).map_err(Into::into),
            other => Err(ServiceError::Internal(format!(
                "a lease revocation produced {other:?}"
            ))),
        }
    }

    /// The shared lease `name` as its owner (or an admin) sees it.
    #[tracing::instrument(skip_all, fields(lease = %name))]
    pub async fn get_lease(
        &self,
        principal: Option<&Principal>,
        name: &str,
        consistency: super::registry::Consistency,
    ) -> Result<LeaseState> {
        let principal = require_writer(principal)?;
        checked_name(name, "/lease")?;
        self.read_barrier(consistency).await?;
        lease::describe(&self.reader().leases(), name, principal)
            .ok_or_else(|| ServiceError::NotFound(format!("lease '{name}' not found")))
    }
}
