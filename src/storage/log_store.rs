//! The Raft log store.
//!
//! Correctness contract kept here: an append is reported flushed to openraft
//! (`LogFlushed::log_io_completed`) only after the WAL holding it is synced
//! to disk, and votes are synced before `save_vote` returns. So a node that
//! acknowledged an entry or a vote still has it after a kill -9.
//!
//! Group commit: for a leader's own entries, `append` writes them without
//! waiting for the disk (so they are readable at once) and hands the flush
//! callback to a syncer thread. The syncer takes every callback queued
//! meanwhile, syncs the WAL once, and then completes them in order. Under
//! concurrent writes one fsync covers many entries, and the leader's core
//! goes on replicating while the disk works.
//!
//! A follower's append is synced in place: openraft's core waits for that
//! flush before it answers the leader, which sends it one AppendEntries at
//! a time, so there is nothing to gather and the hop to the syncer thread
//! and back was two thread wake-ups per write. The core's worker thread
//! waits out the fsync; the runtime's other workers serve everything else
//! (a runtime of one worker keeps the syncer for followers too).

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, OptionalSend, RaftLogReader, StorageIOError, Vote};
use rocksdb::{WriteBatch, WriteOptions, DB};

use super::{cf, get_json, key_u64, u64_key, StorageError as LocalError, CF_LOG, CF_RAFT};
use crate::consensus::codec::{self, Encoding};
use crate::consensus::{LogId, NodeId, StorageError, TypeConfig};

pub(crate) const KEY_VOTE: &[u8] = b"vote";
pub(crate) const KEY_COMMITTED: &[u8] = b"committed";
pub(crate) const KEY_LAST_PURGED: &[u8] = b"last_purged";
/// This data directory's incarnation: random, made with the directory, so a
/// wiped or replaced directory is told apart from the one a member joined
/// with (`consensus::membership_check`).
const KEY_INCARNATION: &[u8] = b"incarnation";

/// RocksDB-backed Raft log. Cheap to clone; clones share the database.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
    /// Last committed index openraft reported, for status and metrics.
    committed: Arc<AtomicU64>,
    /// Flush callbacks waiting for the next WAL sync.
    syncer: Arc<Syncer>,
    incarnation: Arc<str>,
    /// How new entries are written; entries of either encoding are read.
    encoding: Encoding,
}

/// The syncer thread's handle. Dropped with the last `LogStore` clone, it
/// closes the queue and joins the thread, so the thread's reference to the
/// database is gone before the caller goes on. Otherwise the thread could
/// close RocksDB after `main` returned, racing RocksDB's static destructors
/// ("pthread lock: Invalid argument", an abort at exit).
struct Syncer {
    queue: Option<mpsc::Sender<LogFlushed<TypeConfig>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Syncer {
    fn send(&self, callback: LogFlushed<TypeConfig>) {
        let refused = match &self.queue {
            Some(queue) => queue.send(callback).err().map(|mpsc::SendError(c)| c),
            None => Some(callback),
        };
        if let Some(callback) = refused {
            callback.log_io_completed(Err(std::io::Error::other("the log syncer has stopped")));
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the raft log syncer thread panicked");
            }
        }
    }
}

/// Syncs the WAL for every batch of queued callbacks, then completes them.
/// Ends when the last `LogStore` clone is dropped.
fn run_syncer(db: Arc<DB>, queue: mpsc::Receiver<LogFlushed<TypeConfig>>) {
    while let Ok(first) = queue.recv() {
        let mut waiting = vec![first];
        waiting.extend(queue.try_iter());
        let synced = sync_wal(&db);
        for callback in waiting {
            callback.log_io_completed(
                synced
                    .as_ref()
                    .map(|_| ())
                    .map_err(|e| std::io::Error::other(e.to_string())),
            );
        }
    }
}

/// Syncs the WAL (every append written so far), timed for the metrics.
fn sync_wal(db: &DB) -> Result<(), rocksdb::Error> {
    let started = std::time::Instant::now();
    let synced = db.flush_wal(true);
    crate::metrics::observe_log_sync(started.elapsed());
    synced
}

/// Whether the runtime has workers besides the one that would wait out an
/// fsync in place. With a single worker (one CPU, or `TOKIO_WORKER_THREADS
/// = 1`) that wait would stall every request the node serves, so its
/// appends go to the syncer thread like a leader's.
fn other_workers_serve() -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|h| h.metrics().num_workers() > 1)
}

fn synced() -> WriteOptions {
    let mut o = WriteOptions::default();
    o.set_sync(true);
    o
}

fn read_err(e: impl Into<LocalError>) -> StorageError {
    StorageIOError::read_logs(&e.into()).into()
}

fn write_err(e: impl Into<LocalError>) -> StorageError {
    StorageIOError::write_logs(&e.into()).into()
}

impl LogStore {
    pub fn new(db: Arc<DB>) -> Result<Self, LocalError> {
        let committed: Option<Option<LogId>> = get_json(&db, CF_RAFT, KEY_COMMITTED)?;
        let index = committed.flatten().map(|l| l.index).unwrap_or(0);
        let incarnation = match get_json::<String>(&db, CF_RAFT, KEY_INCARNATION)? {
            Some(i) => i,
            None => {
                let mut bytes = [0u8; 12];
                getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
                let made = crate::crypto::hex(&bytes);
                db.put_cf_opt(
                    cf(&db, CF_RAFT)?,
                    KEY_INCARNATION,
                    serde_json::to_vec(&made)?,
                    &synced(),
                )?;
                made
            }
        };
        let (sender, queue) = mpsc::channel();
        let sync_db = db.clone();
        let thread = std::thread::Builder::new()
            .name("raft-log-sync".into())
            .spawn(move || run_syncer(sync_db, queue))?;
        Ok(Self {
            db,
            committed: Arc::new(AtomicU64::new(index)),
            syncer: Arc::new(Syncer {
                queue: Some(sender),
                thread: Some(thread),
            }),
            incarnation: incarnation.into(),
            encoding: Encoding::Binary,
        })
    }

    /// Writes new entries in `encoding` (`raft_encoding`).
    pub fn with_encoding(mut self, encoding: Encoding) -> Self {
        self.encoding = encoding;
        self
    }

    /// This data directory's incarnation.
    pub fn incarnation(&self) -> &str {
        &self.incarnation
    }

    /// The committed index as openraft last saved it.
    pub fn committed_index(&self) -> Arc<AtomicU64> {
        self.committed.clone()
    }

    fn meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, LocalError> {
        get_json(&self.db, CF_RAFT, key)
    }

    fn put_meta<T: serde::Serialize>(&self, key: &[u8], value: &T) -> Result<(), LocalError> {
        let bytes = serde_json::to_vec(value)?;
        self.db
            .put_cf_opt(cf(&self.db, CF_RAFT)?, key, bytes, &synced())?;
        Ok(())
    }

    fn last_entry_log_id(&self) -> Result<Option<LogId>, LocalError> {
        let mut it = self.db.raw_iterator_cf(cf(&self.db, CF_LOG)?);
        it.seek_to_last();
        it.status()?;
        match it.value() {
            Some(v) => Ok(Some(codec::decode_entry(v)?.log_id)),
            None => Ok(None),
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(&n) => n,
            Bound::Excluded(&n) => n.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let log = cf(&self.db, CF_LOG).map_err(read_err)?;
        let mut it = self.db.raw_iterator_cf(log);
        it.seek(u64_key(start));
        let mut out = Vec::new();
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            let Some(index) = key_u64(k) else { break };
            if !range.contains(&index) {
                break;
            }
            out.push(codec::decode_entry(v).map_err(read_err)?);
            it.next();
        }
        it.status().map_err(read_err)?;
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = self.meta(KEY_LAST_PURGED).map_err(read_err)?;
        let last_log_id = self
            .last_entry_log_id()
            .map_err(read_err)?
            .or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.put_meta(KEY_VOTE, vote)
            .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.meta(KEY_VOTE)
            .map_err(|e| StorageIOError::read_vote(&e).into())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Committed need not be synced: losing it only delays re-applying.
        let bytes = serde_json::to_vec(&committed).map_err(write_err)?;
        let raft = cf(&self.db, CF_RAFT).map_err(write_err)?;
        self.db
            .put_cf(raft, KEY_COMMITTED, bytes)
            .map_err(write_err)?;
        if let Some(c) = committed {
            self.committed.store(c.index, Ordering::Release);
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self
            .meta::<Option<LogId>>(KEY_COMMITTED)
            .map_err(read_err)?
            .flatten())
    }

    #[tracing::instrument(level = "trace", skip_all)]
    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let started = std::time::Instant::now();
        let log = cf(&self.db, CF_LOG).map_err(write_err)?;
        let mut batch = WriteBatch::default();
        let mut count = 0;
        for entry in entries {
            batch.put_cf(
                log,
                u64_key(entry.log_id.index),
                codec::encode_entry(&entry, self.encoding).map_err(write_err)?,
            );
            count += 1;
        }
        self.db.write(batch).map_err(write_err)?;
        crate::metrics::observe_log_append(started.elapsed(), count);
        if callback.is_awaited() && other_workers_serve() {
            // A follower's append: openraft waits for the flush before it
            // does anything else, so there is nothing to gather and nothing
            // the core could do meanwhile. Syncing here spares the hand-off
            // to the syncer thread and back (two thread wake-ups a write).
            sync_wal(&self.db).map_err(write_err)?;
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        // A leader's own append: the syncer thread syncs the WAL before
        // reporting the entries flushed, once for every append queued
        // meanwhile, while the core goes on replicating.
        self.syncer.send(callback);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let log = cf(&self.db, CF_LOG).map_err(write_err)?;
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(log, u64_key(log_id.index), u64_key(u64::MAX));
        batch.delete_cf(log, u64_key(u64::MAX));
        self.db.write_opt(batch, &synced()).map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // Record the purge point first: a crash between the two steps leaves
        // extra entries below it, which readers never ask for.
        self.put_meta(KEY_LAST_PURGED, &log_id).map_err(write_err)?;
        let log = cf(&self.db, CF_LOG).map_err(write_err)?;
        self.db
            .delete_range_cf(log, u64_key(0), u64_key(log_id.index.saturating_add(1)))
            .map_err(write_err)
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;
    use crate::consensus::{Command, Proposal};

    /// A follower's append (one openraft waits for) completes on a runtime
    /// of several workers, where it is synced in place, and on one of a
    /// single worker, where the syncer thread takes it so the worker is
    /// never held by an fsync.
    #[test]
    fn an_awaited_append_completes_whichever_the_runtime() {
        use openraft::storage::RaftLogStorageExt;
        let one = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let two = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        for (runtime, inline) in [(one, false), (two, true)] {
            runtime.block_on(async {
                assert_eq!(other_workers_serve(), inline);
                let dir = tempfile::tempdir().unwrap();
                let db =
                    super::super::open(dir.path(), super::super::DEFAULT_MAX_WAL_BYTES).unwrap();
                let mut store = LogStore::new(db).unwrap();
                let entries = (1..=3).map(|index| Entry::<TypeConfig> {
                    log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
                    payload: EntryPayload::Blank,
                });
                store.blocking_append(entries).await.unwrap();
                let state = store.get_log_state().await.unwrap();
                assert_eq!(state.last_log_id.map(|l| l.index), Some(3));
            });
        }
    }

    /// A data directory whose log was written by a version before the
    /// binary encoding, and then appended to by this one, reads whole.
    #[tokio::test]
    async fn a_log_of_both_encodings_reads_whole() {
        let dir = tempfile::tempdir().unwrap();
        let db = super::super::open(dir.path(), super::super::DEFAULT_MAX_WAL_BYTES).unwrap();
        let entry = |index: u64| Entry::<TypeConfig> {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(
                Proposal::new(&Command::Note {
                    now: format!("2026-11-26T00:00:0{index}Z"),
                })
                .unwrap(),
            ),
        };
        let log = cf(&db, CF_LOG).unwrap();
        for index in 1..=4 {
            // Entries 1 and 2 exactly as the JSON-only versions wrote them.
            let bytes = if index <= 2 {
                serde_json::to_vec(&entry(index)).unwrap()
            } else {
                codec::encode_entry(&entry(index), Encoding::Binary).unwrap()
            };
            db.put_cf(log, u64_key(index), bytes).unwrap();
        }
        let mut store = LogStore::new(db).unwrap();
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id.map(|l| l.index), Some(4));
        let read = store.try_get_log_entries(1..=4).await.unwrap();
        assert_eq!(read.len(), 4);
        for (i, e) in read.iter().enumerate() {
            assert_eq!(e.log_id, entry(i as u64 + 1).log_id);
            let EntryPayload::Normal(p) = &e.payload else {
                panic!("entry {} is not a command", i + 1)
            };
            let Command::Note { now } = p.command().unwrap() else {
                panic!("entry {} decoded to another command", i + 1)
            };
            assert_eq!(now, format!("2026-11-26T00:00:0{}Z", i + 1));
        }
    }
}
