//! Discovery indexes, all derived from the applied state: a tag inverted
//! index, a BM25 index and dense vectors (a profile vector per agent, one
//! vector per example and operation). They are built from a scan at start,
//! then follow the change feed: updated as changes are applied, rebuilt when
//! the feed no longer reaches back far enough (after a snapshot install
//! that outran the history). The read path never writes them.

pub mod config;
pub mod embed;
mod endpoint;
pub mod lexical;
#[cfg(feature = "minilm")]
mod minilm;
pub mod search;
mod simd;
pub mod text;
mod vectors;

pub use search::TagRecall;
pub use vectors::ProbeRecall;

/// Texts whose vectors the federated pool cache keeps (~1 KB each with the
/// default model).
const POOL_CACHE_TEXTS: usize = 20_000;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{debug, error, info, info_span, warn, Instrument};

pub use embed::{EmbedError, Embedder};
pub use search::{Hit, Query, TagMatch, Unit, UnitKind, Weights};

use crate::domain::lease::LeaseTable;
use crate::domain::{AgentRecord, Change};
use crate::storage::{FollowEnd, HoldsChanged, Reader, StorageError};
use search::{analyse, prepare, vector_texts, Index, Prepared, PreparedDoc};
use text::Analyzer;

/// Texts embedded per batch while rebuilding.
const REBUILD_BATCH: usize = 8192;
/// Prepared records handed from a rebuild's first stage to its second at
/// once, and chunks that may wait between them.
const REBUILD_CHUNK: usize = 512;
const REBUILD_CHUNKS_AHEAD: usize = 8;

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
    /// Agents whose stored vectors the last build reused (not embedded).
    pub last_rebuild_reused: u64,
    /// Trainings of the vector partitions since start, and the length of
    /// the last: the indexer waits for each, so discovery shows changes
    /// that much later at each doubling of the directory.
    pub trainings: u64,
    pub last_training_ms: u64,
    /// False when ranking runs without vectors (no model loaded).
    pub embedder_loaded: bool,
    /// Agents indexed without vectors because the embedder failed.
    pub without_vectors: usize,
    /// Records the embedder failed to embed while indexing.
    pub embed_failures: u64,
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
    trainings: AtomicU64,
    last_training_ms: AtomicU64,
    last_rebuild_reused: AtomicU64,
    embed_failures: AtomicU64,
    /// Vectors of texts ranked in federated pools, by text: the same
    /// peers' agents come back query after query. Emptied when full.
    pool_vectors: std::sync::Mutex<HashMap<String, Vec<f32>>>,
    /// Documents of records ranked in federated pools, by signature
    /// (`pool_doc_key`). Emptied when full.
    pool_docs: std::sync::Mutex<HashMap<String, PreparedDoc>>,
    /// Held while the vector partitions are saved: the indexer and a
    /// retraining both save, and an older encoding must not be stored
    /// over a newer one.
    saving: std::sync::Mutex<()>,
    /// The indexer's saves: one at a time, none for a while after one
    /// failed.
    save_turn: SaveTurn,
    /// The applied state this index follows (set when following starts):
    /// its lease table, which agents' hold cells are set from and shared
    /// leases' expiries are read from (a refresh changes no record, so
    /// holds do not come through the change feed), and where agents'
    /// vectors are kept for the next restart.
    reader: std::sync::OnceLock<Reader>,
    /// A revision up to which a caught-up check found no agent change left
    /// to index. Nothing can appear there later, so the next check at or
    /// below it does not read the history again: after refreshes, which
    /// change no agent, every discovery did (5 µs of a 100k query). Kept
    /// apart from `indexed`, which answers report: that one moves only
    /// when agents are indexed.
    settled: AtomicU64,
    /// Holds changed while a rebuild runs (None when none runs): the
    /// rebuild read the table before some of them, so it sets them again
    /// when it swaps the new index in.
    holds_pending: std::sync::Mutex<Option<PendingHolds>>,
}

/// See [`Shared::holds_pending`].
#[derive(Default)]
struct PendingHolds {
    agents: Vec<String>,
    /// Every agent's (the table was replaced, or too many to list).
    all: bool,
}

/// Changed holds a rebuild lists before it sets every agent's instead.
const PENDING_HOLDS_MAX: usize = 100_000;

/// How long the indexer waits after a failed save of the partitions before
/// it tries again. A store that fails (a full disk) fails at once, so
/// without a pause the saves that the next changes make due would spin on
/// the error and flood the log.
const SAVE_RETRY: Duration = Duration::from_secs(30);

/// The indexer's turn to save the vector partitions.
#[derive(Default)]
struct SaveTurn {
    running: AtomicBool,
    /// Set by a failed save: no save is claimed before then.
    retry_at: std::sync::Mutex<Option<Instant>>,
}

impl SaveTurn {
    /// True, and the turn taken, for a `due` save when none runs and none
    /// failed within [`SAVE_RETRY`].
    fn claim(&self, due: bool, now: Instant) -> bool {
        due && !self.backing_off(now) && !self.running.swap(true, Ordering::AcqRel)
    }

    /// Ends the turn; a failed save puts the next one off.
    fn finish(&self, saved: bool, now: Instant) {
        *self.retry_at.lock().unwrap_or_else(|p| p.into_inner()) =
            (!saved).then_some(now + SAVE_RETRY);
        self.running.store(false, Ordering::Release);
    }

    /// A save still owed: running, or due and not put off by a failure.
    fn pending(&self, due: bool, now: Instant) -> bool {
        self.running.load(Ordering::Acquire) || (due && !self.backing_off(now))
    }

    fn backing_off(&self, now: Instant) -> bool {
        self.retry_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|at| now < at)
    }
}

/// Sets the hold cells of the agents `changed` names from `leases`.
fn set_holds(index: &Index, leases: &LeaseTable, changed: HoldsChanged<'_>) {
    match changed {
        HoldsChanged::Agents(agents) => {
            for id in agents {
                index.set_hold(id, leases.cell(id));
            }
        }
        HoldsChanged::All => index.set_all_holds(leases),
    }
}

/// Pool documents kept (their words and units, a few KB each; as many as
/// the vector cache holds texts for).
const POOL_CACHE_DOCS: usize = 8192;

/// What a pool document is kept under: the signing authority and the
/// registry signature, which covers every member the document is built
/// from, and the expiry it is ranked by (a lease moves a local agent's
/// without changing its signature). Unsigned records are analysed each
/// time.
fn pool_doc_key(record: &AgentRecord) -> Option<String> {
    let sig = record.envelope.signature.as_ref()?;
    let expires = record.metadata.expires_at.as_deref().unwrap_or("");
    Some(format!("{}\n{}\n{expires}", sig.authority, sig.value))
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
                trainings: AtomicU64::new(0),
                last_training_ms: AtomicU64::new(0),
                last_rebuild_reused: AtomicU64::new(0),
                embed_failures: AtomicU64::new(0),
                pool_vectors: Default::default(),
                pool_docs: Default::default(),
                saving: Default::default(),
                save_turn: Default::default(),
                reader: Default::default(),
                holds_pending: Default::default(),
                settled: AtomicU64::new(0),
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
            if indexed >= revision || self.shared.settled.load(Ordering::Acquire) >= revision {
                return true;
            }
            match reader.changes_from(indexed + 1, 1) {
                Ok(next) if next.first().is_none_or(|c| c.revision > revision) => {
                    self.shared.settled.fetch_max(revision, Ordering::AcqRel);
                    return true;
                }
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

    /// The vector of a query text: none without a model, an error (for
    /// the response's warnings) when the model failed.
    pub async fn query_vector(&self, text: &str) -> Result<Option<Vec<f32>>, String> {
        let Some(embedder) = self.embedder() else {
            return Ok(None);
        };
        match embedder.embed_query(text).await {
            Ok(v) => Ok(Some(v)),
            Err(e) => {
                warn!(error = %e, "embedding the query failed");
                Err(format!(
                    "the query could not be embedded ({e}); candidates are ranked by lexical and tag matches only"
                ))
            }
        }
    }

    /// Ranks agents for `q` with the vector of its text, which is not
    /// computed when the filters admit no agent at all (see
    /// [`Index::admits_none`]): an answer empty either way need not pay
    /// for the model. That check and the search take the index's lock
    /// apart, so an agent the filters admit may be indexed in between; the
    /// search then runs again with the vector rather than rank it without.
    /// Beside the hits, the warning of a model that failed.
    pub async fn search_embedded(&self, mut q: Query<'_>) -> (Vec<Hit>, Option<String>) {
        if self.read().admits_none(q.filters) {
            let hits = self.search(Query {
                vector: None,
                ..q.clone()
            });
            if hits.is_empty() {
                return (hits, None);
            }
        }
        let (vector, warning) = match self.query_vector(q.text).await {
            Ok(vector) => (vector, None),
            Err(warning) => (None, Some(warning)),
        };
        q.vector = vector;
        (self.search(q), warning)
    }

    /// Ranks agents for `q` (whose vector, if any, the caller computed
    /// with [`SearchIndex::query_vector`]).
    pub fn search(&self, q: Query<'_>) -> Vec<Hit> {
        let index = self.read();
        match self.shared.reader.get() {
            Some(reader) => {
                let leases = reader.leases();
                let mut q = q;
                q.leases = Some(&leases);
                index.search(&self.shared.weights, &q)
            }
            None => index.search(&self.shared.weights, &q),
        }
    }

    /// Ranks a small pool of records that are not (all) in this index —
    /// local candidates together with peers' records — with this registry's
    /// own ranker: a throwaway index over just the pool, searched with the
    /// same weights, filters and duplicate detection. Lexical scores are
    /// relative to the pool, as in every search; the other components do
    /// not depend on what else is indexed. Hits carry the records' ids, so
    /// the caller gives each record a key unique within the pool.
    ///
    /// The same peers' agents come back query after query, so each record's
    /// analysed document (words, units, facts; vectors come from the pool's
    /// vector cache) is kept by its registry signature, which fixes its
    /// whole content: a record seen before is not analysed again.
    pub async fn rank_pool(&self, records: &[AgentRecord], q: Query<'_>) -> Vec<Hit> {
        let texts: Vec<Vec<String>> = records.iter().map(vector_texts).collect();
        let vectors = self.pool_vectors(&texts).await;
        let keys: Vec<Option<String>> = records.iter().map(pool_doc_key).collect();
        let mut known: Vec<Option<PreparedDoc>> = {
            let docs = self.pool_docs();
            keys.iter()
                .map(|k| k.as_ref().and_then(|k| docs.get(k).cloned()))
                .collect()
        };
        let mut index = Index::new(self.embedder().map_or(0, Embedder::dim));
        let now = crate::domain::time::now();
        let mut offset = 0;
        let mut analysed = Vec::new();
        for (i, (record, texts)) in records.iter().zip(&texts).enumerate() {
            let own = vectors
                .as_ref()
                .and_then(|v| v.get(offset..offset + texts.len()))
                .map(<[Vec<f32>]>::to_vec);
            offset += texts.len();
            let revision = i as u64 + 1;
            let mut p = match known[i].take() {
                Some(doc) => Prepared {
                    id: record.metadata.id.clone(),
                    revision,
                    doc: Some(doc.indexed_at(&now)),
                },
                None => {
                    let p = analyse(record, revision, &self.shared.analyzer, &now);
                    if let (Some(key), Some(doc)) = (&keys[i], &p.doc) {
                        analysed.push((key.clone(), doc.clone()));
                    }
                    p
                }
            };
            if let Some(doc) = p.doc.as_mut() {
                doc.attach_vectors(own, &self.shared.weights);
            }
            index.apply(p);
        }
        if !analysed.is_empty() {
            let mut docs = self.pool_docs();
            if docs.len() + analysed.len() > POOL_CACHE_DOCS {
                docs.clear();
            }
            docs.extend(analysed);
        }
        let mut hits = index.search(&self.shared.weights, &q);
        // The pool's records are exactly what was ranked.
        for hit in &mut hits {
            if let Some(r) = records.iter().find(|r| r.metadata.id == hit.id) {
                search::fill_evidence(hit, r, q.text, &self.shared.analyzer, true);
            }
        }
        hits
    }

    /// Fills `hit`'s evidence (matched units, snippet) from `record`, the
    /// stored record the response shows for it; see
    /// [`search::fill_evidence`].
    pub fn evidence(&self, hit: &mut Hit, record: &AgentRecord, query: &str) {
        let same = record.envelope.revision == hit.revision;
        search::fill_evidence(hit, record, query, &self.shared.analyzer, same);
    }

    fn pool_docs(&self) -> std::sync::MutexGuard<'_, HashMap<String, PreparedDoc>> {
        self.shared
            .pool_docs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The vectors of every text of a pool, in order (None without a model
    /// or when it failed): cached ones from the pool cache, the rest
    /// embedded in one call.
    async fn pool_vectors(&self, texts: &[Vec<String>]) -> Option<Vec<Vec<f32>>> {
        let embedder = self.embedder()?;
        let lock = || {
            self.shared
                .pool_vectors
                .lock()
                .unwrap_or_else(|p| p.into_inner())
        };
        let missing: Vec<String> = {
            let cache = lock();
            let mut m: Vec<String> = texts
                .iter()
                .flatten()
                .filter(|t| !cache.contains_key(*t))
                .cloned()
                .collect();
            m.sort_unstable();
            m.dedup();
            m
        };
        let fresh = if missing.is_empty() {
            Vec::new()
        } else {
            match embedder.embed(missing.clone()).await {
                Ok(v) => v,
                Err(error) => {
                    self.embed_failed(texts.len(), &error);
                    return None;
                }
            }
        };
        let fresh: HashMap<String, Vec<f32>> = missing.into_iter().zip(fresh).collect();
        let mut cache = lock();
        let out = texts
            .iter()
            .flatten()
            .map(|t| fresh.get(t).or_else(|| cache.get(t)).cloned())
            .collect::<Option<Vec<_>>>();
        if cache.len() + fresh.len() > POOL_CACHE_TEXTS {
            cache.clear();
        }
        cache.extend(fresh);
        out
    }

    /// A poisoned lock still holds a consistent index: every writer swaps
    /// or applies whole documents.
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        match self.shared.index.read() {
            Ok(i) => i,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        match self.shared.index.write() {
            Ok(i) => i,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Retrains the vector partitions when due, beside the index: the
    /// indexer goes on applying changes and searches go on meanwhile (at a
    /// million agents training takes seconds, and discovery waits for the
    /// indexer), and rows changed meanwhile are placed again when the new
    /// partitions are installed (see [`vectors::Retraining`]). At most one
    /// runs at a time; its length is logged.
    fn retrain_vectors(&self) {
        // Asked under the read lock first: this runs for every change, and
        // a write lock each time would hold up searches.
        if !self.read().vectors_training_due() {
            return;
        }
        let Some(mut run) = self.write().begin_vector_retraining() else {
            return;
        };
        let id = run.id();
        let this = self.clone();
        let work = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            run.train();
            run.fill(|copy| copy(this.read().vectors()));
            // The rows changed while it filled are filed outside the write
            // lock too, all but those changed since.
            let changed = this.write().take_retraining_changes(id);
            if let Some(changed) = changed {
                run.apply(changed);
            }
            let (replaced, partitions, rows) = {
                let mut index = this.write();
                let replaced = index.install_retrained(run);
                (replaced, index.partitions(), index.vectors().live())
            };
            let Some(replaced) = replaced else {
                // The index was rebuilt meanwhile; the rebuild trained.
                return;
            };
            drop(replaced);
            let ms = started.elapsed().as_millis() as u64;
            this.shared.trainings.fetch_add(1, Ordering::Relaxed);
            this.shared.last_training_ms.store(ms, Ordering::Relaxed);
            info!(rows, partitions, ms, "vector partitions trained");
            if let Some(reader) = this.shared.reader.get() {
                this.save_partitions(reader);
            }
        });
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = work.await {
                error!(error = %e, "training the vector partitions panicked");
                this.write().abandon_retraining(id);
            }
        });
    }

    /// Whether new vector partitions are being trained beside the index
    /// (searches meanwhile use the ones it has), or partitions are still to
    /// be saved (not counting a save put off after a failure).
    pub fn settling(&self) -> bool {
        let index = self.read();
        index.vectors().retraining()
            || self
                .shared
                .save_turn
                .pending(index.partitions_save_due(), Instant::now())
    }

    /// Recall of the vector candidate scan against an exact scan of the
    /// agents' f32 vectors (`exact`, by id), for the benchmark (see
    /// [`vectors::VectorIndex::recall`]).
    pub fn vector_recall(
        &self,
        queries: &[Vec<f32>],
        limit: usize,
        exact: &HashMap<String, Vec<f32>>,
    ) -> Vec<ProbeRecall> {
        self.read().vector_recall(queries, limit, exact)
    }

    /// See [`search::Index::tag_recall`].
    pub fn tag_recall(
        &self,
        queries: &[(Vec<f32>, String)],
        limit: usize,
        exact: &HashMap<String, Vec<f32>>,
    ) -> Vec<TagRecall> {
        self.read().tag_recall(queries, limit, exact)
    }

    /// Agents indexed without vectors because the embedder failed.
    pub fn without_vectors(&self) -> usize {
        let index = self.read();
        index.size_without_vectors()
    }

    pub fn stats(&self) -> IndexStats {
        let index = self.read();
        let size = index.size();
        IndexStats {
            agents: size.agents,
            terms: size.terms,
            postings: size.postings,
            vector_bytes: size.vector_bytes,
            without_vectors: size.without_vectors,
            embed_failures: self.shared.embed_failures.load(Ordering::Relaxed),
            partitions: index.partitions(),
            indexed_revision: self.indexed_revision(),
            rebuilds: self.shared.rebuilds.load(Ordering::Relaxed),
            last_rebuild_ms: self.shared.last_rebuild_ms.load(Ordering::Relaxed),
            trainings: self.shared.trainings.load(Ordering::Relaxed),
            last_training_ms: self.shared.last_training_ms.load(Ordering::Relaxed),
            last_rebuild_reused: self.shared.last_rebuild_reused.load(Ordering::Relaxed),
            embedder_loaded: self.shared.embedder.is_some(),
        }
    }

    /// Notes a record the embedder failed on; it is indexed without
    /// vectors rather than holding up every change behind it.
    fn embed_failed(&self, records: usize, error: &EmbedError) {
        self.shared
            .embed_failures
            .fetch_add(records as u64, Ordering::Relaxed);
        error!(%error, records, "embedding failed; indexing without vectors (found by words and tags until indexed again)");
    }

    async fn apply_change(&self, change: &Change) {
        let record = &change.record;
        let texts = vector_texts(record);
        let source = self.vector_source(&texts);
        let vectors = match self.embedder() {
            Some(e) if !record.envelope.deleted => match e.embed(texts).await {
                Ok(v) => Some(v),
                Err(error) => {
                    self.embed_failed(1, &error);
                    None
                }
            },
            _ => None,
        };
        let prepared = prepare(
            record,
            change.revision,
            vectors,
            &self.shared.analyzer,
            &self.shared.weights,
            &crate::domain::time::now(),
        );
        let stored = prepared
            .doc
            .as_ref()
            .and_then(|d| d.index_vectors(source))
            .map(|v| v.encode());
        self.store_vectors(&[(record.metadata.id.clone(), stored)]);
        {
            let mut index = self.write();
            let id = prepared.id.clone();
            index.apply(prepared);
            // Under the write lock: a hold applied since is set on the new
            // document by its listener call, which waits for the lock.
            if let Some(reader) = self.shared.reader.get() {
                set_holds(&index, &reader.leases(), HoldsChanged::Agents(&[id]));
            }
        }
        self.retrain_vectors();
        self.save_live_partitions();
        self.shared.indexed.send_replace(change.revision);
    }

    /// See [`search::vector_source`]; 0 without a model.
    fn vector_source(&self, texts: &[String]) -> u64 {
        self.embedder().map_or(0, |e| {
            search::vector_source(e.name(), texts, &self.shared.weights)
        })
    }

    /// Keeps agents' vectors beside their records (None: forget them). A
    /// failure costs only an embedding at the next restart.
    fn store_vectors(&self, entries: &[(String, Option<Vec<u8>>)]) {
        let Some(reader) = self.shared.reader.get() else {
            return;
        };
        if let Err(e) = reader.store_index_vectors(entries) {
            warn!(error = %e, "storing discovery vectors failed; they will be computed again at the next restart");
        }
    }

    /// Saves the vector partitions beside the records when due (see
    /// [`Index::partitions_save_due`]), so that the next start places every
    /// row without training or assigning them; a failure costs only that.
    /// Partitions installed by a retraining between the encoding and the
    /// marking stay due, so they are saved too. False when the store
    /// failed.
    fn save_partitions(&self, reader: &Reader) -> bool {
        let _saving = self.shared.saving.lock().unwrap_or_else(|p| p.into_inner());
        let started = Instant::now();
        let (bytes, generation) = {
            let index = self.read();
            if !index.partitions_save_due() {
                return true;
            }
            (index.saved_partitions(), index.vectors().generation())
        };
        let Some(bytes) = bytes else {
            return true;
        };
        let encoded_ms = started.elapsed().as_millis() as u64;
        match reader.store_index_partitions(&bytes) {
            Ok(()) => {
                self.write().mark_partitions_saved(generation);
                let (bytes, ms) = (bytes.len(), started.elapsed().as_millis() as u64);
                debug!(bytes, encoded_ms, ms, "vector partitions saved");
                true
            }
            Err(e) => {
                warn!(error = %e, "saving the vector partitions failed; the next start assigns them again");
                false
            }
        }
    }

    /// [`Self::save_partitions`] on a blocking thread, not awaited: the
    /// indexer goes on meanwhile, and discovery waits for the indexer (at a
    /// million agents the encoding is 14 MB). One at a time.
    fn save_live_partitions(&self) {
        let Some(reader) = self.shared.reader.get().cloned() else {
            return;
        };
        if !self.claim_save() {
            return;
        }
        let this = self.clone();
        let save = tokio::task::spawn_blocking(move || loop {
            let saved = this.save_partitions(&reader);
            this.shared.save_turn.finish(saved, Instant::now());
            // A change applied during the save found it running and left
            // the partitions due: saved here, or by that change's successor.
            // After a failure the turn refuses until its retry time.
            if !this.claim_save() {
                return;
            }
        });
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = save.await {
                error!(error = %e, "saving the vector partitions panicked");
                this.shared.save_turn.finish(false, Instant::now());
            }
        });
    }

    /// True, and the indexer's save marked running, when a save is due, none
    /// of its saves runs and none failed lately.
    fn claim_save(&self) -> bool {
        let due = self.read().partitions_save_due();
        self.shared.save_turn.claim(due, Instant::now())
    }

    /// Builds a new index from every stored record and swaps it in; the
    /// index then stands at `revision` (read before the scan, so following
    /// from `revision + 1` misses nothing).
    ///
    /// Two stages on two threads: this one reads, decodes and analyses the
    /// records (and embeds those without stored vectors), another inserts
    /// them into the new index in scan order, each about half of the work
    /// (at a million agents, 47 s on one thread). The directory is never
    /// held in memory whole: a few chunks are in flight at a time.
    fn rebuild(&self, reader: &Reader, revision: u64) -> Result<(), StorageError> {
        let started = Instant::now();
        let dim = self.embedder().map_or(0, Embedder::dim);
        let mut fresh = Index::new(dim);
        // The partitions saved by the last index, so rows keep theirs
        // instead of being trained and assigned again.
        if dim > 0 {
            let saved = reader.index_partitions().unwrap_or_else(|e| {
                warn!(error = %e, "reading the saved vector partitions failed; training them again");
                None
            });
            if let Some(saved) = saved.and_then(|b| vectors::SavedPartitions::decode(&b, dim)) {
                fresh.adopt_partitions(saved);
            }
        }
        *self.pending_holds() = Some(PendingHolds::default());
        let (chunks, inserter) =
            std::sync::mpsc::sync_channel::<Vec<Prepared>>(REBUILD_CHUNKS_AHEAD);
        let (mut fresh, counts) = std::thread::scope(|scope| {
            let insert = scope.spawn(move || {
                for chunk in inserter {
                    let ids: Vec<String> = chunk.iter().map(|p| p.id.clone()).collect();
                    chunk.into_iter().for_each(|p| fresh.apply(p));
                    // Each agent's hold as the table has it now (what
                    // changes later is pending, set again at the swap),
                    // read after the chunk so applies wait a lookup each.
                    let leases = reader.leases();
                    if !leases.is_empty() {
                        set_holds(&fresh, &leases, HoldsChanged::Agents(&ids));
                    }
                }
                fresh.maintain();
                fresh.compact();
                fresh
            });
            let counts = self.prepare_all(reader, dim, &chunks);
            // Closing the channel ends the inserter, also after a failure.
            drop(chunks);
            let fresh = insert
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (fresh, counts)
        });
        let (agents, reused) = counts.inspect_err(|_| *self.pending_holds() = None)?;
        fresh.revision = revision;
        // The build's figures are published before it starts serving, so a
        // reader that sees its agents counted sees them too (they used to
        // follow the saving below, and `agentry bench discover` read 0).
        let ms = started.elapsed().as_millis() as u64;
        self.shared.rebuilds.fetch_add(1, Ordering::Relaxed);
        self.shared.last_rebuild_ms.store(ms, Ordering::Relaxed);
        self.shared
            .last_rebuild_reused
            .store(reused as u64, Ordering::Relaxed);
        // The index replaced is dropped after the lock is released: at a
        // million agents that takes long enough to hold up searches.
        let replaced = {
            let mut index = self.write();
            let replaced = std::mem::replace(&mut *index, fresh);
            if let Some(pending) = self.pending_holds().take() {
                let changed = if pending.all {
                    HoldsChanged::All
                } else {
                    HoldsChanged::Agents(&pending.agents)
                };
                set_holds(&index, &reader.leases(), changed);
            }
            replaced
        };
        drop(replaced);
        self.save_partitions(reader);
        simd::release_free_memory();
        self.shared.indexed.send_replace(revision);
        info!(
            agents,
            reused_vectors = reused,
            revision,
            ms,
            "discovery index built"
        );
        Ok(())
    }

    /// The first stage of [`Self::rebuild`]: every stored record prepared,
    /// sent on in chunks of scan order. Records are prepared with the
    /// vectors stored for them when those were computed from the same
    /// texts and model, else embedded a batch at a time (and stored).
    /// Returns (agents, agents whose vectors were reused).
    fn prepare_all(
        &self,
        reader: &Reader,
        dim: usize,
        out: &std::sync::mpsc::SyncSender<Vec<Prepared>>,
    ) -> Result<(usize, usize), StorageError> {
        let now = crate::domain::time::now();
        let mut chunk: Vec<Prepared> = Vec::with_capacity(REBUILD_CHUNK);
        let mut batch: Vec<(AgentRecord, u64)> = Vec::new();
        let mut texts: Vec<String> = Vec::new();
        let mut counts: Vec<usize> = Vec::new();
        let (mut agents, mut reused) = (0usize, 0usize);
        // False once the inserter is gone (it panicked): the scan stops.
        let mut open = true;
        let send = |chunk: &mut Vec<Prepared>, open: &mut bool| {
            if *open && out.send(std::mem::take(chunk)).is_err() {
                *open = false;
            }
        };
        let embed = |batch: &mut Vec<(AgentRecord, u64)>,
                     texts: &mut Vec<String>,
                     counts: &mut Vec<usize>,
                     chunk: &mut Vec<Prepared>| {
            // The texts of as many records as fit in one batch, so the
            // embedder works on large batches across both cores.
            let mut vectors = match self.embedder().map(|e| e.embed_blocking(texts)) {
                Some(Ok(v)) => Some(v.into_iter()),
                Some(Err(error)) => {
                    self.embed_failed(batch.len(), &error);
                    None
                }
                None => None,
            };
            let mut stored = Vec::new();
            for ((record, source), n) in batch.drain(..).zip(counts.drain(..)) {
                let vs = vectors.as_mut().map(|it| it.by_ref().take(n).collect());
                let p = prepare(
                    &record,
                    record.envelope.revision,
                    vs,
                    &self.shared.analyzer,
                    &self.shared.weights,
                    &now,
                );
                if let Some(v) = p.doc.as_ref().and_then(|d| d.index_vectors(source)) {
                    stored.push((record.metadata.id.clone(), Some(v.encode())));
                }
                chunk.push(p);
            }
            if !stored.is_empty() {
                self.store_vectors(&stored);
            }
            texts.clear();
        };
        reader.scan_with_index_vectors(|r, stored| {
            if !open {
                return;
            }
            agents += 1;
            let t = vector_texts(&r);
            let source = self.vector_source(&t);
            let known = stored
                .and_then(search::IndexVectors::decode)
                .filter(|v| self.embedder().is_some() && v.source == source)
                .filter(|v| v.profile.as_ref().is_none_or(|p| p.0.len() == dim));
            if let Some(v) = known {
                let mut p = analyse(&r, r.envelope.revision, &self.shared.analyzer, &now);
                if let Some(doc) = p.doc.as_mut() {
                    doc.attach_stored(v);
                }
                chunk.push(p);
                reused += 1;
            } else {
                counts.push(t.len());
                texts.extend(t);
                batch.push((r, source));
                if texts.len() >= REBUILD_BATCH {
                    embed(&mut batch, &mut texts, &mut counts, &mut chunk);
                }
            }
            if chunk.len() >= REBUILD_CHUNK {
                send(&mut chunk, &mut open);
            }
        })?;
        if !batch.is_empty() {
            embed(&mut batch, &mut texts, &mut counts, &mut chunk);
        }
        send(&mut chunk, &mut open);
        Ok((agents, reused))
    }

    fn pending_holds(&self) -> std::sync::MutexGuard<'_, Option<PendingHolds>> {
        self.shared
            .holds_pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the hold cells of agents whose holds an apply changed (the
    /// table's listener). The table changed before this call; a rebuild
    /// running meanwhile is told too, as it may have read them before.
    fn holds_changed(&self, changed: HoldsChanged<'_>) {
        let Some(reader) = self.shared.reader.get() else {
            return;
        };
        if let Some(pending) = self.pending_holds().as_mut() {
            match changed {
                HoldsChanged::Agents(agents) if !pending.all => {
                    pending.agents.extend(agents.iter().cloned());
                    if pending.agents.len() > PENDING_HOLDS_MAX {
                        pending.agents = Vec::new();
                        pending.all = true;
                    }
                }
                HoldsChanged::Agents(_) => {}
                HoldsChanged::All => {
                    pending.agents = Vec::new();
                    pending.all = true;
                }
            }
        }
        set_holds(&self.read(), &reader.leases(), changed);
    }

    /// Keeps the index in step with the applied state until shutdown.
    pub fn spawn(
        &self,
        reader: Reader,
        shutdown: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let _ = self.shared.reader.set(reader.clone());
        // Weak: the applied state keeps the listener and the index keeps
        // the applied state (its reader); a strong one would keep both.
        let index = Arc::downgrade(&self.shared);
        reader.on_holds_changed(Box::new(move |changed| {
            if let Some(shared) = index.upgrade() {
                SearchIndex { shared }.holds_changed(changed);
            }
        }));
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
                Ok(Err(StorageError::Installing)) => {
                    info!("the index is built once the snapshot install ends");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
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
                .follow(live, from + 1, stop, |c: Arc<Change>| {
                    let this = this.clone();
                    async move {
                        this.apply_change(&c).await;
                        true
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed save (a full disk) puts the next one off instead of
    /// retrying at once, and meanwhile no save counts as owed, so nothing
    /// waits for it; after the pause a due save is claimed again.
    #[test]
    fn a_failed_save_is_retried_only_after_the_pause() {
        let turn = SaveTurn::default();
        let t0 = Instant::now();
        assert!(!turn.claim(false, t0), "nothing due, nothing claimed");
        assert!(turn.claim(true, t0));
        assert!(!turn.claim(true, t0), "one save at a time");
        assert!(turn.pending(false, t0), "a running save is owed");

        turn.finish(false, t0);
        let soon = t0 + Duration::from_secs(1);
        assert!(!turn.claim(true, soon), "no retry right after a failure");
        assert!(
            !turn.pending(true, soon),
            "a put-off save is not waited for"
        );

        let later = t0 + SAVE_RETRY + Duration::from_millis(1);
        assert!(turn.pending(true, later));
        assert!(turn.claim(true, later), "retried after the pause");
        turn.finish(true, later);
        assert!(turn.claim(true, later), "a success puts nothing off");
        turn.finish(true, later);
        assert!(!turn.pending(false, later));
    }
}
