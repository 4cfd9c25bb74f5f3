//! Digests of the replicated state, for the replica consistency check
//! (`agentry cluster check`, as etcd's HashKV and corruption check).
//!
//! Every node applies the same log, so at the same entry every node must
//! hold the same bytes. A consistency-check entry (`Command::Check`) marks
//! that point: each node takes a RocksDB snapshot right after applying it
//! and hashes what the snapshot holds, away from the apply path. Hashing
//! what is on disk, not what apply meant to write, is the point: a bit
//! flipped by a disk, a row edited by hand or a bug that applied an entry
//! differently on one node all show as a member whose digest differs.
//!
//! Only state every node derives from the log alone is hashed. The change
//! history and the audit trail are trimmed by each node's own retention
//! settings, so only a window every node is sure to hold is compared;
//! the discovery index and the node's own refusals are local and left out.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rocksdb::DB;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::state_machine::{
    KEY_AUDIT_SEQ, KEY_CLUSTER, KEY_FEDERATION_CURSORS, KEY_IDENTITY, KEY_MEMBERSHIP,
    KEY_PUBLISHER_KEYS, KEY_REVISION,
};
use super::{cf, u64_key, StorageError, CF_AGENTS, CF_AUDIT, CF_CHANGES, CF_LEASES, CF_SM};

/// What a digest covers and how it is computed. Raised whenever either
/// changes, or a stored encoding does: nodes whose digests have different
/// formats are not compared.
pub const DIGEST_FORMAT: u32 = 1;

/// Revisions of change history compared: every node keeps more than this
/// (`watch_history` is at least 1,024 and history is trimmed to it).
const CHANGES_WINDOW: u64 = 1024;
/// Audit entries compared: the newest ones, and of those only entries at
/// most half a day older than the check. Every node keeps at least 1,000
/// entries and at least a day of them (`AuditConfig::validate`), trimmed
/// by the leader's clock: half a day leaves room for leaders' clocks that
/// disagree.
const AUDIT_WINDOW: u64 = 256;
const AUDIT_WINDOW_SECS: i64 = 43_200;
/// Digests kept per node: a check reads its own within seconds.
const KEPT: usize = 16;

/// One node's digest of the replicated state as of one log entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateDigest {
    pub format: u32,
    /// The log index of the check entry.
    pub index: u64,
    /// The registry revision as of that entry.
    pub revision: u64,
    pub sections: Vec<SectionDigest>,
    /// Milliseconds this node took to read and hash its state.
    pub took_ms: u64,
}

/// The digest of one part of the state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SectionDigest {
    /// `records`, `leases`, `registry`, `changes` or `audit`.
    pub name: String,
    /// Keys hashed.
    pub entries: u64,
    /// SHA-256 of every key and value, in key order, each length-prefixed.
    pub sha256: String,
}

/// Where a check entry was applied: what the digest needs to know of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CheckPoint {
    pub index: u64,
    pub revision: u64,
    pub audit_seq: u64,
    /// The leader's clock in the check command (unix seconds).
    pub now_unix: i64,
}

enum Slot {
    Hashing,
    Done(Result<StateDigest, String>),
}

/// This node's digests of recent check entries, by log index.
#[derive(Default)]
pub struct ReplicaDigests {
    slots: Mutex<BTreeMap<u64, Slot>>,
    done: tokio::sync::Notify,
}

/// Why a node has no digest to give for a check entry.
#[derive(Debug, thiserror::Error)]
pub enum DigestUnavailable {
    #[error("this node did not apply log entry {0} itself (it installed a snapshot past it, or restarted since)")]
    NotApplied(u64),
    #[error("this node had not hashed its state at log entry {index} within {waited:?}")]
    TimedOut { index: u64, waited: Duration },
    #[error("this node could not hash its state at log entry {index}: {reason}")]
    Failed { index: u64, reason: String },
}

impl ReplicaDigests {
    fn slots(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts hashing the state `db` holds now, as of `at`: returns once
    /// the snapshot is taken (so the caller may write again), and hashes
    /// it on a blocking thread.
    pub(crate) async fn start(self: &Arc<Self>, db: Arc<DB>, at: CheckPoint) {
        {
            let mut slots = self.slots();
            slots.insert(at.index, Slot::Hashing);
            while slots.len() > KEPT {
                slots.pop_first();
            }
        }
        let (taken, snapshot_taken) = tokio::sync::oneshot::channel();
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let snapshot = db.snapshot();
            let _ = taken.send(());
            let digest = hash_state(&db, &snapshot, at)
                .map(|sections| StateDigest {
                    format: DIGEST_FORMAT,
                    index: at.index,
                    revision: at.revision,
                    sections,
                    took_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                })
                .map_err(|e| e.to_string());
            if let Err(e) = &digest {
                tracing::error!(index = at.index, error = %e, "cannot hash the replicated state");
            }
            drop(snapshot);
            this.slots().insert(at.index, Slot::Done(digest));
            this.done.notify_waiters();
        });
        // The sender is dropped unsent only if the thread panicked before
        // taking the snapshot; the slot then times out for its readers.
        let _ = snapshot_taken.await;
    }

    /// This node's digest at check entry `index`, once hashed; `applied`
    /// says whether the node has applied that entry yet, and is consulted
    /// again as the wait goes on.
    pub async fn get(
        &self,
        index: u64,
        applied: impl Fn() -> u64,
        wait: Duration,
    ) -> Result<StateDigest, DigestUnavailable> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.slots().get(&index) {
                Some(Slot::Done(Ok(d))) => return Ok(d.clone()),
                Some(Slot::Done(Err(reason))) => {
                    return Err(DigestUnavailable::Failed {
                        index,
                        reason: reason.clone(),
                    })
                }
                Some(Slot::Hashing) => {}
                None if applied() >= index => return Err(DigestUnavailable::NotApplied(index)),
                None => {}
            }
            // Woken by a finished digest, or every 50 ms to look at the
            // applied index again.
            let step = (tokio::time::Instant::now() + Duration::from_millis(50)).min(deadline);
            if tokio::time::timeout_at(step, notified).await.is_err()
                && tokio::time::Instant::now() >= deadline
            {
                return Err(DigestUnavailable::TimedOut {
                    index,
                    waited: wait,
                });
            }
        }
    }
}

/// A running SHA-256 over length-prefixed keys and values.
struct Section {
    name: &'static str,
    hasher: Sha256,
    entries: u64,
}

impl Section {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            hasher: Sha256::new(),
            entries: 0,
        }
    }

    fn add(&mut self, key: &[u8], value: Option<&[u8]>) {
        self.hasher.update((key.len() as u64).to_be_bytes());
        self.hasher.update(key);
        match value {
            Some(v) => {
                self.hasher.update([1]);
                self.hasher.update((v.len() as u64).to_be_bytes());
                self.hasher.update(v);
            }
            None => self.hasher.update([0]),
        }
        self.entries += 1;
    }

    fn finish(self) -> SectionDigest {
        SectionDigest {
            name: self.name.into(),
            entries: self.entries,
            sha256: hex(&self.hasher.finalize()),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// How a section's stored value is compared: as it is, in a canonical
/// form, or not at all (`None`: outside the compared window).
type Canon<'a> = dyn Fn(&[u8]) -> Option<Cow<'_, [u8]>> + 'a;

/// Gives a closure the signature of [`Canon`] (its lifetimes are not
/// inferred otherwise).
fn canon<F: Fn(&[u8]) -> Option<Cow<'_, [u8]>>>(f: F) -> F {
    f
}

/// Hashes every section of the state `snapshot` holds.
fn hash_state(
    db: &DB,
    snapshot: &rocksdb::Snapshot<'_>,
    at: CheckPoint,
) -> Result<Vec<SectionDigest>, StorageError> {
    let read = || {
        let mut opts = super::bulk_read();
        opts.set_snapshot(snapshot);
        opts
    };
    let range = |name: &'static str,
                 cf_name: &'static str,
                 from: Option<Vec<u8>>,
                 to: Option<Vec<u8>>,
                 canon: &Canon<'_>|
     -> Result<SectionDigest, StorageError> {
        let mut section = Section::new(name);
        let mut it = db.raw_iterator_cf_opt(cf(db, cf_name)?, read());
        match &from {
            Some(k) => it.seek(k),
            None => it.seek_to_first(),
        }
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if to.as_deref().is_some_and(|end| k > end) {
                break;
            }
            if let Some(v) = canon(v) {
                section.add(k, Some(&v));
            }
            it.next();
        }
        it.status()?;
        Ok(section.finish())
    };
    let all = canon(|v| Some(Cow::Borrowed(v)));
    let records = range("records", CF_AGENTS, None, None, &all)?;
    let leases = range("leases", CF_LEASES, None, None, &all)?;
    // Apply writes a change with its record's bytes spliced in
    // (`encode_change`), an installed snapshot as serde writes it: the
    // same change in another member order. Compared as serde writes it;
    // bytes that do not decode are compared as they are.
    let change = canon(|v| {
        let canonical = serde_json::from_slice::<crate::domain::Change>(v)
            .ok()
            .and_then(|c| serde_json::to_vec(&c).ok());
        Some(canonical.map_or(Cow::Borrowed(v), Cow::Owned))
    });
    let changes = range(
        "changes",
        CF_CHANGES,
        Some(u64_key(at.revision.saturating_sub(CHANGES_WINDOW - 1).max(1)).to_vec()),
        Some(u64_key(at.revision).to_vec()),
        &change,
    )?;
    let cutoff = at.now_unix.saturating_sub(AUDIT_WINDOW_SECS);
    let recent = canon(|v| {
        let recent = serde_json::from_slice::<crate::domain::audit::AuditEntry>(v)
            .ok()
            .and_then(|e| crate::domain::time::parse(&e.at))
            .is_some_and(|t| t.unix_timestamp() >= cutoff);
        recent.then_some(Cow::Borrowed(v))
    });
    let audit = range(
        "audit",
        CF_AUDIT,
        Some(u64_key(at.audit_seq.saturating_sub(AUDIT_WINDOW - 1).max(1)).to_vec()),
        Some(u64_key(at.audit_seq).to_vec()),
        &recent,
    )?;
    // The registry's own replicated values; `last_applied` is the check
    // entry itself and `oldest_revision` follows each node's retention.
    // A value apply has not written yet is what an installed snapshot
    // writes for it (`install`): the empty value of its type.
    let mut registry = Section::new("registry");
    let sm = cf(db, CF_SM)?;
    let cluster = serde_json::to_vec(&crate::consensus::ClusterRecord::default())?;
    let membership = serde_json::to_vec(&crate::consensus::StoredMembership::default())?;
    for (key, empty) in [
        (KEY_REVISION, None),
        (KEY_IDENTITY, None),
        (KEY_PUBLISHER_KEYS, Some(&b"[]"[..])),
        (KEY_FEDERATION_CURSORS, Some(&b"{}"[..])),
        (KEY_AUDIT_SEQ, Some(&b"0"[..])),
        (KEY_CLUSTER, Some(&cluster[..])),
        (KEY_MEMBERSHIP, Some(&membership[..])),
    ] {
        let value = db.get_cf_opt(sm, key, &read())?;
        registry.add(key, value.as_deref().or(empty));
    }
    Ok(vec![records, leases, registry.finish(), changes, audit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_digest_covers_keys_values_and_their_boundaries() {
        let of = |pairs: &[(&[u8], Option<&[u8]>)]| {
            let mut s = Section::new("t");
            for (k, v) in pairs {
                s.add(k, *v);
            }
            s.finish().sha256
        };
        let base = of(&[(b"ab", Some(b"c"))]);
        assert_ne!(base, of(&[(b"a", Some(b"bc"))]), "a moved boundary");
        assert_ne!(base, of(&[(b"ab", Some(b"d"))]), "a changed value");
        assert_ne!(
            of(&[(b"k", None)]),
            of(&[(b"k", Some(b""))]),
            "absent is not empty"
        );
        assert_eq!(base, of(&[(b"ab", Some(b"c"))]));
    }
}
