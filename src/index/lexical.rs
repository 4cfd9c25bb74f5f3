//! BM25 over each agent's text (name, description, tags, capabilities,
//! example tasks, operation names and descriptions, parameters).
//!
//! Candidate generation must not cost time in proportion to the collection,
//! so every term keeps an *impact-ordered* head: the documents where the
//! term weighs most, at most [`HEAD`] of them, with their frequency of the
//! term and length; the rest of its documents are a plain sorted list of
//! slots, each marked when the document holds the term once (four bytes
//! each). A query accumulates only the heads (score-at-a-time with a
//! bounded budget), and the exact BM25 of the few agents that reach
//! re-ranking is taken from the heads and the marks when they give it
//! whole, else computed from the document's own term list, kept
//! varint-encoded.
//!
//! A document's impact (its BM25 term weight without the IDF) orders a
//! head and decides what enters it, taken with the average length of the
//! moment; the average drifts slowly and only that order feels it. Scores
//! always use the current average.

use std::collections::HashMap;

/// BM25 parameters (Robertson's usual values).
const K1: f32 = 1.2;
const B: f32 = 0.75;
/// Collections at least this large skip their most common query terms.
const PRUNE_MIN_DOCS: u32 = 1000;
/// Documents kept in a term's impact-ordered head.
const HEAD: usize = 512;

/// A document in a term's head: its slot, and its frequency of the term
/// and length, saturated at `u16::MAX` (then its contribution is not taken
/// from the head). Eight bytes, as (impact, slot) were.
#[derive(Clone, Copy)]
struct Posting {
    slot: u32,
    tf: u16,
    length: u16,
}

impl Posting {
    fn new(slot: u32, tf: u32, length: u32) -> Self {
        let narrow = |v: u32| u16::try_from(v).unwrap_or(u16::MAX);
        Self {
            slot,
            tf: narrow(tf),
            length: narrow(length),
        }
    }

    /// True when the frequency and length are the document's own.
    fn exact(self) -> bool {
        self.tf < u16::MAX && self.length < u16::MAX
    }

    fn impact(self, avg_length: f32) -> f32 {
        impact(u32::from(self.tf), u32::from(self.length), avg_length)
    }
}

#[derive(Default)]
struct Term {
    /// Best impact first: exactly the best `head.len()` documents.
    head: Vec<Posting>,
    /// Every other document holding the term.
    rest: Tail,
    /// At least the impact of every document in `rest`.
    floor: f32,
}

/// The documents holding a term outside its head, sorted by slot. An
/// entry is `slot << 1`, its low bit set when the document holds the term
/// once (most do): a pool member found here is then scored without
/// decoding its term list; other frequencies are read from that list.
/// Slots index the documents, so they stay far below 2^31 and the shift
/// loses nothing.
#[derive(Default)]
struct Tail(Vec<u32>);

impl Tail {
    fn entry(slot: u32, tf: u32) -> u32 {
        slot << 1 | u32::from(tf == 1)
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().map(|&e| e >> 1)
    }

    /// Where `slot` is (or would be), and whether it holds the term once.
    fn find(&self, slot: u32) -> Result<(usize, bool), usize> {
        self.0
            .binary_search_by(|&e| (e >> 1).cmp(&slot))
            .map(|at| (at, self.0[at] & 1 == 1))
    }

    fn insert(&mut self, slot: u32, tf: u32) {
        let entry = Self::entry(slot, tf);
        // A rebuild inserts in slot order: the list grows at its end.
        if self.0.last().is_none_or(|&e| e >> 1 < slot) {
            self.0.push(entry);
        } else {
            let at = self.0.partition_point(|&e| e >> 1 < slot);
            self.0.insert(at, entry);
        }
    }

    fn remove(&mut self, slot: u32) -> bool {
        match self.find(slot) {
            Ok((at, _)) => {
                self.0.remove(at);
                true
            }
            Err(_) => false,
        }
    }
}

impl Term {
    /// Documents holding the term.
    fn df(&self) -> usize {
        self.head.len() + self.rest.len()
    }
}

/// A document's terms as (term id, term frequency), sorted by id, stored as
/// LEB128 varints: the id's gap to the previous one shifted left by one,
/// its low bit set when the frequency is 1 (most terms), else followed by
/// the frequency. About two bytes a term instead of eight, and one varint
/// to read for most. Term ids index the term table, so they stay far below
/// 2^31 and the shift loses nothing.
#[derive(Default, Clone)]
struct DocTerms(Box<[u8]>);

impl DocTerms {
    fn encode(terms: &[(u32, u32)]) -> Self {
        let mut out = Vec::with_capacity(terms.len() * 3);
        let mut previous = 0;
        for &(id, tf) in terms {
            let gap = id - previous;
            if tf == 1 {
                put_varint(&mut out, gap << 1 | 1);
            } else {
                put_varint(&mut out, gap << 1);
                put_varint(&mut out, tf);
            }
            previous = id;
        }
        Self(out.into_boxed_slice())
    }

    fn iter(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        let mut at = 0;
        let mut id = 0;
        std::iter::from_fn(move || {
            if at >= self.0.len() {
                return None;
            }
            Some(next_term(&self.0, &mut at, &mut id))
        })
    }

    /// The frequency of term `id` (0 when absent).
    fn tf(&self, id: u32) -> u32 {
        self.iter()
            .take_while(|e| e.0 <= id)
            .find(|e| e.0 == id)
            .map_or(0, |e| e.1)
    }
}

/// The next (term id, frequency) of an encoded term list, `id` being the
/// previous term's id.
#[inline(always)]
fn next_term(bytes: &[u8], at: &mut usize, id: &mut u32) -> (u32, u32) {
    let v = get_varint(bytes, at);
    *id += v >> 1;
    let tf = if v & 1 == 1 { 1 } else { get_varint(bytes, at) };
    (*id, tf)
}

fn put_varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[inline(always)]
fn get_varint(bytes: &[u8], at: &mut usize) -> u32 {
    // Most values (every frequency, most id gaps) fit one byte.
    if let Some(&b) = bytes.get(*at) {
        if b < 0x80 {
            *at += 1;
            return u32::from(b);
        }
    }
    let mut v = 0u32;
    let mut shift = 0;
    while let Some(&b) = bytes.get(*at) {
        *at += 1;
        v |= u32::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    v
}

#[derive(Default)]
pub struct LexicalIndex {
    term_ids: HashMap<String, u32, foldhash::fast::RandomState>,
    terms: Vec<Term>,
    /// Per slot: document length in terms (None: free slot).
    lengths: Vec<Option<u32>>,
    /// Per slot: its terms.
    doc_terms: Vec<DocTerms>,
    total_length: u64,
    live: u32,
}

/// A query prepared against the index: its terms with their IDF.
pub struct LexicalQuery<'a> {
    index: &'a LexicalIndex,
    /// (term id, IDF × repetitions in the query), sorted by id, skipping
    /// pruned terms.
    terms: Vec<(u32, f32)>,
    avg_length: f32,
}

/// Head accumulation of a query: partial BM25 per touched slot, with the
/// query terms whose contribution it holds exactly.
pub struct Accumulated {
    /// Per slot: (partial score, bit `i` set when query term `i`'s head
    /// gave the slot its exact contribution).
    scores: Vec<(f32, u32)>,
    touched: Vec<u32>,
    /// Bits of the query terms whose documents are not all in their heads.
    tailed: u32,
    /// Bits of the query terms with a head posting not taken whole.
    inexact: u32,
    /// False when the query has more terms than the bits can tell apart.
    resolvable: bool,
}

/// Query terms whose head contributions are told apart, one bit each.
const RESOLVED_TERMS: usize = 32;
/// Tails at most this long are searched for a pool member instead of
/// decoding its term list: 16 KiB, which stays in cache across a query's
/// searches. A longer tail's search misses the cache at most of its steps
/// and costs more than the decoding (at 100k agents it doubled exact
/// BM25's time).
const SEARCHED_TAIL: usize = 4096;

thread_local! {
    /// A dense score array per thread, reused across queries: allocating
    /// (and zeroing) one slot per agent for every query cost page faults
    /// at 100k agents. It is handed back with only the touched slots reset.
    static SCORES: std::cell::RefCell<Vec<(f32, u32)>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Drop for Accumulated {
    fn drop(&mut self) {
        let mut scores = std::mem::take(&mut self.scores);
        for &t in &self.touched {
            scores[t as usize] = (0.0, 0);
        }
        SCORES.with(|s| {
            let mut pooled = s.borrow_mut();
            if pooled.len() < scores.len() {
                *pooled = scores;
            }
        });
    }
}

impl Accumulated {
    /// The partial score of `slot` (0 when no head reached it).
    pub fn get(&self, slot: u32) -> f32 {
        self.scores.get(slot as usize).map_or(0.0, |e| e.0)
    }

    /// The exact BM25 score of `slot` when the heads and tails give it:
    /// every query term either reached the slot through its head, or its
    /// tail (searched when it has at most [`SEARCHED_TAIL`] entries) lacks
    /// the slot or holds it with a frequency of one. Tail contributions are
    /// added after the heads', so the sum may differ from
    /// [`LexicalQuery::score`]'s in its last bits.
    fn exact(&self, slot: u32, query: &LexicalQuery) -> Option<f32> {
        let (mut score, reached) = self.scores.get(slot as usize).copied().unwrap_or((0.0, 0));
        if !self.resolvable || self.inexact & !reached != 0 {
            return None;
        }
        let mut open = self.tailed & !reached;
        while open != 0 {
            let i = open.trailing_zeros() as usize;
            open &= open - 1;
            let (id, idf) = *query.terms.get(i)?;
            let tail = &query.index.terms[id as usize].rest;
            if tail.len() > SEARCHED_TAIL {
                return None;
            }
            match tail.find(slot) {
                Err(_) => {}
                Ok((_, true)) => {
                    let length = query.index.lengths.get(slot as usize).copied().flatten()?;
                    score += idf * impact(1, length, query.avg_length);
                }
                Ok((_, false)) => return None,
            }
        }
        Some(score)
    }

    /// Every slot some head reached, with its partial score.
    pub fn touched(&self) -> impl Iterator<Item = (f32, u32)> + '_ {
        self.touched.iter().map(|&s| (self.scores[s as usize].0, s))
    }
}

fn impact(tf: u32, length: u32, avg_length: f32) -> f32 {
    let tf = tf as f32;
    // Written so that the division by the average is the same for every
    // document: a loop over postings computes it once, and pays one
    // division per posting instead of two.
    let norm = K1 * (1.0 - B) + K1 * B / avg_length.max(1.0) * length as f32;
    tf * (K1 + 1.0) / (tf + norm)
}

impl LexicalIndex {
    fn avg_length(&self) -> f32 {
        if self.live == 0 {
            return 1.0;
        }
        (self.total_length as f32 / self.live as f32).max(1.0)
    }

    /// Recomputes term `id`'s head from all its documents.
    fn refill(&mut self, id: u32) {
        let avg = self.avg_length();
        let term = &mut self.terms[id as usize];
        let slots: Vec<u32> = term
            .head
            .drain(..)
            .map(|e| e.slot)
            .chain(term.rest.slots())
            .collect();
        term.rest = Tail::default();
        let mut all: Vec<(f32, Posting)> = slots
            .into_iter()
            .map(|s| {
                let len = self.lengths[s as usize].unwrap_or(0);
                let tf = self.doc_terms[s as usize].tf(id);
                (impact(tf, len, avg), Posting::new(s, tf, len))
            })
            .collect();
        let by_impact = |a: &(f32, Posting), b: &(f32, Posting)| {
            b.0.total_cmp(&a.0).then(a.1.slot.cmp(&b.1.slot))
        };
        let term = &mut self.terms[id as usize];
        if all.len() > HEAD {
            all.select_nth_unstable_by(HEAD, by_impact);
            term.floor = all[HEAD..].iter().map(|e| e.0).fold(0.0, f32::max);
            let mut rest: Vec<u32> = all[HEAD..]
                .iter()
                .map(|e| Tail::entry(e.1.slot, u32::from(e.1.tf)))
                .collect();
            rest.sort_unstable();
            term.rest = Tail(rest);
            all.truncate(HEAD);
        } else {
            term.floor = 0.0;
        }
        all.sort_unstable_by(by_impact);
        term.head = all.into_iter().map(|e| e.1).collect();
    }

    /// Indexes `terms` as the document in `slot` (a free slot).
    pub fn insert<'a>(&mut self, slot: u32, terms: impl IntoIterator<Item = &'a str>) {
        let mut ids: Vec<u32> = terms
            .into_iter()
            .map(|t| match self.term_ids.get(t) {
                Some(&id) => id,
                None => {
                    let id = self.terms.len() as u32;
                    self.term_ids.insert(t.to_string(), id);
                    self.terms.push(Term::default());
                    id
                }
            })
            .collect();
        // Counted by sorting: a document's terms are a few dozen, for which
        // a sort beats a hash map (this runs for every agent at a rebuild).
        ids.sort_unstable();
        let length = ids.len() as u32;
        let mut own: Vec<(u32, u32)> = Vec::new();
        for id in ids {
            match own.last_mut() {
                Some((last, tf)) if *last == id => *tf += 1,
                _ => own.push((id, 1)),
            }
        }
        let s = slot as usize;
        if self.lengths.len() <= s {
            self.lengths.resize(s + 1, None);
            self.doc_terms.resize(s + 1, DocTerms::default());
        }
        self.lengths[s] = Some(length);
        self.total_length += u64::from(length);
        self.live += 1;
        let avg = self.avg_length();
        for &(id, tf) in &own {
            let term = &mut self.terms[id as usize];
            let w = impact(tf, length, avg);
            if w > term.floor {
                let at = term.head.partition_point(|e| e.impact(avg) >= w);
                term.head.insert(at, Posting::new(slot, tf, length));
                if term.head.len() > HEAD {
                    if let Some(dropped) = term.head.pop() {
                        term.floor = term.floor.max(dropped.impact(avg));
                        term.rest.insert(dropped.slot, u32::from(dropped.tf));
                    }
                }
            } else {
                term.rest.insert(slot, tf);
            }
        }
        self.doc_terms[s] = DocTerms::encode(&own);
    }

    /// Removes the document in `slot`, if any.
    pub fn remove(&mut self, slot: u32) {
        let s = slot as usize;
        let Some(length) = self.lengths.get_mut(s).and_then(Option::take) else {
            return;
        };
        self.total_length -= u64::from(length);
        self.live -= 1;
        let own = std::mem::take(&mut self.doc_terms[s]);
        for (id, _) in own.iter() {
            let term = &mut self.terms[id as usize];
            if term.rest.remove(slot) {
                continue;
            }
            if let Some(at) = term.head.iter().position(|e| e.slot == slot) {
                term.head.remove(at);
                // A head worn down to half is refilled: amortised, a
                // removal costs a few postings, not a whole list.
                if term.head.len() < HEAD / 2 && !term.rest.is_empty() {
                    self.refill(id);
                }
            }
        }
    }

    /// Prepares `query_terms` (analyzed, repetitions counted) for scoring.
    pub fn query(&self, query_terms: &[String]) -> LexicalQuery<'_> {
        let n = self.live as f32;
        let mut terms: Vec<(u32, f32)> = Vec::new();
        for t in query_terms {
            let Some(&id) = self.term_ids.get(t) else {
                continue;
            };
            let df = self.terms[id as usize].df();
            if df == 0 {
                continue;
            }
            // A term in more than a quarter of a large collection ("the",
            // "please") adds little (IDF below ln 4); it is skipped.
            if self.live >= PRUNE_MIN_DOCS && df * 4 > self.live as usize {
                continue;
            }
            let df = df as f32;
            let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
            // A repeated query term counts once per repetition, as in
            // BM25's sum over query terms.
            match terms.iter_mut().find(|e| e.0 == id) {
                Some(e) => e.1 += idf,
                None => terms.push((id, idf)),
            }
        }
        terms.sort_unstable_by_key(|e| e.0);
        LexicalQuery {
            index: self,
            terms,
            avg_length: self.avg_length(),
        }
    }

    /// See [`super::search::Index::compact`].
    pub fn compact(&mut self) {
        for t in &mut self.terms {
            t.head.shrink_to_fit();
            t.rest.0.shrink_to_fit();
        }
        self.terms.shrink_to_fit();
        super::simd::on_huge_pages(&mut self.lengths);
        super::simd::on_huge_pages(&mut self.doc_terms);
    }

    /// Distinct terms and postings, for memory figures.
    pub fn size(&self) -> (usize, usize) {
        (self.term_ids.len(), self.terms.iter().map(Term::df).sum())
    }
}

impl LexicalQuery<'_> {
    /// True when no query term is in the index.
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// Partial scores from every query term's head: exact for documents in
    /// all the heads of their terms, a lower bound otherwise. The terms are
    /// added in id order, as [`Self::score`] adds them, so a score the
    /// heads give whole is the same number.
    pub fn accumulate(&self) -> Accumulated {
        let n = self.index.lengths.len();
        let mut scores = SCORES.with(|s| std::mem::take(&mut *s.borrow_mut()));
        // All zeros: only ever returned with its touched slots reset.
        scores.resize(n, (0.0, 0));
        // Whether a posting's slot is new to the query is as likely as not
        // after the first term: a branch on it mispredicted half the time
        // and was most of this loop. Every slot is written at the end of
        // `touched`, which grows only when the slot was new.
        let postings: usize = self
            .terms
            .iter()
            .map(|&(id, _)| self.index.terms[id as usize].head.len())
            .sum();
        let mut touched = vec![0u32; postings];
        let mut reached = 0;
        let (mut tailed, mut inexact) = (0u32, 0u32);
        for (i, &(id, idf)) in self.terms.iter().enumerate() {
            let term = &self.index.terms[id as usize];
            let bit = if i < RESOLVED_TERMS { 1u32 << i } else { 0 };
            if !term.rest.is_empty() {
                tailed |= bit;
            }
            for &p in &term.head {
                let s = &mut scores[p.slot as usize];
                touched[reached] = p.slot;
                reached += usize::from((s.0 == 0.0) & (s.1 == 0));
                s.0 += idf * p.impact(self.avg_length);
                if p.exact() {
                    s.1 |= bit;
                } else {
                    // Not whole: the term is unresolved for it.
                    inexact |= bit;
                }
            }
        }
        touched.truncate(reached);
        Accumulated {
            scores,
            touched,
            tailed,
            inexact,
            resolvable: self.terms.len() <= RESOLVED_TERMS,
        }
    }

    /// [`Self::score`] of each of `slots`, in order. The term lists are
    /// scattered in memory and reading each one's first bytes was most of
    /// the time, so they are asked for a few documents ahead, in two steps:
    /// the list's pointer, then (once that has arrived) its first bytes.
    pub fn scores(&self, slots: &[u32], heads: &Accumulated) -> Vec<f32> {
        const AHEAD: usize = 4;
        // Only the documents the heads left unresolved are read.
        let mut unresolved = Vec::new();
        let mut out: Vec<f32> = slots
            .iter()
            .enumerate()
            .map(|(i, &slot)| {
                heads.exact(slot, self).unwrap_or_else(|| {
                    unresolved.push(i);
                    0.0
                })
            })
            .collect();
        let doc_terms = &self.index.doc_terms;
        let entry = |k: usize| {
            unresolved
                .get(k)
                .and_then(|&i| doc_terms.get(slots[i] as usize))
        };
        for (k, &i) in unresolved.iter().enumerate() {
            if let Some(far) = entry(k + 2 * AHEAD) {
                super::simd::prefetch(std::slice::from_ref(far));
            }
            if let Some(near) = entry(k + AHEAD) {
                super::simd::prefetch(&near.0[..near.0.len().min(128)]);
            }
            out[i] = self.score(slots[i]);
        }
        out
    }

    /// The exact BM25 score of the document in `slot`: one pass over its
    /// term list and the query's, both sorted by id.
    pub fn score(&self, slot: u32) -> f32 {
        let s = slot as usize;
        let Some(length) = self.index.lengths.get(s).copied().flatten() else {
            return 0.0;
        };
        let Some(&(last, _)) = self.terms.last() else {
            return 0.0;
        };
        // Decoded in place (this runs for every pool member of every
        // query): a query term is looked for only until the list passes it.
        let bytes = &self.index.doc_terms[s].0;
        let (mut at, mut id, mut wanted) = (0, 0u32, 0);
        let mut sum = 0.0;
        while at < bytes.len() {
            let (id, tf) = next_term(bytes, &mut at, &mut id);
            if id > last {
                break;
            }
            while self.terms[wanted].0 < id {
                wanted += 1;
            }
            let (term, idf) = self.terms[wanted];
            if term == id {
                sum += idf * impact(tf, length, self.avg_length);
            }
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn rarer_terms_weigh_more_and_removal_undoes_insertion() {
        let mut ix = LexicalIndex::default();
        ix.insert(
            0,
            terms("translate text between languages")
                .iter()
                .map(String::as_str),
        );
        ix.insert(1, terms("summarise text").iter().map(String::as_str));
        ix.insert(
            2,
            terms("weather forecast for a city")
                .iter()
                .map(String::as_str),
        );
        let q = terms("translate text");
        let s: Vec<f32> = (0..3).map(|s| ix.query(&q).score(s)).collect();
        assert!(s[0] > s[1] && s[1] > 0.0 && s[2] == 0.0, "{s:?}");
        ix.remove(0);
        ix.remove(0);
        assert_eq!(ix.query(&q).score(0), 0.0);
        assert!(ix.query(&q).score(1) > 0.0);
        assert_eq!(ix.size().1, 2 + 5);
        assert!(ix.query(&terms("unknown words")).is_empty());
    }

    #[test]
    fn term_lists_round_trip_through_their_encoding() {
        let terms = [
            (0, 1),
            (1, 300),
            (127, 2),
            (128, 1),
            (70_000, 9),
            (u32::MAX >> 1, 1),
        ];
        let encoded = DocTerms::encode(&terms);
        assert_eq!(encoded.iter().collect::<Vec<_>>(), terms);
        assert_eq!(encoded.tf(128), 1);
        assert_eq!(encoded.tf(1), 300);
        assert_eq!(encoded.tf(5), 0);
        assert!(encoded.0.len() < terms.len() * 8);
        // A frequency of 1 costs no byte of its own.
        assert_eq!(DocTerms::encode(&[(3, 1), (9, 1)]).0.len(), 2);
        assert_eq!(DocTerms::default().iter().count(), 0);
    }

    #[test]
    fn a_reused_accumulator_starts_from_zero() {
        let mut ix = LexicalIndex::default();
        ix.insert(
            0,
            terms("translate text between languages")
                .iter()
                .map(String::as_str),
        );
        ix.insert(1, terms("summarise text").iter().map(String::as_str));
        ix.insert(2, terms("weather forecast").iter().map(String::as_str));
        let fresh = |q: &str| -> Vec<(f32, u32)> {
            let mut v: Vec<_> = ix.query(&terms(q)).accumulate().touched().collect();
            v.sort_by_key(|e| e.1);
            v
        };
        let first = fresh("translate text");
        // Other queries on this thread use (and hand back) the same array.
        let _ = fresh("weather forecast text");
        let _ = fresh("summarise");
        assert_eq!(fresh("translate text"), first);
        let acc = ix.query(&terms("weather")).accumulate();
        assert_eq!(acc.get(0), 0.0);
        assert_eq!(acc.get(1), 0.0);
        assert!(acc.get(2) > 0.0);
    }

    #[test]
    fn scores_taken_from_the_heads_are_the_exact_scores() {
        // "rare" stays within its head; "often" overflows it into a tail;
        // lengths vary so the average drifts as documents come and go.
        let mut ix = LexicalIndex::default();
        let n = (HEAD * 10) as u32;
        let doc = |i: u32| {
            let mut t: Vec<String> = (0..(3 + i % 17)).map(|k| format!("filler{k}")).collect();
            if i.is_multiple_of(5) {
                let tf = 1 + (i % 3) as usize;
                t.extend(std::iter::repeat_n("often".to_string(), tf));
                // Long documents that hold it more than once weigh less
                // than short ones holding it once: some land in the tail.
                if tf == 3 {
                    t.extend((0..40).map(|k| format!("long{k}")));
                }
            }
            if i.is_multiple_of(23) {
                t.push("rare".into());
            }
            t
        };
        for i in 0..n {
            ix.insert(i, doc(i).iter().map(String::as_str));
        }
        for i in (0..n).step_by(7) {
            ix.remove(i);
        }
        for text in [
            "rare",
            "often",
            "rare often",
            "rare often rare",
            "filler3 rare",
        ] {
            let q = ix.query(&terms(text));
            let heads = q.accumulate();
            let slots: Vec<u32> = (0..n).collect();
            let (mut from_heads, mut from_marks) = (0, 0);
            for (slot, got) in slots.iter().zip(q.scores(&slots, &heads)) {
                let want = q.score(*slot);
                let resolved = heads.exact(*slot, &q).is_some();
                from_marks += usize::from(resolved && heads.get(*slot) == 0.0 && want > 0.0);
                // The same sum, perhaps added in another order.
                assert!(
                    (got - want).abs() <= want.abs() * 1e-6,
                    "{text}: slot {slot}: {got} against {want}"
                );
                from_heads += usize::from(resolved);
            }
            // Queries of head-only terms are answered from the heads alone.
            if text == "rare" {
                assert_eq!(from_heads, slots.len());
            }
            // A tail's documents that hold the term once are scored from
            // their marks; the others from their term lists.
            if text.contains("often") {
                assert!(from_heads < slots.len());
            }
            if text == "often" {
                assert!(from_marks > 0);
            }
        }
    }

    #[test]
    fn heads_hold_the_best_documents_through_inserts_and_removals() {
        // One common term at different frequencies in many documents of
        // one length (so the average length cannot drift): the head must
        // always hold exactly the highest-impact documents.
        let mut ix = LexicalIndex::default();
        // Every fifth document has the term, so it is not pruned as common.
        let n = (HEAD * 15) as u32;
        let doc = |i: u32| {
            let tf = if i.is_multiple_of(5) {
                1 + (i * 7 % 5) as usize
            } else {
                0
            };
            let mut t = vec!["common".to_string(); tf];
            t.extend((tf..10).map(|k| format!("filler{k}")));
            t
        };
        for i in 0..n {
            ix.insert(i, doc(i).iter().map(String::as_str));
        }
        // Remove most of the head to force refills.
        let q = terms("common");
        for round in 0..3 {
            let acc = ix.query(&q).accumulate();
            let mut reached: Vec<(f32, u32)> = acc.touched().collect();
            assert!(reached.len() <= HEAD && reached.len() >= HEAD / 2);
            reached.sort_by(|a, b| b.0.total_cmp(&a.0));
            let exact = |s: u32| ix.query(&q).score(s);
            let weakest_reached = reached.iter().map(|e| exact(e.1)).fold(f32::MAX, f32::min);
            let reached_slots: Vec<u32> = reached.iter().map(|e| e.1).collect();
            let best_missed = (0..n)
                .filter(|s| !reached_slots.contains(s) && ix.lengths[*s as usize].is_some())
                .map(exact)
                .fold(0.0, f32::max);
            assert!(
                weakest_reached + 1e-3 >= best_missed,
                "round {round}: head misses a better document ({weakest_reached} < {best_missed})"
            );
            for &(_, s) in reached.iter().take(HEAD * 2 / 3) {
                ix.remove(s);
            }
        }
    }
}
