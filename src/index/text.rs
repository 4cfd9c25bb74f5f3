//! Text analysis for the lexical index and for query-derived tags: the same
//! function turns documents and queries into terms, so they always agree.

use rust_stemmers::{Algorithm, Stemmer};

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

impl Analyzer {
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
        let lower = word.to_lowercase();
        if lower.len() > 2 && lower.bytes().all(|b| b.is_ascii_lowercase()) {
            self.stemmer.stem(&lower).into_owned()
        } else {
            lower
        }
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
}
