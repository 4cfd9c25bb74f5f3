//! The registry state machine.
//!
//! Correctness contract kept here:
//! - `apply` is deterministic: it reads only the stored state and the command
//!   (which carries the caller and the leader's clock), never the local clock
//!   or the network, so every node reaches the same state.
//! - Each entry's record write, change-feed entry and `last_applied` go into
//!   one `WriteBatch`, so a crash never leaves a record without its revision.
//!   Batches skip RocksDB's WAL (the Raft log is this state's log), and the
//!   database flushes atomically, so a crash returns to the last flushed
//!   state, from which the log is re-applied.
//! - Refused writes are `CommandResult::Rejected` values, never storage errors
//!   (openraft treats those as fatal).
//! - Snapshots are RocksDB checkpoints (`checkpoint`), so building one costs
//!   a flush, not a copy of the state, and writes keep flowing meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageIOError,
};
use rocksdb::{WriteBatch, DB};
use serde::Deserialize;
use tokio::sync::broadcast;

use super::audit::{trim as trim_audit, Retention, TRIM_EVERY as AUDIT_TRIM_EVERY};
use super::checkpoint;
use super::digest::CheckPoint;
use super::install;
use super::quota::RecordCounts;
use super::reader::{Applied, AppliedState, HoldsChanged};
use super::AuditSink;
use super::{
    cf, get_json, u64_key, unlogged, Reader, StorageError as LocalError, CF_AGENTS, CF_AUDIT,
    CF_CHANGES, CF_LEASES, CF_SM,
};
use crate::consensus::PublisherKeyChange;
use crate::consensus::{
    ClusterRecord, Command, CommandResult, LogId, NodeId, SharedRecord, StorageError,
    StoredMembership, TypeConfig, APPLY_RULES,
};
use crate::crypto::keys::Signer;
use crate::crypto::signature::{sign_record, sign_record_with, still_valid};
use crate::crypto::signature_book::SignatureBook;
use crate::crypto::Identity;
use crate::domain::audit::{AuditEntry, Outcome};
use crate::domain::federation::{decide_federated, FederatedChange};
use crate::domain::lease::{LeaseTable, LeaseWrite, RefreshTarget, Staged};
use crate::domain::write::{
    carry_status, decide_delete, decide_publisher_key, decide_put, decide_reverify, decide_status,
    hold_freshness, settle_verdict, Rejection,
};
use crate::domain::{AgentRecord, Change, ChangeKind, PublisherKey, Sharing};

pub(crate) const KEY_APPLIED: &[u8] = b"last_applied";
pub(crate) const KEY_MEMBERSHIP: &[u8] = b"membership";
pub(crate) const KEY_OLDEST: &[u8] = b"oldest_revision";
/// The last revision taken. Absent in directories from before batch
/// entries, where a revision was always its entry's log index, so the last
/// applied index stands in for it.
pub(crate) const KEY_REVISION: &[u8] = b"revision";
pub(crate) const KEY_IDENTITY: &[u8] = b"identity";
pub(crate) const KEY_PUBLISHER_KEYS: &[u8] = b"publisher_keys";
pub(crate) const KEY_AUDIT_SEQ: &[u8] = b"audit_seq";
pub(crate) const KEY_FEDERATION_CURSORS: &[u8] = b"federation_cursors";
/// The cluster id and members' incarnations (`consensus::membership_check`).
/// Not in backups: a restored directory starts a new cluster.
pub(crate) const KEY_CLUSTER: &[u8] = b"cluster";
/// History is trimmed in steps of this many revisions, so trimming costs one
/// range deletion per step rather than one per write.
const TRIM_STEP: u64 = 1024;

/// Log weight since the last snapshot, deciding when the next is due.
///
/// Entries weigh what they cost to keep and replay: a refresh entry is a
/// few hundred bytes and weighs `1`, any other entry `ENTRY_WEIGHT`. A
/// snapshot is due when the weight reaches `snapshot_logs` whole entries.
/// Building one is a checkpoint (a flush and hard links), whatever the
/// directory's size, so the interval alone decides.
#[derive(Debug, Default)]
pub struct SnapshotWeight {
    since: AtomicU64,
    every: AtomicU64,
    due: tokio::sync::Notify,
}

/// The weight of an entry that is not a refresh.
const ENTRY_WEIGHT: u64 = 8;

impl SnapshotWeight {
    /// Sets the interval (`snapshot_logs` entries; 0: never) and the entries
    /// already in the log since the last snapshot (which replaces what the
    /// replay at start-up counted, so those entries count once).
    pub fn start(&self, every_entries: u64, since_entries: u64) {
        self.every.store(
            every_entries.saturating_mul(ENTRY_WEIGHT),
            Ordering::Relaxed,
        );
        self.since.store(0, Ordering::Relaxed);
        self.add(since_entries.saturating_mul(ENTRY_WEIGHT));
    }

    fn add(&self, weight: u64) {
        let since = self.since.fetch_add(weight, Ordering::Relaxed) + weight;
        let every = self.every.load(Ordering::Relaxed);
        if every > 0 && since >= every {
            self.since.store(0, Ordering::Relaxed);
            self.due.notify_one();
        }
    }

    /// A snapshot was just built or installed.
    fn taken(&self) {
        self.since.store(0, Ordering::Relaxed);
    }

    /// Resolves when a snapshot is due.
    pub async fn due(&self) {
        self.due.notified().await
    }
}

/// Snapshot activity since the node started, for status and metrics.
#[derive(Debug, Default)]
pub struct SnapshotStats {
    built: AtomicU64,
    installed: AtomicU64,
    /// Unix seconds of the last snapshot built or installed; 0: none.
    last_unix: AtomicU64,
}

impl SnapshotStats {
    fn record(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        self.last_unix
            .store(u64::try_from(now).unwrap_or(0), Ordering::Relaxed);
    }

    /// (built, installed, unix seconds of the last one).
    pub fn read(&self) -> (u64, u64, Option<u64>) {
        let last = self.last_unix.load(Ordering::Relaxed);
        (
            self.built.load(Ordering::Relaxed),
            self.installed.load(Ordering::Relaxed),
            (last > 0).then_some(last),
        )
    }
}

/// A snapshot file as kept on disk: the length of the metadata JSON (u64
/// big-endian), the metadata JSON, then the snapshot bytes as they are. (As
/// one JSON document the bytes became an array of numbers, four times the
/// size and most of a node's CPU while a snapshot was written.)
///
/// Snapshots are handed to Raft as this file, opened and positioned at its
/// bytes, never as a buffer: at a million agents a snapshot is 2 GB, which
/// building, sending or reading one at start-up (where only the metadata is
/// wanted) would otherwise hold in memory on top of the node's 4 GB.
type SnapshotMetaOf = SnapshotMeta<NodeId, openraft::BasicNode>;

/// The current snapshot's file in the snapshot directory.
const CURRENT: &str = "current.snapshot";

/// The name prefix of a snapshot file being written, renamed to
/// [`CURRENT`] once complete.
const WRITING: &str = "current.snapshot.tmp";

/// Reads a snapshot file's header, leaving `file` at the snapshot bytes.
fn read_snapshot_header(mut file: File) -> Result<(SnapshotMetaOf, File), LocalError> {
    let corrupt = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "snapshot file shorter than its header",
        )
    };
    let total = file.metadata()?.len();
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|_| corrupt())?;
    let len = u64::from_be_bytes(len);
    if len > total.saturating_sub(8) {
        return Err(corrupt().into());
    }
    let mut header = vec![0u8; usize::try_from(len).map_err(|_| corrupt())?];
    file.read_exact(&mut header)?;
    Ok((serde_json::from_slice(&header)?, file))
}

/// The last applied log id and the membership stored in `db`.
fn stored_meta(db: &DB) -> Result<(Option<LogId>, StoredMembership), LocalError> {
    let last_applied = get_json::<Option<LogId>>(db, CF_SM, KEY_APPLIED)?.flatten();
    let membership = get_json(db, CF_SM, KEY_MEMBERSHIP)?.unwrap_or_default();
    Ok((last_applied, membership))
}

/// The snapshot document a snapshot file stands for, from its position on
/// (`checkpoint::materialised`).
fn materialised_snapshot(file: File) -> Result<File, LocalError> {
    checkpoint::materialised(file, StateMachine::write_snapshot_data)
}

/// The snapshot document a snapshot file stands for, to send to a follower
/// (`checkpoint::outgoing`: shared with the sends of it that overlap).
pub fn outgoing_snapshot(file: File) -> Result<checkpoint::Outgoing, LocalError> {
    checkpoint::outgoing(file, StateMachine::write_snapshot_data)
}

/// The stored forms of an applied change: the record's JSON, and the change
/// feed entry, which embeds the same bytes instead of encoding the record a
/// second time (it decodes as a `Change`).
fn encode_change(change: &Change) -> Result<(Vec<u8>, Vec<u8>), LocalError> {
    let record = serde_json::to_vec(&change.record)?;
    let mut entry = Vec::with_capacity(record.len() + 64);
    entry.extend_from_slice(format!("{{\"revision\":{},\"kind\":", change.revision).as_bytes());
    serde_json::to_writer(&mut entry, &change.kind)?;
    if let Some(unshared) = change.unshared {
        entry.extend_from_slice(format!(",\"unshared\":{unshared}").as_bytes());
    }
    entry.extend_from_slice(b",\"record\":");
    entry.extend_from_slice(&record);
    entry.push(b'}');
    Ok((record, entry))
}

/// RocksDB-backed state machine. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct StateMachine {
    db: Arc<DB>,
    applied: Arc<AppliedState>,
    snapshot_dir: PathBuf,
    history: u64,
    stats: Arc<SnapshotStats>,
    /// Live records per owner and tenant; only `apply` and `install` change it.
    counts: Arc<std::sync::Mutex<RecordCounts>>,
    /// The committed audit trail's last sequence.
    audit_seq: Arc<AtomicU64>,
    audit_retention: Retention,
    audit_sink: Option<AuditSink>,
    /// The applied cluster record, read by the Raft transport.
    cluster: SharedRecord,
    weight: Arc<SnapshotWeight>,
    /// Held while a snapshot is built or installed (`build`).
    snapshot_lock: Arc<std::sync::Mutex<()>>,
    /// Signatures made here to offer followers, and those a leader offered.
    signatures: Arc<SignatureBook>,
}

fn sm_read(e: impl Into<LocalError>) -> StorageError {
    StorageIOError::read_state_machine(&e.into()).into()
}

fn sm_write(e: impl Into<LocalError>) -> StorageError {
    StorageIOError::write_state_machine(&e.into()).into()
}

fn snap_err(e: impl Into<LocalError>) -> StorageError {
    StorageIOError::write_snapshot(None, &e.into()).into()
}

/// Unix seconds of a command's clock (RFC 3339, made by the proposer).
fn unix_of(now: &str) -> i64 {
    crate::domain::time::parse(now).map_or(0, |t| t.unix_timestamp())
}

/// A stored record's envelope, decoded without its metadata.
#[derive(Deserialize)]
struct StoredEnvelope {
    envelope: crate::domain::Envelope,
}

/// Reads every stored hold and lease.
fn load_leases(db: &DB) -> Result<LeaseTable, LocalError> {
    let mut table = LeaseTable::default();
    let mut it = db.raw_iterator_cf_opt(cf(db, CF_LEASES)?, super::bulk_read());
    it.seek_to_first();
    while let Some(v) = it.value() {
        table.load(serde_json::from_slice(v)?);
        it.next();
    }
    it.status()?;
    Ok(table)
}

impl StateMachine {
    /// Opens the state machine over `db`, keeping `history` revisions of
    /// change feed, and snapshots under `snapshot_dir`.
    pub fn open(db: Arc<DB>, snapshot_dir: PathBuf, history: u64) -> Result<Self, LocalError> {
        std::fs::create_dir_all(&snapshot_dir)?;
        // Snapshot files a stopped process left half-written.
        for entry in std::fs::read_dir(&snapshot_dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with(WRITING) {
                std::fs::remove_file(entry.path())?;
            }
        }
        Self::finish_install(&db, &snapshot_dir)?;
        let db_for_seq = db.clone();
        let applied: Option<LogId> = get_json(&db, CF_SM, KEY_APPLIED)?;
        let oldest: Option<u64> = get_json(&db, CF_SM, KEY_OLDEST)?;
        let revision: Option<u64> = get_json(&db, CF_SM, KEY_REVISION)?;
        let identity: Option<Identity> = get_json(&db, CF_SM, KEY_IDENTITY)?;
        let signer = identity.as_ref().and_then(Identity::signer).map(Arc::new);
        let publisher_keys: Vec<PublisherKey> =
            get_json(&db, CF_SM, KEY_PUBLISHER_KEYS)?.unwrap_or_default();
        let (changes, _) = broadcast::channel(4096);
        let applied = Arc::new(AppliedState {
            revision: revision
                .unwrap_or_else(|| applied.map_or(0, |l| l.index))
                .into(),
            oldest_revision: oldest.unwrap_or(1).into(),
            changes,
            identity: std::sync::RwLock::new(identity.map(Arc::new)),
            signer: std::sync::RwLock::new(signer),
            publisher_keys: std::sync::RwLock::new(Arc::new(publisher_keys)),
            leases: std::sync::RwLock::new(load_leases(&db)?),
            holds_listener: Default::default(),
            records: Default::default(),
            installs: Default::default(),
            digests: Default::default(),
        });
        let this = Self {
            db,
            applied,
            snapshot_dir,
            history: history.max(TRIM_STEP),
            stats: Arc::default(),
            counts: Arc::default(),
            audit_seq: Arc::new(AtomicU64::new(
                get_json(&db_for_seq, CF_SM, KEY_AUDIT_SEQ)?.unwrap_or(0),
            )),
            audit_retention: Retention::default(),
            audit_sink: None,
            cluster: SharedRecord::new(
                get_json(&db_for_seq, CF_SM, KEY_CLUSTER)?.unwrap_or_default(),
            ),
            weight: Arc::default(),
            snapshot_lock: Arc::default(),
            signatures: Arc::default(),
        };
        this.keep_current_checkpoint()?;
        this.recount()?;
        Ok(this)
    }

    /// At start: removes the checkpoints that the current snapshot does not
    /// name, and points it at its own when the data directory has moved
    /// since it was built. A snapshot naming a checkpoint that is gone is
    /// removed: openraft builds a new one when the log needs it.
    fn keep_current_checkpoint(&self) -> Result<(), LocalError> {
        let Some((meta, mut file)) = self.open_snapshot_file()? else {
            return checkpoint::remove_others(&self.snapshot_dir, None);
        };
        let Some(named) = checkpoint::named_by(&mut file)? else {
            return checkpoint::remove_others(&self.snapshot_dir, None);
        };
        let here = named.file_name().map(|name| self.snapshot_dir.join(name));
        match here {
            Some(here) if here.is_dir() => {
                if here != named {
                    self.write_snapshot_file(&meta, |data| checkpoint::write_marker(data, &here))?;
                }
                checkpoint::remove_others(&self.snapshot_dir, Some(&here))
            }
            _ => {
                tracing::warn!(
                    checkpoint = %named.display(),
                    "the current snapshot names a checkpoint that is gone; it is rebuilt when needed"
                );
                std::fs::remove_file(self.current_path())?;
                checkpoint::remove_others(&self.snapshot_dir, None)
            }
        }
    }

    /// The envelope of the record stored under `id`: all a refresh checks.
    fn stored_envelope(&self, id: &str) -> Result<Option<crate::domain::Envelope>, LocalError> {
        Ok(get_json::<StoredEnvelope>(&self.db, CF_AGENTS, id.as_bytes())?.map(|s| s.envelope))
    }

    /// Counts the live records per owner and tenant from storage.
    fn recount(&self) -> Result<(), LocalError> {
        let mut counts = RecordCounts::default();
        let mut it = self
            .db
            .raw_iterator_cf_opt(cf(&self.db, CF_AGENTS)?, super::bulk_read());
        it.seek_to_first();
        while let Some(v) = it.value() {
            counts.add_stored(v)?;
            it.next();
        }
        it.status()?;
        *self.counts.lock().unwrap_or_else(|e| e.into_inner()) = counts;
        Ok(())
    }

    /// Bounds the parsed records kept for reads (`[storage]
    /// record_cache_bytes`).
    pub fn with_record_cache(self, bytes: u64) -> Self {
        self.applied.records.set_capacity(bytes);
        self
    }

    /// The same state machine, keeping the audit trail to `retention` and
    /// copying committed entries to `sink`.
    pub fn with_audit(mut self, retention: Retention, sink: Option<AuditSink>) -> Self {
        self.audit_retention = retention;
        self.audit_sink = sink;
        self
    }

    /// Builds and stores a snapshot of the current state now: a directory
    /// seeded from a backup has state but no log before it, so a follower
    /// that needs that part must be sent this snapshot.
    pub fn write_snapshot(&self) -> Result<(), LocalError> {
        self.build().map(|_| ())
    }

    /// The applied cluster id and incarnations, kept current by apply.
    pub fn cluster_record(&self) -> SharedRecord {
        self.cluster.clone()
    }

    /// When the next snapshot is due (`RaftNode` triggers it).
    pub fn snapshot_weight(&self) -> Arc<SnapshotWeight> {
        self.weight.clone()
    }

    /// The signatures this node makes and is offered (signing once).
    pub fn signature_book(&self) -> Arc<SignatureBook> {
        self.signatures.clone()
    }

    pub fn snapshot_stats(&self) -> Arc<SnapshotStats> {
        self.stats.clone()
    }

    /// A read handle over the applied state.
    pub fn reader(&self) -> Reader {
        Reader {
            db: self.db.clone(),
            applied: self.applied.clone(),
            counts: self.counts.clone(),
        }
    }

    fn current_path(&self) -> PathBuf {
        self.snapshot_dir.join(CURRENT)
    }

    fn decide(
        &self,
        cmd: Command,
        current: Option<&AgentRecord>,
        revision: u64,
        signer: Option<&Signer>,
        keys: &[PublisherKey],
    ) -> CommandResult {
        let now = cmd.now().to_string();
        let now = now.as_str();
        // A client's precondition: the stored record (or its tombstone)
        // still has the revision it read, 0 meaning none.
        let actual = current.map_or(0, |r| r.envelope.revision);
        if let Some(expected) = cmd.expected_revision().filter(|e| *e != actual) {
            return CommandResult::Rejected(Rejection::RevisionChanged {
                id: cmd.id().unwrap_or_default().to_string(),
                expected,
                actual,
            });
        }
        let decided = match cmd {
            Command::Put {
                metadata,
                visibility,
                readers,
                principal,
                mode,
                now,
                publisher,
                rules,
                ..
            } => decide_put(
                current,
                *metadata,
                visibility.map(|visibility| Sharing {
                    visibility,
                    readers,
                }),
                &principal,
                mode,
                revision,
                &now,
            )
            .and_then(|(mut record, kind)| {
                if rules >= 1 {
                    carry_status(current, &mut record);
                }
                if let Some(verdict) = publisher {
                    record.envelope.publisher = Some(settle_verdict(verdict, &record, keys));
                }
                if rules >= 3 {
                    record = hold_freshness(record, current)?;
                } else {
                    // What a node of an older release, which keeps no floor,
                    // stores.
                    record.envelope.freshness_floor = None;
                }
                Ok((record, kind))
            }),
            Command::Reverify { id, now } => decide_reverify(current, &id, keys, revision, &now)
                .map(|r| (r, ChangeKind::Updated)),
            Command::Delete {
                id, principal, now, ..
            } => decide_delete(current, &id, &principal, revision, &now)
                .map(|r| (r, ChangeKind::Deleted)),
            Command::SetStatus {
                id,
                status,
                reason,
                principal,
                now,
                ..
            } => decide_status(current, &id, status, reason, &principal, revision, &now)
                .map(|r| (r, ChangeKind::StatusChanged)),
            Command::Federate {
                peer,
                change,
                now,
                rules,
                ..
            } => decide_federated(current, &peer, change, revision, &now, rules),
            Command::Identity { .. }
            | Command::PublisherKey { .. }
            | Command::Audited { .. }
            | Command::Note { .. }
            | Command::Check { .. }
            | Command::Cursor { .. }
            | Command::Refresh { .. }
            | Command::RevokeLease { .. }
            | Command::Cluster { .. }
            | Command::Batch(_) => {
                // Routed to their own appliers by `apply`; never here.
                return CommandResult::Internal;
            }
        };
        match decided {
            Ok((mut record, kind)) => {
                if let Some(signer) = signer {
                    sign_record_with(signer, &mut record, now, |bytes| {
                        self.signatures.sign(signer, revision, bytes)
                    });
                }
                let unshared = Some(
                    current.is_some_and(AgentRecord::shared_with_peers)
                        && !record.shared_with_peers(),
                );
                CommandResult::Applied(Arc::new(Change {
                    revision,
                    kind,
                    record,
                    unshared,
                }))
            }
            Err(rejection) => CommandResult::Rejected(rejection),
        }
    }

    /// Applies a publisher key change into `batch`; a removal names the
    /// records whose verdict relied on the key (the service re-judges them
    /// one by one, each a change of its own that the index and watchers see).
    fn apply_publisher_key(
        &self,
        batch: &mut WriteBatch,
        keys: &mut Vec<PublisherKey>,
        written: &Written,
        change: PublisherKeyChange,
        principal: &crate::domain::Principal,
        now: &str,
    ) -> Result<CommandResult, LocalError> {
        let (key_id, added) = match change {
            PublisherKeyChange::Add {
                key_id,
                public_key,
                namespaces,
                owner,
                owner_tenant,
            } => (
                key_id.clone(),
                Some(PublisherKey {
                    key_id,
                    public_key,
                    principal: owner,
                    namespaces,
                    added_at: now.to_string(),
                    tenant: owner_tenant,
                }),
            ),
            PublisherKeyChange::Remove { key_id } => (key_id, None),
        };
        let removing = added.is_none();
        let next = match decide_publisher_key(keys, &key_id, added, principal) {
            Ok(next) => next,
            Err(rejection) => return Ok(CommandResult::Rejected(rejection)),
        };
        let sm = cf(&self.db, CF_SM)?;
        batch.put_cf(sm, KEY_PUBLISHER_KEYS, serde_json::to_vec(&next)?);
        let mut affected = Vec::new();
        if removing {
            self.each_record(written, |r| {
                let relies = r.is_verified()
                    && r.envelope
                        .publisher
                        .as_ref()
                        .and_then(|p| p.key_id.as_deref())
                        == Some(&key_id[..]);
                if relies && !r.envelope.deleted {
                    affected.push(r.metadata.id.clone());
                }
            })?;
        }
        *keys = next.clone();
        Ok(CommandResult::PublisherKeys {
            keys: next,
            affected,
        })
    }

    /// Visits every record as of this point of the batch: those written
    /// earlier in it (`written`), then the stored ones they do not replace.
    fn each_record(
        &self,
        written: &Written,
        mut visit: impl FnMut(&AgentRecord),
    ) -> Result<(), LocalError> {
        written.records().for_each(&mut visit);
        let mut it = self
            .db
            .raw_iterator_cf_opt(cf(&self.db, CF_AGENTS)?, super::bulk_read());
        it.seek_to_first();
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if !written.holds(String::from_utf8_lossy(k).as_ref()) {
                visit(&serde_json::from_slice(v)?);
            }
            it.next();
        }
        Ok(it.status()?)
    }

    /// Applies an identity change into `batch`. When keys left service (or
    /// the identity is new), every record whose signature the identity no
    /// longer accepts is signed again, so every served record verifies.
    /// `written` holds this batch's records and receives the re-signed ones.
    fn apply_identity(
        &self,
        batch: &mut WriteBatch,
        identity: &mut Option<Identity>,
        written: &mut Written,
        change: &crate::crypto::IdentityChange,
        now: &str,
    ) -> Result<CommandResult, LocalError> {
        let (next, outcome) = match Identity::apply(identity.as_ref(), change, now) {
            Ok(applied) => applied,
            Err(refusal) => return Ok(CommandResult::IdentityRefused(refusal)),
        };
        if !outcome.changed {
            return Ok(CommandResult::IdentityChanged {
                changed: false,
                resigned: 0,
            });
        }
        let Some(next) = next else {
            return Ok(CommandResult::Internal);
        };
        let sm = cf(&self.db, CF_SM)?;
        let agents = cf(&self.db, CF_AGENTS)?;
        batch.put_cf(sm, KEY_IDENTITY, serde_json::to_vec(&next)?);
        let mut stale: Vec<AgentRecord> = Vec::new();
        self.each_record(written, |r| {
            if !still_valid(r, &next) {
                stale.push(r.clone());
            }
        })?;
        let resigned = stale.len() as u64;
        let signer = next.signer();
        for mut r in stale {
            if let Some(signer) = &signer {
                sign_record(signer, &mut r, now);
            }
            batch.put_cf(agents, r.metadata.id.as_bytes(), serde_json::to_vec(&r)?);
            written.resigned(r);
        }
        *identity = Some(next);
        Ok(CommandResult::IdentityChanged {
            changed: true,
            resigned,
        })
    }

    /// Trims the change history in `batch` when going from `previous` to
    /// `revision` completes a trim step (a batch entry's revisions may step
    /// over its multiple); returns the new oldest revision if it did.
    fn trim_history(
        &self,
        batch: &mut WriteBatch,
        previous: u64,
        revision: u64,
    ) -> Result<Option<u64>, LocalError> {
        if previous / TRIM_STEP == revision / TRIM_STEP || revision <= self.history {
            return Ok(None);
        }
        let new_oldest = revision - self.history;
        batch.delete_range_cf(cf(&self.db, CF_CHANGES)?, u64_key(0), u64_key(new_oldest));
        batch.put_cf(
            cf(&self.db, CF_SM)?,
            KEY_OLDEST,
            serde_json::to_vec(&new_oldest)?,
        );
        Ok(Some(new_oldest))
    }

    /// The current snapshot's metadata, and its file positioned at the
    /// snapshot bytes; only the header is read.
    fn open_snapshot_file(&self) -> Result<Option<(SnapshotMetaOf, File)>, LocalError> {
        match File::open(self.current_path()) {
            Ok(file) => read_snapshot_header(file).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes the current snapshot file: the header for `meta`, then what
    /// `data` writes (which returns what the caller wants back). The file
    /// replaces the current one only once complete and synced; the handle
    /// returned reads its snapshot bytes (opened before the rename, so it
    /// reads this snapshot whatever replaces it later).
    fn write_snapshot_file<T>(
        &self,
        meta: &SnapshotMetaOf,
        data: impl FnOnce(&mut BufWriter<File>) -> Result<T, LocalError>,
    ) -> Result<(File, T), LocalError> {
        // Each writer has a file of its own: a snapshot built while one is
        // installed must not write into the same file.
        static WRITERS: AtomicU64 = AtomicU64::new(0);
        let n = WRITERS.fetch_add(1, Ordering::Relaxed);
        let tmp = self.snapshot_dir.join(format!("{WRITING}{n}"));
        let header = serde_json::to_vec(meta)?;
        let written = (|| -> Result<T, LocalError> {
            let mut file = BufWriter::new(File::create(&tmp)?);
            file.write_all(&(header.len() as u64).to_be_bytes())?;
            file.write_all(&header)?;
            let out = data(&mut file)?;
            file.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            Ok(out)
        })();
        // A document refused on the way (or a full disk) leaves no file.
        let out = written.inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        let mut reader = File::open(&tmp)?;
        reader.seek(SeekFrom::Start(8 + header.len() as u64))?;
        std::fs::rename(&tmp, self.current_path())?;
        Ok((reader, out))
    }

    fn build(&self) -> Result<Snapshot<TypeConfig>, LocalError> {
        // Builds and installs do not overlap here: an install removes the
        // checkpoints it replaces, which must not include one just made.
        let _building = self.snapshot_lock.lock().unwrap_or_else(|e| e.into_inner());
        // A checkpoint is a consistent copy: applies that run meanwhile are
        // either wholly in it or wholly out of it, and the metadata is read
        // from the copy itself.
        let dir = checkpoint::create(&self.db, &self.snapshot_dir)?;
        let (last_applied, membership) = {
            // Only an install removes this checkpoint, and not while the
            // lock is held.
            stored_meta(&checkpoint::open(&dir, false)?)?
        };
        let snapshot_id = format!(
            "{}-{}",
            last_applied
                .map(|l| l.to_string())
                .unwrap_or_else(|| "empty".into()),
            crate::domain::time::now()
        );
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id,
        };
        let (file, ()) =
            self.write_snapshot_file(&meta, |data| checkpoint::write_marker(data, &dir))?;
        checkpoint::remove_others(&self.snapshot_dir, Some(&dir))?;
        self.weight.taken();
        self.stats.record(&self.stats.built);
        Ok(Snapshot {
            meta,
            snapshot: Box::new(tokio::fs::File::from_std(file)),
        })
    }

    /// Writes the document `install` reads into `data`, from the bytes
    /// `db` holds (a checkpoint's, which no write changes).
    fn write_snapshot_data(db: &DB, data: &mut BufWriter<File>) -> Result<(), LocalError> {
        let (last_applied, membership) = stored_meta(db)?;
        let stored = |key: &[u8]| -> Result<Option<Vec<u8>>, LocalError> {
            Ok(db.get_cf(cf(db, CF_SM)?, key)?)
        };
        // Every stored value is already the JSON of its type, so records,
        // changes and audit entries are copied, never decoded and encoded
        // again.
        data.write_all(b"{\"last_applied\":")?;
        data.write_all(&serde_json::to_vec(&last_applied)?)?;
        data.write_all(b",\"membership\":")?;
        data.write_all(&serde_json::to_vec(&membership)?)?;
        let mut member = |name: &str, key: &[u8], default: &[u8]| -> Result<(), LocalError> {
            data.write_all(format!(",\"{name}\":").as_bytes())?;
            match stored(key)? {
                Some(b) => data.write_all(&b)?,
                None => data.write_all(default)?,
            }
            Ok(())
        };
        member("oldest_revision", KEY_OLDEST, b"1")?;
        member(
            "revision",
            KEY_REVISION,
            &serde_json::to_vec(&last_applied.map_or(0, |l| l.index))?,
        )?;
        member("identity", KEY_IDENTITY, b"null")?;
        member("publisher_keys", KEY_PUBLISHER_KEYS, b"[]")?;
        member("federation_cursors", KEY_FEDERATION_CURSORS, b"{}")?;
        member("audit_seq", KEY_AUDIT_SEQ, b"0")?;
        member(
            "cluster",
            KEY_CLUSTER,
            &serde_json::to_vec(&ClusterRecord::default())?,
        )?;
        for (name, cf_name) in [
            ("records", CF_AGENTS),
            ("changes", CF_CHANGES),
            ("audit", CF_AUDIT),
            ("leases", CF_LEASES),
        ] {
            data.write_all(format!(",\"{name}\":[").as_bytes())?;
            let mut it = db.raw_iterator_cf_opt(cf(db, cf_name)?, super::bulk_read());
            it.seek_to_first();
            let mut first = true;
            while let Some(v) = it.value() {
                if !first {
                    data.write_all(b",")?;
                }
                first = false;
                data.write_all(v)?;
                it.next();
            }
            it.status()?;
            data.write_all(b"]")?;
        }
        data.write_all(b"}")?;
        Ok(())
    }

    /// Replaces the state with the snapshot whose bytes run from `file`'s
    /// position to its end (a received file holds only them; a built one
    /// has its header before them).
    fn install(&self, meta: &SnapshotMetaOf, file: File) -> Result<(), LocalError> {
        // Received bytes are the document; a snapshot handed over in this
        // process (openraft's storage tests) may name a checkpoint.
        let mut file = materialised_snapshot(file)?;
        // No build may take a checkpoint of a state half installed.
        let _installing = self.snapshot_lock.lock().unwrap_or_else(|e| e.into_inner());
        // The snapshot becomes the current one first, so that a node
        // stopped part-way installs it again when it starts (`open`).
        let (document, ()) =
            self.write_snapshot_file(meta, |out| install::copy_checked(&mut file, out))?;
        // The checkpoints of the state this one replaces.
        checkpoint::remove_others(&self.snapshot_dir, None)?;
        // Readers refuse until the count is even again; an install that
        // fails leaves it odd, and the state is indeed neither.
        self.applied.installs.fetch_add(1, Ordering::AcqRel);
        let installed = install::install(&self.db, meta, document)?;
        self.applied.records.clear();
        self.cluster.set(installed.cluster);
        self.audit_seq.store(installed.audit_seq, Ordering::Release);
        self.recount()?;
        self.applied.set_identity(installed.identity);
        self.applied.set_publisher_keys(installed.publisher_keys);
        *self.applied.leases_mut() = installed.leases;
        self.applied.holds_changed(HoldsChanged::All);
        self.applied
            .oldest_revision
            .store(installed.oldest_revision, Ordering::Release);
        self.applied
            .revision
            .store(installed.revision, Ordering::Release);
        self.applied.installs.fetch_add(1, Ordering::AcqRel);
        self.weight.taken();
        self.stats.record(&self.stats.installed);
        // No subscriber is normal; the send result says nothing else.
        let _ = self.applied.changes.send(Applied::SnapshotInstalled);
        Ok(())
    }

    /// At start: installs the current snapshot again if it is ahead of the
    /// applied state, which only an install stopped part-way leaves (it
    /// makes the snapshot current before it changes the state, and writes
    /// the applied log id last).
    fn finish_install(db: &DB, snapshot_dir: &Path) -> Result<(), LocalError> {
        let file = match File::open(snapshot_dir.join(CURRENT)) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let (meta, file) = read_snapshot_header(file)?;
        let (applied, _) = stored_meta(db)?;
        if meta.last_log_id <= applied {
            return Ok(());
        }
        tracing::warn!(
            snapshot = ?meta.last_log_id,
            applied = ?applied,
            "a snapshot install was interrupted; installing it again"
        );
        install::install(db, &meta, materialised_snapshot(file)?)?;
        Ok(())
    }
}

/// A log entry's payload with its command decoded.
enum Applying {
    Blank,
    Membership(openraft::Membership<NodeId, openraft::BasicNode>),
    Normal(Command),
}

impl StateMachine {
    /// Applies one batch of committed entries (`RaftStateMachine::apply`).
    // openraft's own error type, returned as its `apply` returns it.
    #[allow(clippy::result_large_err)]
    ///
    /// Stops after an entry holding a consistency check (`Command::Check`)
    /// and returns where it was applied: the caller digests the state as
    /// of that entry before applying the rest.
    fn apply_batch<I>(
        &mut self,
        entries: I,
    ) -> Result<(Vec<CommandResult>, Option<CheckPoint>), StorageError>
    where
        I: Iterator<Item = Entry<TypeConfig>>,
    {
        // All entries of a call go into one WriteBatch (one WAL write);
        // records written earlier in the batch are read from `written`, so
        // each decision still sees every entry before it.
        let sm = cf(&self.db, CF_SM).map_err(sm_write)?;
        let agents = cf(&self.db, CF_AGENTS).map_err(sm_write)?;
        let changes = cf(&self.db, CF_CHANGES).map_err(sm_write)?;
        let mut batch = WriteBatch::default();
        let mut written = Written::default();
        // The identity as of each entry (an entry may change it for the
        // ones after it); published to readers once the batch is written.
        let mut identity: Option<Identity> = self.applied.identity().map(|i| (*i).clone());
        let mut signer = self.applied.signer();
        let mut identity_changed = false;
        let mut publisher_keys: Vec<PublisherKey> = (*self.applied.publisher_keys()).clone();
        let mut keys_changed = false;
        let mut results = Vec::new();
        let mut last = None;
        let mut trimmed_to = None;
        // Federation cursors, read at the first entry that moves one.
        let mut cursors: Option<BTreeMap<String, u64>> = None;
        let audit_cf = cf(&self.db, CF_AUDIT).map_err(sm_write)?;
        let first_audit_seq = self.audit_seq.load(Ordering::Acquire);
        let mut audit_seq = first_audit_seq;
        let mut audited: Vec<AuditEntry> = Vec::new();
        let mut audit_now = None;
        // The cluster record and the membership it is kept to, as of each
        // entry; read at the first entry that needs them.
        let mut cluster: Option<ClusterRecord> = None;
        let mut cluster_changed = false;
        let mut membership: Option<StoredMembership> = None;
        let applied = self.applied.clone();
        let lease_table = applied.leases();
        let mut staged = Staged::new(&lease_table);
        let mut weight = 0;
        let mut revision_at = self.applied.revision.load(Ordering::Acquire);
        let mut check = None;
        for entry in entries {
            // The command's bytes as its proposer encoded them, decoded
            // once, here; a batch entry is applied as its commands would be
            // one entry after another.
            let (parts, batched) = match entry.payload {
                EntryPayload::Blank => (vec![Applying::Blank], false),
                EntryPayload::Membership(m) => (vec![Applying::Membership(m)], false),
                EntryPayload::Normal(p) => match p.command().map_err(sm_read)? {
                    Command::Batch(commands) => {
                        (commands.into_iter().map(Applying::Normal).collect(), true)
                    }
                    command => (vec![Applying::Normal(command)], false),
                },
            };
            let mut outcomes = Vec::with_capacity(parts.len());
            for payload in parts {
                // Each command takes one revision: the entry's index, unless
                // the commands of an earlier batch entry took it already.
                let previous = revision_at;
                let revision = (previous + 1).max(entry.log_id.index);
                revision_at = revision;
                weight += match &payload {
                    Applying::Normal(Command::Refresh { .. }) => 1,
                    _ => ENTRY_WEIGHT,
                };
                // A client's command carries who asked; the entry of its
                // outcome joins the trail in the same batch as the change.
                let (payload, audit) = match payload {
                    Applying::Normal(Command::Audited { command, audit }) => {
                        (Applying::Normal(*command), Some(audit))
                    }
                    other => (other, None),
                };
                let at = match (&payload, &audit) {
                    (Applying::Normal(c), Some(_)) => Some(c.now().to_string()),
                    _ => None,
                };
                if let Applying::Normal(c) = &payload {
                    let asked = c.rules_needed();
                    if asked > APPLY_RULES {
                        // Applied by older rules, it would leave this node
                        // holding what no other does: the node stops.
                        let e = LocalError::NewerRules {
                            entry: entry.log_id.to_string(),
                            asked,
                            follows: APPLY_RULES,
                        };
                        tracing::error!(error = %e, "cannot apply a log entry");
                        return Err(sm_write(e));
                    }
                    let record = cluster.get_or_insert_with(|| (*self.cluster.get()).clone());
                    if asked > record.apply_rules {
                        record.apply_rules = asked;
                        cluster_changed = true;
                    }
                }
                let result = match payload {
                    Applying::Blank => CommandResult::Internal,
                    Applying::Membership(m) => {
                        let stored = StoredMembership::new(Some(entry.log_id), m);
                        batch.put_cf(
                            sm,
                            KEY_MEMBERSHIP,
                            serde_json::to_vec(&stored).map_err(sm_write)?,
                        );
                        // A node that left is recorded afresh if it is added
                        // back, with the data directory it has then.
                        let record = cluster.get_or_insert_with(|| (*self.cluster.get()).clone());
                        cluster_changed |=
                            record.keep_members(|n| stored.membership().get_node(&n).is_some());
                        membership = Some(stored);
                        CommandResult::Internal
                    }
                    // Batches are never nested (`consensus::batcher`).
                    Applying::Normal(Command::Note { .. } | Command::Batch(_)) => {
                        CommandResult::Internal
                    }
                    Applying::Normal(Command::Check { now }) => {
                        check = Some(CheckPoint {
                            index: entry.log_id.index,
                            revision,
                            // Counted below, with this command's own entry.
                            audit_seq: audit_seq + u64::from(audit.is_some()),
                            now_unix: unix_of(&now),
                        });
                        CommandResult::Checked {
                            index: entry.log_id.index,
                            revision,
                        }
                    }
                    Applying::Normal(Command::Refresh { refreshes, now }) => {
                        let now_unix = unix_of(&now);
                        let mut out = Vec::with_capacity(refreshes.len());
                        for r in &refreshes {
                            let envelope = match &r.target {
                                RefreshTarget::Agent { id, .. } => match written.get(id) {
                                    Some(rec) => Some(rec.envelope.clone()),
                                    None => self.stored_envelope(id).map_err(sm_read)?,
                                },
                                RefreshTarget::Lease { .. } => None,
                            };
                            out.push(staged.refresh(r, envelope.as_ref(), now_unix));
                        }
                        CommandResult::Leases(out)
                    }
                    Applying::Normal(Command::RevokeLease {
                        name,
                        principal,
                        now,
                    }) => {
                        CommandResult::Leases(vec![staged.revoke(&name, &principal, unix_of(&now))])
                    }
                    Applying::Normal(Command::Cursor { name, value, .. }) => {
                        // Kept with the federation cursors (same map, same
                        // snapshot and backup member); only ever forward.
                        let cursors = match cursors.as_mut() {
                            Some(c) => c,
                            None => cursors.insert(
                                get_json(&self.db, CF_SM, KEY_FEDERATION_CURSORS)
                                    .map_err(sm_read)?
                                    .unwrap_or_default(),
                            ),
                        };
                        let slot = cursors.entry(name).or_insert(0);
                        *slot = (*slot).max(value);
                        CommandResult::Internal
                    }
                    Applying::Normal(Command::Cluster {
                        cluster_id,
                        incarnations,
                        refused,
                        ..
                    }) => {
                        let members = match membership.as_ref() {
                            Some(m) => m,
                            None => membership.insert(
                                get_json(&self.db, CF_SM, KEY_MEMBERSHIP)
                                    .map_err(sm_read)?
                                    .unwrap_or_default(),
                            ),
                        };
                        let record = cluster.get_or_insert_with(|| (*self.cluster.get()).clone());
                        cluster_changed |=
                            record.record(cluster_id.as_deref(), &incarnations, &refused, |n| {
                                members.membership().get_node(&n).is_some()
                            });
                        CommandResult::Internal
                    }
                    Applying::Normal(Command::Identity { change, now }) => {
                        let result = self
                            .apply_identity(&mut batch, &mut identity, &mut written, &change, &now)
                            .map_err(sm_write)?;
                        if matches!(result, CommandResult::IdentityChanged { changed: true, .. }) {
                            identity_changed = true;
                            signer = identity.as_ref().and_then(Identity::signer).map(Arc::new);
                        }
                        result
                    }
                    Applying::Normal(Command::PublisherKey {
                        change,
                        principal,
                        now,
                    }) => {
                        let result = self
                            .apply_publisher_key(
                                &mut batch,
                                &mut publisher_keys,
                                &written,
                                change,
                                &principal,
                                &now,
                            )
                            .map_err(sm_write)?;
                        keys_changed |= matches!(result, CommandResult::PublisherKeys { .. });
                        result
                    }
                    Applying::Normal(cmd) => {
                        if let Command::Federate {
                            peer,
                            cursor: Some(at),
                            change,
                            rules,
                            ..
                        } = &cmd
                        {
                            let cursors = match cursors.as_mut() {
                                Some(c) => c,
                                None => cursors.insert(
                                    get_json(&self.db, CF_SM, KEY_FEDERATION_CURSORS)
                                        .map_err(sm_read)?
                                        .unwrap_or_default(),
                                ),
                            };
                            let slot = cursors.entry(peer.clone()).or_insert(0);
                            // A skip (the end of a listing, or a refused
                            // change) sets the cursor where the peer's
                            // feed stands, lower after the peer was
                            // restored from a backup; a kept change only
                            // moves it on.
                            let listed = matches!(change, FederatedChange::Skip);
                            *slot = if *rules >= 1 && listed {
                                *at
                            } else {
                                (*slot).max(*at)
                            };
                        }
                        let id = cmd.id().unwrap_or_default();
                        let current = match written.get(id) {
                            Some(r) => Some(r.clone()),
                            None => {
                                get_json(&self.db, CF_AGENTS, id.as_bytes()).map_err(sm_read)?
                            }
                        };
                        let limit = cmd.record_limit();
                        // A new registration or a deletion ends the agent's hold.
                        let releases = matches!(cmd, Command::Put { .. } | Command::Delete { .. });
                        let mut result = self.decide(
                            cmd,
                            current.as_ref(),
                            revision,
                            signer.as_deref(),
                            &publisher_keys,
                        );
                        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
                        if let (Some(limit), CommandResult::Applied(change)) = (limit, &result) {
                            if change.kind == ChangeKind::Created {
                                if let Err(r) = counts.admit(&change.record, limit) {
                                    result = CommandResult::Rejected(r);
                                }
                            }
                        }
                        if let CommandResult::Applied(change) = &result {
                            counts.change(current.as_ref(), &change.record);
                            let (record, change_json) = encode_change(change).map_err(sm_write)?;
                            let id = &change.record.metadata.id;
                            batch.put_cf(agents, id.as_bytes(), record);
                            batch.put_cf(changes, u64_key(revision), change_json);
                            written.changed(change);
                            if releases {
                                staged.release(id);
                            }
                        }
                        result
                    }
                };
                if let (Some(audit), Some(at)) = (audit, at) {
                    let outcome = match &result {
                        CommandResult::Applied(c) => Outcome::ok(Some(c.revision)),
                        CommandResult::Rejected(r) => Outcome::refused(r.code(), r.to_string()),
                        CommandResult::IdentityRefused(r) => {
                            Outcome::refused("invalid_request", r.to_string())
                        }
                        _ => Outcome::ok(Some(revision)),
                    };
                    audit_seq += 1;
                    let mut e = audit.entry(&at, outcome);
                    e.seq = audit_seq;
                    batch.put_cf(
                        audit_cf,
                        u64_key(audit_seq),
                        serde_json::to_vec(&e).map_err(sm_write)?,
                    );
                    audit_now = Some(at);
                    audited.push(e);
                }
                trimmed_to = self
                    .trim_history(&mut batch, previous, revision)
                    .map_err(sm_write)?
                    .or(trimmed_to);
                outcomes.push(result);
            }
            last = Some(entry.log_id);
            results.push(if batched {
                CommandResult::Batch(outcomes)
            } else {
                outcomes.pop().unwrap_or(CommandResult::Internal)
            });
            if check.is_some() {
                break;
            }
        }
        let Some(last) = last else {
            return Ok((results, check));
        };
        let lease_writes = staged.into_writes();
        drop(lease_table);
        if !lease_writes.is_empty() {
            let leases = cf(&self.db, CF_LEASES).map_err(sm_write)?;
            for w in &lease_writes {
                match w.entry() {
                    Some(e) => {
                        batch.put_cf(leases, w.key(), serde_json::to_vec(&e).map_err(sm_write)?)
                    }
                    None => batch.delete_cf(leases, w.key()),
                }
            }
        }
        batch.put_cf(
            sm,
            KEY_APPLIED,
            serde_json::to_vec(&Some(last)).map_err(sm_write)?,
        );
        batch.put_cf(
            sm,
            KEY_REVISION,
            serde_json::to_vec(&revision_at).map_err(sm_write)?,
        );
        if let Some(cursors) = &cursors {
            batch.put_cf(
                sm,
                KEY_FEDERATION_CURSORS,
                serde_json::to_vec(cursors).map_err(sm_write)?,
            );
        }
        let cluster = cluster.filter(|_| cluster_changed);
        if let Some(cluster) = &cluster {
            batch.put_cf(
                sm,
                KEY_CLUSTER,
                serde_json::to_vec(cluster).map_err(sm_write)?,
            );
        }
        if audit_seq != first_audit_seq {
            batch.put_cf(
                sm,
                KEY_AUDIT_SEQ,
                serde_json::to_vec(&audit_seq).map_err(sm_write)?,
            );
            // Retention by the leader's clock of the newest entry, so every
            // node drops the same entries.
            let crossed = audit_seq / AUDIT_TRIM_EVERY != first_audit_seq / AUDIT_TRIM_EVERY;
            let now = audit_now
                .as_deref()
                .and_then(crate::domain::time::parse)
                .map(|t| t.unix_timestamp());
            if let (true, Some(now)) = (crossed, now) {
                trim_audit(
                    &self.db,
                    &mut batch,
                    CF_AUDIT,
                    audit_seq,
                    now,
                    self.audit_retention,
                )
                .map_err(sm_write)?;
            }
        }
        // Holds change with the records they belong to: readers that pair a
        // record with its lease (`Reader::get_leased`) hold the table's read
        // lock across both, so they see the batch and the table together.
        //
        // Applied state skips RocksDB's WAL: the Raft log, synced before an
        // entry is committed, already holds every entry, and the state is a
        // deterministic function of it. A node that stops without flushing
        // reopens at its last flush (one consistent state: the database
        // flushes all column families atomically) and re-applies the log
        // after it; the log is purged only below a snapshot, which flushes
        // first. Writing each record, change and audit entry to a WAL too
        // cost more than half the disk written per write (docs/benchmarks.md).
        if lease_writes.is_empty() {
            self.db.write_opt(batch, &unlogged()).map_err(sm_write)?;
        } else {
            let mut table = self.applied.leases_mut();
            self.db.write_opt(batch, &unlogged()).map_err(sm_write)?;
            for w in &lease_writes {
                table.apply(w);
            }
            drop(table);
            let agents: Vec<String> = lease_writes
                .into_iter()
                .filter_map(|w| match w {
                    LeaseWrite::Hold(agent, _) => Some(agent),
                    LeaseWrite::Lease(..) => None,
                })
                .collect();
            if !agents.is_empty() {
                self.applied.holds_changed(HoldsChanged::Agents(&agents));
            }
        }
        // Before the revision is published: whoever sees it reads the
        // records as written.
        self.applied.records.invalidate(written.ids());
        if let Some(cluster) = cluster {
            self.cluster.set(cluster);
        }
        self.audit_seq.store(audit_seq, Ordering::Release);
        if let Some(sink) = &self.audit_sink {
            for e in audited {
                sink.send(e);
            }
        }
        if identity_changed {
            self.applied.set_identity(identity);
        }
        if keys_changed {
            self.applied.set_publisher_keys(publisher_keys);
        }
        self.applied.revision.store(revision_at, Ordering::Release);
        self.weight.add(weight);
        if let Some(oldest) = trimmed_to {
            self.applied
                .oldest_revision
                .store(oldest, Ordering::Release);
        }
        // Every change goes out in revision order, a batch entry's too:
        // watchers and the discovery index follow this channel live.
        let commands = results.iter().flat_map(|r| match r {
            CommandResult::Batch(outcomes) => outcomes.as_slice(),
            single => std::slice::from_ref(single),
        });
        for result in commands {
            if let CommandResult::Applied(change) = result {
                // No subscriber is normal; the send result says nothing else.
                let _ = self.applied.changes.send(Applied::Change(change.clone()));
            }
        }
        Ok((results, check))
    }
}

/// The records a batch of entries has written so far, by id: a decision
/// later in the batch reads them here, not in the database, which the
/// batch has not reached yet. A changed record is the change's own, shared.
#[derive(Default)]
struct Written(HashMap<String, WrittenRecord>);

enum WrittenRecord {
    Changed(Arc<Change>),
    /// Signed again by an identity change (no change of its own).
    Resigned(Box<AgentRecord>),
}

impl WrittenRecord {
    fn record(&self) -> &AgentRecord {
        match self {
            Self::Changed(c) => &c.record,
            Self::Resigned(r) => r,
        }
    }
}

impl Written {
    fn get(&self, id: &str) -> Option<&AgentRecord> {
        self.0.get(id).map(WrittenRecord::record)
    }

    fn holds(&self, id: &str) -> bool {
        self.0.contains_key(id)
    }

    fn records(&self) -> impl Iterator<Item = &AgentRecord> {
        self.0.values().map(WrittenRecord::record)
    }

    fn ids(&self) -> impl Iterator<Item = &String> {
        self.0.keys()
    }

    fn changed(&mut self, change: &Arc<Change>) {
        let id = change.record.metadata.id.clone();
        self.0
            .insert(id, WrittenRecord::Changed(Arc::clone(change)));
    }

    fn resigned(&mut self, record: AgentRecord) {
        let id = record.metadata.id.clone();
        self.0.insert(id, WrittenRecord::Resigned(Box::new(record)));
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    #[tracing::instrument(level = "info", skip_all)]
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let this = self.clone();
        let started = std::time::Instant::now();
        let built = tokio::task::spawn_blocking(move || this.build())
            .await
            .map_err(|e| snap_err(std::io::Error::other(e.to_string())))?
            .map_err(snap_err);
        crate::metrics::observe_snapshot("build", started.elapsed());
        built
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        stored_meta(&self.db).map_err(sm_read)
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandResult>, StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let Some(last) = entries.last().map(|e| e.log_id) else {
            return Ok(Vec::new());
        };
        // Entries another leader proposed: their signatures come with its
        // next message, once it has applied them too (`signature_book`).
        let proposer = (last.leader_id.term, last.leader_id.node_id);
        self.signatures
            .wait_for(proposer, last.index, crate::crypto::signature_book::WAIT)
            .await;
        let started = std::time::Instant::now();
        let mut entries = entries.into_iter();
        let mut applied = Vec::new();
        loop {
            let (results, check) = self.apply_batch(entries.by_ref())?;
            applied.extend(results);
            let Some(at) = check else { break };
            // The state as of the check entry, hashed off the apply path:
            // nothing is written until the snapshot is taken.
            self.applied.digests.start(self.db.clone(), at).await;
        }
        crate::metrics::observe_apply(started.elapsed(), applied.len() as u64);
        self.signatures
            .applied(last.index, self.applied.revision.load(Ordering::Acquire));
        Ok(applied)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    /// A file for a snapshot being received, unlinked as soon as it is
    /// created: it lives only as long as the transfer holds it, so one that
    /// fails leaves nothing behind. Installing copies it to the current
    /// snapshot file.
    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError> {
        let dir = self.snapshot_dir.clone();
        let file = tokio::task::spawn_blocking(move || checkpoint::unlinked_file(&dir, "incoming"))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r)
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        Ok(Box::new(tokio::fs::File::from_std(file)))
    }

    #[tracing::instrument(level = "info", skip_all)]
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, openraft::BasicNode>,
        snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError> {
        let started = std::time::Instant::now();
        let file = snapshot.into_std().await;
        // Minutes at a million agents: off the runtime's threads.
        let (this, owned) = (self.clone(), meta.clone());
        let installed = tokio::task::spawn_blocking(move || this.install(&owned, file))
            .await
            .map_err(|e| LocalError::Io(std::io::Error::other(e)))
            .and_then(|r| r)
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e).into());
        crate::metrics::observe_snapshot("install", started.elapsed());
        installed
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let stored = self
            .open_snapshot_file()
            .map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(stored.map(|(meta, file)| Snapshot {
            meta,
            snapshot: Box::new(tokio::fs::File::from_std(file)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command as a log entry carries it.
    fn normal(command: Command) -> EntryPayload<TypeConfig> {
        EntryPayload::Normal(crate::consensus::Proposal::new(&command).unwrap())
    }
    use crate::consensus::Proposal;
    use crate::domain::write::{decide_put, WriteMode};
    use crate::domain::{Principal, Role};
    use futures::FutureExt;

    #[test]
    fn snapshots_are_due_by_log_weight() {
        let weight = SnapshotWeight::default();
        weight.start(100, 0);
        weight.add(99 * ENTRY_WEIGHT);
        assert!(weight.due().now_or_never().is_none(), "due too early");
        // Refreshes weigh an eighth of other entries.
        weight.add(ENTRY_WEIGHT - 1);
        assert!(weight.due().now_or_never().is_none(), "due too early");
        weight.add(1);
        assert!(weight.due().now_or_never().is_some(), "due at the interval");
        // A snapshot taken (by a trigger or an install) starts the count
        // again.
        weight.add(60 * ENTRY_WEIGHT);
        weight.taken();
        weight.add(99 * ENTRY_WEIGHT);
        assert!(weight.due().now_or_never().is_none(), "due too early");
        weight.add(ENTRY_WEIGHT);
        assert!(weight.due().now_or_never().is_some(), "due at the interval");
        // Entries already in the log at start count.
        weight.start(100, 100);
        assert!(weight.due().now_or_never().is_some(), "due at start");
        // An interval of 0 never takes one.
        weight.start(0, 0);
        weight.add(u64::MAX / 2);
        assert!(weight.due().now_or_never().is_none(), "never");
    }

    #[test]
    fn change_entries_decode_as_changes() {
        let metadata = serde_json::from_value(serde_json::json!({
            "id": "urn:agent:a\"b", "name": "A", "description": "quotes \" and \\ kept",
            "x-extra": {"n": 1}
        }))
        .unwrap();
        let principal = Principal::new("alice", Role::Publisher);
        let (record, kind) = decide_put(
            None,
            metadata,
            None,
            &principal,
            WriteMode::Register,
            42,
            "2026-11-22T00:00:00Z",
        )
        .unwrap();
        let change = Change {
            revision: 42,
            kind,
            record,
            unshared: Some(true),
        };
        let (record_json, entry) = encode_change(&change).unwrap();
        assert_eq!(record_json, serde_json::to_vec(&change.record).unwrap());
        let decoded: Change = serde_json::from_slice(&entry).unwrap();
        assert_eq!(
            serde_json::to_value(&decoded).unwrap(),
            serde_json::to_value(&change).unwrap()
        );
    }

    /// A record with an unknown member named like a defined one is never
    /// proposed (its JSON would hold the member twice); an entry written
    /// with one before this was refused still decodes, the later copy
    /// winning, so the log replays instead of stopping the node.
    #[test]
    fn a_clashing_member_is_never_proposed_and_an_old_entry_still_decodes() {
        let alice = Principal::new("alice", Role::Publisher);
        let mut cmd = register("clash", &alice, "2026-11-25T00:00:00Z");
        let plain = Proposal::new(&cmd).unwrap();
        if let Command::Put { metadata, .. } = &mut cmd {
            metadata
                .extra
                .insert("name".into(), serde_json::json!("second"));
        }
        let refused = Proposal::new(&cmd).unwrap_err().to_string();
        assert!(refused.contains("/extensions/name"), "{refused}");
        // As an older binary wrote it: the member twice.
        let twice = serde_json::to_vec(&cmd).unwrap();
        assert!(serde_json::from_slice::<Command>(&twice).is_err());
        let Command::Put { metadata, .. } = Proposal::from_bytes(twice.into()).command().unwrap()
        else {
            panic!("a Put")
        };
        assert_eq!(metadata.name, "second");
        assert!(plain.command().is_ok());
    }

    /// A registration of a small record `id` by `principal`.
    fn register(id: &str, principal: &Principal, now: &str) -> Command {
        Command::Put {
            metadata: Box::new(
                serde_json::from_value(serde_json::json!({
                    "id": id, "name": id, "description": "d",
                    "bindings": [{"protocol": "https", "endpoint": format!("https://x/{id}")}]
                }))
                .unwrap(),
            ),
            visibility: None,
            readers: Vec::new(),
            principal: principal.clone(),
            mode: crate::domain::write::WriteMode::Register,
            now: now.into(),
            publisher: None,
            quota: None,
            expected_revision: None,
            rules: 0,
        }
    }

    /// A state machine with its database under `dir/a`.
    /// Alice registers a minimal agent `id`.
    fn register_by_alice(id: &str) -> Command {
        Command::Put {
            metadata: Box::new(crate::domain::AgentMetadata {
                id: id.into(),
                name: "A".into(),
                description: "d".into(),
                ..Default::default()
            }),
            visibility: None,
            readers: Vec::new(),
            principal: Principal::new("alice", Role::Publisher),
            mode: WriteMode::Register,
            now: "2026-11-24T00:00:00Z".into(),
            publisher: None,
            quota: None,
            expected_revision: None,
            rules: 0,
        }
    }

    fn state_machine_in(dir: &std::path::Path) -> StateMachine {
        let db =
            crate::storage::open(&dir.join("a"), crate::storage::DEFAULT_MAX_WAL_BYTES).unwrap();
        StateMachine::open(db, dir.join("a-snap"), 1000).unwrap()
    }

    /// A snapshot of `sm`'s state, built now.
    async fn built_now(sm: &mut StateMachine) -> Snapshot<TypeConfig> {
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap()
    }

    /// The names of the files in a snapshot directory.
    fn files_in(dir: &std::path::Path) -> Vec<std::ffi::OsString> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect()
    }

    /// The names in a snapshot directory, checkpoints' as "checkpoint".
    fn kinds_in(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = files_in(dir)
            .into_iter()
            .map(|n| {
                let n = n.to_string_lossy().into_owned();
                if n.starts_with("checkpoint-") {
                    "checkpoint".into()
                } else {
                    n
                }
            })
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn a_start_removes_half_written_snapshots_and_stale_checkpoints_and_keeps_the_current_one(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = state_machine_in(dir.path());
        sm.apply([blank(1)]).await.unwrap();
        let built = built_now(&mut sm).await;
        // Building again replaces the checkpoint.
        sm.apply([blank(2)]).await.unwrap();
        let built = {
            let again = built_now(&mut sm).await;
            assert_ne!(again.meta, built.meta);
            again
        };
        drop(sm);
        let snaps = dir.path().join("a-snap");
        assert_eq!(kinds_in(&snaps), ["checkpoint", "current.snapshot"]);
        std::fs::write(snaps.join(format!("{WRITING}3")), b"half a snapshot").unwrap();
        std::fs::create_dir(snaps.join("checkpoint-1-7")).unwrap();
        let mut sm = state_machine_in(dir.path());
        assert_eq!(kinds_in(&snaps), ["checkpoint", "current.snapshot"]);
        let current = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, built.meta);
        let bytes = snapshot_bytes(current.snapshot).await;
        assert_eq!(bytes, snapshot_bytes(built.snapshot).await);
        let document: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            document["last_applied"],
            serde_json::to_value(built.meta.last_log_id).unwrap()
        );
    }

    #[tokio::test]
    async fn a_moved_data_directory_keeps_its_snapshot_and_a_lost_checkpoint_drops_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = state_machine_in(dir.path());
        sm.apply([blank(1)]).await.unwrap();
        let built = built_now(&mut sm).await;
        let bytes = snapshot_bytes(built.snapshot).await;
        drop(sm);
        let moved = dir.path().join("moved");
        std::fs::create_dir(&moved).unwrap();
        std::fs::rename(dir.path().join("a"), moved.join("a")).unwrap();
        std::fs::rename(dir.path().join("a-snap"), moved.join("a-snap")).unwrap();
        let mut sm = state_machine_in(&moved);
        let current = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, built.meta);
        assert_eq!(snapshot_bytes(current.snapshot).await, bytes);
        drop(sm);

        let snaps = moved.join("a-snap");
        for name in files_in(&snaps) {
            if name.to_string_lossy().starts_with("checkpoint-") {
                std::fs::remove_dir_all(snaps.join(name)).unwrap();
            }
        }
        let mut sm = state_machine_in(&moved);
        assert!(sm.get_current_snapshot().await.unwrap().is_none());
        assert!(files_in(&snaps).is_empty());
    }

    /// A blank log entry at `index`.
    fn blank(index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    /// The snapshot document a snapshot handed to Raft stands for, as a
    /// leader sends it.
    async fn snapshot_bytes(file: Box<tokio::fs::File>) -> Vec<u8> {
        let file = file.into_std().await;
        let mut file = materialised_snapshot(file).unwrap();
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).unwrap();
        bytes
    }

    /// A listener on `reader`'s holds that logs each call: the agents
    /// told, or "*" for all of them.
    fn holds_log(reader: &Reader) -> Arc<std::sync::Mutex<Vec<String>>> {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let into = log.clone();
        assert!(reader.on_holds_changed(Box::new(move |c| {
            let told = match c {
                HoldsChanged::Agents(agents) => agents.join(","),
                HoldsChanged::All => "*".into(),
            };
            into.lock().unwrap().push(told);
        })));
        log
    }

    /// A new state machine (database under `dir/b`) brought up by a
    /// snapshot `sm` builds now, the way a follower is: the leader reads its
    /// current snapshot file, the follower writes the bytes into a file it
    /// is given and installs it.
    async fn restored_from_snapshot(
        sm: &mut StateMachine,
        dir: &std::path::Path,
    ) -> (StateMachine, Arc<DB>) {
        use tokio::io::{AsyncSeekExt, AsyncWriteExt};
        let built = built_now(sm).await;
        let current = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, built.meta);
        let bytes = snapshot_bytes(current.snapshot).await;
        assert_eq!(bytes, snapshot_bytes(built.snapshot).await);
        let db =
            crate::storage::open(&dir.join("b"), crate::storage::DEFAULT_MAX_WAL_BYTES).unwrap();
        let mut fresh = StateMachine::open(db.clone(), dir.join("b-snap"), 1000).unwrap();
        let mut received = fresh.begin_receiving_snapshot().await.unwrap();
        received.write_all(&bytes).await.unwrap();
        received.rewind().await.unwrap();
        fresh.install_snapshot(&built.meta, received).await.unwrap();
        // The follower keeps it as its own current snapshot, and the file
        // it was received into is gone.
        let kept = fresh.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(kept.meta, built.meta);
        assert_eq!(snapshot_bytes(kept.snapshot).await, bytes);
        assert_eq!(kinds_in(&dir.join("b-snap")), ["current.snapshot"]);
        (fresh, db)
    }

    #[tokio::test]
    async fn cached_records_follow_every_write_and_every_installed_snapshot() {
        use tokio::io::{AsyncSeekExt, AsyncWriteExt};
        let leader = openraft::CommittedLeaderId::new(1, 1);
        let alice = Principal::new("alice", Role::Publisher);
        let put = |index: u64| Entry {
            log_id: openraft::LogId::new(leader, index),
            payload: normal(register("a", &alice, "2026-11-25T00:00:00Z")),
        };
        let revision = |sm: &StateMachine| {
            sm.reader().get_shared_many(&["a"]).unwrap()[0]
                .as_ref()
                .map(|(r, size)| (r.envelope.revision, *size))
        };
        let dir = tempfile::tempdir().unwrap();
        let mut sm = state_machine_in(dir.path());
        // Read twice, the second read is the cached one; both give the
        // revision and the stored size that a read from disk gives.
        let stored = |sm: &StateMachine| {
            sm.reader()
                .get_sized("a")
                .unwrap()
                .map(|(r, size)| (r.envelope.revision, size))
        };
        assert_eq!(revision(&sm), None);
        sm.apply([put(1)]).await.unwrap();
        assert_eq!(revision(&sm), stored(&sm));
        assert_eq!(revision(&sm), stored(&sm));
        assert_eq!(revision(&sm).map(|(r, _)| r), Some(1));
        sm.apply([put(2)]).await.unwrap();
        assert_eq!(revision(&sm).map(|(r, _)| r), Some(2));
        assert_eq!(revision(&sm), stored(&sm));
        // Several at once, read from disk (the cache emptied), come back
        // in the order asked: a missing id as none, an id asked twice twice.
        sm.reader().applied.records.clear();
        let both = sm.reader().get_shared_many(&["a", "none", "a"]).unwrap();
        let revisions: Vec<Option<u64>> = both
            .iter()
            .map(|r| r.as_ref().map(|(r, _)| r.envelope.revision))
            .collect();
        assert_eq!(revisions, [Some(2), None, Some(2)]);
        // A follower that read (and cached) an older "a" installs a
        // snapshot holding the newer one.
        let built = built_now(&mut sm).await;
        let bytes = snapshot_bytes(built.snapshot).await;
        let db = crate::storage::open(&dir.path().join("b"), crate::storage::DEFAULT_MAX_WAL_BYTES)
            .unwrap();
        let mut follower = StateMachine::open(db, dir.path().join("b-snap"), 1000).unwrap();
        follower.apply([put(1)]).await.unwrap();
        assert_eq!(revision(&follower).map(|(r, _)| r), Some(1));
        let told = holds_log(&follower.reader());
        let mut received = follower.begin_receiving_snapshot().await.unwrap();
        received.write_all(&bytes).await.unwrap();
        received.rewind().await.unwrap();
        follower
            .install_snapshot(&built.meta, received)
            .await
            .unwrap();
        assert_eq!(revision(&follower).map(|(r, _)| r), Some(2));
        // The lease table was replaced: every agent's hold may have changed.
        assert_eq!(*told.lock().unwrap(), ["*"]);
    }

    #[tokio::test]
    async fn the_cluster_record_follows_the_membership_and_travels_in_snapshots() {
        use std::collections::{BTreeMap, BTreeSet};
        let leader = openraft::CommittedLeaderId::new(1, 1);
        let members = |ids: &[u64]| {
            let nodes: BTreeMap<u64, openraft::BasicNode> = ids
                .iter()
                .map(|id| (*id, openraft::BasicNode::new(format!("n{id}"))))
                .collect();
            let voters = BTreeSet::from_iter(ids.iter().copied());
            openraft::Membership::new(vec![voters], nodes)
        };
        let dir = tempfile::tempdir().unwrap();
        let db = crate::storage::open(&dir.path().join("a"), crate::storage::DEFAULT_MAX_WAL_BYTES)
            .unwrap();
        let mut sm = StateMachine::open(db.clone(), dir.path().join("a-snap"), 1000).unwrap();
        let record = |id: &str, incs: &[(u64, &str)]| Command::Cluster {
            cluster_id: Some(id.into()),
            incarnations: incs.iter().map(|(n, i)| (*n, i.to_string())).collect(),
            now: "2026-11-25T00:00:00Z".into(),
            rules: 0,
            refused: BTreeMap::new(),
        };
        let rules = |rules: u32| Command::Cluster {
            cluster_id: None,
            incarnations: BTreeMap::new(),
            now: "2026-11-25T00:00:00Z".into(),
            rules,
            refused: BTreeMap::new(),
        };
        sm.apply([
            Entry {
                log_id: openraft::LogId::new(leader, 1),
                payload: EntryPayload::Membership(members(&[1, 2])),
            },
            // Node 3 is no member: not recorded.
            Entry {
                log_id: openraft::LogId::new(leader, 2),
                payload: normal(record("c1", &[(1, "a"), (2, "b"), (3, "c")])),
            },
            // A second founding (a racing leader) changes nothing.
            Entry {
                log_id: openraft::LogId::new(leader, 3),
                payload: normal(record("c2", &[(1, "z")])),
            },
        ])
        .await
        .unwrap();
        let got = sm.cluster_record().get();
        assert_eq!(got.cluster_id.as_deref(), Some("c1"));
        assert_eq!(
            got.incarnations,
            BTreeMap::from([(1, "a".to_string()), (2, "b".to_string())])
        );
        // Node 2 leaves: its record goes with it. The apply rules the
        // members follow are recorded, and never lowered.
        sm.apply([
            Entry {
                log_id: openraft::LogId::new(leader, 4),
                payload: EntryPayload::Membership(members(&[1])),
            },
            Entry {
                log_id: openraft::LogId::new(leader, 5),
                payload: normal(rules(APPLY_RULES)),
            },
            Entry {
                log_id: openraft::LogId::new(leader, 6),
                payload: normal(rules(1)),
            },
            // A refusal of a member is kept; of a former member, dropped.
            Entry {
                log_id: openraft::LogId::new(leader, 7),
                payload: normal(Command::Cluster {
                    cluster_id: None,
                    incarnations: BTreeMap::new(),
                    now: "2026-11-25T00:00:00Z".into(),
                    rules: 0,
                    refused: BTreeMap::from([(1, "lost 3".into()), (2, "lost 3".into())]),
                }),
            },
        ])
        .await
        .unwrap();
        let expected = ClusterRecord {
            cluster_id: Some("c1".into()),
            incarnations: BTreeMap::from([(1, "a".to_string())]),
            apply_rules: APPLY_RULES,
            refused: BTreeMap::from([(1, "lost 3".to_string())]),
        };
        assert_eq!(*sm.cluster_record().get(), expected);
        // Kept on disk, and carried by a snapshot.
        drop(sm);
        let mut sm = StateMachine::open(db, dir.path().join("a-snap"), 1000).unwrap();
        assert_eq!(*sm.cluster_record().get(), expected);
        let (fresh, _) = restored_from_snapshot(&mut sm, dir.path()).await;
        assert_eq!(*fresh.cluster_record().get(), expected);
        // An entry asking for rules this binary does not follow stops
        // the node rather than be applied differently from the others.
        let newer = sm
            .apply([Entry {
                log_id: openraft::LogId::new(leader, 8),
                payload: normal(rules(APPLY_RULES + 1)),
            }])
            .await;
        assert!(newer.is_err());
        assert_eq!(*sm.cluster_record().get(), expected);
    }

    #[tokio::test]
    async fn the_index_scan_drops_orphaned_vectors_and_keeps_the_saved_partitions() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = state_machine_in(dir.path());
        let put = register_by_alice("kept");
        sm.apply([Entry {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), 1),
            payload: normal(put),
        }])
        .await
        .unwrap();
        let reader = sm.reader();
        reader
            .store_index_vectors(&[
                ("gone".into(), Some(vec![2])),
                ("kept".into(), Some(vec![1])),
            ])
            .unwrap();
        reader.store_index_partitions(b"partitions").unwrap();
        let mut seen = Vec::new();
        reader
            .scan_with_index_vectors(|r, v| seen.push((r.metadata.id, v.map(<[u8]>::to_vec))))
            .unwrap();
        assert_eq!(seen, vec![("kept".to_string(), Some(vec![1]))]);
        // The orphan went; the partitions are no agent's and stay.
        let mut again = Vec::new();
        reader
            .scan_with_index_vectors(|r, v| again.push((r.metadata.id, v.map(<[u8]>::to_vec))))
            .unwrap();
        assert_eq!(again, seen);
        let cf = cf(&reader.db, crate::storage::CF_INDEX_VECTORS).unwrap();
        assert!(reader.db.get_cf(cf, b"gone").unwrap().is_none());
        assert_eq!(
            reader.index_partitions().unwrap().as_deref(),
            Some(&b"partitions"[..])
        );
    }

    #[tokio::test]
    async fn snapshots_carry_the_audit_trail() {
        let audited = Command::Audited {
            command: Box::new(register_by_alice("audited")),
            audit: crate::domain::audit::AuditContext {
                principal: Some(Principal::new("alice", Role::Publisher)),
                address: Some("192.0.2.7".into()),
                operation: "register".into(),
                target: Some("audited".into()),
                correlation_id: "req-1".into(),
            },
        };
        let leader = openraft::CommittedLeaderId::new(1, 1);
        let dir = tempfile::tempdir().unwrap();
        let mut sm = state_machine_in(dir.path());
        sm.apply([Entry {
            log_id: openraft::LogId::new(leader, 1),
            payload: normal(audited),
        }])
        .await
        .unwrap();
        // A node brought up by the snapshot holds the same record, change
        // history (copied as stored bytes) and trail.
        let (mut fresh, db) = restored_from_snapshot(&mut sm, dir.path()).await;
        let (before, after) = (sm.reader(), fresh.reader());
        let record = after.get("audited").unwrap().expect("the record travels");
        assert_eq!(Some(&record), before.get("audited").unwrap().as_ref());
        assert_eq!(
            after.changes_from(1, 10).unwrap(),
            before.changes_from(1, 10).unwrap()
        );
        assert_eq!(after.changes_from(1, 10).unwrap().len(), 1);
        let store = crate::storage::AuditStore::open(db, 2, Retention::default(), None).unwrap();
        let (entries, more) = store
            .list(
                &crate::domain::audit::AuditQuery::default(),
                crate::storage::AuditCursor::default(),
                10,
            )
            .unwrap();
        assert!(more.is_none());
        assert_eq!(entries.len(), 1);
        let e = &entries[0];
        assert_eq!(
            (e.seq, e.outcome.as_str(), e.revision, e.node),
            (1, "ok", Some(1), None)
        );
        assert_eq!(e.address.as_deref(), Some("192.0.2.7"));
        // And appends after it.
        fresh
            .apply([Entry {
                log_id: openraft::LogId::new(leader, 2),
                payload: normal(Command::Audited {
                    command: Box::new(Command::Note {
                        now: "2026-11-24T00:00:01Z".into(),
                    }),
                    audit: e_context(),
                }),
            }])
            .await
            .unwrap();
        let (entries, _) = store
            .list(
                &crate::domain::audit::AuditQuery::default(),
                crate::storage::AuditCursor::default(),
                10,
            )
            .unwrap();
        assert_eq!(entries.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2]);
    }

    /// `sm` with `n` agents registered by alice, one entry each.
    async fn with_agents(sm: &mut StateMachine, n: u64) {
        let leader = openraft::CommittedLeaderId::new(1, 1);
        for i in 1..=n {
            sm.apply([Entry {
                log_id: openraft::LogId::new(leader, i),
                payload: normal(register_by_alice(&format!("agent-{i:03}"))),
            }])
            .await
            .unwrap();
        }
    }

    /// A batch of history ends once it holds about a megabyte, so a
    /// watcher that stops reading holds no more than that besides its
    /// stream's buffer; following still reads every change, in order.
    #[tokio::test]
    async fn history_is_read_in_batches_bounded_by_their_size() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = state_machine_in(dir.path());
        let leader = openraft::CommittedLeaderId::new(1, 1);
        for i in 1..=12 {
            let mut put = register_by_alice(&format!("big-{i:02}"));
            if let Command::Put { metadata, .. } = &mut put {
                metadata.description = "d".repeat(200 * 1024);
            }
            sm.apply([Entry {
                log_id: openraft::LogId::new(leader, i),
                payload: normal(put),
            }])
            .await
            .unwrap();
        }
        let reader = sm.reader();
        let batch: Vec<u64> = reader
            .changes_from(1, 64)
            .unwrap()
            .iter()
            .map(|c| c.revision)
            .collect();
        assert!((5..=6).contains(&batch.len()), "{batch:?}");
        assert_eq!(batch, (1..=batch.len() as u64).collect::<Vec<_>>());
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = |c: Arc<Change>| {
            seen.lock().unwrap().push(c.revision);
            async move { c.revision < 12 }
        };
        let end = reader
            .follow(reader.subscribe(), 1, std::future::pending(), sink)
            .await;
        assert!(matches!(end, crate::storage::FollowEnd::Stopped));
        assert_eq!(*seen.lock().unwrap(), (1..=12).collect::<Vec<u64>>());
    }

    fn ids(reader: &Reader) -> Vec<String> {
        let mut ids = Vec::new();
        reader.scan(|r| ids.push(r.metadata.id)).unwrap();
        ids
    }

    #[tokio::test]
    async fn an_install_stopped_part_way_is_finished_when_the_node_opens() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = state_machine_in(dir.path());
        with_agents(&mut sm, 40).await;
        let (mut fresh, db) = restored_from_snapshot(&mut sm, dir.path()).await;
        assert_eq!(ids(&fresh.reader()), ids(&sm.reader()));
        let applied = sm.applied_state().await.unwrap();
        assert_eq!(fresh.applied_state().await.unwrap(), applied);
        // What a stop part-way leaves: the snapshot already current, part
        // of its elements written, the applied log id not yet.
        db.delete_range_cf(cf(&db, CF_AGENTS).unwrap(), b"agent-010", b"agent-041")
            .unwrap();
        db.delete_cf(cf(&db, CF_SM).unwrap(), KEY_APPLIED).unwrap();
        assert_eq!(ids(&fresh.reader()).len(), 9);
        drop((fresh, db));
        let db = crate::storage::open(&dir.path().join("b"), crate::storage::DEFAULT_MAX_WAL_BYTES)
            .unwrap();
        let mut reopened = StateMachine::open(db, dir.path().join("b-snap"), 1000).unwrap();
        assert_eq!(ids(&reopened.reader()), ids(&sm.reader()));
        assert_eq!(reopened.applied_state().await.unwrap(), applied);
        assert_eq!(
            reopened.reader().applied_revision(),
            sm.reader().applied_revision()
        );
        assert_eq!(
            reopened.reader().changes_from(1, 100).unwrap(),
            sm.reader().changes_from(1, 100).unwrap()
        );
        // A node whose state is complete opens as it is.
        drop(reopened);
        let db = crate::storage::open(&dir.path().join("b"), crate::storage::DEFAULT_MAX_WAL_BYTES)
            .unwrap();
        let mut again = StateMachine::open(db, dir.path().join("b-snap"), 1000).unwrap();
        assert_eq!(again.applied_state().await.unwrap(), applied);
    }

    #[tokio::test]
    async fn a_document_installs_whatever_the_order_of_its_members_and_without_later_ones() {
        use tokio::io::{AsyncSeekExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let mut sm = state_machine_in(dir.path());
        with_agents(&mut sm, 12).await;
        let built = built_now(&mut sm).await;
        let bytes = snapshot_bytes(built.snapshot).await;
        let today: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&bytes).unwrap();
        // The order and members of the documents written before batch
        // entries, leases and the cluster record, plus one from a later
        // version.
        let mut earlier = serde_json::Map::new();
        for member in [
            "last_applied",
            "membership",
            "records",
            "oldest_revision",
            "changes",
            "identity",
            "publisher_keys",
            "federation_cursors",
            "audit",
            "audit_seq",
        ] {
            earlier.insert(member.into(), today[member].clone());
        }
        earlier.insert("from_a_later_version".into(), serde_json::json!({"x": [1]}));
        let db = crate::storage::open(&dir.path().join("b"), crate::storage::DEFAULT_MAX_WAL_BYTES)
            .unwrap();
        let mut fresh = StateMachine::open(db, dir.path().join("b-snap"), 1000).unwrap();
        let mut received = fresh.begin_receiving_snapshot().await.unwrap();
        received
            .write_all(&serde_json::to_vec(&earlier).unwrap())
            .await
            .unwrap();
        received.rewind().await.unwrap();
        fresh.install_snapshot(&built.meta, received).await.unwrap();
        assert_eq!(ids(&fresh.reader()).len(), 12);
        assert_eq!(ids(&fresh.reader()), ids(&sm.reader()));
        assert_eq!(
            fresh.reader().changes_from(1, 100).unwrap(),
            sm.reader().changes_from(1, 100).unwrap()
        );
        // Without a revision member, the last revision is the log index.
        assert_eq!(fresh.reader().applied_revision(), 12);
        // A document cut short is refused before it changes anything: the
        // node keeps its state and its current snapshot.
        let dir = tempfile::tempdir().unwrap();
        let mut cut = state_machine_in(dir.path());
        with_agents(&mut cut, 2).await;
        let kept = built_now(&mut cut).await.meta;
        let applied = cut.applied_state().await.unwrap();
        let mut received = cut.begin_receiving_snapshot().await.unwrap();
        received.write_all(&bytes[..bytes.len() / 2]).await.unwrap();
        received.rewind().await.unwrap();
        assert!(cut.install_snapshot(&built.meta, received).await.is_err());
        assert_eq!(
            kinds_in(&dir.path().join("a-snap")),
            ["checkpoint", "current.snapshot"]
        );
        assert_eq!(cut.applied_state().await.unwrap(), applied);
        assert_eq!(ids(&cut.reader()), ["agent-001", "agent-002"]);
        let current = cut.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, kept);
    }

    #[tokio::test]
    async fn reads_wait_out_an_install_and_a_follower_of_the_feed_carries_on_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = state_machine_in(dir.path());
        with_agents(&mut sm, 3).await;
        let reader = sm.reader();
        let live = reader.subscribe();
        reader.applied.installs.fetch_add(1, Ordering::AcqRel);
        assert!(matches!(
            reader.get("agent-001"),
            Err(LocalError::Installing)
        ));
        assert!(matches!(
            reader.get_shared_many(&["agent-001"]),
            Err(LocalError::Installing)
        ));
        assert!(matches!(reader.scan(|_| {}), Err(LocalError::Installing)));
        assert!(matches!(
            reader.changes_from(1, 10),
            Err(LocalError::Installing)
        ));
        // A follower of the feed started meanwhile waits for the end.
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let follower = {
            let (reader, seen) = (reader.clone(), seen.clone());
            tokio::spawn(async move {
                reader
                    .follow(live, 1, std::future::pending(), |c: Arc<Change>| {
                        seen.lock().unwrap().push(c.revision);
                        async move { c.revision < 3 }
                    })
                    .await
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(seen.lock().unwrap().is_empty());
        reader.applied.installs.fetch_add(1, Ordering::AcqRel);
        let _ = reader.applied.changes.send(Applied::SnapshotInstalled);
        let end = tokio::time::timeout(std::time::Duration::from_secs(5), follower)
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(end, crate::storage::FollowEnd::Stopped));
        assert_eq!(*seen.lock().unwrap(), [1, 2, 3]);
        assert_eq!(ids(&reader).len(), 3);
    }

    #[tokio::test]
    async fn leases_apply_in_order_end_with_a_new_registration_and_persist() {
        use crate::domain::lease::{Hold, Refresh, RefreshTarget};
        let leader = openraft::CommittedLeaderId::new(1, 1);
        let dir = tempfile::tempdir().unwrap();
        let mut sm = state_machine_in(dir.path());
        let alice = Principal::new("alice", Role::Publisher);
        let now = "2026-11-25T00:00:00Z";
        let now_unix = unix_of(now);
        let put = |index: u64, id: &str| Entry {
            log_id: openraft::LogId::new(leader, index),
            payload: normal(register(id, &alice, now)),
        };
        let refresh = |target: RefreshTarget, ttl: Option<u32>| Refresh {
            target,
            ttl_seconds: ttl,
            principal: alice.clone(),
        };
        let agent = |id: &str, lease: Option<&str>| RefreshTarget::Agent {
            id: id.into(),
            lease: lease.map(String::from),
        };
        let lease = RefreshTarget::Lease {
            name: "fleet".into(),
        };
        sm.apply([put(1, "a"), put(2, "b")]).await.unwrap();
        let told = holds_log(&sm.reader());
        // One entry: the lease is made before "b" joins it, and "nobody"
        // is refused without failing the others.
        let results = sm
            .apply([Entry {
                log_id: openraft::LogId::new(leader, 3),
                payload: normal(Command::Refresh {
                    refreshes: vec![
                        refresh(agent("a", None), Some(30)),
                        refresh(lease.clone(), Some(90)),
                        refresh(agent("b", Some("fleet")), None),
                        refresh(agent("nobody", None), None),
                    ],
                    now: now.into(),
                }),
            }])
            .await
            .unwrap();
        let CommandResult::Leases(outcomes) = &results[0] else {
            panic!("{results:?}");
        };
        assert_eq!(outcomes[0].as_ref().unwrap().expires_unix, now_unix + 30);
        assert_eq!(outcomes[2].as_ref().unwrap().expires_unix, now_unix + 90);
        assert_eq!(outcomes[2].as_ref().unwrap().agents, 1);
        assert!(matches!(outcomes[3], Err(Rejection::NotFound { .. })));
        let reader = sm.reader();
        assert_eq!(reader.leases().expiry_unix("a"), Some(now_unix + 30));
        assert_eq!(reader.leases().expiry_unix("b"), Some(now_unix + 90));
        // No record changed: the revisions are those of the registrations.
        assert_eq!(reader.get("a").unwrap().unwrap().envelope.revision, 1);
        // Registering "a" again ends its hold.
        sm.apply([put(4, "a")]).await.unwrap();
        assert_eq!(reader.leases().expiry_unix("a"), None);
        // The index was told of each agent whose hold changed, once the
        // table had changed (the lease itself changes no agent's cell).
        assert_eq!(*told.lock().unwrap(), ["a,b", "a"]);
        // Stored, and carried by snapshots.
        drop((sm, reader));
        let mut sm = state_machine_in(dir.path());
        assert_eq!(sm.reader().leases().expiry_unix("b"), Some(now_unix + 90));
        let (fresh, _) = restored_from_snapshot(&mut sm, dir.path()).await;
        let leases = fresh.reader();
        let table = leases.leases();
        assert_eq!(
            table.hold("b"),
            Some(&Hold::Shared {
                lease: "fleet".into()
            })
        );
        assert_eq!(table.expiry_unix("b"), Some(now_unix + 90));
        assert_eq!(table.expiry_unix("a"), None);
    }

    #[tokio::test]
    async fn named_cursors_only_move_forward_and_travel_in_snapshots() {
        let leader = openraft::CommittedLeaderId::new(1, 1);
        let dir = tempfile::tempdir().unwrap();
        let mut sm = state_machine_in(dir.path());
        let cursor = |index: u64, value: u64| Entry {
            log_id: openraft::LogId::new(leader, index),
            payload: normal(Command::Cursor {
                name: "mcp-upstream:https://up.example".into(),
                value,
                now: "2026-11-26T00:00:00Z".into(),
            }),
        };
        // In one batch and across batches, a lower value never wins.
        sm.apply([cursor(1, 20), cursor(2, 10)]).await.unwrap();
        sm.apply([cursor(3, 15)]).await.unwrap();
        let reader = sm.reader();
        assert_eq!(
            reader
                .federation_cursor("mcp-upstream:https://up.example")
                .unwrap(),
            20
        );
        sm.apply([cursor(4, 30)]).await.unwrap();
        let (fresh, _) = restored_from_snapshot(&mut sm, dir.path()).await;
        assert_eq!(
            fresh
                .reader()
                .federation_cursor("mcp-upstream:https://up.example")
                .unwrap(),
            30
        );
    }

    /// A check entry's digest is the state as of that entry, whether the
    /// entries after it arrive in the same call or later, so every node
    /// digests the same state however openraft groups its entries; a node
    /// whose stored record differs has a different records digest.
    #[tokio::test]
    async fn a_check_digests_the_state_as_of_its_own_entry() {
        let leader = openraft::CommittedLeaderId::new(1, 1);
        let entry = |index: u64, command: Command| Entry {
            log_id: openraft::LogId::new(leader, index),
            payload: normal(command),
        };
        let alice = Principal::new("alice", Role::Publisher);
        let now = "2026-12-08T00:00:00Z";
        let check = || Command::Check { now: now.into() };
        let wait = std::time::Duration::from_secs(10);
        let digest_of = |sm: &StateMachine, index: u64| {
            let reader = sm.reader();
            async move { reader.state_digest(index, || 0, wait).await.unwrap() }
        };

        let dir = tempfile::tempdir().unwrap();
        let mut together = state_machine_in(&dir.path().join("together"));
        let results = together
            .apply([
                entry(1, register("a", &alice, now)),
                entry(2, check()),
                entry(3, register("b", &alice, now)),
            ])
            .await
            .unwrap();
        assert_eq!(
            results[1],
            CommandResult::Checked {
                index: 2,
                revision: 2
            }
        );
        assert_eq!(
            results.len(),
            3,
            "the entries after the check are applied too"
        );

        let mut apart = state_machine_in(&dir.path().join("apart"));
        apart
            .apply([entry(1, register("a", &alice, now)), entry(2, check())])
            .await
            .unwrap();
        apart
            .apply([entry(3, register("b", &alice, now))])
            .await
            .unwrap();
        let (one, other) = (digest_of(&together, 2).await, digest_of(&apart, 2).await);
        assert_eq!(one.sections, other.sections);
        let records = |d: &crate::storage::StateDigest| {
            d.sections
                .iter()
                .find(|s| s.name == "records")
                .cloned()
                .unwrap()
        };
        assert_eq!(records(&one).entries, 1, "b came after the check");

        // A later check sees b, and a member that installed a snapshot of
        // the same state (stored in its own encoding) digests it alike.
        let (mut installed, _db) = restored_from_snapshot(&mut apart, &dir.path().join("b")).await;
        apart.apply([entry(4, check())]).await.unwrap();
        installed.apply([entry(4, check())]).await.unwrap();
        let later = digest_of(&apart, 4).await;
        assert_eq!(records(&later).entries, 2);
        assert_eq!(later.sections, digest_of(&installed, 4).await.sections);

        // A record changed behind the log changes the records digest.
        let agents = cf(&apart.db, CF_AGENTS).unwrap();
        let stored = apart.db.get_cf(agents, b"a").unwrap().unwrap();
        let changed = String::from_utf8(stored)
            .unwrap()
            .replacen("\"d\"", "\"e\"", 1);
        apart.db.put_cf(agents, b"a", changed).unwrap();
        apart.apply([entry(5, check())]).await.unwrap();
        let tampered = digest_of(&apart, 5).await;
        for (before, after) in later.sections.iter().zip(&tampered.sections) {
            match before.name.as_str() {
                "records" => assert_ne!(before.sha256, after.sha256),
                // The check entry itself moved the revision.
                "registry" | "changes" | "audit" | "leases" => {}
                other => panic!("unexpected section {other}"),
            }
        }
        assert_eq!(
            tampered.sections.iter().find(|s| s.name == "leases"),
            later.sections.iter().find(|s| s.name == "leases")
        );

        // An index this node never applied a check at.
        let reader = apart.reader();
        let missing = reader.state_digest(3, || 5, wait).await.unwrap_err();
        assert!(missing.to_string().contains("did not apply"), "{missing}");
    }

    #[tokio::test]
    async fn a_batch_entry_gives_each_command_its_own_revision_and_outcome() {
        use crate::consensus::Proposal;
        let leader = openraft::CommittedLeaderId::new(1, 1);
        let dir = tempfile::tempdir().unwrap();
        let mut sm = state_machine_in(dir.path());
        let alice = Principal::new("alice", Role::Publisher);
        let now = "2026-11-26T00:00:00Z";
        let put = |id: &str| register(id, &alice, now);
        let entry = |index: u64, payload| Entry {
            log_id: openraft::LogId::new(leader, index),
            payload,
        };
        let batch = |commands: Vec<Command>| {
            let parts: Vec<Proposal> = commands.iter().map(|c| Proposal::new(c).unwrap()).collect();
            EntryPayload::Normal(Proposal::batch(&parts))
        };
        sm.apply([entry(1, normal(put("a")))]).await.unwrap();
        // Entry 2 holds three writes; the third deletes what the second made,
        // so it sees it. Entry 3 follows the batch's revisions.
        let delete = Command::Delete {
            id: "c".into(),
            principal: alice.clone(),
            now: now.into(),
            expected_revision: None,
        };
        let missing = Command::Delete {
            id: "nobody".into(),
            principal: alice.clone(),
            now: now.into(),
            expected_revision: None,
        };
        let mut live = sm.reader().subscribe();
        let results = sm
            .apply([
                entry(2, batch(vec![put("b"), put("c"), delete, missing])),
                entry(3, normal(put("d"))),
            ])
            .await
            .unwrap();
        let [CommandResult::Batch(outcomes), CommandResult::Applied(d)] = &results[..] else {
            panic!("{results:?}");
        };
        let revisions: Vec<Option<u64>> = outcomes
            .iter()
            .map(|r| match r {
                CommandResult::Applied(c) => Some(c.revision),
                _ => None,
            })
            .collect();
        assert_eq!(revisions, [Some(2), Some(3), Some(4), None]);
        assert!(matches!(outcomes[3], CommandResult::Rejected(_)));
        // The refused delete took revision 5, as a refused entry takes its
        // index.
        assert_eq!(d.revision, 6);
        let reader = sm.reader();
        assert_eq!(reader.applied_revision(), 6);
        let feed: Vec<u64> = reader
            .changes_from(1, 100)
            .unwrap()
            .iter()
            .map(|c| c.revision)
            .collect();
        assert_eq!(feed, [1, 2, 3, 4, 6]);
        // The live channel (watchers, the discovery index) carries each
        // change of the batch entry too, in order: the very change the
        // writer is answered with, not a copy of it.
        let mut sent = Vec::new();
        while let Ok(crate::storage::Applied::Change(c)) = live.try_recv() {
            sent.push(c);
        }
        let sent_revisions: Vec<u64> = sent.iter().map(|c| c.revision).collect();
        assert_eq!(sent_revisions, [2, 3, 4, 6]);
        let answered = outcomes[..3].iter().chain([&results[1]]);
        for (c, outcome) in sent.iter().zip(answered) {
            let CommandResult::Applied(a) = outcome else {
                panic!("{outcome:?}");
            };
            assert!(Arc::ptr_eq(c, a), "revision {} was copied", c.revision);
        }
        assert!(reader.get("c").unwrap().unwrap().envelope.deleted);
        // Entry 4's own index is behind the revisions: it takes the next.
        sm.apply([entry(4, normal(put("e")))]).await.unwrap();
        assert_eq!(reader.get("e").unwrap().unwrap().envelope.revision, 7);
        // Kept across a restart and carried by snapshots.
        drop((sm, reader));
        let mut sm = state_machine_in(dir.path());
        assert_eq!(sm.reader().applied_revision(), 7);
        let (mut fresh, _) = restored_from_snapshot(&mut sm, dir.path()).await;
        assert_eq!(fresh.reader().applied_revision(), 7);
        fresh.apply([entry(5, normal(put("f")))]).await.unwrap();
        assert_eq!(
            fresh.reader().get("f").unwrap().unwrap().envelope.revision,
            8
        );
        // And by backups.
        let mut backup = Vec::new();
        super::super::backup::write_backup(&fresh.db, 1, &mut backup).unwrap();
        let db = crate::storage::open(&dir.path().join("c"), crate::storage::DEFAULT_MAX_WAL_BYTES)
            .unwrap();
        let target = super::super::backup::RestoreTarget {
            node_id: 1,
            members: BTreeMap::from([(1, "127.0.0.1:1".to_string())]),
        };
        super::super::backup::load_backup(&db, backup.as_slice(), &target).unwrap();
        let restored = StateMachine::open(db, dir.path().join("c-snap"), 1000).unwrap();
        assert_eq!(restored.reader().applied_revision(), 8);
    }

    fn e_context() -> crate::domain::audit::AuditContext {
        crate::domain::audit::AuditContext {
            principal: Some(Principal::new("root", Role::Admin)),
            address: None,
            operation: "cluster.promote".into(),
            target: Some("3".into()),
            correlation_id: "req-2".into(),
        }
    }

    /// A peer's copy, as the sync proposes it: held to `quota` by `rules`.
    fn federate(id: &str, quota: Option<u64>, rules: u32) -> Command {
        use crate::domain::{AgentMetadata, Envelope, Provenance};
        Command::Federate {
            peer: "b.example".into(),
            change: FederatedChange::Copy {
                metadata: Box::new(AgentMetadata {
                    id: id.into(),
                    name: "n".into(),
                    description: "d".into(),
                    ..Default::default()
                }),
                origin: Box::new(Envelope {
                    owner: "alice".into(),
                    revision: 1,
                    ..Default::default()
                }),
                provenance: Box::new(Provenance {
                    origin_service: "http://b.example:8473".into(),
                    origin_authority: "b.example".into(),
                    origin_signature: Default::default(),
                    received_at: "2026-12-02T00:00:00Z".into(),
                    origin_revision: 1,
                    origin_envelope: serde_json::json!({}),
                    via: Vec::new(),
                }),
                listed: false,
            },
            cursor: None,
            quota,
            now: "2026-12-02T00:00:00Z".into(),
            rules,
        }
    }

    #[tokio::test]
    async fn a_peers_copies_are_held_to_its_quota_only_by_rules_5() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::storage::open(&dir.path().join("a"), crate::storage::DEFAULT_MAX_WAL_BYTES)
            .unwrap();
        let snapshots = dir.path().join("a-snap");
        let mut sm = StateMachine::open(db.clone(), snapshots.clone(), 1000).unwrap();
        let leader = openraft::CommittedLeaderId::new(1, 1);
        let entries = [
            federate("b1", Some(1), APPLY_RULES),
            federate("b2", Some(1), APPLY_RULES),
            // Proposed while a member followed older rules: kept, as every
            // node of that cluster would.
            federate("b3", Some(1), 4),
            federate("b4", None, APPLY_RULES),
        ];
        let results = sm
            .apply(entries.into_iter().zip(1..).map(|(c, i)| Entry {
                log_id: openraft::LogId::new(leader, i),
                payload: normal(c),
            }))
            .await
            .unwrap();
        let applied: Vec<bool> = results
            .iter()
            .map(|r| matches!(r, CommandResult::Applied(_)))
            .collect();
        assert_eq!(applied, [true, false, true, true], "{results:?}");
        assert!(matches!(
            &results[1],
            CommandResult::Rejected(Rejection::QuotaExceeded {
                scope: crate::domain::write::QuotaScope::Peer,
                limit: 1,
                ..
            })
        ));
        assert!(sm.reader().get("b2").unwrap().is_none());
        // Counted again at a start: three copies, over a limit of 3.
        drop(sm);
        let mut sm = StateMachine::open(db, snapshots, 1000).unwrap();
        let results = sm
            .apply([Entry {
                log_id: openraft::LogId::new(leader, 5),
                payload: normal(federate("b5", Some(3), APPLY_RULES)),
            }])
            .await
            .unwrap();
        assert!(
            matches!(
                &results[0],
                CommandResult::Rejected(Rejection::QuotaExceeded { .. })
            ),
            "{results:?}"
        );
    }
}
