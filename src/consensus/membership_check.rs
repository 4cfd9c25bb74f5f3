//! Who may take part in this cluster's Raft traffic, beyond proving the
//! cluster secret or certificate (`cluster_auth`): etcd's cluster-id and
//! member checks. Two mistakes pass a shared secret or a shared CA:
//!
//! - a node of *another* cluster (clusters commonly share a CA, or a Helm
//!   release's secret) is pointed at this one;
//! - a member's data directory is wiped or replaced and the node comes back
//!   with the same id. Its vote would count for entries it no longer holds,
//!   so a candidate missing committed entries could win with it.
//!
//! Every message carries a `PeerStamp`: the sender's cluster id, its data
//! directory's incarnation (random, made with the directory), and on
//! requests the incarnation the sender has on record for the receiver. The
//! receiver refuses a foreign cluster id and a request addressed to another
//! incarnation of itself, before anything is acted on.
//!
//! The record is replicated state (`Command::Cluster`), so every leader —
//! not only the one that saw a member join — checks against it: the leader
//! founds the cluster id and records each member's incarnation the first
//! time it sees one; a node that leaves the membership loses its record, so
//! an operator's remove-and-add records the directory it has then. A node
//! that has not learned the cluster id yet (a new member) claims none and
//! is checked for none; but what it sends to a node's log or vote is
//! admitted only if it is a member there (`admit_to_log`), or a new cluster
//! pointed at a running node could replace that node's log before its own
//! id is founded. A restored cluster has its id from the start (derived in
//! `storage::backup`).
//!
//! A directory put back from an older copy keeps its incarnation; only a
//! leader that saw it acknowledge entries it no longer holds can tell
//! (`network`). That leader records the member as *refused* in the same
//! record, so every later leader sends it nothing either, no candidate asks
//! for its vote, and every node refuses its requests, until an operator
//! removes it (which drops the refusal with the rest of its record).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::NodeId;
use crate::pb::PeerStamp;

/// A refusal is logged at most this often per peer.
const LOG_EVERY: Duration = Duration::from_secs(30);

/// The replicated part: the cluster's id and each member's incarnation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterRecord {
    pub cluster_id: Option<String>,
    pub incarnations: BTreeMap<NodeId, String>,
    /// The newest apply rules an applied entry asked for: every member
    /// followed them then (`consensus::APPLY_RULES`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub apply_rules: u32,
    /// Members refused for losing log entries they had acknowledged, with
    /// what the refusing leader saw (apply rules 4).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub refused: BTreeMap<NodeId, String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl ClusterRecord {
    /// Applies a `Command::Cluster`: the first cluster id stays; an
    /// incarnation is recorded for a current member that has none, and a
    /// refusal for a current member not yet refused (a proposal that raced
    /// the member's removal records nothing). Whether anything changed.
    pub fn record(
        &mut self,
        cluster_id: Option<&str>,
        incarnations: &BTreeMap<NodeId, String>,
        refused: &BTreeMap<NodeId, String>,
        is_member: impl Fn(NodeId) -> bool,
    ) -> bool {
        let mut changed = false;
        if let (None, Some(id)) = (&self.cluster_id, cluster_id) {
            self.cluster_id = Some(id.to_string());
            changed = true;
        }
        for (node, incarnation) in incarnations {
            if is_member(*node) && !self.incarnations.contains_key(node) {
                self.incarnations.insert(*node, incarnation.clone());
                changed = true;
            }
        }
        for (node, why) in refused {
            if is_member(*node) && !self.refused.contains_key(node) {
                self.refused.insert(*node, why.clone());
                changed = true;
            }
        }
        changed
    }

    /// Drops the records of nodes no longer in the membership. Whether
    /// anything changed.
    pub fn keep_members(&mut self, is_member: impl Fn(NodeId) -> bool) -> bool {
        let before = (self.incarnations.len(), self.refused.len());
        self.incarnations.retain(|node, _| is_member(*node));
        self.refused.retain(|node, _| is_member(*node));
        (self.incarnations.len(), self.refused.len()) != before
    }
}

/// The applied `ClusterRecord`, published by the state machine and read by
/// the transport on every message. Cheap to clone; clones share it.
#[derive(Clone, Default)]
pub struct SharedRecord(Arc<RwLock<Arc<ClusterRecord>>>);

impl SharedRecord {
    pub fn new(record: ClusterRecord) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(record))))
    }

    pub fn get(&self) -> Arc<ClusterRecord> {
        match self.0.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn set(&self, record: ClusterRecord) {
        let record = Arc::new(record);
        match self.0.write() {
            Ok(mut g) => *g = record,
            Err(poisoned) => *poisoned.into_inner() = record,
        }
    }
}

/// Why a peer's message was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(
        "node {from} belongs to cluster {theirs}, this node to cluster {ours} (nodes restored \
         from one backup share a cluster id only when every restore was given the same \
         --initial-members list)"
    )]
    OtherCluster {
        from: NodeId,
        theirs: String,
        ours: String,
    },
    #[error(
        "node {from} has data directory {expected} on record for node {me}, but this node's \
         is {actual}: its data directory was wiped or replaced since it joined. Remove node {me} \
         from the cluster and add it back (agentry cluster remove / add / promote)"
    )]
    Replaced {
        from: NodeId,
        me: NodeId,
        expected: String,
        actual: String,
    },
    #[error(
        "node {from} is refused by the cluster: {why}. Remove it from the cluster and add it \
         back (agentry cluster remove / add / promote)"
    )]
    RolledBack { from: NodeId, why: String },
    #[error(
        "node {from} claims no cluster and {why}, so it is not a member of this node's cluster \
         {ours} (a new or restored cluster whose member list names this node's address?)"
    )]
    Stranger {
        from: NodeId,
        why: &'static str,
        ours: String,
    },
}

/// This node's side of the check. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct MembershipCheck {
    me: NodeId,
    incarnation: Arc<str>,
    record: SharedRecord,
    /// Incarnations peers answered with while none was on record: the
    /// leader records them.
    seen: Arc<Mutex<BTreeMap<NodeId, String>>>,
    /// Peers that have answered with a stamp: they run a version that
    /// reads `Command::Cluster`, which is proposed only once all members do
    /// (an older node could not decode the entry and would stop following
    /// during a rolling upgrade).
    stamped: Arc<Mutex<BTreeSet<NodeId>>>,
    /// When a refusal involving each peer was last logged.
    logged: Arc<Mutex<HashMap<NodeId, Instant>>>,
}

impl MembershipCheck {
    pub fn new(me: NodeId, incarnation: &str, record: SharedRecord) -> Self {
        Self {
            me,
            incarnation: incarnation.into(),
            record,
            seen: Arc::default(),
            stamped: Arc::default(),
            logged: Arc::default(),
        }
    }

    /// The apply rules the cluster has moved to: what a member not heard
    /// from since this node leads is taken to follow.
    pub fn cluster_rules(&self) -> u32 {
        self.record.get().apply_rules
    }

    /// The stamp of a message to `to` (`None`: an answer, or a request that
    /// addresses no member, such as a forwarded one).
    pub fn stamp(&self, to: Option<NodeId>) -> PeerStamp {
        let record = self.record.get();
        PeerStamp {
            cluster_id: record.cluster_id.clone().unwrap_or_default(),
            incarnation: self.incarnation.to_string(),
            to_incarnation: to
                .and_then(|n| record.incarnations.get(&n).cloned())
                .unwrap_or_default(),
        }
    }

    /// Checks a request from `from` before it is acted on.
    pub fn admit(&self, from: NodeId, stamp: Option<&PeerStamp>) -> Result<(), Refusal> {
        let record = self.record.get();
        if let Some(why) = record.refused.get(&from) {
            return Err(Refusal::RolledBack {
                from,
                why: why.clone(),
            });
        }
        let Some(stamp) = stamp else {
            return Ok(());
        };
        if let Some(ours) = &record.cluster_id {
            if !stamp.cluster_id.is_empty() && stamp.cluster_id != *ours {
                return Err(Refusal::OtherCluster {
                    from,
                    theirs: stamp.cluster_id.clone(),
                    ours: ours.clone(),
                });
            }
        }
        if !stamp.to_incarnation.is_empty() && stamp.to_incarnation != *self.incarnation {
            return Err(Refusal::Replaced {
                from,
                me: self.me,
                expected: stamp.to_incarnation.clone(),
                actual: self.incarnation.to_string(),
            });
        }
        Ok(())
    }

    /// Checks a request that acts on this node's log or vote (entries, a
    /// vote, a snapshot) before it is acted on: `admit`, and, once this
    /// node knows its cluster id, a sender that claims none must be a
    /// member (`member`: in this node's membership) whose data directory
    /// is the one on record, if any. Such a sender is a member that has
    /// not applied the id yet; anything else claiming none belongs to a
    /// cluster still founding its id, pointed here by mistake, and its
    /// entries would replace this node's. Forwarded requests go through
    /// `admit` alone: a new node asks a peer whether it belongs to a
    /// cluster before it founds one.
    pub fn admit_to_log(
        &self,
        from: NodeId,
        stamp: Option<&PeerStamp>,
        member: bool,
    ) -> Result<(), Refusal> {
        self.admit(from, stamp)?;
        let record = self.record.get();
        let (Some(stamp), Some(ours)) = (stamp, &record.cluster_id) else {
            return Ok(());
        };
        if !stamp.cluster_id.is_empty() {
            return Ok(());
        }
        let another_directory = record.incarnations.get(&from).is_some_and(|on_record| {
            !stamp.incarnation.is_empty() && *on_record != stamp.incarnation
        });
        let why = if !member {
            "is not in this node's membership"
        } else if another_directory {
            "its data directory is not the one on record for that node"
        } else {
            return Ok(());
        };
        Err(Refusal::Stranger {
            from,
            why,
            ours: ours.clone(),
        })
    }

    /// Notes the incarnation `from` answered with, when this node has none
    /// on record for it.
    pub fn answered(&self, from: NodeId, stamp: Option<&PeerStamp>) {
        let Some(stamp) = stamp.filter(|s| !s.incarnation.is_empty()) else {
            return;
        };
        self.stamped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(from);
        if self.record.get().incarnations.contains_key(&from) {
            return;
        }
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(from, stamp.incarnation.clone());
    }

    /// What the leader should record among `members`: a cluster id when
    /// there is none (`new_id` makes one), and the incarnations known for
    /// members without a record (this node's own, and those seen in
    /// answers, which are taken). `None`: nothing to record, or a member
    /// has not answered with a stamp yet.
    pub fn missing(
        &self,
        members: &[NodeId],
        new_id: impl FnOnce() -> Option<String>,
    ) -> Option<(Option<String>, BTreeMap<NodeId, String>)> {
        {
            let stamped = self.stamped.lock().unwrap_or_else(|e| e.into_inner());
            if !members.iter().all(|n| *n == self.me || stamped.contains(n)) {
                return None;
            }
        }
        let record = self.record.get();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut incarnations = BTreeMap::new();
        for node in members
            .iter()
            .filter(|n| !record.incarnations.contains_key(n))
        {
            let known = if *node == self.me {
                Some(self.incarnation.to_string())
            } else {
                seen.remove(node)
            };
            if let Some(incarnation) = known {
                incarnations.insert(*node, incarnation);
            }
        }
        let cluster_id = if record.cluster_id.is_none() {
            new_id()
        } else {
            None
        };
        (cluster_id.is_some() || !incarnations.is_empty()).then_some((cluster_id, incarnations))
    }

    /// Whether the applied record refuses `node` (it lost log entries it
    /// had acknowledged).
    pub fn is_refused(&self, node: NodeId) -> bool {
        self.record.get().refused.contains_key(&node)
    }

    /// The members the applied record refuses.
    pub fn refused(&self) -> Vec<NodeId> {
        self.record.get().refused.keys().copied().collect()
    }

    /// The cluster id this node has applied.
    pub fn cluster_id(&self) -> Option<String> {
        self.record.get().cluster_id.clone()
    }

    /// Whether a refusal involving `peer` should be logged now (at most once
    /// per `LOG_EVERY`), so a refused peer's heartbeats do not flood the log.
    pub fn should_log(&self, peer: NodeId) -> bool {
        let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match logged.get(&peer) {
            Some(at) if now.duration_since(*at) < LOG_EVERY => false,
            _ => {
                logged.insert(peer, now);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(cluster: &str, incarnation: &str, to: &str) -> PeerStamp {
        PeerStamp {
            cluster_id: cluster.into(),
            incarnation: incarnation.into(),
            to_incarnation: to.into(),
        }
    }

    #[test]
    fn the_first_id_stays_and_only_members_without_a_record_are_recorded() {
        let mut r = ClusterRecord::default();
        let members = |n: NodeId| n <= 3;
        let incs = BTreeMap::from([(1, "a".to_string()), (2, "b".into()), (9, "z".into())]);
        assert!(r.record(Some("c1"), &incs, &BTreeMap::new(), members));
        assert_eq!(r.cluster_id.as_deref(), Some("c1"));
        assert_eq!(r.incarnations.keys().copied().collect::<Vec<_>>(), [1, 2]);
        // A later proposal changes neither the id nor a recorded member.
        let again = BTreeMap::from([(1, "other".to_string()), (3, "c".into())]);
        assert!(r.record(Some("c2"), &again, &BTreeMap::new(), members));
        assert_eq!(r.cluster_id.as_deref(), Some("c1"));
        assert_eq!(r.incarnations[&1], "a");
        assert_eq!(r.incarnations[&3], "c");
        assert!(!r.record(Some("c3"), &again, &BTreeMap::new(), members));
        // Leaving the membership drops the record.
        assert!(r.keep_members(|n| n != 2));
        assert!(!r.incarnations.contains_key(&2));
        assert!(!r.keep_members(|n| n != 2));
    }

    #[test]
    fn a_refusal_holds_until_the_member_leaves() {
        let mut r = ClusterRecord::default();
        let members = |n: NodeId| n <= 3;
        let none = BTreeMap::new();
        let why = |s: &str| BTreeMap::from([(1, s.to_string()), (9, "not a member".into())]);
        assert!(r.record(None, &none, &why("lost 5"), members));
        assert_eq!(r.refused, BTreeMap::from([(1, "lost 5".to_string())]));
        // A second leader's refusal of the same member changes nothing.
        assert!(!r.record(None, &none, &why("lost 7"), members));
        assert_eq!(r.refused[&1], "lost 5");
        let shared = SharedRecord::new(r.clone());
        let check = MembershipCheck::new(2, "i2", shared.clone());
        assert!(check.is_refused(1) && !check.is_refused(3));
        assert_eq!(check.refused(), [1]);
        // Its requests are refused, stamped or not (a vote request from a
        // node that kept campaigning, say).
        for stamped in [None, Some(stamp("", "i1", "i2"))] {
            let e = check.admit(1, stamped.as_ref()).unwrap_err().to_string();
            assert!(e.contains("lost 5") && e.contains("cluster remove"), "{e}");
        }
        assert!(check.admit(3, None).is_ok());
        // Removing it drops the refusal; adding it back starts afresh.
        assert!(r.keep_members(|n| n != 1));
        assert!(r.refused.is_empty());
        shared.set(r);
        assert!(!check.is_refused(1) && check.admit(1, None).is_ok());
    }

    #[test]
    fn a_sender_claiming_no_cluster_reaches_the_log_only_as_a_known_member() {
        let record = SharedRecord::new(ClusterRecord {
            cluster_id: Some("c1".into()),
            incarnations: BTreeMap::from([(1, "i1".into()), (2, "i2".into())]),
            ..Default::default()
        });
        let check = MembershipCheck::new(2, "i2", record);
        // A member that has not applied the id yet; one not on record yet
        // (added since); an older release (no stamp); a claimed id.
        assert!(check
            .admit_to_log(1, Some(&stamp("", "i1", "")), true)
            .is_ok());
        assert!(check
            .admit_to_log(3, Some(&stamp("", "i3", "")), true)
            .is_ok());
        assert!(check.admit_to_log(7, None, false).is_ok());
        assert!(check
            .admit_to_log(7, Some(&stamp("c1", "i7", "")), false)
            .is_ok());
        // A node of a cluster still founding its id: not a member here, or
        // a member's id with another directory.
        let e = check
            .admit_to_log(7, Some(&stamp("", "x", "")), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not in this node's membership") && e.contains("c1"),
            "{e}"
        );
        let e = check
            .admit_to_log(1, Some(&stamp("", "other", "")), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not the one on record"), "{e}");
        // A forwarded request (a new node asking whether this one belongs
        // to a cluster) is not held to it.
        assert!(check.admit(7, Some(&stamp("", "x", ""))).is_ok());
        // Nor is anything, while this node knows no id itself.
        let blank = MembershipCheck::new(2, "i2", SharedRecord::default());
        assert!(blank
            .admit_to_log(7, Some(&stamp("", "x", "")), false)
            .is_ok());
    }

    #[test]
    fn foreign_clusters_and_replaced_directories_are_refused() {
        let record = SharedRecord::new(ClusterRecord {
            cluster_id: Some("c1".into()),
            incarnations: BTreeMap::from([(1, "i1".into()), (2, "i2".into())]),
            ..Default::default()
        });
        let check = MembershipCheck::new(2, "i2", record.clone());
        // Unstamped (an older node) and unclaimed (a new member) pass.
        assert!(check.admit(1, None).is_ok());
        assert!(check.admit(1, Some(&stamp("", "i1", ""))).is_ok());
        assert!(check.admit(1, Some(&stamp("c1", "i1", "i2"))).is_ok());
        let e = check
            .admit(7, Some(&stamp("c9", "x", "")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cluster c9") && e.contains("cluster c1"), "{e}");
        // This node's directory is not the one node 1 has on record.
        let wiped = MembershipCheck::new(2, "new", record);
        let e = wiped
            .admit(1, Some(&stamp("c1", "i1", "i2")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("wiped or replaced"), "{e}");
        // A wiped node knows no cluster id yet: it cannot refuse on that.
        let blank = MembershipCheck::new(3, "i3", SharedRecord::default());
        assert!(blank.admit(1, Some(&stamp("c1", "i1", ""))).is_ok());
    }

    #[test]
    fn the_leader_records_what_it_has_seen_once() {
        let record = SharedRecord::default();
        let check = MembershipCheck::new(1, "i1", record.clone());
        check.answered(2, Some(&stamp("", "i2", "")));
        // Node 3 has not answered with a stamp (it may run an older
        // version, which could not read the entry): nothing is proposed.
        check.answered(3, None);
        assert!(check.missing(&[1, 2, 3], || Some("new".into())).is_none());
        let (id, incs) = check.missing(&[1, 2], || Some("new".into())).unwrap();
        assert_eq!(id.as_deref(), Some("new"));
        assert_eq!(
            incs,
            BTreeMap::from([(1, "i1".to_string()), (2, "i2".to_string())])
        );
        let mut applied = ClusterRecord::default();
        applied.record(id.as_deref(), &incs, &BTreeMap::new(), |_| true);
        record.set(applied);
        // Recorded: nothing more until node 3 answers.
        assert!(check.missing(&[1, 2], || Some("x".into())).is_none());
        check.answered(2, Some(&stamp("", "other", "")));
        assert!(check.missing(&[1, 2, 3], || Some("x".into())).is_none());
        check.answered(3, Some(&stamp("new", "i3", "")));
        let (id, incs) = check.missing(&[1, 2, 3], || Some("x".into())).unwrap();
        assert_eq!(id, None);
        assert_eq!(incs, BTreeMap::from([(3, "i3".to_string())]));
        assert_eq!(check.stamp(Some(2)).to_incarnation, "i2");
        assert_eq!(check.stamp(Some(3)).to_incarnation, "");
        assert_eq!(check.stamp(None).cluster_id, "new");
    }
}
