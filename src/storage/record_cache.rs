//! Parsed records kept for the read path. Discovery reads the stored
//! record of every hit it returns (what is stored now, not what was
//! indexed); parsing those from RocksDB was about a fifth of a query's
//! time. The cache is bounded by the memory its records take (estimated
//! from their stored size, `[storage] record_cache_bytes`), so a directory
//! of a million agents keeps only its hot records parsed.
//!
//! An entry is a whole record or a summary (what a discovery answer below
//! `full` detail shows, `domain::discovery::parse_summary`): a summary
//! takes about half the memory of a whole record, so the same bound holds
//! about twice as many of the records discovery keeps returning. A whole
//! record serves both kinds of read; a summary only summary reads.
//!
//! Coherence: an apply writes its batch, then [`RecordCache::invalidate`]s
//! the records it wrote, before it publishes the new applied revision. A
//! reader that parsed a record from disk inserts it only if no
//! invalidation ran since it began ([`RecordCache::fill`] compares a
//! generation counter), so a value read before a write can never be
//! cached after it.

use std::sync::{Arc, Mutex};

use quick_cache::sync::Cache;
use quick_cache::Weighter;

use crate::domain::AgentRecord;

/// Memory the parsed records may take by default. It holds a directory of
/// about 12,000 typical agents whole: at 10,000 agents, one in three of a
/// query's records missed the 24 MiB it had before, and reading and
/// parsing the misses was a fifth of the query (p50 278 against 200 µs with
/// everything held). A million agents' node stays under 4 GiB with it.
pub const DEFAULT_RECORD_CACHE_BYTES: u64 = 64 << 20;
/// Parsed, a record takes about five times its stored (JSON) size: every
/// string and map is an allocation of its own (measured with `agentry
/// bench discover`: 8 MiB of stored records grew the node by 43 MiB).
const PARSED_PER_STORED: u64 = 5;
/// A typical stored record, for sizing the cache's table.
const TYPICAL_BYTES: u64 = 2048;

/// A record read for an answer, with the size of its stored form.
pub type SizedRecord = (Arc<AgentRecord>, usize);

#[derive(Clone)]
struct Cached {
    record: Arc<AgentRecord>,
    /// Its stored (JSON) size.
    stored: u32,
    /// False for a summary.
    whole: bool,
}

#[derive(Clone)]
struct ByParsedSize;

impl Weighter<String, Cached> for ByParsedSize {
    fn weight(&self, _id: &String, value: &Cached) -> u64 {
        parsed_bytes(value.stored as usize, value.whole).max(1)
    }
}

/// The estimated memory of a parsed record, whole or as a summary.
fn parsed_bytes(stored_bytes: usize, whole: bool) -> u64 {
    if whole {
        stored_bytes as u64 * PARSED_PER_STORED
    } else {
        summary_bytes(stored_bytes)
    }
}

/// A summary's memory, estimated from the record's stored size: its
/// structs, and the strings it keeps (a subset of the stored text) with
/// the allocations' overhead. Measured on `agentry bench discover`'s
/// records: stored in 1,499 bytes, a record's allocations take 6,079 bytes
/// whole and 2,980 as a summary (estimated 7,495 and 3,506).
fn summary_bytes(stored_bytes: usize) -> u64 {
    (std::mem::size_of::<AgentRecord>() + stored_bytes * 5 / 4) as u64
}

pub(crate) struct RecordCache {
    cache: Cache<String, Cached, ByParsedSize>,
    /// Bumped by every invalidation; held while filling, so a fill and an
    /// invalidation never interleave.
    generation: Mutex<u64>,
}

impl Default for RecordCache {
    fn default() -> Self {
        let bytes = DEFAULT_RECORD_CACHE_BYTES;
        Self {
            cache: Cache::with_weighter(
                (bytes / summary_bytes(TYPICAL_BYTES as usize)) as usize,
                bytes,
                ByParsedSize,
            ),
            generation: Mutex::new(0),
        }
    }
}

impl RecordCache {
    /// Bounds the parsed records to about `bytes` (0: keeps none).
    pub fn set_capacity(&self, bytes: u64) {
        self.cache.set_capacity(bytes);
    }

    /// The record with this id, if kept: whole, or (`whole` false) whole
    /// or as a summary; with its stored size.
    pub fn get(&self, id: &str, whole: bool) -> Option<SizedRecord> {
        self.cache
            .get(id)
            .filter(|c| c.whole || !whole)
            .map(|c| (c.record, c.stored as usize))
    }

    /// The generation to pass to [`Self::fill`], taken before reading disk.
    pub fn generation(&self) -> u64 {
        *self.generation.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `record`, whole or (`whole` false) a summary, read from
    /// `stored_bytes` on disk after [`Self::generation`] returned `read_at`,
    /// unless something was invalidated since.
    pub fn fill(&self, read_at: u64, record: Arc<AgentRecord>, stored_bytes: usize, whole: bool) {
        let generation = self.generation.lock().unwrap_or_else(|e| e.into_inner());
        if *generation == read_at {
            let id = record.metadata.id.clone();
            self.cache.insert(
                id,
                Cached {
                    record,
                    stored: u32::try_from(stored_bytes).unwrap_or(u32::MAX),
                    whole,
                },
            );
        }
    }

    /// Forgets the records with these ids (written by an apply).
    pub fn invalidate<'a>(&self, ids: impl IntoIterator<Item = &'a String>) {
        let mut generation = self.generation.lock().unwrap_or_else(|e| e.into_inner());
        *generation += 1;
        for id in ids {
            self.cache.remove(id.as_str());
        }
    }

    /// Forgets every record (a snapshot replaced the state).
    pub fn clear(&self) {
        let mut generation = self.generation.lock().unwrap_or_else(|e| e.into_inner());
        *generation += 1;
        self.cache.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, description: &str) -> Arc<AgentRecord> {
        let metadata = serde_json::json!({"id": id, "name": id, "description": description});
        Arc::new(AgentRecord {
            metadata: serde_json::from_value(metadata).unwrap(),
            envelope: Default::default(),
        })
    }

    #[test]
    fn a_fill_that_raced_an_invalidation_is_not_kept() {
        let cache = RecordCache::default();
        let at = cache.generation();
        cache.fill(at, record("a", "first"), 100, true);
        assert_eq!(
            cache
                .get("a", true)
                .map(|(r, _)| r.metadata.description.clone()),
            Some("first".to_string())
        );
        // A reader reads the old value from disk, then a write lands.
        let read_at = cache.generation();
        cache.invalidate([&"a".to_string()]);
        assert!(cache.get("a", true).is_none());
        cache.fill(read_at, record("a", "first"), 100, true);
        assert!(cache.get("a", true).is_none(), "a stale read was cached");
        // A read that began after the write is kept.
        let at = cache.generation();
        cache.fill(at, record("a", "second"), 100, true);
        assert_eq!(
            cache
                .get("a", true)
                .map(|(r, _)| r.metadata.description.clone()),
            Some("second".to_string())
        );
        cache.clear();
        assert!(cache.get("a", true).is_none());
    }

    #[test]
    fn a_summary_serves_summary_reads_only_and_a_whole_record_both() {
        let cache = RecordCache::default();
        let at = cache.generation();
        cache.fill(at, record("a", "summary"), 100, false);
        assert!(
            cache.get("a", true).is_none(),
            "a summary was served as a whole record"
        );
        assert!(cache.get("a", false).is_some());
        // Read whole later, the record replaces its summary.
        cache.fill(at, record("a", "whole"), 100, true);
        assert_eq!(
            cache
                .get("a", true)
                .map(|(r, _)| r.metadata.description.clone()),
            Some("whole".to_string())
        );
        assert_eq!(
            cache
                .get("a", false)
                .map(|(r, _)| r.metadata.description.clone()),
            Some("whole".to_string())
        );
        // Summaries weigh less: more of them fit the same bound.
        let fill = |whole: bool| {
            let cache = RecordCache::default();
            cache.set_capacity(1 << 20);
            for i in 0..1000 {
                let at = cache.generation();
                cache.fill(at, record(&format!("agent-{i}"), "x"), 2048, whole);
            }
            (0..1000)
                .filter(|i| cache.get(&format!("agent-{i}"), false).is_some())
                .count()
        };
        let (whole, summaries) = (fill(true), fill(false));
        assert!(
            whole > 0 && summaries >= 2 * whole,
            "{summaries} summaries against {whole} whole records"
        );
    }

    #[test]
    fn the_cache_is_bounded_by_stored_size() {
        let cache = RecordCache::default();
        // `n` records, each `1/share` of the default bound: how many stay.
        let fill = |cache: &RecordCache, share: u64, n: usize| {
            let size = (DEFAULT_RECORD_CACHE_BYTES / PARSED_PER_STORED / share) as usize;
            for i in 0..n {
                let at = cache.generation();
                cache.fill(at, record(&format!("agent-{share}-{i}"), "x"), size, true);
            }
            (0..n)
                .filter(|i| cache.get(&format!("agent-{share}-{i}"), true).is_some())
                .count()
        };
        let kept = fill(&cache, 16, 64);
        assert!(kept <= 16, "{kept} records of 1/16 of the capacity kept");
        assert!(kept > 0);
        // The configured bound: at a quarter of the default, at most a
        // quarter of 256 such records (all fit the default).
        cache.set_capacity(DEFAULT_RECORD_CACHE_BYTES / 4);
        let kept = fill(&cache, 256, 256);
        assert!(kept <= 64, "{kept} records of 1/256 of the default kept");
        assert!(kept > 0);
        cache.set_capacity(0);
        assert_eq!(fill(&cache, 256, 16), 0, "a cache turned off keeps nothing");
    }
}
