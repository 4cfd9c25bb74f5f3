//! BM25 over each agent's text (name, description, tags, capabilities,
//! example tasks, operation names and descriptions).
//!
//! Documents live in slots that are never reused while the index lives, so
//! every posting list stays sorted by slot and a removal is a binary search.

use std::collections::HashMap;

/// BM25 parameters (Robertson's usual values).
const K1: f32 = 1.2;
const B: f32 = 0.75;
/// Collections at least this large skip their most common query terms.
const PRUNE_MIN_DOCS: u32 = 1000;

#[derive(Default)]
pub struct LexicalIndex {
    term_ids: HashMap<String, u32>,
    /// Per term: (slot, term frequency), sorted by slot.
    postings: Vec<Vec<(u32, u32)>>,
    /// Per slot: document length in terms (None: free slot).
    lengths: Vec<Option<u32>>,
    /// Per slot: its distinct term ids, to undo its postings.
    doc_terms: Vec<Vec<u32>>,
    total_length: u64,
    live: u32,
}

impl LexicalIndex {
    /// Indexes `terms` as the document in `slot`; slots must grow.
    pub fn insert(&mut self, slot: u32, terms: &[String]) {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for t in terms {
            let next = self.term_ids.len() as u32;
            let id = *self.term_ids.entry(t.clone()).or_insert(next);
            if id as usize == self.postings.len() {
                self.postings.push(Vec::new());
            }
            *counts.entry(id).or_default() += 1;
        }
        let s = slot as usize;
        if self.lengths.len() <= s {
            self.lengths.resize(s + 1, None);
            self.doc_terms.resize(s + 1, Vec::new());
        }
        let mut ids: Vec<u32> = counts.keys().copied().collect();
        ids.sort_unstable();
        for &id in &ids {
            let list = &mut self.postings[id as usize];
            let at = list.partition_point(|&(d, _)| d < slot);
            list.insert(at, (slot, counts[&id]));
        }
        self.lengths[s] = Some(terms.len() as u32);
        self.doc_terms[s] = ids;
        self.total_length += terms.len() as u64;
        self.live += 1;
    }

    /// Removes the document in `slot`, if any.
    pub fn remove(&mut self, slot: u32) {
        let s = slot as usize;
        let Some(length) = self.lengths.get_mut(s).and_then(Option::take) else {
            return;
        };
        for id in std::mem::take(&mut self.doc_terms[s]) {
            let list = &mut self.postings[id as usize];
            if let Ok(at) = list.binary_search_by_key(&slot, |&(d, _)| d) {
                list.remove(at);
            }
        }
        self.total_length -= u64::from(length);
        self.live -= 1;
    }

    /// Adds each document's BM25 score for `query_terms` into `scores`
    /// (indexed by slot, at least as long as the slot count).
    pub fn score_into(&self, query_terms: &[String], scores: &mut [f32]) {
        if self.live == 0 {
            return;
        }
        let n = self.live as f32;
        let avg = (self.total_length as f32 / n).max(1.0);
        for t in query_terms {
            let Some(&id) = self.term_ids.get(t) else {
                continue;
            };
            // A repeated query term counts once per repetition, as in BM25's
            // sum over query terms.
            let list = &self.postings[id as usize];
            if list.is_empty() {
                continue;
            }
            // A term in more than a quarter of a large collection ("the",
            // "please") adds little (IDF below ln 4) but costs the longest
            // posting lists; it is skipped.
            if self.live >= PRUNE_MIN_DOCS && list.len() * 4 > self.live as usize {
                continue;
            }
            let df = list.len() as f32;
            let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
            for &(slot, tf) in list {
                let len = self.lengths[slot as usize].unwrap_or(0) as f32;
                let tf = tf as f32;
                let norm = K1 * (1.0 - B + B * len / avg);
                scores[slot as usize] += idf * tf * (K1 + 1.0) / (tf + norm);
            }
        }
    }

    /// Distinct terms and postings, for memory figures.
    pub fn size(&self) -> (usize, usize) {
        (
            self.term_ids.len(),
            self.postings.iter().map(Vec::len).sum(),
        )
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
        ix.insert(0, &terms("translate text between languages"));
        ix.insert(1, &terms("summarise text"));
        ix.insert(2, &terms("weather forecast for a city"));
        let mut s = vec![0.0; 3];
        ix.score_into(&terms("translate text"), &mut s);
        assert!(s[0] > s[1] && s[1] > 0.0 && s[2] == 0.0, "{s:?}");
        ix.remove(0);
        ix.remove(0);
        let mut s = vec![0.0; 3];
        ix.score_into(&terms("translate text"), &mut s);
        assert_eq!(s[0], 0.0);
        assert!(s[1] > 0.0);
        assert_eq!(ix.size().1, 2 + 5);
    }
}
