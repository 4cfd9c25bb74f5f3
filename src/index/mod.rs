//! Discovery indexes, all derived from the applied state: a tag inverted
//! index, a BM25 index and dense vectors (a profile vector per agent, one
//! vector per example and operation). They are built from a scan at start,
//! then follow the change feed: updated as changes are applied, rebuilt when
//! the feed no longer reaches back far enough (after a snapshot install
//! that outran the history). The read path never writes them.

pub mod embed;
pub mod lexical;
pub mod search;
mod simd;
pub mod text;
mod vectors;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{error, info, info_span, Instrument};

pub use embed::{EmbedError, Embedder};
pub use search::{Hit, Query, TagMatch, Unit, UnitKind, Weights};

use crate::domain::{AgentRecord, Change};
use crate::storage::{FollowEnd, Reader, StorageError};
use search::{prepare, vector_texts, Index, Prepared};
use text::Analyzer;

/// Texts embedded per batch while rebuilding.
const REBUILD_BATCH: usize = 8192;

/// Counters for metrics and `agentry bench`.
#[derive(Debug, Clone, Default)]
pub struct IndexStats {
    pub agents: usize,
    pub terms: usize,
    pub postings: usize,
    pub vector_bytes: usize,
    /// Partitions of the vector index (0: every vector is scanned).
    pub partitions: usize,
    pub indexed_revision: u64,
    pub rebuilds: u64,
    pub last_rebuild_ms: u64,
    /// False when ranking runs without vectors (no model loaded).
    pub embedder_loaded: bool,
}

struct Shared {
    index: RwLock<Index>,
    embedder: Option<Embedder>,
    /// Why there is no embedder, for response warnings.
    no_embedder: Option<String>,
    analyzer: Analyzer,
    weights: Weights,
    indexed: watch::Sender<u64>,
    rebuilds: AtomicU64,
    last_rebuild_ms: AtomicU64,
}

/// The discovery index of this node. Cheap to clone.
#[derive(Clone)]
pub struct SearchIndex {
    shared: Arc<Shared>,
}

impl SearchIndex {
    /// An empty index; `embedder` is the model, or why there is none.
    pub fn new(embedder: Result<Embedder, String>, weights: Weights) -> Self {
        let (embedder, no_embedder) = match embedder {
            Ok(e) => (Some(e), None),
            Err(why) => (None, Some(why)),
        };
        let dim = embedder.as_ref().map_or(0, Embedder::dim);
        Self {
            shared: Arc::new(Shared {
                index: RwLock::new(Index::new(dim)),
                embedder,
                no_embedder,
                analyzer: Analyzer::default(),
                weights,
                indexed: watch::Sender::new(0),
                rebuilds: AtomicU64::new(0),
                last_rebuild_ms: AtomicU64::new(0),
            }),
        }
    }

    pub fn embedder(&self) -> Option<&Embedder> {
        self.shared.embedder.as_ref()
    }

    /// Why no model is loaded, when none is.
    pub fn embedder_problem(&self) -> Option<&str> {
        self.shared.no_embedder.as_deref()
    }

    pub fn weights(&self) -> &Weights {
        &self.shared.weights
    }

    pub fn indexed_revision(&self) -> u64 {
        *self.shared.indexed.borrow()
    }

    /// Waits until every agent change up to `revision` is indexed (log
    /// entries that change no agent, such as membership, need no indexing).
    /// False when `timeout` passed first.
    pub async fn caught_up(&self, reader: &Reader, revision: u64, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.shared.indexed.subscribe();
        loop {
            let indexed = *rx.borrow_and_update();
            if indexed >= revision {
                return true;
            }
            match reader.changes_from(indexed + 1, 1) {
                Ok(next) if next.first().is_none_or(|c| c.revision > revision) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return false;
            }
        }
    }

    /// Ranks agents for `q`; the query vector is computed here.
    pub fn search(&self, mut q: Query<'_>) -> Vec<Hit> {
        if q.vector.is_none() {
            q.vector = self.embedder().map(|e| e.embed_one(q.text));
        }
        let index = match self.shared.index.read() {
            Ok(i) => i,
            Err(poisoned) => poisoned.into_inner(),
        };
        index.search(&self.shared.weights, &q)
    }

    pub fn stats(&self) -> IndexStats {
        let index = match self.shared.index.read() {
            Ok(i) => i,
            Err(poisoned) => poisoned.into_inner(),
        };
        let (agents, terms, postings, vector_bytes) = index.size();
        IndexStats {
            agents,
            terms,
            postings,
            vector_bytes,
            partitions: index.partitions(),
            indexed_revision: self.indexed_revision(),
            rebuilds: self.shared.rebuilds.load(Ordering::Relaxed),
            last_rebuild_ms: self.shared.last_rebuild_ms.load(Ordering::Relaxed),
            embedder_loaded: self.shared.embedder.is_some(),
        }
    }

    fn prepare_one(&self, record: &AgentRecord, revision: u64, indexed_at: &str) -> Prepared {
        let vectors = self.embedder().map(|e| e.embed(&vector_texts(record)));
        prepare(
            record,
            revision,
            vectors,
            &self.shared.analyzer,
            &self.shared.weights,
            indexed_at,
        )
    }

    fn apply_change(&self, change: &Change) {
        let prepared =
            self.prepare_one(&change.record, change.revision, &crate::domain::time::now());
        {
            let mut index = match self.shared.index.write() {
                Ok(i) => i,
                Err(poisoned) => poisoned.into_inner(),
            };
            index.apply(prepared);
            index.maintain();
        }
        self.shared.indexed.send_replace(change.revision);
    }

    /// Builds a new index from every stored record and swaps it in; the
    /// index then stands at `revision` (read before the scan, so following
    /// from `revision + 1` misses nothing).
    fn rebuild(&self, reader: &Reader, revision: u64) -> Result<(), StorageError> {
        let started = Instant::now();
        let mut records = Vec::new();
        reader.scan(|r| {
            if !r.envelope.deleted {
                records.push(r);
            }
        })?;
        let now = crate::domain::time::now();
        let dim = self.embedder().map_or(0, Embedder::dim);
        let mut fresh = Index::new(dim);
        let mut start = 0;
        while start < records.len() {
            // Batch the texts of as many records as fit, so the embedder
            // works on large batches across both cores.
            let mut end = start;
            let mut texts = Vec::new();
            let mut counts = Vec::new();
            while end < records.len() && texts.len() < REBUILD_BATCH {
                let t = vector_texts(&records[end]);
                counts.push(t.len());
                texts.extend(t);
                end += 1;
            }
            let mut vectors = self.embedder().map(|e| e.embed(&texts).into_iter());
            for (record, n) in records[start..end].iter().zip(counts) {
                let vs = vectors.as_mut().map(|it| it.by_ref().take(n).collect());
                fresh.apply(prepare(
                    record,
                    record.envelope.revision,
                    vs,
                    &self.shared.analyzer,
                    &self.shared.weights,
                    &now,
                ));
            }
            start = end;
        }
        fresh.maintain();
        fresh.revision = revision;
        {
            let mut index = match self.shared.index.write() {
                Ok(i) => i,
                Err(poisoned) => poisoned.into_inner(),
            };
            *index = fresh;
        }
        let ms = started.elapsed().as_millis() as u64;
        self.shared.rebuilds.fetch_add(1, Ordering::Relaxed);
        self.shared.last_rebuild_ms.store(ms, Ordering::Relaxed);
        self.shared.indexed.send_replace(revision);
        info!(
            agents = records.len(),
            revision, ms, "discovery index built"
        );
        Ok(())
    }

    /// Keeps the index in step with the applied state until shutdown.
    pub fn spawn(
        &self,
        reader: Reader,
        shutdown: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(
            async move { this.follow(reader, shutdown).await }.instrument(info_span!("indexer")),
        )
    }

    async fn follow(self, reader: Reader, shutdown: watch::Receiver<bool>) {
        loop {
            let live = reader.subscribe();
            let from = reader.applied_revision();
            let (this, r) = (self.clone(), reader.clone());
            match tokio::task::spawn_blocking(move || this.rebuild(&r, from)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    error!(error = %e, "building the discovery index failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Err(e) => {
                    error!(error = %e, "the index builder panicked");
                    return;
                }
            }
            let mut stop_rx = shutdown.clone();
            let stop = async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            };
            let this = self.clone();
            let end = reader
                .follow(live, from + 1, stop, |c: Change| {
                    this.apply_change(&c);
                    std::future::ready(true)
                })
                .await;
            match end {
                FollowEnd::Stopped => return,
                FollowEnd::Compacted { requested, oldest } => {
                    info!(
                        requested,
                        oldest, "change history moved past the index; rebuilding"
                    );
                }
                FollowEnd::Failed(e) => {
                    error!(error = %e, "reading the change feed failed; rebuilding the index");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}
