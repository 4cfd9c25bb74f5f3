//! The replica consistency check: a check entry goes through the log,
//! every member digests its replicated state as of that entry
//! (`storage::digest`), and the digests are compared. Run on demand by an
//! admin (`agentry cluster check`) and periodically by the leader, as
//! etcd's corruption check is; the outcome goes to the metrics and the log.

use std::time::Duration;

use crate::consensus::{Command, CommandResult, MemberDigest, NodeId, RaftNode};
use crate::storage::{SectionDigest, DIGEST_FORMAT};

use super::ServiceError;

/// How the members' digests compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every member answered with the same digest.
    Consistent,
    /// A member's digest differs from the one most members hold.
    Diverged,
    /// Those that answered agree, but not every member answered.
    Incomplete,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Consistent => "consistent",
            Self::Diverged => "diverged",
            Self::Incomplete => "incomplete",
        }
    }
}

/// One member's place in a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberState {
    Agrees,
    /// These sections differ from the reference digest.
    Differs(Vec<String>),
    /// No digest to compare, and why.
    Unanswered(String),
}

#[derive(Debug, Clone)]
pub struct MemberCheck {
    pub id: NodeId,
    pub raft_addr: String,
    pub voter: bool,
    pub state: MemberState,
    pub sections: Vec<SectionDigest>,
    pub took_ms: u64,
}

/// What a consistency check found.
#[derive(Debug, Clone)]
pub struct CheckReport {
    pub index: u64,
    pub revision: u64,
    pub outcome: Outcome,
    pub members: Vec<MemberCheck>,
}

impl CheckReport {
    /// Compares the members' digests. The reference is the digest most
    /// members hold; on a tie, the one `prefer` (the asking node) holds,
    /// so a two-member split still names one member as differing.
    pub fn compare(index: u64, revision: u64, digests: Vec<MemberDigest>, prefer: NodeId) -> Self {
        let comparable = |d: &MemberDigest| {
            d.digest
                .as_ref()
                .ok()
                .filter(|d| d.format == DIGEST_FORMAT)
                .map(|d| d.sections.clone())
        };
        // Each distinct digest with how many members hold it.
        let mut held: Vec<(Vec<SectionDigest>, usize, bool)> = Vec::new();
        for d in &digests {
            let Some(sections) = comparable(d) else {
                continue;
            };
            match held.iter_mut().find(|(s, _, _)| *s == sections) {
                Some((_, n, preferred)) => {
                    *n += 1;
                    *preferred |= d.id == prefer;
                }
                None => held.push((sections, 1, d.id == prefer)),
            }
        }
        let reference = held
            .iter()
            .max_by_key(|(_, n, preferred)| (*n, *preferred))
            .map(|(s, _, _)| s.clone());
        let members: Vec<MemberCheck> = digests
            .into_iter()
            .map(|d| {
                let (state, sections, took_ms) = match d.digest {
                    Err(reason) => (MemberState::Unanswered(reason), Vec::new(), 0),
                    Ok(digest) if digest.format != DIGEST_FORMAT => (
                        MemberState::Unanswered(format!(
                            "its digest has format {} and this node's {DIGEST_FORMAT} (another release)",
                            digest.format
                        )),
                        digest.sections,
                        digest.took_ms,
                    ),
                    Ok(digest) => {
                        let differing: Vec<String> = match &reference {
                            Some(r) => digest
                                .sections
                                .iter()
                                .filter(|s| !r.contains(s))
                                .map(|s| s.name.clone())
                                .collect(),
                            None => Vec::new(),
                        };
                        let state = if differing.is_empty() {
                            MemberState::Agrees
                        } else {
                            MemberState::Differs(differing)
                        };
                        (state, digest.sections, digest.took_ms)
                    }
                };
                MemberCheck {
                    id: d.id,
                    raft_addr: d.raft_addr,
                    voter: d.voter,
                    state,
                    sections,
                    took_ms,
                }
            })
            .collect();
        let outcome = if members
            .iter()
            .any(|m| matches!(m.state, MemberState::Differs(_)))
        {
            Outcome::Diverged
        } else if members
            .iter()
            .all(|m| matches!(m.state, MemberState::Agrees))
        {
            Outcome::Consistent
        } else {
            Outcome::Incomplete
        };
        Self {
            index,
            revision,
            outcome,
            members,
        }
    }

    /// Members whose state differs.
    pub fn diverged(&self) -> Vec<NodeId> {
        self.members
            .iter()
            .filter(|m| matches!(m.state, MemberState::Differs(_)))
            .map(|m| m.id)
            .collect()
    }
}

/// Proposes a check entry and compares every member's digest at it; the
/// outcome is also logged and counted.
pub async fn check(node: &RaftNode) -> Result<CheckReport, ServiceError> {
    let started = std::time::Instant::now();
    let command = Command::Check {
        now: crate::domain::time::now(),
    };
    let (index, revision) = match super::audit::propose(node, command).await? {
        CommandResult::Checked { index, revision } => (index, revision),
        other => {
            return Err(ServiceError::Internal(format!(
                "a consistency check was answered with {other:?}"
            )))
        }
    };
    let digests = node.member_digests(index).await;
    let report = CheckReport::compare(index, revision, digests, node.id);
    let diverged = report.diverged();
    crate::metrics::observe_replica_check(
        report.outcome.as_str(),
        diverged.len() as i64,
        started.elapsed(),
    );
    match report.outcome {
        Outcome::Diverged => tracing::error!(
            index,
            ?diverged,
            "replica consistency check: members hold state the log does not explain; \
             replace them (docs/operations.md, \"Checking replicas\")"
        ),
        Outcome::Incomplete => tracing::warn!(
            index,
            unanswered = ?report
                .members
                .iter()
                .filter(|m| matches!(m.state, MemberState::Unanswered(_)))
                .map(|m| m.id)
                .collect::<Vec<_>>(),
            "replica consistency check: not every member could be compared"
        ),
        Outcome::Consistent => tracing::info!(
            index,
            members = report.members.len(),
            "replica consistency check: every member holds the same state"
        ),
    }
    Ok(report)
}

/// Runs a check every `every` while this node leads (one leader at a time,
/// so one check per interval in the cluster), until `shutdown`.
///
/// A node that does not lead forgets its own last outcome once it is older
/// than `every` (`agentry_replicas_diverged` back to 0): the leader's
/// checks speak for the cluster from then on, so a member replaced after a
/// divergence is not still reported by a node that lost the leadership.
pub async fn run_periodically(
    node: RaftNode,
    every: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return;
        }
        if !node.status().is_leader {
            crate::metrics::expire_replica_check(every);
            continue;
        }
        tokio::select! {
            checked = check(&node) => if let Err(e) = checked {
                tracing::warn!(error = %e, "the periodic replica consistency check could not run");
            },
            _ = shutdown.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::StateDigest;

    fn member(id: NodeId, records: &str) -> MemberDigest {
        MemberDigest {
            id,
            raft_addr: format!("127.0.0.1:{id}"),
            voter: true,
            digest: Ok(StateDigest {
                format: DIGEST_FORMAT,
                index: 9,
                revision: 4,
                sections: vec![
                    SectionDigest {
                        name: "records".into(),
                        entries: 3,
                        sha256: records.into(),
                    },
                    SectionDigest {
                        name: "leases".into(),
                        entries: 0,
                        sha256: "e3".into(),
                    },
                ],
                took_ms: 1,
            }),
        }
    }

    #[test]
    fn the_member_outside_the_majority_differs_in_the_sections_it_holds_otherwise() {
        let r = CheckReport::compare(
            9,
            4,
            vec![member(1, "a"), member(2, "b"), member(3, "a")],
            2,
        );
        assert_eq!(r.outcome, Outcome::Diverged);
        assert_eq!(
            r.diverged(),
            vec![2],
            "the majority wins over the asking node"
        );
        assert_eq!(
            r.members[1].state,
            MemberState::Differs(vec!["records".into()])
        );
        assert_eq!(r.members[0].state, MemberState::Agrees);
    }

    #[test]
    fn a_tie_is_settled_by_the_asking_node_and_silence_is_incomplete() {
        let r = CheckReport::compare(9, 4, vec![member(1, "a"), member(2, "b")], 1);
        assert_eq!(r.diverged(), vec![2]);

        let mut gone = member(3, "a");
        gone.digest = Err("not reachable".into());
        let r = CheckReport::compare(9, 4, vec![member(1, "a"), member(2, "a"), gone], 1);
        assert_eq!(r.outcome, Outcome::Incomplete);
        assert!(matches!(r.members[2].state, MemberState::Unanswered(_)));

        let r = CheckReport::compare(9, 4, vec![member(1, "a"), member(2, "a")], 1);
        assert_eq!(r.outcome, Outcome::Consistent);
    }

    #[test]
    fn a_digest_of_another_format_is_not_compared() {
        let mut other = member(2, "b");
        if let Ok(d) = other.digest.as_mut() {
            d.format = DIGEST_FORMAT + 1;
        }
        let r = CheckReport::compare(9, 4, vec![member(1, "a"), other], 1);
        assert_eq!(r.outcome, Outcome::Incomplete);
    }
}
