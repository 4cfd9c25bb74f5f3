//! Filters of AIDIP's list and search (`GET /agents`, `POST /agents/search`):
//! every given filter must hold (AND); set filters match by inclusion.

use super::record::{AgentRecord, AgentStatus, Principal};
use super::validate::{normalise_tags, FieldError};

/// A normalised filter set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    pub capabilities: Vec<String>,
    pub tags: Vec<String>,
    pub languages: Vec<String>,
    /// Empty means every status except `deleted`.
    pub statuses: Vec<AgentStatus>,
    pub publisher: Option<String>,
    pub owner: Option<String>,
    pub include_expired: bool,
}

impl Filter {
    /// Normalises tag-like filters the same way records are normalised, so a
    /// query for "NLP" finds records tagged "nlp".
    pub fn normalise(&mut self) -> Result<(), FieldError> {
        normalise_tags(&mut self.capabilities, "/capabilities")?;
        normalise_tags(&mut self.tags, "/tags")?;
        normalise_tags(&mut self.languages, "/languages")?;
        Ok(())
    }

    /// Whether `record` passes every filter and may be shown to `principal`.
    pub fn matches(
        &self,
        record: &AgentRecord,
        principal: Option<&Principal>,
        now: time::OffsetDateTime,
    ) -> bool {
        let m = &record.metadata;
        if record.envelope.deleted || !record.readable_by(principal) {
            return false;
        }
        let status = m.effective_status();
        let status_ok = if self.statuses.is_empty() {
            status != AgentStatus::Deleted
        } else {
            self.statuses.contains(&status)
        };
        status_ok
            && (self.include_expired || !m.is_expired_at(now))
            && self.capabilities.iter().all(|c| m.capabilities.contains(c))
            && self.tags.iter().all(|t| m.tags.contains(t))
            // Agents that declare no languages are language-agnostic (AIDIP).
            && (m.supported_languages.is_empty() || self.languages.iter().all(|l| m.supported_languages.contains(l)))
            && self.publisher.as_ref().is_none_or(|p| m.publisher.as_ref() == Some(p))
            && self.owner.as_ref().is_none_or(|o| &record.envelope.owner == o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::record::{AgentMetadata, Envelope, Role, Visibility};

    fn rec(tags: &[&str], langs: &[&str], status: Option<AgentStatus>) -> AgentRecord {
        AgentRecord {
            metadata: AgentMetadata {
                id: "a".into(),
                tags: tags.iter().map(|s| s.to_string()).collect(),
                supported_languages: langs.iter().map(|s| s.to_string()).collect(),
                status,
                ..Default::default()
            },
            envelope: Envelope {
                owner: "alice".into(),
                ..Default::default()
            },
        }
    }

    fn now() -> time::OffsetDateTime {
        time::OffsetDateTime::now_utc()
    }

    #[test]
    fn tags_are_and_and_languages_respect_agnostic_agents() {
        let f = Filter {
            tags: vec!["nlp".into(), "chinese".into()],
            languages: vec!["zh".into()],
            ..Default::default()
        };
        assert!(f.matches(&rec(&["nlp", "chinese", "x"], &["zh"], None), None, now()));
        assert!(!f.matches(&rec(&["nlp"], &["zh"], None), None, now()));
        assert!(f.matches(&rec(&["nlp", "chinese"], &[], None), None, now()));
        assert!(!f.matches(&rec(&["nlp", "chinese"], &["en"], None), None, now()));
    }

    #[test]
    fn deleted_status_hidden_unless_asked_and_private_hidden_from_others() {
        let f = Filter::default();
        assert!(!f.matches(&rec(&[], &[], Some(AgentStatus::Deleted)), None, now()));
        let f = Filter {
            statuses: vec![AgentStatus::Deleted],
            ..Default::default()
        };
        assert!(f.matches(&rec(&[], &[], Some(AgentStatus::Deleted)), None, now()));
        let mut private = rec(&[], &[], None);
        private.envelope.visibility = Visibility::Private;
        let bob = Principal::new("bob", Role::Reader);
        let alice = Principal::new("alice", Role::Publisher);
        assert!(!Filter::default().matches(&private, Some(&bob), now()));
        assert!(Filter::default().matches(&private, Some(&alice), now()));
    }

    #[test]
    fn expired_hidden_by_default() {
        let mut r = rec(&[], &[], None);
        r.metadata.expires_at = Some("2000-01-01T00:00:00Z".into());
        assert!(!Filter::default().matches(&r, None, now()));
        assert!(Filter {
            include_expired: true,
            ..Default::default()
        }
        .matches(&r, None, now()));
    }
}
