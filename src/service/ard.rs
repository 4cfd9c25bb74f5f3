//! ARD and the AI Catalog (`../shared/specs/ard/`): the registry as an AI
//! Catalog host (`/.well-known/ai-catalog.json`) and as an ARD registry
//! (search, explore, list, get). Both are views of the records, never a
//! second store: entries come from `domain::catalog`, filters from the one
//! filter engine, ranking from ADP discovery.
//!
//! Entries are kept in a cache keyed by record id and brought up to date
//! from the change history (only changed records are rebuilt and signed);
//! the catalog document is assembled from the cached entries' bytes at
//! most once a second while the registry changes. A change of signing key,
//! or history that no longer reaches back, rebuilds the cache from a scan.
//!
//! Every entry carries a `trustManifest`: the registry's identity
//! (`https://<authority>`), a `publishedFrom` provenance link to the record
//! as this registry serves it with the SHA-256 of the record's signed bytes
//! (and a `copiedFrom` link to the origin for a peer's record), and a
//! detached JWS (EdDSA, `kid` = the signing key's id) over the RFC 8785
//! form of the manifest without `signature`. The keys are those published
//! at `/.well-known/agentry.json`.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{json, Map, Value};
use time::OffsetDateTime;
use tracing::{debug, instrument};

use super::woa_host::changed_at;
use super::{RegistryService, ServiceError};
use crate::crypto::canonical::canonical;
use crate::crypto::keys::Signer;
use crate::crypto::signature::{served_form, signed_bytes};
use crate::domain::catalog::{
    self, ard_score, digest, facet, record_url, urn_publisher, EntryContext, ExplorePlan, Facet,
    Federation, ListPlan, SearchPlan, MAX_MATCHED, MIN_SCORE,
};
use crate::domain::discovery::{Detail, DiscoveryRequest, Scope};
use crate::domain::filter::{AgentFacts, HardFilters};
use crate::domain::lease::LeaseTable;
use crate::domain::{AgentRecord, AgentStatus, Envelope, Principal};

type Result<T> = std::result::Result<T, ServiceError>;

/// The least time between two builds of the catalog document while the
/// registry keeps changing.
const REBUILD_EVERY: Duration = Duration::from_secs(1);
/// Changes read from history per batch while the cache catches up.
const BATCH: usize = 4096;

/// One cached entry.
#[derive(Debug)]
pub struct Item {
    pub facts: AgentFacts,
    /// With its `trustManifest`.
    pub entry: Map<String, Value>,
    /// `entry` serialised, as the catalog document embeds it.
    pub json: Bytes,
    /// Strong validator of the entry, quoted.
    pub etag: String,
    /// When the registry first stored the record (list ordering).
    pub created: String,
}

/// The built catalog document.
#[derive(Debug)]
pub struct CatalogDocument {
    pub revision: u64,
    pub body: Bytes,
    pub etag: String,
    pub last_modified: OffsetDateTime,
    built: Instant,
}

#[derive(Default)]
struct Cache {
    /// The registry revision the items reflect.
    revision: u64,
    /// The key the items' manifests are signed with.
    key_id: String,
    /// Live records by id (private ones too: list, get and explore show
    /// callers what they may read; the document shows public ones only).
    items: BTreeMap<String, Arc<Item>>,
    document: Option<Arc<CatalogDocument>>,
}

/// One search result: an entry with its `score` and `source`.
#[derive(Debug, Clone)]
pub struct SearchHit {
    pub score: u8,
    pub source: String,
    pub entry: HitEntry,
}

/// A result's entry: a local agent's from the cache (shared, never
/// copied: the facade writes its cached bytes), a peer's built for the
/// answer.
#[derive(Debug, Clone)]
pub enum HitEntry {
    Cached(Arc<Item>),
    Built(Map<String, Value>),
}

impl SearchHit {
    /// The entry without `score` and `source`.
    pub fn entry(&self) -> &Map<String, Value> {
        match &self.entry {
            HitEntry::Cached(item) => &item.entry,
            HitEntry::Built(entry) => entry,
        }
    }

    /// The entry with `score` and `source`.
    pub fn to_map(&self) -> Map<String, Value> {
        let mut e = self.entry().clone();
        e.insert("score".into(), json!(self.score));
        e.insert("source".into(), json!(self.source));
        e
    }

    /// Appends the result as JSON: `score` and `source`, then the entry's
    /// members (a local agent's straight from the cached bytes).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"score\":");
        out.extend_from_slice(self.score.to_string().as_bytes());
        out.extend_from_slice(b",\"source\":");
        // Serialising a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, &self.source);
        let built;
        let entry: &[u8] = match &self.entry {
            HitEntry::Cached(item) => &item.json,
            HitEntry::Built(entry) => {
                built = serde_json::to_vec(entry).unwrap_or_default();
                &built
            }
        };
        // `entry` is an object, `{}` or `{"k":...}`: splice its members.
        match entry.get(1..) {
            Some(b"}") | Some([]) | None => out.push(b'}'),
            Some(members) => {
                out.push(b',');
                out.extend_from_slice(members);
            }
        }
    }
}

/// One page of search results.
#[derive(Debug, Clone, Default)]
pub struct SearchPage {
    pub results: Vec<SearchHit>,
    pub referrals: Vec<Map<String, Value>>,
    pub page_token: String,
}

/// One page of a list.
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    pub items: Vec<Map<String, Value>>,
    pub total: u64,
    pub page_token: String,
}

/// The ARD registry and AI Catalog host of this node.
#[derive(Clone)]
pub struct ArdService {
    registry: RegistryService,
    /// Public base URL of the HTTP API.
    base: String,
    pub max_age: Duration,
    cache: Arc<RwLock<Cache>>,
    /// One catch-up at a time; others wait and then read its result.
    updating: Arc<tokio::sync::Mutex<()>>,
}

fn read(c: &RwLock<Cache>) -> std::sync::RwLockReadGuard<'_, Cache> {
    c.read().unwrap_or_else(|p| p.into_inner())
}

fn write(c: &RwLock<Cache>) -> std::sync::RwLockWriteGuard<'_, Cache> {
    c.write().unwrap_or_else(|p| p.into_inner())
}

impl ArdService {
    pub fn new(registry: RegistryService, base: String, max_age: Duration) -> Self {
        Self {
            registry,
            base: base.trim_end_matches('/').to_string(),
            max_age,
            cache: Arc::default(),
            updating: Arc::default(),
        }
    }

    pub fn registry(&self) -> &RegistryService {
        &self.registry
    }

    /// This registry's ARD API, as catalogs and results name it.
    pub fn ard_url(&self) -> String {
        format!("{}/ard", self.base)
    }

    fn publisher(&self) -> String {
        urn_publisher(&self.registry.own_authority())
    }

    /// Brings the cache up to what this node has applied.
    async fn fresh(&self) -> Result<()> {
        let applied = self.registry.reader().applied_revision();
        let Some(signer) = self.registry.reader().signer() else {
            return Err(ServiceError::no_signing_identity());
        };
        let current = |c: &Cache| c.revision >= applied && c.key_id == signer.key_id;
        if current(&read(&self.cache)) {
            return Ok(());
        }
        let _one = self.updating.lock().await;
        if current(&read(&self.cache)) {
            return Ok(());
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.catch_up(&signer))
            .await
            .map_err(|e| ServiceError::Internal(format!("updating the catalog: {e}")))?
    }

    /// Applies the changes since the cache's revision, or rebuilds it from
    /// a scan when it cannot (first use, new signing key, history gone).
    fn catch_up(&self, signer: &Signer) -> Result<()> {
        let reader = self.registry.reader();
        let (from, same_key) = {
            let c = read(&self.cache);
            (c.revision + 1, c.key_id == signer.key_id)
        };
        let ctx = Ctx {
            base: &self.base,
            publisher: &self.publisher(),
            signer,
        };
        if !same_key || from <= 1 || from < reader.oldest_revision() {
            let revision = reader.applied_revision();
            let mut items = BTreeMap::new();
            reader.scan(|r| {
                if let Some(item) = ctx.item(&r) {
                    items.insert(r.metadata.id.clone(), Arc::new(item));
                }
            })?;
            debug!(entries = items.len(), revision, "catalog built from a scan");
            let mut c = write(&self.cache);
            *c = Cache {
                revision: revision.max(c.revision),
                key_id: signer.key_id.clone(),
                items,
                document: None,
            };
            return Ok(());
        }
        // Everything applied by now has its change in history already.
        let applied = reader.applied_revision();
        let mut next = from;
        loop {
            let batch = reader.changes_from(next, BATCH)?;
            let Some(last) = batch.last().map(|c| c.revision) else {
                break;
            };
            // Built outside the lock; only the swap holds it.
            let built: Vec<(String, Option<Arc<Item>>)> = batch
                .iter()
                .map(|c| {
                    (
                        c.record.metadata.id.clone(),
                        ctx.item(&c.record).map(Arc::new),
                    )
                })
                .collect();
            let mut c = write(&self.cache);
            for (id, item) in built {
                match item {
                    Some(i) => c.items.insert(id, i),
                    None => c.items.remove(&id),
                };
            }
            c.revision = c.revision.max(last);
            next = last + 1;
        }
        // Revisions without a record change (membership, keys) count too.
        let mut c = write(&self.cache);
        c.revision = c.revision.max(applied);
        Ok(())
    }

    /// The AI Catalog document (ARD §4.1).
    #[instrument(skip_all)]
    pub async fn catalog(&self, principal: Option<&Principal>) -> Result<Arc<CatalogDocument>> {
        self.registry.require_reader(principal)?;
        self.fresh().await?;
        let (revision, doc) = {
            let c = read(&self.cache);
            (c.revision, c.document.clone())
        };
        if let Some(doc) = doc {
            let aged = doc.built.elapsed();
            if (doc.revision == revision || aged < REBUILD_EVERY)
                && aged < self.max_age.max(REBUILD_EVERY)
            {
                return Ok(doc);
            }
        }
        let this = self.clone();
        let doc = tokio::task::spawn_blocking(move || this.build_document())
            .await
            .map_err(|e| ServiceError::Internal(format!("building the catalog: {e}")))?;
        Ok(doc)
    }

    fn build_document(&self) -> Arc<CatalogDocument> {
        let authority = self.registry.own_authority();
        let now = OffsetDateTime::now_utc().unix_timestamp();
        let head = json!({
            "specVersion": "1.0",
            "host": {
                "displayName": format!("{authority} (Agentry registry)"),
                "identifier": authority,
                "documentationUrl": format!("{}/openapi.json", self.base),
            },
        });
        let mut body = head.to_string();
        body.pop();
        body.push_str(",\"entries\":[");
        body.push_str(&Value::Object(self.registry_entry()).to_string());
        let mut c = write(&self.cache);
        let leases = self.registry.reader().leases();
        for (id, item) in c.items.iter() {
            if !listed(&item.facts, expiry(&leases, id, item), now) {
                continue;
            }
            body.push(',');
            body.push_str(std::str::from_utf8(&item.json).unwrap_or("{}"));
        }
        body.push_str("]}");
        let etag = format!("\"{}\"", &digest(body.as_bytes())[7..39]);
        let previous = c
            .document
            .as_ref()
            .map(|d| (d.etag.as_str(), d.last_modified));
        let last_modified = changed_at(previous, &etag, OffsetDateTime::now_utc());
        let doc = Arc::new(CatalogDocument {
            revision: c.revision,
            body: Bytes::from(body),
            etag,
            last_modified,
            built: Instant::now(),
        });
        c.document = Some(doc.clone());
        doc
    }

    /// The catalog's entry for this registry's ARD API.
    fn registry_entry(&self) -> Map<String, Value> {
        let authority = self.registry.own_authority();
        let mut e = Map::new();
        e.insert(
            "identifier".into(),
            json!(format!("urn:air:{}:registry:agentry", self.publisher())),
        );
        e.insert(
            "displayName".into(),
            json!(format!("{authority} agent registry")),
        );
        e.insert("type".into(), json!(catalog::REGISTRY_TYPE));
        e.insert("url".into(), json!(self.ard_url()));
        e.insert(
            "description".into(),
            json!("ARD search API of this Agentry registry: POST /search, POST /explore, GET /agents (federation auto, referrals and none)."),
        );
        e.insert("tags".into(), json!(["registry", "search"]));
        e
    }

    /// An entry by its URN identifier, with its ETag.
    #[instrument(skip_all)]
    pub async fn get(
        &self,
        principal: Option<&Principal>,
        identifier: &str,
    ) -> Result<(Map<String, Value>, String)> {
        self.registry.require_reader(principal)?;
        let ids = crate::domain::urn::ids_for(identifier, &self.publisher());
        if ids.is_empty() {
            return Err(crate::domain::FieldError::new(
                "/identifier",
                format!("'{identifier}' is not an ARD identifier (urn:air:<publisher>:<namespace>:<name>)"),
            )
            .into());
        }
        self.fresh().await?;
        let now = OffsetDateTime::now_utc().unix_timestamp();
        let c = read(&self.cache);
        let leases = self.registry.reader().leases();
        ids.iter()
            .filter_map(|id| Some(id).zip(c.items.get(id)))
            .find(|(id, i)| visible(&i.facts, expiry(&leases, id, i), principal, now))
            .map(|(_, i)| i)
            .map(|i| (i.entry.clone(), i.etag.clone()))
            .ok_or_else(|| ServiceError::NotFound(format!("no agent '{identifier}'")))
    }

    /// ARD list (§7.4): filtered by the Appendix A expression, ordered,
    /// paged by the sort key of the last entry (stable under writes).
    #[instrument(skip_all)]
    pub async fn list(&self, principal: Option<&Principal>, plan: ListPlan) -> Result<ListPage> {
        self.registry.require_reader(principal)?;
        self.fresh().await?;
        let mut filters = plan.filters.clone();
        filters.local_publisher = Some(self.publisher());
        let now = OffsetDateTime::now_utc().unix_timestamp();
        let c = read(&self.cache);
        let leases = self.registry.reader().leases();
        let mut matched: Vec<(String, &Arc<Item>)> = c
            .items
            .iter()
            .filter(|(id, i)| {
                filters.admit_expiring(&i.facts, || expiry(&leases, id, i), principal, now)
            })
            .map(|(id, i)| (plan.sort_key(&i.entry, id, &i.created), i))
            .collect();
        matched.sort_by(|a, b| a.0.cmp(&b.0));
        if plan.descending {
            matched.reverse();
        }
        let total = matched.len() as u64;
        let start = match &plan.after {
            None => 0,
            Some(after) => matched
                .iter()
                .position(|(k, _)| {
                    if plan.descending {
                        k < after
                    } else {
                        k > after
                    }
                })
                .unwrap_or(matched.len()),
        };
        let page: Vec<&(String, &Arc<Item>)> = matched
            .iter()
            .skip(start)
            .take(plan.page_size as usize)
            .collect();
        let page_token = match page.last() {
            Some((k, _)) if start + page.len() < matched.len() => plan.token_after(k),
            _ => String::new(),
        };
        Ok(ListPage {
            items: page.iter().map(|(_, i)| i.entry.clone()).collect(),
            total,
            page_token,
        })
    }

    /// ARD search (§7.2, §8).
    #[instrument(skip_all, fields(federation = ?plan.federation))]
    pub async fn search(
        &self,
        principal: Option<&Principal>,
        plan: SearchPlan,
    ) -> Result<SearchPage> {
        // `auto` without a peer to ask is a local search (a federated one
        // would re-rank the local pool for nothing).
        let peers_to_ask = self.registry.peers().all().iter().any(|p| p.fan_out);
        let scope = match plan.federation {
            Federation::Auto if peers_to_ask => Scope::Federated,
            Federation::Auto | Federation::Referrals | Federation::None => Scope::Local,
        };
        let matched = self
            .ranked(
                principal,
                &plan.text,
                plan.clauses.clone(),
                plan.depth(),
                scope,
            )
            .await?;
        let start = plan.offset as usize;
        let end = (start + plan.page_size as usize).min(matched.len());
        let page_token = if matched.len() > end {
            plan.token_at(end as u32)
        } else {
            String::new()
        };
        let results = matched
            .into_iter()
            .skip(start)
            .take(end.saturating_sub(start))
            .collect();
        let referrals = match plan.federation {
            Federation::Referrals => self.referrals(),
            _ => Vec::new(),
        };
        Ok(SearchPage {
            results,
            referrals,
            page_token,
        })
    }

    /// Entries ranked for `text` above the relevance cutoff, best first,
    /// each with `score` and `source`.
    async fn ranked(
        &self,
        principal: Option<&Principal>,
        text: &str,
        clauses: Vec<crate::domain::filter::AnyOf>,
        depth: u32,
        scope: Scope,
    ) -> Result<Vec<SearchHit>> {
        let request = DiscoveryRequest {
            query: text.to_string(),
            limit: depth.clamp(1, MAX_MATCHED),
            // Local entries come from the catalog cache; only peers'
            // candidates are rendered from their metadata.
            detail: if scope == Scope::Federated {
                Detail::Full
            } else {
                Detail::Minimal
            },
            scope,
            any_of: clauses,
            local_publisher: Some(self.publisher()),
            ..Default::default()
        };
        let result = self.registry.discover(principal, request).await?;
        self.fresh().await?;
        let signer = self.registry.reader().signer();
        let mut out = Vec::with_capacity(result.candidates.len());
        for c in result.candidates {
            let score = ard_score(c.hit.score);
            if score < MIN_SCORE {
                continue;
            }
            let remote = c
                .provenance
                .as_ref()
                .filter(|p| p.origin_envelope.is_null());
            let (entry, source) = match remote {
                None => {
                    let cached = read(&self.cache).items.get(&c.hit.id).cloned();
                    let Some(item) = cached else {
                        continue;
                    };
                    (HitEntry::Cached(item), self.ard_url())
                }
                Some(p) => {
                    let Some(signer) = signer.as_deref() else {
                        continue;
                    };
                    let source = self
                        .registry
                        .peers()
                        .get(&p.origin_authority)
                        .and_then(|peer| peer.ard_url())
                        .unwrap_or_else(|| format!("https://{}", p.origin_authority));
                    let base = source.trim_end_matches("/ard").to_string();
                    let record = AgentRecord {
                        metadata: c.metadata(),
                        envelope: Envelope {
                            revision: p.origin_revision,
                            modified_at: c.metadata_updated_at().to_string(),
                            provenance: Some(p.clone()),
                            ..Default::default()
                        },
                    };
                    let ctx = Ctx {
                        base: &base,
                        publisher: &urn_publisher(&p.origin_authority),
                        signer,
                    };
                    (HitEntry::Built(ctx.entry(&record)), source)
                }
            };
            out.push(SearchHit {
                score,
                source,
                entry,
            });
        }
        Ok(out)
    }

    /// This registry's peers as ARD referrals (those whose ARD API is
    /// known: `ard_url`, or beside their well-known document).
    fn referrals(&self) -> Vec<Map<String, Value>> {
        self.registry
            .peers()
            .all()
            .iter()
            .filter_map(|p| {
                let url = p.ard_url()?;
                let mut e = Map::new();
                e.insert(
                    "identifier".into(),
                    json!(format!(
                        "urn:air:{}:registry:agentry",
                        urn_publisher(&p.authority)
                    )),
                );
                e.insert(
                    "displayName".into(),
                    json!(format!("{} agent registry", p.authority)),
                );
                e.insert("type".into(), json!(catalog::REGISTRY_TYPE));
                e.insert("url".into(), json!(url));
                Some(e)
            })
            .collect()
    }

    /// ARD explore (§7.3): facets over the matched set — every entry the
    /// caller may see that passes the filter, narrowed by the same
    /// relevance cutoff as search when `text` is given. Local only.
    #[instrument(skip_all)]
    pub async fn explore(
        &self,
        principal: Option<&Principal>,
        plan: ExplorePlan,
    ) -> Result<Vec<Facet>> {
        self.registry.require_reader(principal)?;
        if !plan.text.is_empty() {
            let matched = self
                .ranked(
                    principal,
                    &plan.text,
                    plan.clauses.clone(),
                    MAX_MATCHED,
                    Scope::Local,
                )
                .await?;
            return Ok(plan
                .facets
                .iter()
                .map(|f| facet(f, matched.iter().map(SearchHit::entry)))
                .collect());
        }
        self.fresh().await?;
        let filters = HardFilters {
            any_of: plan.clauses.clone(),
            local_publisher: Some(self.publisher()),
            ..Default::default()
        };
        let now = OffsetDateTime::now_utc().unix_timestamp();
        let c = read(&self.cache);
        let leases = self.registry.reader().leases();
        let matched: Vec<&Map<String, Value>> = c
            .items
            .iter()
            .filter(|(id, i)| {
                filters.admit_expiring(&i.facts, || expiry(&leases, id, i), principal, now)
            })
            .map(|(_, i)| &i.entry)
            .collect();
        Ok(plan
            .facets
            .iter()
            .map(|f| facet(f, matched.iter().copied()))
            .collect())
    }
}

/// Whether the catalog document lists an agent: public, active or
/// deprecated, not expired.
fn listed(facts: &AgentFacts, expires_unix: Option<i64>, now: i64) -> bool {
    facts.access.admits(None)
        && matches!(facts.status, AgentStatus::Active | AgentStatus::Deprecated)
        && expires_unix.is_none_or(|t| t > now)
}

/// An entry's expiry: its agent's lease's, else its own `expires_at`.
fn expiry(leases: &LeaseTable, id: &str, item: &Item) -> Option<i64> {
    leases.expiry_unix(id).or(item.facts.expires_unix)
}

/// Whether `principal` may see the entry by itself (get): readable and not
/// deleted.
fn visible(
    facts: &AgentFacts,
    expires_unix: Option<i64>,
    principal: Option<&Principal>,
    now: i64,
) -> bool {
    HardFilters {
        statuses: crate::domain::filter::ALL_BUT_DELETED.to_vec(),
        ..Default::default()
    }
    .admit_expiring(facts, || expires_unix, principal, now)
}

/// What building entries needs.
struct Ctx<'a> {
    base: &'a str,
    publisher: &'a str,
    signer: &'a Signer,
}

impl Ctx<'_> {
    /// The cached entry of a live record (none for a tombstone).
    fn item(&self, record: &AgentRecord) -> Option<Item> {
        if record.envelope.deleted {
            return None;
        }
        let entry = self.entry(record);
        let json = Value::Object(entry.clone()).to_string();
        let etag = format!("\"{}\"", &digest(json.as_bytes())[7..39]);
        Some(Item {
            facts: AgentFacts::of(record),
            entry,
            json: Bytes::from(json),
            etag,
            created: record.envelope.registered_at.clone(),
        })
    }

    /// The entry with its signed trust manifest.
    fn entry(&self, record: &AgentRecord) -> Map<String, Value> {
        let mut e = catalog::entry(
            record,
            &EntryContext {
                base: self.base,
                publisher: self.publisher,
            },
        );
        e.insert("trustManifest".into(), self.trust_manifest(record));
        e
    }

    fn trust_manifest(&self, record: &AgentRecord) -> Value {
        let id = &record.metadata.id;
        let mut published = json!({
            "relation": "publishedFrom",
            "sourceId": record_url(self.base, id),
        });
        if let Ok(bytes) = signed_bytes(&served_form(record)) {
            published["sourceDigest"] = json!(digest(bytes.as_bytes()));
        }
        let mut provenance = vec![published];
        if let Some(p) = &record.envelope.provenance {
            provenance.push(json!({
                "relation": "copiedFrom",
                "sourceId": crate::domain::urn::for_id(id, &urn_publisher(&p.origin_authority)),
            }));
        }
        let mut manifest = json!({
            "identity": format!("https://{}", self.signer.authority),
            "identityType": "https",
            "trustSchema": {
                "identifier": format!("urn:air:{}:agentry:trust-manifest", self.publisher),
                "version": "1",
                "governanceUri": format!("{}/.well-known/agentry.json", self.base),
                "verificationMethods": ["jws-eddsa"],
            },
            "provenance": provenance,
        });
        manifest["signature"] = json!(detached_jws(self.signer, &manifest));
        manifest
    }
}

/// A detached JWS (RFC 7515 Appendix F) over the RFC 8785 form of
/// `payload`: `<header>..<signature>`, EdDSA with the signer's key id.
pub fn detached_jws(signer: &Signer, payload: &Value) -> String {
    let header = URL_SAFE_NO_PAD
        .encode(canonical(&json!({"alg": "EdDSA", "kid": signer.key_id})).as_bytes());
    let body = URL_SAFE_NO_PAD.encode(canonical(payload).as_bytes());
    let signature = signer.sign(format!("{header}.{body}").as_bytes());
    format!("{header}..{signature}")
}
