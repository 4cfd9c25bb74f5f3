//! Backups of a node's replicated state, and seeding a new data directory
//! from one.
//!
//! A backup is JSON lines, written from one RocksDB snapshot (so applies
//! that run meanwhile are wholly in it or wholly out of it) one stored value
//! at a time, never the whole state in memory:
//!
//! ```text
//! {"agentry_backup":1, ...header: applied position, membership, identity,
//!   publisher keys, federation cursors, history bounds...}
//! {"record":{...}}    one per stored record, tombstones included
//! {"change":{...}}    the change history, oldest first
//! {"audit":{...}}     the committed audit trail
//! {"end":{"records":N,"changes":N,"audit":N,"sha256":"<hex>"}}
//! ```
//!
//! The SHA-256 covers every byte before the `end` line. A restore checks it
//! in a first pass before it writes anything, then loads the lines into a
//! fresh database as the state of a new cluster's first snapshot (written
//! too, for followers added later): the log starts after the backup's last
//! applied entry, in its term, so the new cluster's first leader continues
//! the old numbering.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Arc;

use openraft::{BasicNode, Membership, Vote};
use rocksdb::{WriteBatch, DB};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::log_store::{KEY_COMMITTED, KEY_LAST_PURGED, KEY_VOTE};
use super::state_machine::{
    KEY_APPLIED, KEY_AUDIT_SEQ, KEY_CLUSTER, KEY_FEDERATION_CURSORS, KEY_IDENTITY, KEY_MEMBERSHIP,
    KEY_OLDEST, KEY_PUBLISHER_KEYS, KEY_REVISION,
};
use super::{
    cf, u64_key, StorageError, CF_AGENTS, CF_AUDIT, CF_CHANGES, CF_LEASES, CF_RAFT, CF_SM,
};
use crate::consensus::{ClusterRecord, LogId, NodeId, StoredMembership};
use crate::crypto::{hex, Identity};
use crate::domain::audit::AuditEntry;
use crate::domain::lease::LeaseEntry;
use crate::domain::{AgentRecord, Change, PublisherKey};

/// Version of the backup format this binary writes and reads.
pub const BACKUP_FORMAT: u32 = 1;

/// Values written per RocksDB batch while restoring.
const RESTORE_BATCH: usize = 1024;

/// Why a backup could not be taken or restored.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("line {line}: {message}")]
    Invalid { line: u64, message: String },
    #[error("the backup's checksum does not match its contents (expected {expected}, computed {computed}): the file is damaged or incomplete")]
    Checksum { expected: String, computed: String },
    #[error("{0}")]
    Refused(String),
}

/// The first line: everything that is one value rather than many.
#[derive(Debug, Serialize, Deserialize)]
pub struct BackupHeader {
    pub agentry_backup: u32,
    /// RFC 3339 time the backup was taken.
    pub created: String,
    /// The node it was taken from.
    pub node_id: NodeId,
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub oldest_revision: u64,
    pub audit_seq: u64,
    pub identity: Option<Identity>,
    pub publisher_keys: Vec<PublisherKey>,
    pub federation_cursors: BTreeMap<String, u64>,
    /// The last revision taken (absent in backups from before batch
    /// entries, and then the last applied index).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
}

/// The last line: counts and the checksum of everything before it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BackupEnd {
    pub records: u64,
    pub changes: u64,
    pub audit: u64,
    /// Agents' holds and shared leases (absent in backups from before).
    #[serde(default)]
    pub leases: u64,
    pub sha256: String,
}

/// What was written or restored.
#[derive(Debug, Clone)]
pub struct BackupSummary {
    pub last_applied: Option<LogId>,
    /// A restore's new cluster id (`restored_cluster_id`); none for a save.
    pub cluster_id: Option<String>,
    pub counts: BackupEnd,
    pub bytes: u64,
}

/// One body line of a backup.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Line {
    Record(AgentRecord),
    Change(Change),
    Audit(AuditEntry),
    Lease(LeaseEntry),
    End(BackupEnd),
}

/// A writer that hashes and counts what passes through it.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes a backup of everything this node has applied to `out`.
pub fn write_backup(
    db: &DB,
    node_id: NodeId,
    out: &mut dyn Write,
) -> Result<BackupSummary, BackupError> {
    let snap = db.snapshot();
    let meta = |key: &[u8]| -> Result<Option<Vec<u8>>, StorageError> {
        Ok(snap.get_cf(cf(db, CF_SM)?, key)?)
    };
    fn parse<T: serde::de::DeserializeOwned + Default>(
        bytes: Option<Vec<u8>>,
    ) -> Result<T, StorageError> {
        Ok(match bytes {
            Some(b) => serde_json::from_slice(&b)?,
            None => T::default(),
        })
    }
    let header = BackupHeader {
        agentry_backup: BACKUP_FORMAT,
        created: crate::domain::time::now(),
        node_id,
        last_applied: parse(meta(KEY_APPLIED)?)?,
        membership: parse(meta(KEY_MEMBERSHIP)?)?,
        oldest_revision: parse::<Option<u64>>(meta(KEY_OLDEST)?)?.unwrap_or(1),
        audit_seq: parse(meta(KEY_AUDIT_SEQ)?)?,
        identity: parse(meta(KEY_IDENTITY)?)?,
        publisher_keys: parse(meta(KEY_PUBLISHER_KEYS)?)?,
        federation_cursors: parse(meta(KEY_FEDERATION_CURSORS)?)?,
        revision: parse(meta(KEY_REVISION)?)?,
    };
    let mut w = Hashing {
        inner: std::io::BufWriter::with_capacity(256 << 10, out),
        hash: Sha256::new(),
        bytes: 0,
    };
    serde_json::to_writer(&mut w, &header).map_err(StorageError::from)?;
    w.write_all(b"\n")?;
    let mut counts = BackupEnd::default();
    // Stored values are already the JSON of their type: copied as they are.
    for (cf_name, tag, count) in [
        (CF_AGENTS, "record", &mut counts.records),
        (CF_CHANGES, "change", &mut counts.changes),
        (CF_AUDIT, "audit", &mut counts.audit),
        (CF_LEASES, "lease", &mut counts.leases),
    ] {
        let mut it = snap.raw_iterator_cf_opt(cf(db, cf_name)?, super::bulk_read());
        it.seek_to_first();
        while let Some(v) = it.value() {
            write!(w, "{{\"{tag}\":")?;
            w.write_all(v)?;
            w.write_all(b"}\n")?;
            *count += 1;
            it.next();
        }
        it.status().map_err(StorageError::from)?;
    }
    counts.sha256 = hex(&w.hash.clone().finalize());
    let bytes = w.bytes;
    let mut inner = w.inner;
    serde_json::to_writer(&mut inner, &serde_json::json!({ "end": &counts }))
        .map_err(StorageError::from)?;
    inner.write_all(b"\n")?;
    inner.flush()?;
    Ok(BackupSummary {
        last_applied: header.last_applied,
        cluster_id: None,
        counts,
        bytes,
    })
}

fn invalid(line: u64, message: impl std::fmt::Display) -> BackupError {
    BackupError::Invalid {
        line,
        message: message.to_string(),
    }
}

/// Reads a backup's header and checks its checksum and counts, without
/// keeping more than one line in memory.
pub fn verify_backup(mut input: impl BufRead) -> Result<(BackupHeader, BackupEnd), BackupError> {
    let mut hash = Sha256::new();
    let mut line = Vec::new();
    let mut n = 0u64;
    let mut header: Option<BackupHeader> = None;
    let mut seen = BackupEnd::default();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return Err(invalid(
                n,
                "the backup ends without its end line: it is incomplete",
            ));
        }
        n += 1;
        // Every line ends with a newline, the end line too: a file cut in
        // the middle of one is incomplete, whatever the piece looks like.
        if line.last() != Some(&b'\n') {
            return Err(invalid(
                n,
                "the backup ends in the middle of a line: it is incomplete",
            ));
        }
        if header.is_none() {
            let h: BackupHeader = serde_json::from_slice(&line)
                .map_err(|e| invalid(n, format!("not an Agentry backup header: {e}")))?;
            if h.agentry_backup != BACKUP_FORMAT {
                return Err(invalid(
                    n,
                    format!(
                        "backup format {} is not the one this binary reads ({BACKUP_FORMAT})",
                        h.agentry_backup
                    ),
                ));
            }
            hash.update(&line);
            header = Some(h);
            continue;
        }
        // Only the line's kind is decoded here; the load decodes the rest.
        let kind = line.get(..12).unwrap_or(&line);
        if kind.starts_with(b"{\"end\":") {
            let end = match serde_json::from_slice::<Line>(&line) {
                Ok(Line::End(end)) => end,
                _ => return Err(invalid(n, "malformed end line")),
            };
            let computed = hex(&hash.finalize());
            if computed != end.sha256 {
                return Err(BackupError::Checksum {
                    expected: end.sha256,
                    computed,
                });
            }
            if (seen.records, seen.changes, seen.audit, seen.leases)
                != (end.records, end.changes, end.audit, end.leases)
            {
                return Err(invalid(
                    n,
                    "the counts in the end line do not match the lines",
                ));
            }
            let mut rest = Vec::new();
            if input.read_until(b'\n', &mut rest)? != 0 {
                return Err(invalid(n + 1, "data after the end line"));
            }
            let header = header.ok_or_else(|| invalid(1, "no header"))?;
            return Ok((header, end));
        }
        if kind.starts_with(b"{\"record\":") {
            seen.records += 1;
        } else if kind.starts_with(b"{\"change\":") {
            seen.changes += 1;
        } else if kind.starts_with(b"{\"audit\":") {
            seen.audit += 1;
        } else if kind.starts_with(b"{\"lease\":") {
            seen.leases += 1;
        } else {
            return Err(invalid(n, "unknown line"));
        }
        hash.update(&line);
    }
}

/// Where a restored node stands in its new cluster.
#[derive(Debug, Clone)]
pub struct RestoreTarget {
    pub node_id: NodeId,
    /// Every voter of the new cluster (this node among them) and its Raft
    /// address.
    pub members: BTreeMap<NodeId, String>,
}

/// Loads a backup (checked by `verify_backup` first) into the empty
/// database `db`, as node `target.node_id` of a new cluster of
/// `target.members`.
pub fn load_backup(
    db: &DB,
    mut input: impl BufRead,
    target: &RestoreTarget,
) -> Result<BackupSummary, BackupError> {
    if !target.members.contains_key(&target.node_id) {
        return Err(BackupError::Refused(format!(
            "node {} is not among the initial members",
            target.node_id
        )));
    }
    let mut line = Vec::new();
    input.read_until(b'\n', &mut line)?;
    let header: BackupHeader = serde_json::from_slice(&line).map_err(|e| invalid(1, e))?;
    let leases = cf(db, CF_LEASES)?;
    let (agents, changes, audit, sm, raft) = (
        cf(db, CF_AGENTS)?,
        cf(db, CF_CHANGES)?,
        cf(db, CF_AUDIT)?,
        cf(db, CF_SM)?,
        cf(db, CF_RAFT)?,
    );
    let mut batch = WriteBatch::default();
    let mut counts = BackupEnd::default();
    let mut bytes = line.len() as u64;
    let mut n = 1u64;
    let end = loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return Err(invalid(n, "the backup ends without its end line"));
        }
        n += 1;
        bytes += line.len() as u64;
        match serde_json::from_slice::<Line>(&line).map_err(|e| invalid(n, e))? {
            Line::Record(r) => {
                batch.put_cf(
                    agents,
                    r.metadata.id.as_bytes(),
                    serde_json::to_vec(&r).map_err(StorageError::from)?,
                );
                counts.records += 1;
            }
            Line::Change(c) => {
                batch.put_cf(
                    changes,
                    u64_key(c.revision),
                    serde_json::to_vec(&c).map_err(StorageError::from)?,
                );
                counts.changes += 1;
            }
            Line::Audit(e) => {
                batch.put_cf(
                    audit,
                    u64_key(e.seq),
                    serde_json::to_vec(&e).map_err(StorageError::from)?,
                );
                counts.audit += 1;
            }
            Line::Lease(e) => {
                batch.put_cf(
                    leases,
                    e.key(),
                    serde_json::to_vec(&e).map_err(StorageError::from)?,
                );
                counts.leases += 1;
            }
            Line::End(end) => break end,
        }
        if batch.len() >= RESTORE_BATCH {
            db.write(std::mem::take(&mut batch))
                .map_err(StorageError::from)?;
        }
    };
    // The new cluster starts where the backup ends: its members, as of the
    // last applied entry; log entries before it exist only as this state.
    let last = header.last_applied;
    let voters: std::collections::BTreeSet<NodeId> = target.members.keys().copied().collect();
    let nodes: BTreeMap<NodeId, BasicNode> = target
        .members
        .iter()
        .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
        .collect();
    let membership = StoredMembership::new(last, Membership::new(vec![voters], nodes));
    batch.put_cf(sm, KEY_APPLIED, json(&last)?);
    batch.put_cf(sm, KEY_MEMBERSHIP, json(&membership)?);
    batch.put_cf(sm, KEY_OLDEST, json(&header.oldest_revision)?);
    if let Some(revision) = header.revision {
        batch.put_cf(sm, KEY_REVISION, json(&revision)?);
    }
    batch.put_cf(sm, KEY_AUDIT_SEQ, json(&header.audit_seq)?);
    if let Some(identity) = &header.identity {
        batch.put_cf(sm, KEY_IDENTITY, json(identity)?);
    }
    batch.put_cf(sm, KEY_PUBLISHER_KEYS, json(&header.publisher_keys)?);
    batch.put_cf(
        sm,
        KEY_FEDERATION_CURSORS,
        json(&header.federation_cursors)?,
    );
    let cluster_id = restored_cluster_id(&end.sha256, &target.members);
    let cluster = ClusterRecord {
        cluster_id: Some(cluster_id.clone()),
        ..ClusterRecord::default()
    };
    batch.put_cf(sm, KEY_CLUSTER, json(&cluster)?);
    // The log is empty and purged up to the backup's last entry. A vote in
    // that entry's term (for this node, not committed) makes the first
    // election of the new cluster use a later term, so its entries follow
    // the backup's in Raft order.
    let term = last.map(|l| l.leader_id.term).unwrap_or(0);
    batch.put_cf(raft, KEY_LAST_PURGED, json(&last)?);
    batch.put_cf(raft, KEY_COMMITTED, json(&last)?);
    batch.put_cf(raft, KEY_VOTE, json(&Vote::new(term, target.node_id))?);
    db.write(batch).map_err(StorageError::from)?;
    db.flush_wal(true).map_err(StorageError::from)?;
    Ok(BackupSummary {
        last_applied: last,
        cluster_id: Some(cluster_id),
        counts: BackupEnd {
            sha256: end.sha256,
            ..counts
        },
        bytes,
    })
}

/// The id of the cluster restored from the backup whose checksum is
/// `sha256` onto `members`. The restored nodes hold it from their first
/// message, so the cluster the backup came from (whose nodes may still run
/// at an address the new one was given) refuses their traffic and they
/// refuse its: founded at the first election instead, after every member
/// answered, the id would come too late — a restored leader, in a later
/// term than an old node, would have had it replace its log, and would
/// have recorded that node's directory as a member's. Each node is restored
/// on its own, so the id is derived, as etcd derives a restored cluster's
/// from its members: the same backup onto the same members gives every
/// node the same id, and any other backup or member list another one.
fn restored_cluster_id(sha256: &str, members: &BTreeMap<NodeId, String>) -> String {
    let mut digest = Sha256::new();
    digest.update(b"agentry restored cluster\n");
    digest.update(sha256.as_bytes());
    for (id, addr) in members {
        digest.update(format!("\n{id}={addr}").as_bytes());
    }
    hex(&digest.finalize()[..16])
}

fn json<T: Serialize>(value: &T) -> Result<Vec<u8>, StorageError> {
    Ok(serde_json::to_vec(value)?)
}

/// Makes `scratch` (inside the node's data directory, so RocksDB can hard
/// link its tables) a copy of the stopped node's data directory, whose
/// database `db` is: an offline backup applies the log to the copy, never
/// to the node's own applied state, which must not hold an entry the
/// cluster may yet replace.
pub fn scratch_copy(db: &DB, data_dir: &Path, scratch: &Path) -> Result<(), StorageError> {
    if scratch.exists() {
        std::fs::remove_dir_all(scratch)?;
    }
    std::fs::create_dir_all(scratch)?;
    std::fs::copy(
        data_dir.join(super::format::FORMAT_FILE),
        scratch.join(super::format::FORMAT_FILE),
    )?;
    rocksdb::checkpoint::Checkpoint::new(db)?.create_checkpoint(scratch.join("db"))?;
    Ok(())
}

/// Applies every entry of a stopped node's log that its applied state
/// lacks: those it committed but had not written yet (the applied state
/// is not in RocksDB's WAL; a node replays them when it starts), and those
/// it held without knowing they were committed. For an offline backup of
/// the last survivor of a cluster, as etcd's `--force-new-cluster` does:
/// a write acknowledged to a client is in a quorum's logs, perhaps only in
/// the survivor's, and the survivor may not have heard that it committed.
/// (An entry that never committed comes along too: its client was told
/// the outcome is unknown.) Returns the number of entries applied.
pub async fn apply_log(
    db: Arc<DB>,
    state: &mut super::StateMachine,
) -> Result<usize, StorageError> {
    use openraft::storage::{RaftLogStorage, RaftStateMachine};
    use openraft::RaftLogReader;
    let failed = |e: crate::consensus::StorageError| StorageError::Format(e.to_string());
    let mut log = super::LogStore::new(db)?;
    let Some(last) = log.get_log_state().await.map_err(failed)?.last_log_id else {
        return Ok(0);
    };
    let (applied, _) = state.applied_state().await.map_err(failed)?;
    let from = applied.map_or(0, |l| l.index + 1);
    if last.index < from {
        return Ok(0);
    }
    let entries = log
        .try_get_log_entries(from..=last.index)
        .await
        .map_err(failed)?;
    if entries.first().map(|e| e.log_id.index) != Some(from) {
        return Err(StorageError::Format(format!(
            "the log no longer holds entry {from}, which the applied state needs next"
        )));
    }
    let count = entries.len();
    state.apply(entries).await.map_err(failed)?;
    Ok(count)
}

/// Seeds `data_dir` (which must not exist or be empty) from the backup at
/// `path`: checks the checksum, then loads it.
pub fn restore(
    path: &Path,
    data_dir: &Path,
    target: &RestoreTarget,
    max_wal_bytes: u64,
) -> Result<BackupSummary, BackupError> {
    let open = || -> Result<_, BackupError> {
        let file = std::fs::File::open(path)
            .map_err(|e| BackupError::Refused(format!("cannot open {}: {e}", path.display())))?;
        Ok(std::io::BufReader::with_capacity(256 << 10, file))
    };
    verify_backup(open()?)?;
    // A fresh ext4 volume holds lost+found; nothing else may be there.
    let occupied = data_dir.exists()
        && std::fs::read_dir(data_dir)?
            .filter_map(Result::ok)
            .any(|e| e.file_name() != "lost+found");
    if occupied {
        return Err(BackupError::Refused(format!(
            "{} is not empty; restore seeds a new data directory only",
            data_dir.display()
        )));
    }
    let db = super::open(data_dir, max_wal_bytes)?;
    let summary = load_backup(&db, open()?, target)?;
    super::StateMachine::open(db, data_dir.join("snapshots"), 0)?.write_snapshot()?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_cluster_id_follows_the_backup_and_the_members() {
        let members = |list: &[(NodeId, &str)]| -> BTreeMap<NodeId, String> {
            list.iter().map(|(n, a)| (*n, a.to_string())).collect()
        };
        let three = members(&[(1, "a:8472"), (2, "b:8472"), (3, "c:8472")]);
        let id = restored_cluster_id("00ff", &three);
        assert_eq!(id.len(), 32, "as long as a founded id: {id}");
        assert_eq!(restored_cluster_id("00ff", &three.clone()), id);
        assert_ne!(restored_cluster_id("00fe", &three), id, "another backup");
        let moved = members(&[(1, "a:8472"), (2, "b:8472"), (3, "d:8472")]);
        assert_ne!(restored_cluster_id("00ff", &moved), id, "another address");
        let two = members(&[(1, "a:8472"), (2, "b:8472")]);
        assert_ne!(restored_cluster_id("00ff", &two), id, "other members");
    }

    #[test]
    fn a_damaged_backup_is_refused() {
        let header = BackupHeader {
            agentry_backup: BACKUP_FORMAT,
            created: "2026-11-25T00:00:00Z".into(),
            node_id: 1,
            last_applied: None,
            membership: StoredMembership::default(),
            oldest_revision: 1,
            audit_seq: 0,
            identity: None,
            publisher_keys: Vec::new(),
            federation_cursors: BTreeMap::new(),
            revision: None,
        };
        let mut body = serde_json::to_vec(&header).unwrap();
        body.push(b'\n');
        let sha = hex(&Sha256::digest(&body));
        let good = [
            body.clone(),
            format!(
                "{{\"end\":{{\"records\":0,\"changes\":0,\"audit\":0,\"sha256\":\"{sha}\"}}}}\n"
            )
            .into_bytes(),
        ]
        .concat();
        verify_backup(good.as_slice()).unwrap();
        let mut flipped = good.clone();
        flipped[20] ^= 1;
        assert!(verify_backup(flipped.as_slice()).is_err());
        // Cut anywhere, even inside a line's kind or before the last
        // newline: incomplete.
        for at in 1..good.len() {
            let e = verify_backup(&good[..at]).unwrap_err();
            assert!(e.to_string().contains("incomplete"), "cut at {at}: {e}");
        }
        let wrong_count = String::from_utf8(good.clone())
            .unwrap()
            .replace("\"records\":0", "\"records\":1");
        assert!(verify_backup(wrong_count.as_bytes()).is_err());
    }
}
