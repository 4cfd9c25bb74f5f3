//! The audit trail on disk: committed entries in `audit` (written by
//! `apply`, keyed by the replicated sequence, carried by snapshots) and this
//! node's refusals in `audit_local` (keyed by a node-local sequence, never
//! replicated). Both are trimmed by the same retention.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rocksdb::{WriteBatch, DB};

use super::{cf, key_u64, u64_key, AuditSink, DiskSpace, StorageError, CF_AUDIT, CF_AUDIT_LOCAL};
use crate::domain::audit::{AuditEntry, AuditQuery};

/// How much of the trail is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Entries kept per trail (committed, and each node's refusals).
    pub max_entries: u64,
    /// Entries older than this are dropped.
    pub max_age_secs: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            max_entries: 1_000_000,
            max_age_secs: 365 * 86_400,
        }
    }
}

/// Retention runs when a trail's sequence crosses a multiple of this.
pub(super) const TRIM_EVERY: u64 = 256;
/// At most this many entries are dropped for age per trim, so one trim
/// never stalls a write.
const AGE_TRIM_BATCH: usize = 4096;

/// Puts into `batch` the deletions retention asks of `cf_name`, whose
/// newest sequence is `seq`, at `now_unix` (the leader's clock for the
/// committed trail, so every node trims the same entries).
pub(super) fn trim(
    db: &DB,
    batch: &mut WriteBatch,
    cf_name: &'static str,
    seq: u64,
    now_unix: i64,
    retention: Retention,
) -> Result<(), StorageError> {
    let handle = cf(db, cf_name)?;
    let keep_from = seq.saturating_sub(retention.max_entries) + 1;
    let mut first_kept = keep_from;
    let cutoff = now_unix.saturating_sub(i64::try_from(retention.max_age_secs).unwrap_or(i64::MAX));
    let mut it = db.raw_iterator_cf(handle);
    it.seek(u64_key(keep_from));
    let mut seen = 0;
    while let (Some(k), Some(v)) = (it.key(), it.value()) {
        let old = serde_json::from_slice::<AuditEntry>(v)
            .ok()
            .and_then(|e| crate::domain::time::parse(&e.at))
            .is_some_and(|t| t.unix_timestamp() < cutoff);
        if !old || seen >= AGE_TRIM_BATCH {
            break;
        }
        first_kept = key_u64(k).map_or(first_kept, |s| s + 1);
        seen += 1;
        it.next();
    }
    it.status()?;
    batch.delete_range_cf(handle, u64_key(0), u64_key(first_kept));
    Ok(())
}

/// Where a listing of the trail stopped: the last sequence returned from
/// each trail.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditCursor {
    pub committed: u64,
    pub local: u64,
}

/// This node's audit store: writes refusals, lists both trails.
pub struct AuditStore {
    db: Arc<DB>,
    node: u64,
    local_seq: AtomicU64,
    retention: Retention,
    sink: Option<AuditSink>,
    space: Option<DiskSpace>,
    /// The applied state's reader, once the state machine is open: the
    /// committed trail is replaced by a snapshot install, and a listing
    /// refuses while one runs as every read does.
    installs: std::sync::OnceLock<super::Reader>,
}

impl AuditStore {
    pub fn open(
        db: Arc<DB>,
        node: u64,
        retention: Retention,
        sink: Option<AuditSink>,
    ) -> Result<Self, StorageError> {
        let last = {
            let mut it = db.raw_iterator_cf(cf(&db, CF_AUDIT_LOCAL)?);
            it.seek_to_last();
            it.status()?;
            it.key().and_then(key_u64).unwrap_or(0)
        };
        Ok(Self {
            db,
            node,
            local_seq: AtomicU64::new(last),
            retention,
            sink,
            space: None,
            installs: std::sync::OnceLock::new(),
        })
    }

    /// Lists consistently with `reader`'s snapshot installs (set once).
    pub fn watch_installs(&self, reader: super::Reader) {
        let _ = self.installs.set(reader);
    }

    /// Stops storing local refusals while the data directory is short of
    /// space.
    pub fn with_space(mut self, space: DiskSpace) -> Self {
        self.space = Some(space);
        self
    }

    /// Records a refusal (or an admin action that changed nothing
    /// replicated) on this node.
    pub fn record_local(&self, mut entry: AuditEntry) -> Result<AuditEntry, StorageError> {
        let seq = self.local_seq.fetch_add(1, Ordering::Relaxed) + 1;
        entry.seq = seq;
        entry.node = Some(self.node);
        if let Some(Err(short)) = self.space.as_ref().map(DiskSpace::check) {
            // A flood of refused writes must not fill the last of the disk
            // (RocksDB would then stop taking the Raft log's writes too):
            // while space is short, refusals go to the JSON-lines file only.
            tracing::debug!(error = %short, "refusal not stored in the local trail");
            if let Some(sink) = &self.sink {
                sink.send(entry.clone());
            }
            return Ok(entry);
        }
        let mut batch = WriteBatch::default();
        batch.put_cf(
            cf(&self.db, CF_AUDIT_LOCAL)?,
            u64_key(seq),
            serde_json::to_vec(&entry)?,
        );
        if seq.is_multiple_of(TRIM_EVERY) {
            let now = time::OffsetDateTime::now_utc().unix_timestamp();
            trim(
                &self.db,
                &mut batch,
                CF_AUDIT_LOCAL,
                seq,
                now,
                self.retention,
            )?;
        }
        self.db.write(batch)?;
        if let Some(sink) = &self.sink {
            sink.send(entry.clone());
        }
        Ok(entry)
    }

    /// Up to `limit` entries matching `query` after `cursor`, oldest first,
    /// the two trails merged by time; and the cursor for the next page
    /// when there is more.
    pub fn list(
        &self,
        query: &AuditQuery,
        cursor: AuditCursor,
        limit: usize,
    ) -> Result<(Vec<AuditEntry>, Option<AuditCursor>), StorageError> {
        let committed = match self.installs.get() {
            Some(reader) => {
                reader.consistent(|| self.matching(CF_AUDIT, query, cursor.committed, limit + 1))?
            }
            None => self.matching(CF_AUDIT, query, cursor.committed, limit + 1)?,
        };
        let local = self.matching(CF_AUDIT_LOCAL, query, cursor.local, limit + 1)?;
        let available = committed.len() + local.len();
        // A merge, not a sort: each trail stays in its own order, so what
        // a page returns of it is a prefix and the cursor skips nothing.
        let time = |e: &AuditEntry| crate::domain::time::parse(&e.at);
        let (mut c, mut l) = (
            committed.into_iter().peekable(),
            local.into_iter().peekable(),
        );
        let mut merged = Vec::with_capacity(limit);
        while merged.len() < limit {
            let take_local = match (c.peek(), l.peek()) {
                (Some(a), Some(b)) => time(b) < time(a),
                (None, Some(_)) => true,
                (_, None) => false,
            };
            match if take_local { l.next() } else { c.next() } {
                Some(e) => merged.push(e),
                None => break,
            }
        }
        let more = available > merged.len();
        let mut next = cursor;
        for e in &merged {
            match e.node {
                None => next.committed = next.committed.max(e.seq),
                Some(_) => next.local = next.local.max(e.seq),
            }
        }
        Ok((merged, more.then_some(next)))
    }

    fn matching(
        &self,
        cf_name: &'static str,
        query: &AuditQuery,
        after: u64,
        limit: usize,
    ) -> Result<Vec<AuditEntry>, StorageError> {
        let mut it = self.db.raw_iterator_cf(cf(&self.db, cf_name)?);
        it.seek(u64_key(after.saturating_add(1)));
        let mut out = Vec::new();
        while let Some(v) = it.value() {
            let e: AuditEntry = serde_json::from_slice(v)?;
            if query.matches(&e) {
                out.push(e);
                if out.len() >= limit {
                    break;
                }
            }
            it.next();
        }
        it.status()?;
        Ok(out)
    }
}
