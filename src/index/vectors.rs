//! Profile vectors, one per slot, held only as i8 codes with a scale per
//! row (a quarter of f32), once, in lists — one list until there are
//! enough rows that scanning them all would be slow, then one per
//! partition of an inverted-file index (spherical k-means); a slot knows
//! its list and position.
//!
//! A query scans the codes of the `nprobe` partitions whose centroids are
//! closest to it, keeps the best by the approximate (i8 × i8) score, and the
//! ranker then re-scores those with the query kept in f32 against the row's
//! codes, which leaves only the row's rounding in the score (well under the
//! gaps between ranked agents; `agentry bench discover` measures the recall
//! against an f32 scan). Each partition holds its rows' codes contiguous: at
//! 100k agents the scan is bound by memory, and reading one block per
//! partition instead of a row scattered per agent is what keeps it fast.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use super::simd::{dot_f32_i8, dot_i8, each_dot_i8, prefetch, quantize};

/// Below this many vectors every row is scanned.
const IVF_MIN: usize = 4096;
/// Rows sampled to train the partitions.
const TRAIN_SAMPLE: usize = 16_384;
const TRAIN_ROUNDS: usize = 6;
/// `at` of a slot without a vector.
const NONE: (u32, u32) = (u32::MAX, u32::MAX);
/// The list number in `at` of a row waiting in `pending`.
const PENDING: u32 = u32::MAX - 1;

/// One list: its rows' slots, codes (`dim` each, contiguous, so a scan
/// reads one block) and scales, by position.
#[derive(Clone, Default)]
struct List {
    slots: Vec<u32>,
    codes: Vec<i8>,
    scales: Vec<f32>,
}

impl List {
    fn push(&mut self, slot: u32, code: &[i8], scale: f32) -> u32 {
        self.slots.push(slot);
        self.codes.extend_from_slice(code);
        self.scales.push(scale);
        (self.slots.len() - 1) as u32
    }

    fn row(&self, pos: usize, dim: usize) -> (&[i8], f32) {
        (&self.codes[pos * dim..(pos + 1) * dim], self.scales[pos])
    }

    /// Removes the row at `at`; the last row moves into its place, and its
    /// slot is returned so its position can be updated.
    fn swap_remove(&mut self, at: usize, dim: usize) -> Option<u32> {
        let last = self.slots.len() - 1;
        self.slots.swap_remove(at);
        self.scales.swap_remove(at);
        if at != last {
            self.codes
                .copy_within(last * dim..(last + 1) * dim, at * dim);
        }
        self.codes.truncate(last * dim);
        (at != last).then(|| self.slots[at])
    }

    fn shrink_to_fit(&mut self) {
        self.slots.shrink_to_fit();
        self.codes.shrink_to_fit();
        self.scales.shrink_to_fit();
    }

    fn bytes(&self) -> usize {
        self.slots.len() * 4 + self.codes.len() + self.scales.len() * 4
    }
}

/// Rows scored ahead of the one being read where rows are visited by
/// slot: their codes are asked for early, so the scattered reads overlap.
const AHEAD: usize = 8;

/// Partitions trained by [`VectorIndex::train`], to install.
pub struct Trained {
    centroids: Vec<f32>,
    lists: Vec<List>,
    at: Vec<(u32, u32)>,
    rows: usize,
}

pub struct VectorIndex {
    dim: usize,
    /// Per slot: (list, position in it), (`PENDING`, position), or
    /// [`NONE`].
    at: Vec<(u32, u32)>,
    /// One list while unpartitioned, else one per centroid. The codes live
    /// only here: a partition's scan reads its rows in one block, which at
    /// 100k agents took a third less time than reading them scattered by
    /// slot.
    lists: Vec<List>,
    /// Unit centroids, `dim` each; empty while unpartitioned.
    centroids: Vec<f32>,
    /// The centroids as i8, which place rows (a row is only held as i8).
    coded: CodedCentroids,
    live: usize,
    trained_at: usize,
    /// While a rebuild adopts saved partitions: rows without a saved
    /// partition wait in `pending` and are assigned together (on every
    /// core) by [`Self::maintain`], instead of one by one.
    staging: bool,
    pending: List,
    /// Rows placed since the partitions were last saved
    /// ([`Self::saved`]), which says when saving them again is due.
    placed_since_saved: usize,
    /// While a [`Retraining`] runs beside the index: its id and the slots
    /// whose rows changed since it began, placed again when it installs.
    retraining: Option<(u64, HashSet<u32>)>,
    /// Counts the partitions installed, so a save encoded before an
    /// install does not mark the new ones saved.
    generation: u64,
}

/// Ids of retrainings, so one begun on an index that has since been
/// replaced (a rebuild swaps in a new one) is never installed on it.
static RETRAININGS: AtomicU64 = AtomicU64::new(1);

/// Rows a retraining copies out of the index per read of it: a few
/// megabytes, so the lock is held for about a millisecond each time.
const RETRAIN_CHUNK: usize = 16_384;

/// New partitions trained beside the live index, so that the indexer and
/// searches go on meanwhile (training a million rows takes seconds, and
/// discovery waits for the indexer). [`VectorIndex::begin_retraining`]
/// copies out the rows it samples; [`Retraining::train`] trains the
/// centroids on them without the index; [`Retraining::fill`] copies every
/// row out a chunk at a time and files it under its nearest new centroid;
/// [`VectorIndex::install_retrained`] swaps the result in, placing again
/// the rows that changed since it began.
pub struct Retraining {
    id: u64,
    rows: usize,
    nlist: usize,
    sample: List,
    next: VectorIndex,
}

impl Retraining {
    /// Trains the centroids on the sample; no index is needed.
    pub fn train(&mut self) {
        let dim = self.next.dim;
        self.next.centroids = kmeans(&self.sample, self.nlist, dim);
        self.next.coded = CodedCentroids::new(&self.next.centroids, dim);
        self.next.lists = vec![List::default(); self.nlist];
        self.sample = List::default();
    }

    /// Files every row of the index under its nearest new centroid;
    /// `read` lends the index (under its lock) for each chunk's copy, so
    /// the assigning itself runs without it.
    pub fn fill(&mut self, mut read: impl FnMut(&mut dyn FnMut(&VectorIndex))) {
        let mut from = 0u32;
        loop {
            let mut chunk = List::default();
            let mut end = from;
            let id = self.id;
            read(&mut |ix: &VectorIndex| {
                end = ix.copy_rows(id, from, RETRAIN_CHUNK, &mut chunk);
            });
            self.file(&chunk);
            if end <= from {
                return;
            }
            from = end;
        }
    }

    /// Files the rows changed so far ([`VectorIndex::take_changed`]) as
    /// [`Self::fill`] does, so that the install, under the index's write
    /// lock, has only those changed since to place.
    pub fn apply(&mut self, changed: Changed) {
        for slot in changed.removed {
            self.next.clear(slot);
        }
        self.file(&changed.rows);
    }

    /// Files `rows` under their nearest new centroids (on half the cores:
    /// the node serves meanwhile), each in place of any row its slot had.
    fn file(&mut self, rows: &List) {
        let dim = self.next.dim;
        let lists = assign(
            &self.next.coded,
            rows.slots.len(),
            |i| rows.row(i, dim).0,
            half_the_cores(),
        );
        for (i, list) in lists.into_iter().enumerate() {
            let (code, scale) = rows.row(i, dim);
            self.next.clear(rows.slots[i]);
            self.next.place(rows.slots[i], list, code, scale);
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }
}

/// The rows changed while a [`Retraining`] ran: slots left without a row,
/// and the others' rows as they are now.
pub struct Changed {
    removed: Vec<u32>,
    rows: List,
}

impl VectorIndex {
    pub fn new(dim: usize) -> Self {
        Self {
            dim,
            at: Vec::new(),
            lists: vec![List::default()],
            centroids: Vec::new(),
            coded: CodedCentroids::default(),
            live: 0,
            trained_at: 0,
            staging: false,
            pending: List::default(),
            placed_since_saved: 0,
            retraining: None,
            generation: 0,
        }
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn has(&self, slot: u32) -> bool {
        self.at.get(slot as usize).is_some_and(|a| *a != NONE)
    }

    /// The list a row is in (`pending` included).
    fn list(&self, list: u32) -> Option<&List> {
        if list == PENDING {
            Some(&self.pending)
        } else {
            self.lists.get(list as usize)
        }
    }

    /// The codes and scale of `slot`'s row.
    fn code(&self, slot: u32) -> Option<(&[i8], f32)> {
        let &(list, pos) = self.at.get(slot as usize).filter(|a| **a != NONE)?;
        Some(self.list(list)?.row(pos as usize, self.dim))
    }

    /// Sizes `at` to hold `slot`.
    fn reach(&mut self, slot: u32) {
        let s = slot as usize;
        if self.at.len() <= s {
            self.at.resize(s + 1, NONE);
        }
    }

    /// Puts a row into `list`.
    fn place(&mut self, slot: u32, list: usize, code: &[i8], scale: f32) {
        self.reach(slot);
        let pos = self.lists[list].push(slot, code, scale);
        self.at[slot as usize] = (list as u32, pos);
        self.live += 1;
        self.placed_since_saved += 1;
    }

    /// Keeps a row out of the lists until [`Self::maintain`] assigns it.
    fn stage(&mut self, slot: u32, code: &[i8], scale: f32) {
        self.reach(slot);
        let pos = self.pending.push(slot, code, scale);
        self.at[slot as usize] = (PENDING, pos);
        self.live += 1;
    }

    /// Places a row: into `hint` (its saved partition) when there is one,
    /// else into the partition nearest its codes, or held back for
    /// [`Self::maintain`] while staging.
    fn put(&mut self, slot: u32, code: &[i8], scale: f32, hint: Option<u32>) {
        self.clear(slot);
        let nlist = self.partitions();
        if nlist == 0 {
            return self.place(slot, 0, code, scale);
        }
        if let Some(list) = hint.filter(|&l| (l as usize) < nlist) {
            return self.place(slot, list as usize, code, scale);
        }
        if self.staging {
            return self.stage(slot, code, scale);
        }
        let list = self.coded.nearest(code);
        self.place(slot, list, code, scale);
    }

    /// Stores the unit vector of `slot` (replacing any); `hint` is the
    /// partition saved for it, if any ([`SavedPartitions`]).
    pub fn set(&mut self, slot: u32, v: &[f32], hint: Option<u32>) {
        if v.len() != self.dim || self.dim == 0 {
            return;
        }
        let (q, scale) = quantize(v);
        if scale == 0.0 {
            self.clear(slot);
            return;
        }
        self.put(slot, &q, scale, hint);
    }

    /// Stores `slot`'s row from its i8 codes (as [`Self::set`] would have
    /// made them).
    pub fn set_code(&mut self, slot: u32, code: &[i8], scale: f32, hint: Option<u32>) {
        if code.len() != self.dim || self.dim == 0 || scale == 0.0 {
            return;
        }
        self.put(slot, code, scale, hint);
    }

    /// Takes saved partitions into an empty index (a rebuild's): rows are
    /// then placed into their saved partition, and the rest held back for
    /// [`Self::maintain`]. A million agents' partitions are otherwise
    /// trained and assigned again at every start (a quarter of the build).
    pub fn adopt(&mut self, saved: &SavedPartitions) {
        if self.live > 0 || saved.dim != self.dim || saved.centroids.is_empty() {
            return;
        }
        self.centroids = saved.centroids.clone();
        self.coded = CodedCentroids::new(&self.centroids, self.dim);
        self.lists = vec![List::default(); self.partitions()];
        self.trained_at = saved.trained_at;
        self.staging = true;
    }

    /// Trains the partitions when the collection has doubled since they
    /// were last trained (or first passes [`IVF_MIN`]). Called after a batch
    /// of changes, so a rebuild trains once, on everything.
    pub fn maintain(&mut self) {
        // Partitions adopted from a directory several times the size of
        // this one are too many for it: they go, and training decides
        // again (what a start did before partitions were saved).
        if self.staging && self.live.saturating_mul(4) < self.trained_at {
            self.unpartition();
        }
        if let Some(t) = self.train() {
            self.install(t);
        }
        self.staging = false;
        let pending = std::mem::take(&mut self.pending);
        if pending.slots.is_empty() {
            return;
        }
        let dim = self.dim;
        let lists = assign(
            &self.coded,
            pending.slots.len(),
            |i| pending.row(i, dim).0,
            every_core(),
        );
        for (i, (&slot, list)) in pending.slots.iter().zip(lists).enumerate() {
            let (code, scale) = pending.row(i, dim);
            let pos = self.lists[list].push(slot, code, scale);
            self.at[slot as usize] = (list as u32, pos);
            self.placed_since_saved += 1;
        }
    }

    /// Every row back in one list, untrained.
    fn unpartition(&mut self) {
        let (one, at) = self.regrouped(1, |_| 0);
        self.lists = one;
        self.at = at;
        self.centroids.clear();
        self.coded = CodedCentroids::default();
        self.pending = List::default();
        self.trained_at = 0;
    }

    /// Every stored row (pending ones included) copied into `n` new lists,
    /// each into list `list_of(its index among the stored rows)`, with the
    /// positions that go with them.
    fn regrouped(
        &self,
        n: usize,
        list_of: impl Fn(usize) -> usize,
    ) -> (Vec<List>, Vec<(u32, u32)>) {
        let mut lists = vec![List::default(); n];
        let mut at = vec![NONE; self.at.len()];
        for (i, s) in self.stored_slots().into_iter().enumerate() {
            if let Some((code, scale)) = self.code(s) {
                let l = list_of(i);
                let pos = lists[l].push(s, code, scale);
                at[s as usize] = (l as u32, pos);
            }
        }
        (lists, at)
    }

    /// Every slot with a row, in slot order.
    fn stored_slots(&self) -> Vec<u32> {
        (0..self.at.len() as u32).filter(|&s| self.has(s)).collect()
    }

    /// Whether [`Self::maintain`] would train.
    pub fn training_due(&self) -> bool {
        self.live >= IVF_MIN && self.live >= 2 * self.trained_at
    }

    /// New partitions for the rows held now, when training is due (a
    /// rebuild's, which holds the index alone; the live indexer's runs
    /// beside it, see [`Retraining`]).
    fn train(&self) -> Option<Trained> {
        self.training_due().then(|| self.trained())
    }

    fn install(&mut self, t: Trained) {
        self.coded = CodedCentroids::new(&t.centroids, self.dim);
        self.centroids = t.centroids;
        self.lists = t.lists;
        self.at = t.at;
        self.trained_at = t.rows;
        // Training assigned every row, those held back included.
        self.pending = List::default();
        self.placed_since_saved = self.live.max(1);
        self.generation += 1;
    }

    pub fn clear(&mut self, slot: u32) {
        if let Some((_, touched)) = &mut self.retraining {
            touched.insert(slot);
        }
        let s = slot as usize;
        let Some(&(list, pos)) = self.at.get(s).filter(|a| **a != NONE) else {
            return;
        };
        self.at[s] = NONE;
        self.live -= 1;
        let dim = self.dim;
        let rows = if list == PENDING {
            &mut self.pending
        } else {
            &mut self.lists[list as usize]
        };
        if let Some(moved) = rows.swap_remove(pos as usize, dim) {
            self.at[moved as usize] = (list, pos);
        }
    }

    /// Cosine of two stored rows (0 when either has none).
    pub fn cosine(&self, a: u32, b: u32) -> f32 {
        match (self.code(a), self.code(b)) {
            (Some((x, sx)), Some((y, sy))) => dot_i8(x, y) as f32 * sx * sy,
            _ => 0.0,
        }
    }

    /// Cosine of `q` (unit length, f32) to the row of `slot`: the re-score
    /// of the candidates the approximate scan found.
    pub fn exact(&self, slot: u32, q: &[f32]) -> f32 {
        match self.code(slot) {
            Some((code, scale)) if q.len() == self.dim => dot_f32_i8(q, code) * scale,
            _ => 0.0,
        }
    }

    /// Trains the partitions on a sample and assigns every row. Rows are
    /// compared with the centroids by their i8 codes, as they are placed
    /// later: a quarter of the work of decoding them to f32, and training
    /// runs on every node while it serves.
    fn trained(&self) -> Trained {
        let (sample, nlist) = self.sample();
        let slots = self.stored_slots();
        let centroids = kmeans(&sample, nlist, self.dim);
        let coded = CodedCentroids::new(&centroids, self.dim);
        let assigned = assign(
            &coded,
            slots.len(),
            |i| self.code(slots[i]).map_or(&[][..], |(code, _)| code),
            every_core(),
        );
        let (lists, at) = self.regrouped(nlist, |i| assigned[i]);
        Trained {
            centroids,
            lists,
            at,
            rows: slots.len(),
        }
    }

    /// The rows training learns from (every row up to [`TRAIN_SAMPLE`],
    /// else evenly spaced ones), and the number of partitions for the rows
    /// held now.
    fn sample(&self) -> (List, usize) {
        let slots = self.stored_slots();
        let nlist = ((2.0 * (slots.len() as f64).sqrt()) as usize).clamp(16, 4096);
        let step = (slots.len() / TRAIN_SAMPLE).max(1);
        let mut sample = List::default();
        for &s in slots.iter().step_by(step) {
            if let Some((code, scale)) = self.code(s) {
                sample.push(s, code, scale);
            }
        }
        (sample, nlist)
    }

    /// Begins a [`Retraining`] when training is due and none is running:
    /// copies out the rows it samples, and from now on notes every row
    /// that changes.
    pub fn begin_retraining(&mut self) -> Option<Retraining> {
        if !self.retraining_due() {
            return None;
        }
        let (sample, nlist) = self.sample();
        if sample.slots.is_empty() {
            return None;
        }
        let id = RETRAININGS.fetch_add(1, Ordering::Relaxed);
        self.retraining = Some((id, HashSet::new()));
        Some(Retraining {
            id,
            rows: self.live,
            nlist,
            sample,
            next: VectorIndex::new(self.dim),
        })
    }

    /// Copies the rows of slots `from..` into `into` for retraining `id`,
    /// at most `max` slots' worth; the slot to go on from (`from` itself
    /// once none is left, or when `id` is not running here: the index was
    /// replaced, and its rows are not the retraining's).
    fn copy_rows(&self, id: u64, from: u32, max: usize, into: &mut List) -> u32 {
        if !self.running(id) {
            return from;
        }
        let end = (from as usize).saturating_add(max).min(self.at.len());
        for s in from as usize..end {
            if let Some((code, scale)) = self.code(s as u32) {
                into.push(s as u32, code, scale);
            }
        }
        (end as u32).max(from)
    }

    /// Installs a finished [`Retraining`] begun on this index, placing
    /// again every row that changed since it began, and gives back the
    /// partitions it replaced (for the caller to drop once it has let go
    /// of the index's lock); None, and nothing changed, for a retraining
    /// begun elsewhere or given up.
    pub fn install_retrained(&mut self, r: Retraining) -> Option<VectorIndex> {
        let touched = match self.retraining.take() {
            Some((id, touched)) if id == r.id => touched,
            other => {
                self.retraining = other;
                return None;
            }
        };
        let mut next = r.next;
        if next.partitions() == 0 {
            return None;
        }
        for slot in touched {
            next.clear(slot);
            if let Some((code, scale)) = self.code(slot) {
                let code = code.to_vec();
                next.put(slot, &code, scale, None);
            }
        }
        next.reach(self.at.len().saturating_sub(1) as u32);
        next.trained_at = r.rows;
        next.placed_since_saved = next.live.max(1);
        next.generation = self.generation + 1;
        Some(std::mem::replace(self, next))
    }

    /// The rows changed since retraining `id` began or last took them;
    /// it notes changes afresh from here. None when `id` is not running.
    pub fn take_changed(&mut self, id: u64) -> Option<Changed> {
        let touched = match &mut self.retraining {
            Some((running, touched)) if *running == id => std::mem::take(touched),
            _ => return None,
        };
        let mut changed = Changed {
            removed: Vec::new(),
            rows: List::default(),
        };
        for slot in touched {
            match self.code(slot) {
                Some((code, scale)) => {
                    changed.rows.push(slot, code, scale);
                }
                None => changed.removed.push(slot),
            }
        }
        Some(changed)
    }

    /// Whether a [`Retraining`] begun on this index is still running.
    pub fn retraining(&self) -> bool {
        self.retraining.is_some()
    }

    /// Whether a [`Retraining`] may begin: training is due, and none runs.
    pub fn retraining_due(&self) -> bool {
        !self.retraining() && self.training_due()
    }

    /// Whether retraining `id` is the one running on this index.
    fn running(&self, id: u64) -> bool {
        self.retraining.as_ref().is_some_and(|(r, _)| *r == id)
    }

    /// Forgets a retraining that will not be installed (it failed), so
    /// that the next one may begin.
    pub fn abandon_retraining(&mut self, id: u64) {
        if self.running(id) {
            self.retraining = None;
        }
    }

    /// Approximate cosine of the query `code` (from [`quantize`]) to the
    /// vector of `slot`; 0 when it has none.
    pub fn approx(&self, slot: u32, code: &(Vec<i8>, f32)) -> f32 {
        match self.code(slot) {
            Some((row, scale)) if code.0.len() == self.dim => {
                dot_i8(&code.0, row) as f32 * code.1 * scale
            }
            _ => 0.0,
        }
    }

    /// Approximate cosines of the query `code` to the vectors of `slots`,
    /// in order, reading only the rows in the partitions nearest the query:
    /// as many partitions as would hold `want` of `slots` if they were
    /// spread evenly (every row while unpartitioned, or when that would be
    /// half the partitions or more). A skipped row is None; a slot without
    /// a vector, or whose row waits to be placed, is read (0 without one).
    ///
    /// A selective filter's agents are scattered over the lists, so each
    /// row read is a cache miss of its own: at 100k agents reading a tag's
    /// 2,000 rows was a third of such a query. The rows in far partitions
    /// are the least likely to be among the best, and most of the reads.
    pub fn approx_near(
        &self,
        slots: &[u32],
        code: &(Vec<i8>, f32),
        want: usize,
    ) -> Vec<Option<f32>> {
        let nlist = self.partitions();
        let probe = want.saturating_mul(nlist).div_ceil(slots.len().max(1));
        let near: Option<Vec<bool>> = (code.0.len() == self.dim && probe < nlist / 2).then(|| {
            let mut near = vec![false; nlist];
            for c in self.nearest_lists(&code.0, probe.max(1)) {
                near[c] = true;
            }
            near
        });
        let read = |list: u32| {
            list != NONE.0
                && near
                    .as_ref()
                    .is_none_or(|n| n.get(list as usize).copied().unwrap_or(true))
        };
        slots
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                self.prefetch_ahead_in(slots, i, read);
                match self.at.get(s as usize) {
                    Some(&(list, _)) if list != NONE.0 && !read(list) => None,
                    _ => Some(self.approx(s, code)),
                }
            })
            .collect()
    }

    /// Called at position `i` of a walk over `slots`: starts loading the
    /// rows a few slots ahead, in two steps - a slot's position first,
    /// then (once that has arrived) its row; rows visited by slot are
    /// scattered over the lists.
    pub fn prefetch_ahead(&self, slots: &[u32], i: usize) {
        self.prefetch_ahead_in(slots, i, |_| true);
    }

    /// [`Self::prefetch_ahead`] asking only for the rows in the lists that
    /// `read` accepts (the rows a walk will read).
    fn prefetch_ahead_in(&self, slots: &[u32], i: usize, read: impl Fn(u32) -> bool) {
        if let Some(far) = slots
            .get(i + 2 * AHEAD)
            .and_then(|&f| self.at.get(f as usize))
        {
            prefetch(std::slice::from_ref(far));
        }
        let next = slots
            .get(i + AHEAD)
            .and_then(|&next| self.at.get(next as usize))
            .filter(|a| **a != NONE && read(a.0))
            .and_then(|&(list, pos)| Some(self.list(list)?.row(pos as usize, self.dim)));
        if let Some((code, _)) = next {
            prefetch(code);
        }
    }

    /// Rows in the square root of the partitions (16 to 64 of them; all
    /// rows while unpartitioned): up to this many holders, a required
    /// tag's agents are scanned rather than filtered out of the vector
    /// candidates.
    ///
    /// Deliberately not the rows [`Self::top`] probes. When the probes went
    /// from the full square root to three quarters of it, the bound went
    /// with them: at 1M agents a tag held by 2 % (20,000) fell just above
    /// it, so its queries took the vector path, whose filter then had to
    /// search far for agents it admits (p50 / p99 1.2-1.6 / 5.3-6.8 ms
    /// against 0.9 / 1.4 ms on the tag path, in `agentry bench discover`).
    pub fn tag_scan_rows(&self) -> usize {
        tag_scan_bound(self.live, self.partitions())
    }

    /// Up to `k` admitted slots with the best approximate scores, in no
    /// particular order, as (slot, approximate cosine). `code` is the
    /// query quantized.
    pub fn top(
        &self,
        q: &[f32],
        code: &(Vec<i8>, f32),
        k: usize,
        admit: impl Admit,
    ) -> Vec<(u32, f32)> {
        let probe = nprobe(self.partitions(), self.live);
        self.top_probing(q, code, k, probe, admit)
    }

    /// [`Self::top`] probing `nprobe` partitions (ignored when unpartitioned).
    ///
    /// A filter that admits fewer than `k` of the probed rows probes
    /// further, four times as many partitions a round, nearest first, up
    /// to every one: a filter that admits 30 of a directory's agents finds
    /// those 30 wherever they were placed. The filter is selective then,
    /// so the further rounds check it before scoring a row. A filter that
    /// admits almost nothing thus reads every agent's facts once, as a
    /// database's scan without an index would; rate limits bound how often.
    fn top_probing(
        &self,
        q: &[f32],
        code: &(Vec<i8>, f32),
        k: usize,
        nprobe: usize,
        admit: impl Admit,
    ) -> Vec<(u32, f32)> {
        if q.len() != self.dim || code.0.len() != self.dim || k == 0 || self.live == 0 {
            return Vec::new();
        }
        let (qq, qscale) = (&code.0, code.1);
        // Every partition by its nearness (the one list while
        // unpartitioned): the `nprobe` nearest first, the rest after them.
        let by_nearness = |a: &(f32, usize), b: &(f32, usize)| b.0.total_cmp(&a.0);
        let mut order = match self.partitions() {
            0 => vec![(0.0, 0)],
            _ => self.nearness(qq),
        };
        let first = nprobe.clamp(1, order.len());
        order.select_nth_unstable_by(first - 1, by_nearness);
        let (probed, rest) = order.split_at_mut(first);
        let mut scored: Vec<(f32, u32)> =
            Vec::with_capacity(probed.iter().map(|&(_, c)| self.lists[c].slots.len()).sum());
        for &(_, c) in probed.iter() {
            let list = &self.lists[c];
            each_dot_i8(qq, &list.codes, |i, dot| {
                scored.push((dot as f32 * qscale * list.scales[i], list.slots[i]));
            });
        }
        let mut found = best_admitted(
            scored,
            k,
            Prefetching(|s| admit.admit(s), |s| admit.ahead(s)),
        );
        if found.len() >= k || rest.is_empty() {
            return found;
        }
        // Every admitted row probed so far is in `found`. The rest of the
        // partitions, nearest first.
        rest.sort_unstable_by(by_nearness);
        let mut round = probed.len();
        let mut next = &*rest;
        let mut more: Vec<(f32, u32)> = Vec::new();
        let score = |row: &[i8], scale: f32| dot_i8(qq, row) as f32 * qscale * scale;
        while !next.is_empty() && found.len() + more.len() < k {
            round = round.saturating_mul(4);
            let (now, later) = next.split_at(round.min(next.len()));
            for &(_, c) in now {
                let list = &self.lists[c];
                for (i, &slot) in list.slots.iter().enumerate() {
                    if let Some(&ahead) = list.slots.get(i + AHEAD) {
                        admit.ahead(ahead);
                    }
                    if admit.admit(slot) {
                        let (row, scale) = list.row(i, self.dim);
                        more.push((score(row, scale), slot));
                    }
                }
            }
            next = later;
        }
        found.extend(best_admitted(more, k - found.len(), |_| true));
        found
    }

    /// The `n` partitions (at least one, at most all) whose centroids are
    /// nearest the query `qq`, by the i8 centroids, as rows are placed.
    fn nearest_lists(&self, qq: &[i8], n: usize) -> Vec<usize> {
        let nlist = self.partitions();
        if nlist == 0 {
            return Vec::new();
        }
        let n = n.clamp(1, nlist);
        let mut order = self.nearness(qq);
        order.select_nth_unstable_by(n - 1, |a, b| b.0.total_cmp(&a.0));
        order[..n].iter().map(|&(_, c)| c).collect()
    }

    /// Every partition as (its i8 centroid's score against the query
    /// `qq`, the partition), in partition order.
    fn nearness(&self, qq: &[i8]) -> Vec<(f32, usize)> {
        let mut order: Vec<(f32, usize)> = Vec::with_capacity(self.partitions());
        each_dot_i8(qq, &self.coded.codes, |c, dot| {
            order.push((dot as f32 * self.coded.scales[c], c));
        });
        order
    }

    /// Bytes held for the vectors (codes, scales, positions, centroids).
    pub fn bytes(&self) -> usize {
        let lists: usize = self.lists.iter().map(List::bytes).sum();
        lists + self.pending.bytes() + self.at.len() * 8 + self.centroids.len() * 4
    }

    /// How well the candidate scan finds the true nearest vectors: for
    /// each probe count (the default, half and double it), the share of
    /// each query's `k` nearest by `truth` (a slot's cosine to a query;
    /// the benchmark passes an f32 scan of the agents' vectors) that
    /// [`Self::top`] returns among its `pool` candidates, and the scan's
    /// mean time. For the benchmark, which is how the default probe count
    /// was chosen.
    pub fn recall(
        &self,
        queries: &[Vec<f32>],
        k: usize,
        pool: usize,
        truth: impl Fn(u32, &[f32]) -> Option<f32>,
    ) -> Vec<ProbeRecall> {
        let nlist = self.partitions();
        if nlist == 0 {
            return Vec::new();
        }
        let default = nprobe(nlist, self.live);
        let slots = self.stored_slots();
        let truth: Vec<Vec<u32>> = queries
            .iter()
            .map(|q| {
                let scored = slots
                    .iter()
                    .filter_map(|&s| Some((truth(s, q)?, s)))
                    .collect();
                best_admitted(scored, k, |_| true)
                    .into_iter()
                    .map(|(s, _)| s)
                    .collect()
            })
            .collect();
        let mut probes = vec![(default / 2).max(1), default, (default * 2).min(nlist)];
        probes.dedup();
        probes
            .into_iter()
            .map(|probe| {
                let (mut found, mut wanted) = (0usize, 0usize);
                let started = std::time::Instant::now();
                for (q, want) in queries.iter().zip(&truth) {
                    let got = self.top_probing(q, &quantize(q), pool, probe, |_| true);
                    found += found_in(want, &got);
                    wanted += want.len();
                }
                ProbeRecall {
                    nprobe: probe,
                    partitions: nlist,
                    pool,
                    recall: found as f64 / wanted.max(1) as f64,
                    scan_us: started.elapsed().as_secs_f64() * 1e6 / queries.len().max(1) as f64,
                }
            })
            .collect()
    }

    /// See [`super::search::Index::compact`]. The lists grew by doubling
    /// while rows were placed: their spare room goes.
    pub fn compact(&mut self) {
        for l in &mut self.lists {
            l.shrink_to_fit();
        }
        self.pending.shrink_to_fit();
        self.at.shrink_to_fit();
    }

    /// Partitions (0 while every row is in one list).
    pub fn partitions(&self) -> usize {
        self.centroids.len() / self.dim.max(1)
    }

    /// The partitions and each row's, keyed by `keys[slot]`, for
    /// [`SavedPartitions::decode`]; None while unpartitioned.
    pub fn saved(&self, keys: &[u64]) -> Option<Vec<u8>> {
        let nlist = self.partitions();
        if nlist == 0 {
            return None;
        }
        let mut out = Vec::with_capacity(28 + self.centroids.len() * 4 + self.live * 12);
        out.extend(SAVED_MAGIC);
        out.extend((self.dim as u32).to_le_bytes());
        out.extend((nlist as u32).to_le_bytes());
        out.extend((self.trained_at as u64).to_le_bytes());
        let count_at = out.len();
        out.extend(0u64.to_le_bytes());
        for c in &self.centroids {
            out.extend(c.to_le_bytes());
        }
        let mut rows = 0u64;
        for (a, key) in self.at.iter().zip(keys) {
            if *a != NONE && a.0 != PENDING {
                out.extend(key.to_le_bytes());
                out.extend(a.0.to_le_bytes());
                rows += 1;
            }
        }
        out[count_at..count_at + 8].copy_from_slice(&rows.to_le_bytes());
        Some(out)
    }

    /// Rows placed since [`Self::mark_saved`] (all of them after training).
    pub fn placed_since_saved(&self) -> usize {
        self.placed_since_saved
    }

    /// Which partitions these are (see [`Self::mark_saved`]).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Notes that the partitions of `generation` were saved (nothing, when
    /// others were installed since they were encoded).
    pub fn mark_saved(&mut self, generation: u64) {
        if generation == self.generation {
            self.placed_since_saved = 0;
        }
    }

    /// Rows counted in the index.
    pub fn live(&self) -> usize {
        self.live
    }
}

const SAVED_MAGIC: &[u8; 4] = b"IVF1";

/// Partitions saved beside the records ([`VectorIndex::saved`]): the
/// centroids, the row count they were trained at, and each row's
/// partition by a 64-bit key of its agent id. Derived data: whatever does
/// not match is assigned again.
pub struct SavedPartitions {
    dim: usize,
    centroids: Vec<f32>,
    trained_at: usize,
    rows: std::collections::HashMap<u64, u32, foldhash::fast::RandomState>,
}

impl SavedPartitions {
    /// None for bytes that are not a saving of `dim`-dimensional partitions.
    pub fn decode(bytes: &[u8], dim: usize) -> Option<Self> {
        let u32_at = |at: usize| -> Option<usize> {
            Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize)
        };
        let u64_at = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        if bytes.get(..4)? != SAVED_MAGIC || u32_at(4)? != dim || dim == 0 {
            return None;
        }
        let nlist = u32_at(8)?;
        let trained_at = usize::try_from(u64_at(12)?).ok()?;
        let rows = usize::try_from(u64_at(20)?).ok()?;
        let centroids_end = 28usize.checked_add(nlist.checked_mul(dim)?.checked_mul(4)?)?;
        if nlist == 0 || bytes.len() != centroids_end.checked_add(rows.checked_mul(12)?)? {
            return None;
        }
        let centroids = bytes[28..centroids_end]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut by_key =
            std::collections::HashMap::with_capacity_and_hasher(rows, Default::default());
        for row in bytes[centroids_end..].chunks_exact(12) {
            let key = u64::from_le_bytes(row[..8].try_into().ok()?);
            let list = u32::from_le_bytes(row[8..].try_into().ok()?);
            if list as usize >= nlist {
                return None;
            }
            by_key.insert(key, list);
        }
        Some(Self {
            dim,
            centroids,
            trained_at,
            rows: by_key,
        })
    }

    /// The partition saved for the row keyed `key`.
    pub fn list_of(&self, key: u64) -> Option<u32> {
        self.rows.get(&key).copied()
    }
}

/// Recall of the partitioned scan at one probe count (see
/// [`VectorIndex::recall`]).
#[derive(Debug, Clone)]
pub struct ProbeRecall {
    pub nprobe: usize,
    pub partitions: usize,
    pub pool: usize,
    pub recall: f64,
    pub scan_us: f64,
}

/// How many of `truth` are among `got`, for the recall figures.
pub(crate) fn found_in(truth: &[u32], got: &[(u32, f32)]) -> usize {
    truth
        .iter()
        .filter(|s| got.iter().any(|(g, _)| g == *s))
        .count()
}

/// A hard filter over slots, as the candidate scans apply it: any
/// `Fn(u32) -> bool`, or a [`Prefetching`] one.
pub(crate) trait Admit {
    fn admit(&self, slot: u32) -> bool;
    /// Called a few slots before `admit(slot)`, so that what the filter
    /// reads (scattered in memory) can be asked for early.
    fn ahead(&self, _slot: u32) {}
}

impl<F: Fn(u32) -> bool> Admit for F {
    fn admit(&self, slot: u32) -> bool {
        self(slot)
    }
}

/// A filter (`.0`) with the prefetch (`.1`) of what it reads.
pub(crate) struct Prefetching<A, P>(pub A, pub P);

impl<A: Fn(u32) -> bool, P: Fn(u32)> Admit for Prefetching<A, P> {
    fn admit(&self, slot: u32) -> bool {
        (self.0)(slot)
    }
    fn ahead(&self, slot: u32) {
        (self.1)(slot)
    }
}

/// The `k` best admitted items by score, as (slot, score), in no
/// particular order (every caller gathers candidates into a set). A
/// selection first; a sort only when the filter rejects some of the best.
pub(crate) fn best_admitted(
    mut scored: Vec<(f32, u32)>,
    k: usize,
    filter: impl Admit,
) -> Vec<(u32, f32)> {
    const AHEAD: usize = 4;
    let by_score = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0);
    // Usually every one of the best `k` is admitted: then only they are
    // sorted.
    if k > 0 && scored.len() > k {
        scored.select_nth_unstable_by(k - 1, by_score);
        let head = &scored[..k];
        head.iter().take(AHEAD).for_each(|&(_, s)| filter.ahead(s));
        let all = head.iter().enumerate().all(|(i, &(_, s))| {
            if let Some(&(_, next)) = head.get(i + AHEAD) {
                filter.ahead(next);
            }
            filter.admit(s)
        });
        if all {
            return scored[..k].iter().map(|&(sc, s)| (s, sc)).collect();
        }
    }
    let head = (k * 4).max(64);
    if scored.len() > head {
        scored.select_nth_unstable_by(head, by_score);
        let mut first: Vec<(f32, u32)> = scored[..head].to_vec();
        first.sort_unstable_by(by_score);
        let picked: Vec<(u32, f32)> = first
            .iter()
            .filter(|(_, s)| filter.admit(*s))
            .take(k)
            .map(|&(sc, s)| (s, sc))
            .collect();
        if picked.len() == k {
            return picked;
        }
    }
    scored.sort_unstable_by(by_score);
    scored
        .into_iter()
        .filter(|&(_, s)| filter.admit(s))
        .take(k)
        .map(|(sc, s)| (s, sc))
        .collect()
}

/// The partition of each of `n` rows (`row(i)` gives row `i`'s codes):
/// the centroid nearest its codes, by i8 dot products (a quarter of the
/// work of f32; a row near a border may go to its second-nearest
/// partition, which probing absorbs), on every core. At a million agents
/// this assignment was most of an index build.
/// Spherical k-means over `sample`'s rows: `nlist` unit centroids, `dim`
/// each, started from evenly spaced rows; a partition left empty restarts
/// from a row of the sample.
fn kmeans(sample: &List, nlist: usize, dim: usize) -> Vec<f32> {
    let n = sample.slots.len();
    let mut centroids = vec![0.0f32; nlist * dim];
    if n == 0 {
        return centroids;
    }
    let decode_into = |i: usize, out: &mut [f32]| {
        let (code, scale) = sample.row(i, dim);
        out.iter_mut()
            .zip(code)
            .for_each(|(o, &c)| *o = f32::from(c) * scale);
    };
    let spacing = (n / nlist).max(1);
    for (c, row) in centroids.chunks_exact_mut(dim).enumerate() {
        decode_into((c * spacing) % n, row);
    }
    for _ in 0..TRAIN_ROUNDS {
        let coded = CodedCentroids::new(&centroids, dim);
        let mut sums = vec![0.0f32; nlist * dim];
        let mut counts = vec![0usize; nlist];
        for i in 0..n {
            let (code, scale) = sample.row(i, dim);
            let c = coded.nearest(code);
            counts[c] += 1;
            sums[c * dim..(c + 1) * dim]
                .iter_mut()
                .zip(code)
                .for_each(|(a, &b)| *a += f32::from(b) * scale);
        }
        for c in 0..nlist {
            let row = &mut sums[c * dim..(c + 1) * dim];
            if counts[c] == 0 {
                decode_into((c * 7919) % n, row);
            }
            let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt();
            if norm > 0.0 {
                row.iter_mut().for_each(|x| *x /= norm);
            }
        }
        centroids = sums;
    }
    centroids
}

/// The nearest centroid of each of `n` rows, on `threads` threads.
fn assign<'a>(
    coded: &CodedCentroids,
    n: usize,
    row: impl Fn(usize) -> &'a [i8] + Sync,
    threads: usize,
) -> Vec<usize> {
    let nearest = |i: usize| coded.nearest(row(i));
    let part = n.div_ceil(threads.max(1)).max(1);
    let ranges: Vec<std::ops::Range<usize>> = (0..n)
        .step_by(part)
        .map(|start| start..(start + part).min(n))
        .collect();
    std::thread::scope(|scope| {
        let workers: Vec<_> = ranges
            .into_iter()
            .map(|range| {
                let again = range.clone();
                (
                    again,
                    scope.spawn(|| range.map(nearest).collect::<Vec<_>>()),
                )
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|(range, worker)| {
                // A worker that panicked is redone here.
                worker
                    .join()
                    .unwrap_or_else(|_| range.map(nearest).collect::<Vec<_>>())
            })
            .collect()
    })
}

/// Threads for assigning rows when nothing else runs (a rebuild): every
/// core.
fn every_core() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Threads for assigning rows beside a serving index (a [`Retraining`]):
/// half the cores, so that requests keep the rest. Nothing waits for it.
fn half_the_cores() -> usize {
    (every_core() / 2).max(1)
}

/// Partitions a query probes: three quarters of the square root of their
/// number, 16 to 64. The nearest rows of a query sit in a few neighbouring
/// partitions, so the probes needed grow much slower than the partitions
/// (a fixed share would scan a fixed share of the directory). On the
/// benchmark corpus (`agentry bench discover`), recall@10 in the top 100:
/// at 10k agents 16 of 181 partitions find 98.2-99.0 %; at 100k 16 of 512
/// find 99.3-99.6 % (22, the full square root, found 99.7-99.9 % for a
/// third more scanning); at 1M 19, 38 and 76 of 1,448 all find 97.2-97.4
/// % (there the i8 codes, not the probes, bound it), so 28 lose nothing.
///
/// Partitions of a small directory hold few rows each (about 55 at 10k),
/// and there 16 probes found 97.5-99.2 % over twenty-one runs, varying with
/// how the load order trained the partitions: the probes then read at
/// least [`MIN_PROBED_ROWS`] (24 of 181 partitions at 10k found 99.0-99.6
/// % in seven runs, for 2-3 µs more a query). From about 25k rows the
/// square root's share reads more than that anyway.
fn nprobe(nlist: usize, live: usize) -> usize {
    let floor = (MIN_PROBED_ROWS * nlist).div_ceil(live.max(1));
    root_share(nlist, 0.75).max(floor.min(64)).min(nlist)
}

/// Rows a query's probes read at the least (see [`nprobe`]): at 256
/// bytes of codes each, 320 KiB, a few µs of scanning.
const MIN_PROBED_ROWS: usize = 1_280;

/// `share` of the square root of `nlist` partitions, 16 to 64 of them (at
/// most all).
fn root_share(nlist: usize, share: f64) -> usize {
    (((nlist as f64).sqrt() * share) as usize)
        .clamp(16, 64)
        .min(nlist)
}

/// [`VectorIndex::tag_scan_rows`] for `live` rows in `nlist` partitions.
fn tag_scan_bound(live: usize, nlist: usize) -> usize {
    match nlist {
        0 => live,
        n => live * root_share(n, 1.0) / n,
    }
}

/// Centroids as i8 codes with a scale each: a row is placed by i8 dot
/// products with them (a quarter of the work of f32; a row near a border
/// may go to its second-nearest partition, which probing absorbs).
#[derive(Default)]
struct CodedCentroids {
    codes: Vec<i8>,
    scales: Vec<f32>,
}

impl CodedCentroids {
    fn new(centroids: &[f32], dim: usize) -> Self {
        let mut out = Self::default();
        for row in centroids.chunks_exact(dim.max(1)) {
            let (code, scale) = quantize(row);
            out.codes.extend_from_slice(&code);
            out.scales.push(scale);
        }
        out
    }

    /// The centroid nearest `row` (0 when there are none).
    fn nearest(&self, row: &[i8]) -> usize {
        let mut best = (f32::MIN, 0);
        each_dot_i8(row, &self.codes, |i, dot| {
            let d = dot as f32 * self.scales[i];
            if d > best.0 {
                best = (d, i);
            }
        });
        best.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(seed: u64, dim: usize) -> Vec<f32> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut v: Vec<f32> = (0..dim)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 33) as f32 / (1u64 << 31) as f32) - 0.5
            })
            .collect();
        let n = v.iter().map(|a| a * a).sum::<f32>().sqrt();
        v.iter_mut().for_each(|a| *a /= n);
        v
    }

    /// An index holding rows 0..n, each `unit(row)`, not yet trained.
    fn with_rows(n: u32, dim: usize) -> VectorIndex {
        let mut ix = VectorIndex::new(dim);
        for s in 0..n {
            ix.set(s, &unit(u64::from(s), dim), None);
        }
        ix
    }

    #[test]
    fn partitioned_search_finds_the_nearest_rows_and_honours_filters() {
        let dim = 32;
        let mut ix = with_rows(6000, dim);
        assert_eq!(ix.partitions(), 0, "trained only when asked");
        ix.maintain();
        assert!(ix.partitions() > 0, "trained once past {IVF_MIN} rows");
        // A query equal to a stored row finds that row first.
        for probe in [3u32, 1234, 5999] {
            let q = unit(u64::from(probe), dim);
            let top = ix.top(&q, &quantize(&q), 5, |_| true);
            let best = top.iter().max_by(|a, b| a.1.total_cmp(&b.1));
            assert_eq!(best.map(|b| b.0), Some(probe));
            assert!((ix.exact(probe, &q) - 1.0).abs() < 1e-2);
            let odd = ix.top(&q, &quantize(&q), 5, |s| s % 2 == 1);
            assert!(odd.iter().all(|(s, _)| s % 2 == 1));
        }
        ix.clear(1234);
        let q = unit(1234, dim);
        assert!(ix
            .top(&q, &quantize(&q), 5, |_| true)
            .iter()
            .all(|(s, _)| *s != 1234));
        // Removal moved another row's code within its partition; every
        // other row is still found.
        for probe in [3u32, 1235, 5999] {
            let q = unit(u64::from(probe), dim);
            assert_eq!(ix.top(&q, &quantize(&q), 1, |_| true)[0].0, probe);
        }
    }

    #[test]
    fn every_row_stays_its_own_through_removals_training_and_replacement() {
        let dim = 32;
        let n = 6000u32;
        let mut ix = with_rows(n, dim);
        ix.maintain();
        assert!(ix.partitions() > 0);
        // Removals move each list's last row into the hole; replacements
        // (some of removed rows) move a row to another list.
        for s in (0..n).step_by(3) {
            ix.clear(s);
        }
        for s in (1..n).step_by(7) {
            ix.set(s, &unit(u64::from(s) + 1_000_000, dim), None);
        }
        let expected = |s: u32| -> Option<Vec<f32>> {
            if s % 7 == 1 {
                Some(unit(u64::from(s) + 1_000_000, dim))
            } else if s.is_multiple_of(3) {
                None
            } else {
                Some(unit(u64::from(s), dim))
            }
        };
        let check = |ix: &VectorIndex| {
            for s in 0..n {
                match expected(s) {
                    None => assert!(!ix.has(s) && ix.exact(s, &unit(0, dim)) == 0.0, "{s}"),
                    Some(v) => assert!(ix.exact(s, &v) > 0.99, "row {s} is not its own"),
                }
            }
            let rows: usize = ix.lists.iter().map(|l| l.slots.len()).sum();
            assert_eq!(rows + ix.pending.slots.len(), ix.live());
        };
        check(&ix);
        // Retrained on the rows now held: every row regrouped.
        let trained = ix.trained();
        ix.install(trained);
        check(&ix);
        ix.compact();
        check(&ix);
    }

    /// What the retraining tests leave in slot `s` of `0..n + 500`: rows
    /// added (`n..`), replaced (every seventh) and removed (every fifth)
    /// while the partitions were retrained beside the index.
    fn changed_meanwhile(s: u32, dim: usize) -> Option<Vec<f32>> {
        if s % 7 == 2 {
            Some(unit(u64::from(s) + 2_000_000, dim))
        } else if s.is_multiple_of(5) {
            None
        } else {
            Some(unit(u64::from(s), dim))
        }
    }

    #[test]
    fn a_retraining_beside_the_index_places_again_the_rows_changed_meanwhile() {
        let (dim, n) = (32, 6000u32);
        let mut ix = with_rows(n, dim);
        let mut run = ix.begin_retraining().expect("due past the minimum");
        assert!(ix.begin_retraining().is_none(), "one at a time");
        // Changes before the centroids are trained, and between the
        // chunks that copy the rows out (the indexer goes on meanwhile).
        for s in (0..n).step_by(5) {
            ix.clear(s);
        }
        run.train();
        let mut chunk = 0u32;
        run.fill(|copy| {
            let (from, to) = (chunk * 100, (chunk + 1) * 100);
            for s in (from..to).filter(|s| s % 7 == 2) {
                ix.set(s, &unit(u64::from(s) + 2_000_000, dim), None);
            }
            for s in (n + chunk * 100..n + (chunk + 1) * 100).take_while(|&s| s < n + 500) {
                if let Some(v) = changed_meanwhile(s, dim) {
                    ix.set(s, &v, None);
                }
            }
            chunk += 1;
            copy(&ix);
        });
        // Half the rest of the replacements come after every row was
        // copied, and are filed outside the lock; the other half only at
        // the install.
        let half = chunk * 100 + (n - chunk * 100) / 2;
        for s in (chunk * 100..half).filter(|s| s % 7 == 2) {
            ix.set(s, &unit(u64::from(s) + 2_000_000, dim), None);
        }
        run.apply(ix.take_changed(run.id()).expect("running"));
        assert!(ix.take_changed(run.id() + 1).is_none(), "not running");
        for s in (half..n).filter(|s| s % 7 == 2) {
            ix.set(s, &unit(u64::from(s) + 2_000_000, dim), None);
        }
        let generation = ix.generation();
        let replaced = ix.install_retrained(run).expect("begun on this index");
        assert_eq!(replaced.partitions(), 0);
        assert!(ix.partitions() > 0);
        assert_eq!(ix.generation(), generation + 1);
        let mut live = 0;
        for s in 0..n + 500 {
            match changed_meanwhile(s, dim) {
                None => assert!(!ix.has(s), "row {s} was removed"),
                Some(v) => {
                    live += 1;
                    assert!(ix.exact(s, &v) > 0.99, "row {s} is not its own");
                    // Filed where a search for it looks.
                    let top = ix.top(&v, &quantize(&v), 1, |_| true);
                    assert_eq!(top.first().map(|t| t.0), Some(s), "row {s} is not found");
                }
            }
        }
        assert_eq!(ix.live(), live);
        let rows: usize = ix.lists.iter().map(|l| l.slots.len()).sum();
        assert_eq!(rows, live, "each row in one list, once");
        // Trained at the rows it began with: not due again until they double.
        assert!(ix.begin_retraining().is_none());
    }

    #[test]
    fn a_retraining_given_up_or_begun_elsewhere_changes_nothing() {
        let dim = 32;
        let mut ix = with_rows(5000, dim);
        let mut other = with_rows(5000, dim);
        let mut run = ix.begin_retraining().expect("due");
        run.train();
        run.fill(|copy| copy(&ix));
        let mut elsewhere = other.begin_retraining().expect("due");
        elsewhere.train();
        // Rows of an index that is not retraining it are not copied.
        let mut copies = 0;
        elsewhere.fill(|copy| {
            copies += 1;
            copy(&ix)
        });
        assert_eq!((copies, elsewhere.next.live()), (1, 0));
        elsewhere.fill(|copy| copy(&other));
        assert!(ix.install_retrained(elsewhere).is_none(), "another index's");
        assert_eq!(ix.partitions(), 0);
        ix.abandon_retraining(run.id());
        assert!(ix.install_retrained(run).is_none(), "given up");
        assert_eq!(ix.partitions(), 0);
        // Giving up lets the next one begin.
        assert!(ix.begin_retraining().is_some());
    }

    #[test]
    fn partitions_installed_after_a_save_was_encoded_stay_due() {
        let dim = 32;
        let mut ix = with_rows(5000, dim);
        ix.maintain();
        let encoded = ix.generation();
        for s in 5000..10_000 {
            ix.set(s, &unit(u64::from(s), dim), None);
        }
        let mut run = ix.begin_retraining().expect("doubled");
        run.train();
        run.fill(|copy| copy(&ix));
        assert!(ix.install_retrained(run).is_some());
        ix.mark_saved(encoded);
        assert!(
            ix.placed_since_saved() > 0,
            "the new partitions are not saved"
        );
        ix.mark_saved(ix.generation());
        assert_eq!(ix.placed_since_saved(), 0);
    }

    #[test]
    fn saved_partitions_place_every_row_as_before_without_training() {
        let (dim, n) = (32, 6000u32);
        let keys: Vec<u64> = (0..n).map(|s| u64::from(s) * 7 + 1).collect();
        let mut first = with_rows(n, dim);
        assert!(
            first.saved(&keys).is_none(),
            "nothing to save unpartitioned"
        );
        first.maintain();
        let bytes = first.saved(&keys).expect("partitioned");
        assert!(
            SavedPartitions::decode(&bytes, dim + 1).is_none(),
            "another dimension"
        );
        assert!(SavedPartitions::decode(&bytes[..bytes.len() - 1], dim).is_none());
        assert!(SavedPartitions::decode(b"IVF1", dim).is_none());
        let saved = SavedPartitions::decode(&bytes, dim).expect("decodes");

        // A rebuild: every known row goes to its saved partition, one new
        // row waits and is assigned by `maintain`, which does not train.
        let mut again = VectorIndex::new(dim);
        again.adopt(&saved);
        for s in 0..n {
            let hint = saved.list_of(u64::from(s) * 7 + 1);
            assert!(hint.is_some());
            again.set(s, &unit(u64::from(s), dim), hint);
        }
        again.set(n, &unit(u64::from(n), dim), None);
        assert_eq!(again.pending.slots, vec![n]);
        again.maintain();
        assert!(again.pending.slots.is_empty());
        assert_eq!(again.centroids, first.centroids, "not trained again");
        assert_eq!(again.live(), n as usize + 1);
        for s in 0..n as usize {
            assert_eq!(again.at[s].0, first.at[s].0, "row {s} kept its partition");
        }
        assert_ne!(again.at[n as usize], NONE);
        for probe in [3u32, 1234, n] {
            let q = unit(u64::from(probe), dim);
            assert_eq!(again.top(&q, &quantize(&q), 1, |_| true)[0].0, probe);
        }
        assert!(again.placed_since_saved() > 0);
        again.mark_saved(again.generation());
        assert_eq!(again.placed_since_saved(), 0);
    }

    #[test]
    fn partitions_saved_by_a_much_larger_directory_are_not_kept() {
        let dim = 32;
        let mut large = with_rows(6000, dim);
        large.maintain();
        large.clear(1500);
        let keys: Vec<u64> = (0..6000).collect();
        let bytes = large.saved(&keys).expect("partitioned");
        let saved = SavedPartitions::decode(&bytes, dim).expect("decodes");
        assert!(saved.list_of(1500).is_none(), "a removed row is not saved");
        assert!(saved.list_of(1499).is_some());
        let mut small = VectorIndex::new(dim);
        small.adopt(&saved);
        for s in 0..1000u32 {
            small.set(s, &unit(u64::from(s), dim), saved.list_of(u64::from(s)));
        }
        small.set(1000, &unit(1000, dim), None);
        small.maintain();
        assert_eq!(small.partitions(), 0, "1,001 rows are scanned whole");
        assert_eq!(small.live(), 1001);
        for probe in [0u32, 500, 1000] {
            let q = unit(u64::from(probe), dim);
            assert_eq!(small.top(&q, &quantize(&q), 1, |_| true)[0].0, probe);
        }
    }

    #[test]
    fn a_filtered_scan_reads_the_nearest_partitions_rows_and_finds_the_best() {
        let dim = 32;
        let mut ix = with_rows(6000, dim);
        // A filter's agents: every third, spread over every partition.
        let slots: Vec<u32> = (0..6000u32).step_by(3).collect();
        let q = unit(900, dim);
        let code = quantize(&q);
        // Unpartitioned, every row is read.
        assert!(ix
            .approx_near(&slots, &code, 10)
            .iter()
            .all(Option::is_some));
        ix.maintain();
        let nlist = ix.partitions();
        assert!(nlist > 0);
        let read = ix.approx_near(&slots, &code, 200);
        let scored: Vec<(f32, u32)> = slots
            .iter()
            .zip(&read)
            .filter_map(|(&s, c)| Some(((*c)?, s)))
            .collect();
        // About the rows wanted, far fewer than all, each scored as alone.
        assert!(
            scored.len() >= 100 && scored.len() < slots.len() / 2,
            "{}",
            scored.len()
        );
        assert!(scored.iter().all(|&(c, s)| c == ix.approx(s, &code)));
        // The query is agent 900's own vector: it is read, and best.
        let best = scored.iter().max_by(|a, b| a.0.total_cmp(&b.0));
        assert_eq!(best.map(|b| b.1), Some(900));
        // Wanting most of the rows reads them all.
        let all = ix.approx_near(&slots, &code, slots.len() * 3 / 4);
        assert!(all.iter().all(Option::is_some));
        // A slot without a vector is read (as 0), never skipped.
        ix.clear(901);
        let mut with_gap = slots.clone();
        with_gap.push(901);
        assert_eq!(
            ix.approx_near(&with_gap, &code, 200).last(),
            Some(&Some(0.0))
        );
    }

    #[test]
    fn a_required_tag_is_scanned_up_to_the_square_roots_rows_whatever_the_probes() {
        // A million agents in 1,448 partitions, a tag held by 2 % of them:
        // scanned. Tied to the 28 probes, the bound was 19,337, and such a
        // tag's queries took the vector path (p99 5-7 ms against 1.1).
        let (live, nlist) = (1_000_000, 1448);
        assert!(tag_scan_bound(live, nlist) >= 20_000);
        // Unpartitioned, every row is read anyway.
        assert_eq!(tag_scan_bound(3000, 0), 3000);
    }

    /// A small directory's query reads at least `MIN_PROBED_ROWS` rows;
    /// from about 25k rows the square root's share decides, as before.
    #[test]
    fn probes_read_a_floor_of_rows_in_a_small_directory() {
        // 10k agents in the 181 partitions trained at 8,192.
        assert_eq!(nprobe(181, 10_000), 24);
        assert!(nprobe(181, 10_000) * 10_000 / 181 >= MIN_PROBED_ROWS);
        // 16k rows in 256 partitions: 20 (80 rows each would be 1,280).
        assert_eq!(nprobe(256, 16_384), 20);
        // Larger directories: three quarters of the square root.
        assert_eq!(nprobe(512, 100_000), 16);
        assert_eq!(nprobe(1_448, 1_000_000), 28);
        // Never more than 64, nor more partitions than there are.
        assert_eq!(nprobe(181, 100), 64);
        assert_eq!(nprobe(20, 100), 20);
        assert_eq!(nprobe(0, 0), 0);
    }

    #[test]
    fn a_selective_filter_probes_further_until_it_has_its_candidates() {
        let dim = 32;
        let mut ix = with_rows(6000, dim);
        ix.maintain();
        let nlist = ix.partitions();
        assert!(nlist > nprobe(nlist, ix.live));
        let q = unit(900, dim);
        let code = quantize(&q);
        // 30 admitted rows, scattered over the partitions.
        let admitted = |s: u32| s % 200 == 13;
        let got = ix.top(&q, &code, 100, admitted);
        let mut slots: Vec<u32> = got.iter().map(|&(s, _)| s).collect();
        slots.sort_unstable();
        assert_eq!(slots, (13..6000).step_by(200).collect::<Vec<u32>>());
        assert!(got.iter().all(|&(s, c)| c == ix.approx(s, &code)));
        // Wanting fewer stops probing once it has them: each admitted,
        // from the nearest partitions first, so the best of the 30 is
        // among them.
        let few = ix.top(&q, &code, 10, admitted);
        assert_eq!(few.len(), 10);
        assert!(few.iter().all(|&(s, _)| admitted(s)));
        let best = got.iter().max_by(|a, b| a.1.total_cmp(&b.1)).map(|b| b.0);
        assert!(few.iter().any(|&(s, _)| Some(s) == best));
        // A filter that admits no row: nothing, after every partition.
        assert!(ix.top(&q, &code, 10, |_| false).is_empty());
        // An unselective filter is answered by the first probes alone.
        assert_eq!(ix.top(&q, &code, 10, |_| true).len(), 10);
    }

    #[test]
    fn recall_grows_with_the_probed_partitions_and_is_complete_when_all_are() {
        let dim = 32;
        let mut ix = VectorIndex::new(dim);
        assert!(
            ix.recall(&[unit(1, dim)], 10, 100, |s, q| Some(ix.exact(s, q)))
                .is_empty(),
            "nothing partitioned"
        );
        for s in 0..8000u32 {
            ix.set(s, &unit(u64::from(s), dim), None);
        }
        ix.maintain();
        // Queries near stored rows but not equal to any.
        let queries: Vec<Vec<f32>> = (0..40u64).map(|i| unit(100_000 + i, dim)).collect();
        let figures = ix.recall(&queries, 10, 100, |s, q| Some(ix.exact(s, q)));
        assert_eq!(figures.len(), 3);
        assert!(figures.windows(2).all(|w| w[0].nprobe < w[1].nprobe));
        assert!(figures
            .windows(2)
            .all(|w| w[0].recall <= w[1].recall + 1e-9));
        assert!(figures.iter().all(|f| (0.0..=1.0).contains(&f.recall)));
        // Probing everything leaves only the i8 approximation, which a
        // 100-deep pool absorbs.
        let all = ix.partitions();
        let (mut found, mut wanted) = (0, 0);
        for q in &queries {
            let scored = (0..8000u32).map(|s| (ix.exact(s, q), s)).collect();
            let truth = best_admitted(scored, 10, |_| true);
            let got = ix.top_probing(q, &quantize(q), 100, all, |_| true);
            wanted += truth.len();
            found += truth
                .iter()
                .filter(|(s, _)| got.iter().any(|(g, _)| g == s))
                .count();
        }
        assert_eq!(found, wanted);
    }
}
