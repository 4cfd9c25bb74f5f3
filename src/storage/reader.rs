//! Read access to the applied state for the service layer. Reads never go
//! through Raft: they see what this node has applied, and report the revision.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rocksdb::DB;
use tokio::sync::broadcast;

use super::record_cache::SizedRecord;
use super::{
    cf, get_json, key_u64, u64_key, StorageError, CF_AGENTS, CF_CHANGES, CF_INDEX_VECTORS,
};
use crate::crypto::keys::Signer;
use crate::crypto::Identity;
use crate::domain::lease::LeaseTable;
use crate::domain::{AgentRecord, Change, PublisherKey};

/// What live watchers are told.
#[derive(Debug, Clone)]
pub enum Applied {
    /// One applied change, in revision order (shared with the writer's
    /// answer and every other receiver).
    Change(Arc<Change>),
    /// The whole state was replaced by a snapshot from the leader; the
    /// changes it brought are in the history, not on the live channel, so
    /// watchers re-read the history from where they are.
    SnapshotInstalled,
}

/// Why following the change feed ended.
#[derive(Debug)]
pub enum FollowEnd {
    /// The sink or the stop signal ended it.
    Stopped,
    /// The next revision wanted is no longer in the history.
    Compacted {
        requested: u64,
        oldest: u64,
    },
    Failed(StorageError),
}

/// Holds an apply changed, told to whoever keeps a copy of them beside the
/// agents (the discovery index, which reads an agent's hold from its own
/// document instead of looking it up by name for every candidate).
#[derive(Debug, Clone, Copy)]
pub enum HoldsChanged<'a> {
    Agents(&'a [String]),
    /// The table was replaced (a snapshot was installed).
    All,
}

/// Called after the lease table has changed, with no lock held, on the
/// applying task: it must be quick and must not wait for an apply.
pub type HoldsListener = Box<dyn Fn(HoldsChanged<'_>) + Send + Sync>;

/// Changes read from history per batch while a follower catches up. A
/// watcher that stops reading holds one batch besides its stream's
/// buffer, so this bounds what a stalled client costs; reading on costs
/// one more RocksDB seek per batch.
const CATCH_UP_BATCH: usize = 64;

/// Stored bytes past which a batch of history ends early: records may be
/// 256 KiB each, and a batch of those would hold 16 MiB.
const BATCH_BYTES: usize = 1024 * 1024;

/// Shared between the state machine (which advances it) and the readers.
pub(crate) struct AppliedState {
    pub revision: AtomicU64,
    pub oldest_revision: AtomicU64,
    pub changes: broadcast::Sender<Applied>,
    /// The registry's identity as applied (secrets included: apply signs
    /// with it); `None` until the cluster has established one.
    pub identity: std::sync::RwLock<Option<Arc<Identity>>>,
    /// The identity's signing key, parsed once per identity change.
    pub signer: std::sync::RwLock<Option<Arc<Signer>>>,
    /// Registered publisher keys, as applied.
    pub publisher_keys: std::sync::RwLock<Arc<Vec<PublisherKey>>>,
    /// Every hold and lease, as applied: only `apply` and `install` change
    /// it, after their batch is written.
    pub leases: std::sync::RwLock<LeaseTable>,
    /// Told of every change to `leases`, after it is made.
    pub holds_listener: std::sync::OnceLock<HoldsListener>,
    /// Parsed records for discovery's answers; the state machine
    /// invalidates what it writes.
    pub records: super::record_cache::RecordCache,
    /// Counts snapshot installs' starts and ends: odd while one runs,
    /// when the database holds part of the old state and part of the new
    /// (`storage::install`). Reads check it before and after, as a seqlock.
    pub installs: AtomicU64,
    /// This node's digests of the state at consistency-check entries.
    pub digests: Arc<super::digest::ReplicaDigests>,
}

impl AppliedState {
    pub fn identity(&self) -> Option<Arc<Identity>> {
        match self.identity.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn publisher_keys(&self) -> Arc<Vec<PublisherKey>> {
        match self.publisher_keys.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn set_publisher_keys(&self, keys: Vec<PublisherKey>) {
        let keys = Arc::new(keys);
        match self.publisher_keys.write() {
            Ok(mut g) => *g = keys,
            Err(poisoned) => *poisoned.into_inner() = keys,
        }
    }

    pub fn leases(&self) -> std::sync::RwLockReadGuard<'_, LeaseTable> {
        self.leases.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn leases_mut(&self) -> std::sync::RwLockWriteGuard<'_, LeaseTable> {
        self.leases.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the listener, if any, of holds just changed.
    pub fn holds_changed(&self, changed: HoldsChanged<'_>) {
        if let Some(listener) = self.holds_listener.get() {
            listener(changed);
        }
    }

    pub fn signer(&self) -> Option<Arc<Signer>> {
        match self.signer.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn set_identity(&self, identity: Option<Identity>) {
        let signer = identity.as_ref().and_then(Identity::signer).map(Arc::new);
        match self.signer.write() {
            Ok(mut g) => *g = signer,
            Err(poisoned) => *poisoned.into_inner() = signer,
        }
        let identity = identity.map(Arc::new);
        match self.identity.write() {
            Ok(mut g) => *g = identity,
            Err(poisoned) => *poisoned.into_inner() = identity,
        }
    }
}

/// A handle for reading the registry's applied state. Cheap to clone.
#[derive(Clone)]
pub struct Reader {
    pub(crate) db: Arc<DB>,
    pub(crate) applied: Arc<AppliedState>,
    /// The state machine's live-record counts (`/metrics` shows each
    /// peer's).
    pub(super) counts: Arc<std::sync::Mutex<super::quota::RecordCounts>>,
}

impl Reader {
    /// This node's digest of its state at the consistency check entry
    /// `index`; `applied` is the log index the node has applied.
    pub async fn state_digest(
        &self,
        index: u64,
        applied: impl Fn() -> u64,
        wait: std::time::Duration,
    ) -> Result<super::StateDigest, super::DigestUnavailable> {
        self.applied.digests.get(index, applied, wait).await
    }

    /// Whether a snapshot install is replacing the state now (reads are
    /// refused meanwhile; readiness says so).
    pub fn installing(&self) -> bool {
        self.settled().is_err()
    }

    /// The install count a read starts at, or `Installing` while a
    /// snapshot install runs.
    fn settled(&self) -> Result<u64, StorageError> {
        let installs = self.applied.installs.load(Ordering::Acquire);
        if installs % 2 == 1 {
            return Err(StorageError::Installing);
        }
        Ok(installs)
    }

    /// Whether what was read since [`Self::settled`] returned `installs`
    /// is one state: no install started meanwhile.
    fn still(&self, installs: u64) -> Result<(), StorageError> {
        std::sync::atomic::fence(Ordering::Acquire);
        if self.applied.installs.load(Ordering::Acquire) != installs {
            return Err(StorageError::Installing);
        }
        Ok(())
    }

    /// `read` over one state: refused while a snapshot install runs, or
    /// when one started before it ended.
    pub(crate) fn consistent<T>(
        &self,
        read: impl FnOnce() -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let installs = self.settled()?;
        let value = read()?;
        self.still(installs)?;
        Ok(value)
    }

    /// Writes a backup of everything applied so far (`storage::backup`).
    pub fn write_backup(
        &self,
        node_id: u64,
        out: &mut dyn std::io::Write,
    ) -> Result<super::BackupSummary, super::BackupError> {
        let installs = self.settled()?;
        let summary = super::backup::write_backup(&self.db, node_id, out)?;
        self.still(installs)?;
        Ok(summary)
    }

    /// Revision of the last applied log entry.
    pub fn applied_revision(&self) -> u64 {
        self.applied.revision.load(Ordering::Acquire)
    }

    /// Oldest revision still in the change history.
    pub fn oldest_revision(&self) -> u64 {
        self.applied.oldest_revision.load(Ordering::Acquire)
    }

    /// The registry's published identity (no secrets), once established.
    pub fn identity(&self) -> Option<Identity> {
        self.applied.identity().map(|i| i.public())
    }

    /// The identity's signing key, once established.
    pub fn signer(&self) -> Option<Arc<Signer>> {
        self.applied.signer()
    }

    /// The live copies kept from `peer` (its authority), as applied.
    pub fn peer_copies(&self, peer: &str) -> u64 {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.of_peer(peer)
    }

    /// The peer revision the federation follower of `peer` has consumed
    /// (0: none yet).
    pub fn federation_cursor(&self, peer: &str) -> Result<u64, StorageError> {
        let cursors: Option<std::collections::BTreeMap<String, u64>> = get_json(
            &self.db,
            super::CF_SM,
            super::state_machine::KEY_FEDERATION_CURSORS,
        )?;
        Ok(cursors.and_then(|c| c.get(peer).copied()).unwrap_or(0))
    }

    /// The applied holds and leases; discovery reads agents' expiry here.
    /// Hold the guard briefly: applies wait for it.
    pub fn leases(&self) -> std::sync::RwLockReadGuard<'_, LeaseTable> {
        self.applied.leases()
    }

    pub fn publisher_keys(&self) -> Arc<Vec<PublisherKey>> {
        self.applied.publisher_keys()
    }

    /// Sets who is told of changes to the lease table (once: false when a
    /// listener was set already).
    pub fn on_holds_changed(&self, listener: HoldsListener) -> bool {
        self.applied.holds_listener.set(listener).is_ok()
    }

    /// Subscribes to changes applied from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Applied> {
        self.applied.changes.subscribe()
    }

    /// The record (or tombstone) with this id.
    pub fn get(&self, id: &str) -> Result<Option<AgentRecord>, StorageError> {
        self.consistent(|| get_json(&self.db, CF_AGENTS, id.as_bytes()))
    }

    /// [`Self::get`], with the size of the record's stored form, always
    /// read from disk: what the record cache is checked against.
    #[cfg(test)]
    pub fn get_sized(&self, id: &str) -> Result<Option<(AgentRecord, usize)>, StorageError> {
        self.consistent(
            || match self.db.get_cf(cf(&self.db, CF_AGENTS)?, id.as_bytes())? {
                Some(bytes) => Ok(Some((serde_json::from_slice(&bytes)?, bytes.len()))),
                None => Ok(None),
            },
        )
    }

    /// The records (or tombstones) with these ids, in order, shared: parsed
    /// once and kept in a bounded cache for the records discovery keeps
    /// returning. Those not in the cache are read from RocksDB in one
    /// batched lookup: a discovery answer reads each of its hits, and in a
    /// directory larger than the cache most of them miss. Each comes with
    /// its stored size, which bounds an answer.
    pub fn get_shared_many(&self, ids: &[&str]) -> Result<Vec<Option<SizedRecord>>, StorageError> {
        self.read_many(ids, true)
    }

    /// As [`Self::get_shared_many`], but a record may come as its summary
    /// (`domain::discovery::parse_summary`): for answers below `full`
    /// detail, which show no more, and parse and keep less.
    pub fn get_summaries(&self, ids: &[&str]) -> Result<Vec<Option<SizedRecord>>, StorageError> {
        self.read_many(ids, false)
    }

    fn read_many(
        &self,
        ids: &[&str],
        whole: bool,
    ) -> Result<Vec<Option<SizedRecord>>, StorageError> {
        self.consistent(|| self.read_many_now(ids, whole))
    }

    fn read_many_now(
        &self,
        ids: &[&str],
        whole: bool,
    ) -> Result<Vec<Option<SizedRecord>>, StorageError> {
        let cache = &self.applied.records;
        let mut out: Vec<Option<SizedRecord>> = ids.iter().map(|id| cache.get(id, whole)).collect();
        let missed: Vec<usize> = (0..ids.len()).filter(|&i| out[i].is_none()).collect();
        if missed.is_empty() {
            return Ok(out);
        }
        let read_at = cache.generation();
        let read = self.db.batched_multi_get_cf(
            cf(&self.db, CF_AGENTS)?,
            missed.iter().map(|&i| ids[i].as_bytes()),
            false,
        );
        for (&i, bytes) in missed.iter().zip(read) {
            let Some(bytes) = bytes? else { continue };
            let record: Arc<AgentRecord> = Arc::new(if whole {
                serde_json::from_slice(&bytes)?
            } else {
                crate::domain::discovery::parse_summary(&bytes)?
            });
            cache.fill(read_at, record.clone(), bytes.len(), whole);
            out[i] = Some((record, bytes.len()));
        }
        Ok(out)
    }

    /// A record with the expiry its lease gives it, both as of the same
    /// applied entry: an apply that changes holds writes its batch and
    /// updates the lease table under the table's write lock, and this read
    /// holds the read lock across both lookups. Read one after the other,
    /// a registration could show its old value with its hold already ended
    /// (expired) — a state that never existed.
    pub fn get_leased(&self, id: &str) -> Result<Option<(AgentRecord, Option<i64>)>, StorageError> {
        let leases = self.leases();
        Ok(self.get(id)?.map(|r| {
            let expiry = leases.expiry_unix(id);
            (r, expiry)
        }))
    }

    /// Visits every record (tombstones included) in id order.
    pub fn scan(&self, mut visit: impl FnMut(AgentRecord)) -> Result<(), StorageError> {
        self.scan_sized(|r, _| visit(r))
    }

    /// An iterator for a pass over every stored record (tombstones
    /// included), not yet positioned; it reads the state as of its
    /// creation.
    fn all_records(&self) -> Result<rocksdb::DBRawIteratorWithThreadMode<'_, DB>, StorageError> {
        self.consistent(|| {
            Ok(self
                .db
                .raw_iterator_cf_opt(cf(&self.db, CF_AGENTS)?, super::bulk_read()))
        })
    }

    /// The live copies kept from peers: (origin authority, id, the
    /// origin's revision of the copy). Each record is decoded only as far
    /// as those members: every peer's listing ends with this scan over the
    /// whole directory (and a new leader starts with one), where building
    /// each record would cost seconds at a million agents.
    pub fn federated_copies(&self) -> Result<Vec<(String, String, u64)>, StorageError> {
        /// What the scan needs of a stored record.
        #[derive(serde::Deserialize)]
        struct Stored {
            envelope: StoredEnvelope,
        }
        #[derive(serde::Deserialize)]
        struct StoredEnvelope {
            #[serde(default)]
            deleted: bool,
            #[serde(default)]
            provenance: Option<StoredProvenance>,
        }
        #[derive(serde::Deserialize)]
        struct StoredProvenance {
            origin_authority: String,
            origin_revision: u64,
        }
        let mut it = self.all_records()?;
        it.seek_to_first();
        let mut copies = Vec::new();
        while let (Some(id), Some(v)) = (it.key(), it.value()) {
            let e = serde_json::from_slice::<Stored>(v)?.envelope;
            if let Some(p) = e.provenance.filter(|_| !e.deleted) {
                let id = String::from_utf8_lossy(id).into_owned();
                copies.push((p.origin_authority, id, p.origin_revision));
            }
            it.next();
        }
        it.status()?;
        Ok(copies)
    }

    /// Visits every record (tombstones included) in id order, with the
    /// size of its stored form.
    pub fn scan_sized(
        &self,
        mut visit: impl FnMut(AgentRecord, usize),
    ) -> Result<(), StorageError> {
        let mut it = self.all_records()?;
        it.seek_to_first();
        while let Some(v) = it.value() {
            visit(serde_json::from_slice(v)?, v.len());
            it.next();
        }
        it.status()?;
        Ok(())
    }

    /// Visits every live record in id order with the index vectors stored
    /// for it (see [`Self::store_index_vectors`]), if any. Stored vectors
    /// of ids that hold no live record are deleted on the way (left by a
    /// deletion the indexer had not yet recorded, or a snapshot install).
    pub fn scan_with_index_vectors(
        &self,
        mut visit: impl FnMut(AgentRecord, Option<&[u8]>),
    ) -> Result<(), StorageError> {
        let vectors_cf = cf(&self.db, CF_INDEX_VECTORS)?;
        let mut records = self.all_records()?;
        let mut vectors = self.db.raw_iterator_cf_opt(vectors_cf, super::bulk_read());
        records.seek_to_first();
        vectors.seek_to_first();
        let mut orphans = rocksdb::WriteBatch::default();
        let mut orphan = |k: &[u8]| {
            if !super::is_index_meta_key(k) {
                orphans.delete_cf(vectors_cf, k);
            }
        };
        while let (Some(key), Some(value)) = (records.key(), records.value()) {
            let record: AgentRecord = serde_json::from_slice(value)?;
            // Vectors before this id belong to no record.
            while let Some(k) = vectors.key().filter(|k| *k < key) {
                orphan(k);
                vectors.next();
            }
            let live = !record.envelope.deleted;
            let stored = vectors.key().filter(|k| *k == key).and(vectors.value());
            let matched = stored.is_some();
            if !live && matched {
                orphan(key);
            }
            if live {
                visit(record, stored);
            }
            if matched {
                vectors.next();
            }
            records.next();
        }
        records.status()?;
        while let Some(k) = vectors.key() {
            orphan(k);
            vectors.next();
        }
        vectors.status()?;
        if !orphans.is_empty() {
            self.db.write(orphans)?;
        }
        Ok(())
    }

    /// The discovery index's vector partitions as last saved, if any.
    pub fn index_partitions(&self) -> Result<Option<Vec<u8>>, StorageError> {
        let vectors_cf = cf(&self.db, CF_INDEX_VECTORS)?;
        Ok(self
            .db
            .get_cf_opt(vectors_cf, super::INDEX_PARTITIONS_KEY, &super::bulk_read())?)
    }

    /// Saves the discovery index's vector partitions (derived data, like
    /// the vectors: written outside Raft).
    pub fn store_index_partitions(&self, bytes: &[u8]) -> Result<(), StorageError> {
        let vectors_cf = cf(&self.db, CF_INDEX_VECTORS)?;
        self.db
            .put_cf(vectors_cf, super::INDEX_PARTITIONS_KEY, bytes)?;
        Ok(())
    }

    /// Stores (or, with None, deletes) agents' index vectors: derived data
    /// the indexer keeps beside the records, written outside Raft. Not in
    /// RocksDB's WAL either: a restart checks each stored vector against
    /// the text it was made from and embeds again what is missing or stale,
    /// so vectors a crash loses cost only their embedding, while logging
    /// them made every write's WAL sync carry them.
    pub fn store_index_vectors(
        &self,
        entries: &[(String, Option<Vec<u8>>)],
    ) -> Result<(), StorageError> {
        let vectors_cf = cf(&self.db, CF_INDEX_VECTORS)?;
        let mut batch = rocksdb::WriteBatch::default();
        for (id, value) in entries {
            match value {
                Some(v) => batch.put_cf(vectors_cf, id.as_bytes(), v),
                None => batch.delete_cf(vectors_cf, id.as_bytes()),
            }
        }
        self.db.write_opt(batch, &super::unlogged())?;
        Ok(())
    }

    /// Visits records (tombstones included) in id order from `start`
    /// (inclusive) while `visit` returns true.
    pub fn scan_from(
        &self,
        start: &str,
        mut visit: impl FnMut(AgentRecord) -> bool,
    ) -> Result<(), StorageError> {
        let mut it = self.consistent(|| Ok(self.db.raw_iterator_cf(cf(&self.db, CF_AGENTS)?)))?;
        it.seek(start.as_bytes());
        while let Some(v) = it.value() {
            if !visit(serde_json::from_slice(v)?) {
                break;
            }
            it.next();
        }
        it.status()?;
        Ok(())
    }

    /// Changes with revision >= `from`, in order: at most `limit` of them,
    /// and no more once they reach `BATCH_BYTES` as stored (at least one).
    pub fn changes_from(&self, from: u64, limit: usize) -> Result<Vec<Change>, StorageError> {
        let mut it = self.consistent(|| Ok(self.db.raw_iterator_cf(cf(&self.db, CF_CHANGES)?)))?;
        it.seek(u64_key(from));
        let mut out = Vec::new();
        let mut bytes = 0;
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if out.len() >= limit || bytes >= BATCH_BYTES || key_u64(k).is_none() {
                break;
            }
            bytes += v.len();
            out.push(serde_json::from_slice(v)?);
            it.next();
        }
        it.status()?;
        Ok(out)
    }

    /// Feeds `sink` every change from revision `next` on, in order, never
    /// skipping or repeating one: history first, then live changes from
    /// `live` (subscribed before `next` was chosen, so nothing falls in
    /// between). A follower that falls behind the live channel, or whose
    /// node installed a snapshot, re-reads the history from where it is.
    /// Ends when `sink` returns false, `stop` completes, or history no
    /// longer reaches back to `next`.
    pub async fn follow<F, S>(
        &self,
        mut live: broadcast::Receiver<Applied>,
        mut next: u64,
        stop: impl Future<Output = ()>,
        mut sink: S,
    ) -> FollowEnd
    where
        S: FnMut(Arc<Change>) -> F,
        F: Future<Output = bool>,
    {
        let mut stop = std::pin::pin!(stop);
        'catch_up: loop {
            let oldest = self.oldest_revision();
            if next < oldest {
                return FollowEnd::Compacted {
                    requested: next,
                    oldest,
                };
            }
            loop {
                let batch = match self.changes_from(next, CATCH_UP_BATCH) {
                    Ok(b) => b,
                    // Its end is announced on `live`: catch up then.
                    Err(StorageError::Installing) => break,
                    Err(e) => return FollowEnd::Failed(e),
                };
                if batch.is_empty() {
                    break;
                }
                for c in batch {
                    next = c.revision + 1;
                    if !sink(Arc::new(c)).await {
                        return FollowEnd::Stopped;
                    }
                }
            }
            loop {
                let received = tokio::select! {
                    r = live.recv() => r,
                    _ = &mut stop => return FollowEnd::Stopped,
                };
                match received {
                    Ok(Applied::Change(c)) if c.revision < next => continue,
                    Ok(Applied::Change(c)) => {
                        next = c.revision + 1;
                        if !sink(c).await {
                            return FollowEnd::Stopped;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_))
                    | Ok(Applied::SnapshotInstalled) => continue 'catch_up,
                    Err(broadcast::error::RecvError::Closed) => return FollowEnd::Stopped,
                }
            }
        }
    }
}
