//! Discovery use cases: ADP discovery and AIDIP ranked search, over this
//! node's discovery index.

use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, instrument};

use super::registry::{Consistency, RegistryService, MAX_PAGE_BYTES};
use super::ServiceError;
use crate::domain::discovery::{
    visible_metadata, Candidate, Detail, DiscoveryPlan, DiscoveryRequest, DiscoveryResult,
    MatchedUnit, Ranked, Scope,
};
use crate::domain::filter::{HardFilters, ALL_BUT_DELETED};
use crate::domain::resolve::{chosen_operation, Resolution, ResolveRequest, Resolved};
use crate::domain::{AgentRecord, Principal};
use crate::index::{Hit, Query, UnitKind};

type Result<T> = std::result::Result<T, ServiceError>;

/// How long a request waits for changes already applied to reach the index.
const INDEX_WAIT: Duration = Duration::from_secs(2);

impl RegistryService {
    /// Waits for the index to hold what this node has applied (after a read
    /// barrier for linearizable reads); a warning when it could not.
    async fn index_ready(&self, consistency: Consistency) -> Result<Option<String>> {
        self.read_barrier(consistency).await?;
        let applied = self.reader().applied_revision();
        let index = self.index();
        if index.caught_up(self.reader(), applied, INDEX_WAIT).await {
            Ok(None)
        } else {
            Ok(Some(format!(
                "the discovery index is catching up (indexed revision {} of {applied}); recent changes may be missing",
                index.indexed_revision()
            )))
        }
    }

    /// The query's vector; when the model fails, none and a warning.
    pub(super) async fn query_vector(
        &self,
        text: &str,
        warnings: &mut Vec<String>,
    ) -> Option<Vec<f32>> {
        match self.index().query_vector(text).await {
            Ok(v) => v,
            Err(w) => {
                warnings.push(w);
                None
            }
        }
    }

    fn model_warning(&self) -> Option<String> {
        let stats_missing = self.index().without_vectors();
        if stats_missing > 0 {
            return Some(format!("{stats_missing} agent(s) are indexed without vectors because the embedder failed on them; they are found by lexical and tag matches until they are indexed again"));
        }
        self.index().embedder_problem().map(|why| {
            format!("no embedding model is loaded ({why}); candidates are ranked by lexical and tag matches only")
        })
    }

    /// What every discovery response warns about: an index catching up, a
    /// missing model, constraints not applied.
    pub(super) async fn discovery_warnings(&self, plan: &DiscoveryPlan) -> Result<Vec<String>> {
        let mut warnings: Vec<String> = Vec::new();
        warnings.extend(self.index_ready(Consistency::Local).await?);
        warnings.extend(self.model_warning());
        if !plan.unsupported.is_empty() {
            warnings.push(format!(
                "constraints this registry cannot apply were not applied: {}",
                plan.unsupported.join(", ")
            ));
        }
        Ok(warnings)
    }

    /// The response around ranked candidates, with the redaction warning
    /// when any candidate had fields omitted.
    pub(super) fn discovery_result(
        &self,
        plan: DiscoveryPlan,
        now: time::OffsetDateTime,
        candidates: Vec<Candidate>,
        mut warnings: Vec<String>,
        scope: Scope,
    ) -> DiscoveryResult {
        let redacted = candidates.iter().filter(|c| c.redacted).count();
        if redacted > 0 {
            warnings.push(format!(
                "fields were omitted by policy from {redacted} candidate(s): extension members, signatures, auth instructions, billing constraints and endpoint credentials are shown only to the record's owner and admins"
            ));
        }
        DiscoveryResult {
            request_id: uuid::Uuid::new_v4().to_string(),
            generated_at: crate::domain::time::format(now),
            candidates,
            applied_filters: plan.filters.applied(),
            unsupported_filters: plan.unsupported,
            warnings,
            detail: plan.detail,
            include_evidence: plan.include_evidence,
            indexed_revision: self.index().indexed_revision(),
            scope,
            left_out: 0,
        }
    }

    /// ADP discovery.
    #[instrument(skip_all, fields(principal = principal.map(|p| p.name.as_str())))]
    pub async fn discover(
        &self,
        principal: Option<&Principal>,
        request: DiscoveryRequest,
    ) -> Result<DiscoveryResult> {
        if request.scope == Scope::Federated {
            // Boxed: the fan-out's future would otherwise nest inside
            // every caller's.
            return Box::pin(self.discover_federated(principal, request)).await;
        }
        self.require_reader(principal)?;
        let plan = request.plan()?;
        let mut warnings = self.discovery_warnings(&plan).await?;
        let now = time::OffsetDateTime::now_utc();
        let (hits, model_warning) = self
            .index()
            .search_embedded(ranking_query(&plan, principal, now, None))
            .await;
        warnings.extend(model_warning);
        // Evidence and `full` detail show a record's example tasks and
        // operations; anything less shows only its summary.
        let whole = plan.detail == Detail::Full || plan.include_evidence;
        // The record may have changed since it was indexed; show what is
        // stored now (and skip it if it is gone).
        let ids: Vec<&str> = hits.iter().map(|h| h.id.as_str()).collect();
        let PageRead { records, stopped } = self.read_page(&ids, whole)?;
        let left_out = stopped.map_or(0, |at| hits.len() - at);
        let mut hits = hits.into_iter().enumerate();
        let mut candidates = Vec::with_capacity(records.len());
        for (at, record) in records {
            let Some((_, mut hit)) = hits.find(|(i, _)| *i == at) else {
                continue;
            };
            self.index().evidence(&mut hit, &record, &plan.query);
            for note in &hit.notes {
                warnings.push(format!("candidate '{}': {note}", hit.id));
            }
            candidates.push(candidate(hit, &record, plan.detail, principal));
        }
        debug!(candidates = candidates.len(), left_out, "discovered");
        let mut result = self.discovery_result(plan, now, candidates, warnings, Scope::Local);
        result.left_out = left_out;
        Ok(result)
    }

    /// AIDIP semantic search: the filter search ranked by `query`, best
    /// first, at most `top` records with their scores, served from the
    /// `offset`-th on. A page ends early once its records' stored forms
    /// reach [`MAX_PAGE_BYTES`] (it always holds one), as list pages do, so
    /// large records never make an answer stock gRPC clients refuse (or one
    /// the server must hold whole); `next_offset` then says where the next
    /// page starts.
    #[instrument(skip_all, fields(principal = principal.map(|p| p.name.as_str())))]
    pub async fn ranked_search(
        &self,
        principal: Option<&Principal>,
        query: &str,
        mut filters: HardFilters,
        top: usize,
        offset: usize,
        consistency: Consistency,
    ) -> Result<RankedPage> {
        self.require_reader(principal)?;
        filters.normalise()?;
        if top > super::registry::MAX_PAGE_SIZE as usize {
            return Err(ServiceError::InvalidRequest {
                field: Some("/top".into()),
                message: format!("/top: must be at most {}", super::registry::MAX_PAGE_SIZE),
            });
        }
        if offset > 0 && offset >= top {
            return Err(ServiceError::InvalidRequest {
                field: Some("/page_token".into()),
                message: "/page_token: not a page of this search (was `top` changed?)".into(),
            });
        }
        let plan = DiscoveryRequest {
            query: query.to_string(),
            ..Default::default()
        }
        .plan()?;
        self.index_ready(consistency).await?;
        // AIDIP search has no warnings to give: a failed model ranks by
        // words and tags, as it always did here.
        let (hits, _) = self
            .index()
            .search_embedded(Query {
                text: &plan.query,
                vector: None,
                filters: &filters,
                preferred_tags: &[],
                limit: top,
                evidence: false,
                principal,
                now_unix: time::OffsetDateTime::now_utc().unix_timestamp(),
                leases: None,
            })
            .await;
        let matched = hits.len();
        let ids: Vec<&str> = hits.iter().skip(offset).map(|h| h.id.as_str()).collect();
        let PageRead {
            records: read,
            stopped,
        } = self.read_page(&ids, true)?;
        let records = read
            .into_iter()
            .map(|(at, r)| (r, hits[offset + at].score))
            .collect();
        let next_offset = stopped.map(|at| offset + at);
        Ok(RankedPage {
            records,
            matched,
            next_offset,
            applied_revision: self.reader().applied_revision(),
        })
    }
}

/// One page of a ranked search.
#[derive(Debug)]
pub struct RankedPage {
    /// Best first, with their scores.
    pub records: Vec<(Arc<AgentRecord>, f32)>,
    /// How many agents the search ranked (at most `top`), on every page.
    pub matched: usize,
    /// Where the next page starts, when this one ended early.
    pub next_offset: Option<usize>,
    pub applied_revision: u64,
}

impl RegistryService {
    /// The stored records of `ids` (positions in it, in order), skipping
    /// those gone or deleted, and where the page stopped if it did. Whole
    /// records are read a chunk at a time and stop once their stored sizes
    /// fill a page (one always fits): up to 200 records of up to 256 KiB
    /// each would otherwise all be read and parsed (about five times their
    /// size in memory) for an answer that holds 2 MiB. Summaries are small
    /// and read at once.
    fn read_page(&self, ids: &[&str], whole: bool) -> Result<PageRead> {
        let (mut records, mut bytes, mut at) = (Vec::new(), 0, 0);
        while at < ids.len() {
            let left = ids.len() - at;
            let take = if whole {
                next_chunk(bytes, records.len(), left)
            } else {
                left
            };
            let chunk = &ids[at..at + take];
            let read = if whole {
                self.reader().get_shared_many(chunk)?
            } else {
                self.reader().get_summaries(chunk)?
            };
            for (i, record) in read.into_iter().enumerate() {
                let Some((record, size)) = record else {
                    continue;
                };
                if record.envelope.deleted {
                    continue;
                }
                if whole && !records.is_empty() && bytes + size > MAX_PAGE_BYTES {
                    let stopped = Some(at + i);
                    return Ok(PageRead { records, stopped });
                }
                bytes += size;
                records.push((at + i, record));
            }
            at += take;
        }
        let stopped = None;
        Ok(PageRead { records, stopped })
    }
}

/// The records read for a page of hits.
struct PageRead {
    /// Each with its hit's position, in order.
    records: Vec<(usize, Arc<AgentRecord>)>,
    /// Where the page stopped, when its records' stored sizes filled it.
    stopped: Option<usize>,
}

/// How many more whole records to read, with `bytes` of stored records
/// read for `read` candidates so far and `left` hits to go: all that the
/// records so far suggest would fit the page, at least a few (records
/// differ), starting from enough for a usual answer in one read.
fn next_chunk(bytes: usize, read: usize, left: usize) -> usize {
    const FIRST: usize = 16;
    const AT_LEAST: usize = 4;
    let fits = match (bytes, read) {
        (_, 0) => FIRST,
        (0, _) => left,
        _ => MAX_PAGE_BYTES.saturating_sub(bytes) / (bytes / read).max(1),
    };
    fits.clamp(AT_LEAST, left.max(AT_LEAST)).min(left)
}

/// Score taken from a candidate whose declared languages miss the locale's.
const LOCALE_MISMATCH: f32 = 0.05;

impl RegistryService {
    /// AIDIP Agent Semantic Resolution. Agents are ranked for the intent
    /// (the context's domain as a preferred tag), then taken in order: those
    /// that pass the policy become candidates, those that fail it are
    /// reported with their reasons, until enough candidates are found.
    #[instrument(skip_all, fields(principal = principal.map(|p| p.name.as_str())))]
    pub async fn resolve(
        &self,
        principal: Option<&Principal>,
        mut request: ResolveRequest,
    ) -> Result<Resolution> {
        self.require_reader(principal)?;
        request.normalise()?;
        let mut warnings: Vec<String> = Vec::new();
        warnings.extend(self.index_ready(Consistency::Local).await?);
        warnings.extend(self.model_warning());
        let preferred: Vec<String> = request.domain_tag().into_iter().collect();
        let max = request.policy.max_candidates as usize;
        // Every status but deleted is ranked, so an agent the policy refuses
        // for its status is reported rather than silently missing.
        let filters = HardFilters {
            statuses: ALL_BUT_DELETED.to_vec(),
            ..Default::default()
        };
        let vector = self.query_vector(&request.intent, &mut warnings).await;
        let now = time::OffsetDateTime::now_utc();
        let hits = self.index().search(Query {
            text: &request.intent,
            vector,
            filters: &filters,
            preferred_tags: &preferred,
            limit: max * 4 + 10,
            evidence: true,
            principal,
            now_unix: now.unix_timestamp(),
            leases: None,
        });
        let language = request.locale_language();
        let mut candidates: Vec<Resolved> = Vec::new();
        let mut excluded = Vec::new();
        for mut hit in hits {
            if candidates.len() >= max {
                break;
            }
            let Some(record) = self.reader().get(&hit.id)?.filter(|r| !r.envelope.deleted) else {
                continue;
            };
            self.index().evidence(&mut hit, &record, &request.intent);
            let reasons = request.policy.violations(&record, record.is_verified());
            if !reasons.is_empty() {
                excluded.push((hit.id.clone(), reasons, hit.score));
                continue;
            }
            let best_operation = hit
                .matched_units
                .iter()
                .find(|(u, _)| u.kind == UnitKind::Operation)
                .and_then(|(u, _)| u.label.as_deref());
            let operation = chosen_operation(&record, best_operation).cloned();
            let (metadata, redacted) = visible_metadata(&record, Detail::Full, principal);
            // The binding chosen from the record, shown as the caller may see it.
            let Some(index) = request
                .policy
                .binding(&record)
                .and_then(|b| record.metadata.bindings.iter().position(|x| x == b))
            else {
                continue;
            };
            let mut score = hit.score;
            let mut notes = hit.notes.clone();
            let langs = &record.metadata.supported_languages;
            if let Some(l) = &language {
                if !langs.is_empty() && !langs.contains(l) {
                    score -= LOCALE_MISMATCH;
                    notes.push(format!("does not declare the context's language '{l}'"));
                }
            }
            candidates.push(Resolved {
                id: hit.id,
                score,
                binding: metadata.bindings[index].clone(),
                metadata,
                redacted,
                operation,
                status: record.metadata.effective_status(),
                notes,
            });
        }
        candidates.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.id.cmp(&b.id)));
        if candidates.is_empty() {
            warnings.push("no agent satisfies the policy".into());
        }
        Ok(Resolution {
            request_id: uuid::Uuid::new_v4().to_string(),
            generated_at: crate::domain::time::format(now),
            candidates,
            excluded,
            warnings,
        })
    }
}

/// What the index ranks for a discovery plan (ADP discover, local or
/// federated).
pub(super) fn ranking_query<'a>(
    plan: &'a DiscoveryPlan,
    principal: Option<&'a Principal>,
    now: time::OffsetDateTime,
    vector: Option<Vec<f32>>,
) -> Query<'a> {
    Query {
        text: &plan.query,
        vector,
        filters: &plan.filters,
        preferred_tags: &plan.preferred_tags,
        limit: plan.limit as usize,
        evidence: plan.include_evidence,
        principal,
        now_unix: now.unix_timestamp(),
        leases: None,
    }
}

pub(super) fn candidate(
    hit: Hit,
    record: &Arc<AgentRecord>,
    detail: Detail,
    principal: Option<&Principal>,
) -> Candidate {
    let expires_at = hit
        .lease_expires_unix
        .and_then(|t| time::OffsetDateTime::from_unix_timestamp(t).ok())
        .map(crate::domain::time::format)
        .or_else(|| record.metadata.expires_at.clone());
    Candidate::new(ranked(hit), record.clone(), detail, principal, expires_at)
}

/// What a result keeps of the index's hit.
fn ranked(hit: Hit) -> Ranked {
    Ranked {
        id: hit.id,
        score: hit.score,
        components: hit.components,
        matched_tags: hit.matched_tags,
        matched_units: hit
            .matched_units
            .into_iter()
            .map(|(u, score)| MatchedUnit {
                kind: u.kind,
                label: u.label,
                text: u.text,
                score,
            })
            .collect(),
        snippet: hit.snippet,
        indexed_at: hit.indexed_at,
        status: hit.status,
        expired: hit.expired,
        duplicate_of: hit.duplicate_of,
        notes: hit.notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_records_are_read_about_a_page_at_a_time() {
        // A usual answer is one read; a large limit of usual records, two.
        assert_eq!(next_chunk(0, 0, 10), 10);
        assert_eq!(next_chunk(0, 0, 200), 16);
        assert_eq!(next_chunk(16 * 2048, 16, 184), 184);
        // Records of 256 KiB: the first read holds 16 (4 MiB), then the
        // page is full; at 200 KiB a few more are read at a time.
        assert_eq!(next_chunk(4 << 20, 16, 184), 4);
        assert_eq!(next_chunk(1 << 20, 5, 195), 5);
        // Never fewer than a few, never more than are left.
        assert_eq!(next_chunk(MAX_PAGE_BYTES - 10, 3, 50), 4);
        assert_eq!(next_chunk(1 << 20, 5, 2), 2);
        // Records read so far all empty (tombstones): the rest at once.
        assert_eq!(next_chunk(0, 3, 40), 40);
    }
}
