//! RocksDB storage: one database per node holding the Raft log, Raft's own
//! metadata and the registry state machine in separate column families.
//!
//! Keys: log entries and changes are keyed by big-endian u64 index/revision so
//! RocksDB's byte order is numeric order; agents are keyed by id bytes.
//! Values are JSON, which keeps unknown metadata fields exactly as published.

mod audit;
mod audit_file;
mod backup;
mod checkpoint;
mod digest;
mod format;
mod install;
mod log_store;
mod quota;
mod reader;
mod record_cache;
mod space;
mod state_machine;

pub use audit::{AuditCursor, AuditStore, Retention};
pub use audit_file::{check as check_audit_file, open as audit_file_sink, AuditSink, Rotation};
pub use backup::{
    apply_log, restore, scratch_copy, verify_backup, write_backup, BackupEnd, BackupError,
    BackupHeader, BackupSummary, RestoreTarget, BACKUP_FORMAT,
};
pub use checkpoint::Outgoing;
pub use digest::{DigestUnavailable, SectionDigest, StateDigest, DIGEST_FORMAT};
pub use format::DATA_FORMAT;
pub use log_store::LogStore;
pub use reader::{Applied, FollowEnd, HoldsChanged, HoldsListener, Reader};
pub use record_cache::DEFAULT_RECORD_CACHE_BYTES;
pub use space::{DiskSpace, NoSpace, SpaceStats, DEFAULT_RESERVE_BYTES};
pub use state_machine::{outgoing_snapshot, SnapshotStats, SnapshotWeight, StateMachine};

use std::path::Path;
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, Options, DB};

pub(crate) const CF_LOG: &str = "raft_log";
pub(crate) const CF_RAFT: &str = "raft_meta";
pub(crate) const CF_SM: &str = "sm_meta";
pub(crate) const CF_AGENTS: &str = "agents";
pub(crate) const CF_CHANGES: &str = "changes";
pub(crate) const CF_AUDIT: &str = "audit";
pub(crate) const CF_AUDIT_LOCAL: &str = "audit_local";
/// Agents' holds and shared leases (`domain::lease`).
pub(crate) const CF_LEASES: &str = "leases";
/// The discovery index's vectors per agent (`index::search`), derived from
/// the records and local to this node: never replicated, snapshotted or
/// backed up; kept so that a restart need not embed every record again.
pub(crate) const CF_INDEX_VECTORS: &str = "index_vectors";
/// The key in [`CF_INDEX_VECTORS`] of the index's vector partitions (see
/// `index::vectors::SavedPartitions`). Agent ids hold no control
/// characters, so keys that start with NUL are never an agent's.
const INDEX_PARTITIONS_KEY: &[u8] = b"\0partitions";

/// Whether a key of [`CF_INDEX_VECTORS`] is the index's own (such as
/// [`INDEX_PARTITIONS_KEY`]) rather than an agent's vectors.
fn is_index_meta_key(key: &[u8]) -> bool {
    key.starts_with(b"\0")
}

/// Storage failures. They are fatal to Raft (openraft stops the node), so
/// anything a client can cause is handled before it reaches storage.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("corrupt stored value: {0}")]
    Codec(#[from] serde_json::Error),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("column family {0} missing")]
    MissingColumnFamily(&'static str),
    #[error("{0}")]
    Format(String),
    #[error("corrupt log entry: {0}")]
    LogEntry(#[from] crate::consensus::codec::CodecError),
    /// This node is replacing its state with a snapshot from the leader;
    /// until it has, what it holds is part old and part new.
    #[error("this node is installing a snapshot from the leader; retry shortly or read from another node")]
    Installing,
    /// A log entry asks for apply rules this binary does not follow: it is
    /// older than the release the cluster has moved to.
    #[error("log entry {entry} needs apply rules {asked}; this binary follows {follows}: run the release the rest of the cluster runs")]
    NewerRules {
        entry: String,
        asked: u32,
        follows: u32,
    },
}

/// Upper bound of the shared block cache: the blocks of about 50k records
/// of a few KiB, those requests read most (whole-directory scans bypass
/// it). Beyond it records are read through the OS page cache, which is not
/// the process's memory; every node holds the whole directory's index, so
/// the process's own memory is kept for that.
const BLOCK_CACHE_BYTES: usize = 128 << 20;

/// Default bound of the WAL (`[storage] max_wal_bytes`).
pub const DEFAULT_MAX_WAL_BYTES: u64 = 32 << 20;

/// Upper bound of what one compaction reads (RocksDB's default is 1.6 GiB
/// with its default table size); it also bounds the room the free-space
/// check keeps for compactions of a large column family.
const MAX_COMPACTION_BYTES: u64 = 1 << 30;

/// The column families, in the order they are opened.
const COLUMN_FAMILIES: [&str; 9] = [
    CF_LOG,
    CF_RAFT,
    CF_SM,
    CF_AGENTS,
    CF_CHANGES,
    CF_AUDIT,
    CF_AUDIT_LOCAL,
    CF_LEASES,
    CF_INDEX_VECTORS,
];

/// What compacting the largest column family may write before it deletes
/// its inputs. While a column family is smaller than RocksDB's base level
/// target (256 MiB) its tables all sit in one level, and a compaction of
/// newly flushed tables rewrites every one of them: the room is its whole
/// size. Larger ones compact a part at a time, bounded by
/// [`MAX_COMPACTION_BYTES`].
pub(crate) fn compaction_headroom(db: &DB) -> u64 {
    COLUMN_FAMILIES
        .iter()
        .filter_map(|name| db.cf_handle(name))
        .filter_map(|cf| {
            db.property_int_value_cf(cf, rocksdb::properties::LIVE_SST_FILES_SIZE)
                .ok()
                .flatten()
        })
        .max()
        .unwrap_or(0)
        .min(MAX_COMPACTION_BYTES)
}

/// Opens (or creates) the node's database under `dir`, its memtables
/// unbounded but by the WAL's flushes (tools, tests, a restore).
pub fn open(dir: &Path, max_wal_bytes: u64) -> Result<Arc<DB>, StorageError> {
    open_bounded(dir, max_wal_bytes, 0)
}

/// [`open`], flushing every memtable once together they take
/// `memtable_bytes` of memory (0: no bound). A serving node bounds them by
/// its free-space reserve: their flush takes its room from the reserve
/// (`DiskSpace`), and the WAL's bound alone does not bound them, since the
/// state machine and the index's vectors are written without the WAL: a
/// WAL of log entries leaves several times its size to flush (each record
/// is also stored as itself and in its change).
pub fn open_bounded(
    dir: &Path,
    max_wal_bytes: u64,
    memtable_bytes: u64,
) -> Result<Arc<DB>, StorageError> {
    std::fs::create_dir_all(dir)?;
    format::check_and_upgrade(dir)?;
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    // A restart flushes what the WAL holds into new tables before the node
    // serves; bounding the WAL bounds the space that takes (the reserve of
    // `DiskSpace` keeps it free), so a node whose disk filled up can start.
    opts.set_max_total_wal_size(max_wal_bytes);
    opts.set_db_write_buffer_size(usize::try_from(memtable_bytes).unwrap_or(usize::MAX));
    // The state machine writes without the WAL (its WAL is the Raft log:
    // `StateMachine::apply_batch`); flushing every column family together
    // keeps what reaches disk one applied state, never records of one
    // entry beside the applied log id of another.
    opts.set_atomic_flush(true);
    // Compactions (RocksDB's low-priority pool) run at the lowest CPU
    // priority: on a busy node they take the cores' idle time instead of
    // time from requests and Raft. Flushes keep their normal priority:
    // writes wait for them when memtables fill.
    let mut env = rocksdb::Env::new()?;
    env.lower_thread_pool_cpu_priority();
    opts.set_env(&env);
    // One LRU block cache for every column family. RocksDB's default (a
    // small cache per table) leaves discovery reading the returned records
    // through the OS page cache, decompressing their blocks on every
    // request. The cache only fills as blocks are read.
    let cache = rocksdb::Cache::new_lru_cache(BLOCK_CACHE_BYTES);
    let mut table = rocksdb::BlockBasedOptions::default();
    table.set_block_cache(&cache);
    // Records are read by id on every discovery answer (each hit's stored
    // record): their tables also get a hash index inside each block (no
    // binary search over a block's keys) and bloom filters (a table or
    // level without the id is skipped unread), and their memtable a whole
    // key filter (a read of an id not written lately skips its skip list).
    let mut records = rocksdb::BlockBasedOptions::default();
    records.set_block_cache(&cache);
    records.set_data_block_index_type(rocksdb::DataBlockIndexType::BinaryAndHash);
    records.set_data_block_hash_ratio(0.75);
    records.set_bloom_filter(10.0, false);
    let cfs = COLUMN_FAMILIES.into_iter().map(|name| {
        let mut o = Options::default();
        o.set_max_compaction_bytes(MAX_COMPACTION_BYTES);
        // Compression is an option of each column family: the database's
        // own options reach only the default one, which holds nothing.
        // The history (log, changes, audit) is written once and read in
        // bulk, so it is compressed. Records stay as they are: discovery
        // reads them one by one, and decompressing each block the cache
        // misses cost a 100k directory's queries 11 % at p50. Vectors do
        // not compress.
        if [CF_LOG, CF_CHANGES, CF_AUDIT, CF_AUDIT_LOCAL].contains(&name) {
            o.set_compression_type(rocksdb::DBCompressionType::Lz4);
        }
        if name == CF_AGENTS {
            o.set_block_based_table_factory(&records);
            o.set_memtable_prefix_bloom_ratio(0.02);
            o.set_memtable_whole_key_filtering(true);
        } else {
            o.set_block_based_table_factory(&table);
        }
        ColumnFamilyDescriptor::new(name, o)
    });
    Ok(Arc::new(DB::open_cf_descriptors(
        &opts,
        dir.join("db"),
        cfs,
    )?))
}

pub(crate) fn cf<'a>(
    db: &'a DB,
    name: &'static str,
) -> Result<&'a rocksdb::ColumnFamily, StorageError> {
    db.cf_handle(name)
        .ok_or(StorageError::MissingColumnFamily(name))
}

/// Read options for a pass over a whole column family: its blocks are read
/// once, and caching them would only evict the blocks requests keep
/// reading (a restart's scans would otherwise fill the cache with the
/// whole directory).
pub(crate) fn bulk_read() -> rocksdb::ReadOptions {
    let mut opts = rocksdb::ReadOptions::default();
    opts.fill_cache(false);
    opts
}

/// Write options for the applied state, which RocksDB's WAL does not log:
/// the Raft log is its log (`StateMachine::apply_batch`, `install`).
pub(crate) fn unlogged() -> rocksdb::WriteOptions {
    let mut opts = rocksdb::WriteOptions::default();
    opts.disable_wal(true);
    opts
}

pub(crate) fn u64_key(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

pub(crate) fn key_u64(k: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(k.try_into().ok()?))
}

fn get_json<T: serde::de::DeserializeOwned>(
    db: &DB,
    cf_name: &'static str,
    key: &[u8],
) -> Result<Option<T>, StorageError> {
    match db.get_cf(cf(db, cf_name)?, key)? {
        Some(bytes) => Ok(Some(serde_json::from_slice(&bytes)?)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod conformance;

#[cfg(test)]
mod tests {
    use super::*;

    /// The history (the log, changes, the audit trail) is compressed on
    /// disk; records and vectors, read one by one, are not.
    #[test]
    fn the_history_is_compressed_and_records_and_vectors_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path(), DEFAULT_MAX_WAL_BYTES).unwrap();
        let value = br#"{"description":"translates text between languages"}"#.repeat(40);
        let size = |name: &'static str| {
            let cf = cf(&db, name).unwrap();
            for i in 0..2_000u64 {
                db.put_cf(cf, u64_key(i), &value).unwrap();
            }
            db.flush_cf(cf).unwrap();
            db.property_int_value_cf(cf, "rocksdb.total-sst-files-size")
                .unwrap()
                .unwrap()
        };
        let written = 2_000 * value.len() as u64;
        for name in [CF_CHANGES, CF_LOG, CF_AUDIT, CF_AUDIT_LOCAL] {
            assert!(size(name) < written / 4, "{name} is not compressed");
        }
        for name in [CF_AGENTS, CF_INDEX_VECTORS] {
            assert!(size(name) > written, "{name} is compressed");
        }
    }
}
