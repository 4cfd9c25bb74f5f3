//! Text analysis for the lexical index and for query-derived tags: the same
//! function turns documents and queries into terms, so they always agree.

use std::cell::RefCell;
use std::collections::HashMap;

use rust_stemmers::{Algorithm, Stemmer};

/// Words whose stems a thread remembers. An index rebuild stems every word
/// of every agent (at a million agents, over half the time of analysing
/// them went to the stemmer), while a directory's vocabulary is far
/// smaller than its text; past this many the memory is cleared and refills.
const STEMS_KEPT: usize = 1 << 16;

/// Longest word, in bytes, that is stemmed.
const MAX_STEMMED: usize = 32;

thread_local! {
    /// Lowercase word → stem. Per thread, so no lock: every `Analyzer` is
    /// the same English stemmer, so one memory serves them all.
    static STEMS: RefCell<HashMap<Box<str>, Box<str>, foldhash::fast::RandomState>> =
        RefCell::new(HashMap::default());
}

/// Splits text into lowercase terms and stems English words.
pub struct Analyzer {
    stemmer: Stemmer,
}

impl Default for Analyzer {
    fn default() -> Self {
        Self {
            stemmer: Stemmer::create(Algorithm::English),
        }
    }
}

/// A document's terms in one buffer (two allocations instead of one per
/// term: an index rebuild analyses a million documents on one thread and
/// frees their terms on another).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TermList {
    text: String,
    ends: Vec<u32>,
}

impl TermList {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(&self.ends)
            .map(|(start, &end)| &self.text[start as usize..end as usize])
    }
}

impl Analyzer {
    /// [`Self::terms`] as a [`TermList`].
    pub fn term_list(&self, text: &str) -> TermList {
        let mut out = TermList::default();
        self.for_each_word(text, |w| {
            self.normalise_into(w, &mut out.text);
            out.ends.push(out.text.len() as u32);
        });
        out
    }

    /// Terms of `text`, in order. Words break at anything not alphanumeric
    /// and at lower-to-upper case changes, so `translateText` and
    /// `translate_text` give the same terms as "translate text".
    pub fn terms(&self, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        self.for_each_word(text, |w| out.push(self.normalise(w)));
        out
    }

    /// The indexed form of one word: lowercase, stemmed when it is an
    /// ASCII word (the stemmer is English; other scripts stay as written).
    pub fn normalise(&self, word: &str) -> String {
        let mut out = String::new();
        self.normalise_into(word, &mut out);
        out
    }

    /// Appends [`Self::normalise`] of `word` to `out`.
    fn normalise_into(&self, word: &str, out: &mut String) {
        let start = out.len();
        if word.is_ascii() {
            out.push_str(word);
            out[start..].make_ascii_lowercase();
        } else {
            out.push_str(&word.to_lowercase());
        }
        let lower = &out[start..];
        if lower.len() <= 2 || !lower.bytes().all(|b| b.is_ascii_lowercase()) {
            return;
        }
        // The word is copied out of `out` to be looked up while `out` is
        // written. A longer word is kept as written: no English word is
        // that long, and stemming one costs in proportion to its length (a
        // record whose description was one 1,900-letter run spent 8 % of a
        // follower's CPU per write in the stemmer).
        let mut word = [0u8; MAX_STEMMED];
        let Some(key) = word
            .get_mut(..lower.len())
            .map(|w| {
                w.copy_from_slice(lower.as_bytes());
                &*w
            })
            .and_then(|w| std::str::from_utf8(w).ok())
        else {
            return;
        };
        out.truncate(start);
        STEMS.with_borrow_mut(|stems| {
            if let Some(stem) = stems.get(key) {
                out.push_str(stem);
                return;
            }
            let stem: Box<str> = self.stemmer.stem(key).into();
            out.push_str(&stem);
            if stems.len() >= STEMS_KEPT {
                stems.clear();
            }
            stems.insert(key.into(), stem);
        });
    }

    fn for_each_word(&self, text: &str, mut f: impl FnMut(&str)) {
        let mut start = None;
        let mut prev_lower = false;
        for (i, c) in text.char_indices() {
            if c.is_alphanumeric() {
                if let Some(s) = start {
                    if prev_lower && c.is_uppercase() {
                        f(&text[s..i]);
                        start = Some(i);
                    }
                } else {
                    start = Some(i);
                }
                prev_lower = c.is_lowercase();
            } else {
                if let Some(s) = start.take() {
                    f(&text[s..i]);
                }
                prev_lower = false;
            }
        }
        if let Some(s) = start {
            f(&text[s..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_case_and_punctuation_and_stems() {
        let a = Analyzer::default();
        assert_eq!(a.terms("translateText"), a.terms("translate_text"));
        assert_eq!(
            a.terms("Translations, translating!"),
            vec!["translat", "translat"]
        );
        assert_eq!(
            a.terms("HR api-automation 2024"),
            vec!["hr", "api", "autom", "2024"]
        );
        assert_eq!(a.terms("Übersetzung 翻译"), vec!["übersetzung", "翻译"]);
        assert!(a.terms("  ,.; ").is_empty());
    }

    #[test]
    fn words_longer_than_any_english_word_are_kept_as_written() {
        let a = Analyzer::default();
        let word = "counterrevolutionaries";
        assert_ne!(a.terms(word), vec![word]);
        let long = word.repeat(2);
        assert!(long.len() > MAX_STEMMED);
        assert_eq!(a.terms(&long.to_uppercase()), vec![long]);
    }

    #[test]
    fn the_term_list_holds_the_same_terms_and_stems_the_same_twice() {
        let a = Analyzer::default();
        let text = "Translations of translateText: Übersetzung, HR api 2024 translations";
        let list = a.term_list(text);
        assert_eq!(list.iter().collect::<Vec<_>>(), a.terms(text));
        assert_eq!(list.len(), a.terms(text).len());
        assert!(a.term_list(" ;").is_empty());
    }
}
