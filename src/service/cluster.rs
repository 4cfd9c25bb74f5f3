//! Cluster administration use cases: status for anyone who may read, and
//! bootstrap, membership changes and fault rules for admins only.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::consensus::{Command, Faults, LinkFault, NodeId, NodeStatus, RaftNode};
use crate::domain::{Principal, Role};
use crate::storage::{BackupError, BackupSummary, Reader, StorageError};

use super::consistency::CheckReport;
use super::ServiceError;

type Result<T> = std::result::Result<T, ServiceError>;

/// One member's place in the cluster, from the leader's point of view when
/// it could be asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub id: NodeId,
    pub raft_addr: String,
    pub voter: bool,
    pub leader: bool,
    pub matched_index: u64,
    pub lag: u64,
    /// Refused for losing log entries it had acknowledged: sent nothing
    /// until an operator removes it and adds it back.
    pub refused: bool,
    /// Has not answered the leader for 5 s.
    pub unreachable: bool,
}

/// What `Cluster.Status` answers.
#[derive(Debug, Clone)]
pub struct ClusterView {
    pub node: NodeStatus,
    pub leader_id: Option<NodeId>,
    pub leader_addr: Option<String>,
    pub members: Vec<MemberView>,
    pub replication_known: bool,
}

/// A piece of a backup in progress.
#[derive(Debug)]
pub enum BackupPart {
    Chunk(Vec<u8>),
    Done(BackupSummary),
    Failed(ServiceError),
}

/// Hands what a backup writes to the channel, as it is written.
struct ChannelWriter(tokio::sync::mpsc::Sender<BackupPart>);

impl std::io::Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(BackupPart::Chunk(buf.to_vec()))
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away")
            })?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Cluster administration.
#[derive(Clone)]
pub struct ClusterService {
    node: RaftNode,
    reader: Reader,
    faults: Faults,
    fault_injection: bool,
    anonymous_reads: bool,
}

fn require_admin(principal: Option<&Principal>) -> Result<()> {
    match principal {
        None => Err(ServiceError::Unauthorized(
            "cluster administration needs an admin API key".into(),
        )),
        Some(p) if p.role != Role::Admin => Err(ServiceError::Forbidden(format!(
            "principal '{}' is not an admin",
            p.name
        ))),
        Some(_) => Ok(()),
    }
}

fn invalid(field: &str, message: impl Into<String>) -> ServiceError {
    ServiceError::InvalidRequest {
        field: Some(field.into()),
        message: message.into(),
    }
}

fn check_id(id: NodeId, field: &str) -> Result<()> {
    if id == 0 {
        return Err(invalid(field, format!("{field}: node ids start at 1")));
    }
    Ok(())
}

/// A Raft address must be host:port with a numeric port.
fn check_addr(addr: &str, field: &str) -> Result<()> {
    let ok = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0))
        && !addr.contains(['/', ' ']);
    if !ok {
        return Err(invalid(
            field,
            format!("{field}: '{addr}' is not a host:port address"),
        ));
    }
    Ok(())
}

impl ClusterService {
    pub fn new(
        node: RaftNode,
        reader: Reader,
        faults: Faults,
        fault_injection: bool,
        anonymous_reads: bool,
    ) -> Self {
        Self {
            node,
            reader,
            faults,
            fault_injection,
            anonymous_reads,
        }
    }

    /// Starts an online backup (admins): once this node has applied
    /// everything committed before the call, a consistent copy of its state
    /// is written in chunks to the returned channel, which ends with the
    /// summary. The backup is read from a RocksDB snapshot off the async
    /// runtime; a receiver that goes away stops it.
    pub async fn backup(
        &self,
        principal: Option<&Principal>,
    ) -> Result<tokio::sync::mpsc::Receiver<BackupPart>> {
        require_admin(principal)?;
        self.node.read_barrier().await?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let reader = self.reader.clone();
        let node_id = self.node.id;
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let mut out = ChannelWriter(tx.clone());
            let part = match reader.write_backup(node_id, &mut out) {
                Ok(summary) => {
                    tracing::info!(
                        node_id,
                        records = summary.counts.records,
                        bytes = summary.bytes,
                        ms = started.elapsed().as_millis() as u64,
                        "backup written"
                    );
                    crate::metrics::observe_backup(started.elapsed(), summary.bytes);
                    BackupPart::Done(summary)
                }
                Err(BackupError::Storage(e @ StorageError::Installing)) => {
                    BackupPart::Failed(e.into())
                }
                Err(e) => BackupPart::Failed(ServiceError::Internal(format!("backup failed: {e}"))),
            };
            let _ = tx.blocking_send(part);
        });
        Ok(rx)
    }

    /// Runs a replica consistency check (admins): every member's digest
    /// of its state at one new log entry, compared.
    pub async fn check(&self, principal: Option<&Principal>) -> Result<CheckReport> {
        super::audit::begin("cluster.check", None);
        require_admin(principal)?;
        super::consistency::check(&self.node).await
    }

    /// This node's state and the membership with replication progress.
    pub async fn status(&self, principal: Option<&Principal>) -> Result<ClusterView> {
        if principal.is_none() && !self.anonymous_reads {
            return Err(ServiceError::Unauthorized(
                "anonymous reads are disabled; send an API key".into(),
            ));
        }
        let node = self.node.status();
        let leader = if node.leader.is_some() {
            self.node.leader_status().await
        } else {
            None
        };
        let view = leader.as_ref().unwrap_or(&node);
        let matched: BTreeMap<NodeId, u64> = view.follower_matched.iter().copied().collect();
        let members = view
            .addresses
            .iter()
            .map(|(id, addr)| {
                let is_leader = view.is_leader && *id == view.node_id;
                let matched_index = if is_leader {
                    view.last_log_index
                } else {
                    matched.get(id).copied().unwrap_or(0)
                };
                MemberView {
                    id: *id,
                    raft_addr: addr.clone(),
                    voter: view.voters.contains(id),
                    leader: is_leader || (!view.is_leader && node.leader == Some(*id)),
                    matched_index,
                    lag: if leader.is_some() {
                        view.last_log_index.saturating_sub(matched_index)
                    } else {
                        0
                    },
                    refused: view.refused.contains(id),
                    unreachable: view.unreachable.contains(id),
                }
            })
            .collect();
        Ok(ClusterView {
            leader_id: node.leader,
            leader_addr: node.leader_addr().map(String::from),
            replication_known: leader.is_some(),
            members,
            node,
        })
    }

    /// Initialises a new cluster on this (uninitialised) node.
    pub async fn initialize(
        &self,
        principal: Option<&Principal>,
        members: Vec<(NodeId, String)>,
    ) -> Result<()> {
        super::audit::begin("cluster.initialize", None);
        require_admin(principal)?;
        let mut map = BTreeMap::new();
        for (i, (id, addr)) in members.into_iter().enumerate() {
            check_id(id, &format!("/members/{i}/id"))?;
            check_addr(&addr, &format!("/members/{i}/raft_addr"))?;
            if map.insert(id, addr).is_some() {
                return Err(invalid(
                    &format!("/members/{i}/id"),
                    format!("node id {id} is listed twice"),
                ));
            }
        }
        if map.is_empty() {
            map.insert(self.node.id, self.node.status().raft_addr);
        }
        self.node.initialize(map).await?;
        // Answer once this node knows the leader it just created.
        self.node.wait_for_leader(Duration::from_secs(10)).await?;
        self.recorded().await
    }

    /// Records the admin action that just took effect in the replicated
    /// audit trail (membership lives outside the state machine). If that
    /// fails the action still stands, and the gate records it on this node.
    async fn recorded(&self) -> Result<()> {
        let note = Command::Note {
            now: crate::domain::time::now(),
        };
        if let Err(e) = super::audit::propose(&self.node, note).await {
            tracing::warn!(error = %e, "a cluster change could not be added to the replicated audit trail");
        }
        Ok(())
    }

    pub async fn add_learner(
        &self,
        principal: Option<&Principal>,
        id: NodeId,
        raft_addr: String,
        wait: bool,
    ) -> Result<()> {
        super::audit::begin("cluster.add_learner", Some(&id.to_string()));
        require_admin(principal)?;
        check_id(id, "/id")?;
        check_addr(&raft_addr, "/raft_addr")?;
        self.node.add_learner(id, raft_addr, wait).await?;
        self.recorded().await
    }

    pub async fn promote(&self, principal: Option<&Principal>, id: NodeId) -> Result<()> {
        super::audit::begin("cluster.promote", Some(&id.to_string()));
        require_admin(principal)?;
        check_id(id, "/id")?;
        self.node.promote(id).await?;
        self.recorded().await
    }

    /// Hands leadership to the voter `to` (`None`: the most caught-up);
    /// answers the new leader.
    pub async fn transfer_leader(
        &self,
        principal: Option<&Principal>,
        to: Option<NodeId>,
    ) -> Result<NodeId> {
        let target = to.map(|id| id.to_string());
        super::audit::begin("cluster.transfer_leader", target.as_deref());
        require_admin(principal)?;
        let leader = self.node.transfer_leadership(to).await?;
        self.recorded().await?;
        Ok(leader)
    }

    pub async fn remove(&self, principal: Option<&Principal>, id: NodeId) -> Result<()> {
        super::audit::begin("cluster.remove", Some(&id.to_string()));
        require_admin(principal)?;
        check_id(id, "/id")?;
        self.node.remove(id).await?;
        self.recorded().await
    }

    /// Replaces this node's fault rules (testing only).
    pub fn set_faults(
        &self,
        principal: Option<&Principal>,
        rules: Vec<(NodeId, LinkFault)>,
    ) -> Result<()> {
        super::audit::begin("cluster.set_faults", None);
        require_admin(principal)?;
        if !self.fault_injection {
            return Err(ServiceError::Forbidden(
                "fault injection is disabled on this node (config fault_injection = false)".into(),
            ));
        }
        for (i, (peer, rule)) in rules.iter().enumerate() {
            check_id(*peer, &format!("/faults/{i}/peer"))?;
            if !(0.0..=1.0).contains(&rule.drop_rate) {
                return Err(invalid(
                    &format!("/faults/{i}/drop_rate"),
                    "drop_rate must be between 0 and 1",
                ));
            }
        }
        self.faults.set(rules);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_must_be_host_and_port() {
        assert!(check_addr("10.0.0.1:8472", "/a").is_ok());
        assert!(check_addr("agentry-0.agentry.default.svc:8472", "/a").is_ok());
        assert!(check_addr("[::1]:8472", "/a").is_ok());
        for bad in [
            "",
            "host",
            ":8472",
            "host:0",
            "host:99999",
            "http://h:1",
            "h :1",
        ] {
            assert!(check_addr(bad, "/a").is_err(), "{bad}");
        }
    }
}
