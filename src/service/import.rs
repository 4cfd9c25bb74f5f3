//! Importing agents described in other formats (SPECS.md "One agent
//! record"): a Web of Agents host's `/.well-known/woa.json`, an A2A Agent
//! Card, an Agent Protocol agent's `describe`, or a host's AI Catalog
//! (`/.well-known/ai-catalog.json`, whose entries point at documents of
//! those formats and at nested catalogs). The source is fetched
//! through the outbound guard, validated as a whole, mapped into records
//! (`gateway::import`), and each record is created, updated, left alone
//! when unchanged, or — for a WoA host that no longer lists an agent it
//! listed before — removed.

use std::collections::BTreeSet;

use serde_json::Value;
use url::Url;

use super::error::ServiceError;
use super::invocation::InvocationService;
use super::registry::require_writer;
use crate::domain::validate::normalise_and_validate;
use crate::domain::{AgentMetadata, Principal};
use crate::gateway::import::{
    a2a_card, ap_descriptor, map_document, merge, read_catalog, woa_document, CatalogItem,
};
use crate::gateway::transport::Fetched;

type Result<T> = std::result::Result<T, ServiceError>;

/// The formats agents are imported from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportFormat {
    Woa,
    A2a,
    AgentProtocol,
    AiCatalog,
}

/// Catalog documents one import reads at most (the first and the nested
/// ones it names), and how deep nested catalogs are followed.
const MAX_CATALOG_DOCUMENTS: usize = 32;
const MAX_CATALOG_DEPTH: usize = 3;

impl ImportFormat {
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "woa" => Some(Self::Woa),
            "a2a" => Some(Self::A2a),
            "agent-protocol" | "ap" => Some(Self::AgentProtocol),
            "ai-catalog" | "catalog" => Some(Self::AiCatalog),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Woa => "woa",
            Self::A2a => "a2a",
            Self::AgentProtocol => "agent-protocol",
            Self::AiCatalog => "ai-catalog",
        }
    }

    /// The document a bare origin stands for.
    fn well_known(self) -> Option<&'static str> {
        match self {
            Self::Woa => Some("/.well-known/woa.json"),
            Self::A2a => Some("/.well-known/agent-card.json"),
            Self::AiCatalog => Some("/.well-known/ai-catalog.json"),
            Self::AgentProtocol => None,
        }
    }

    pub fn accept(self) -> &'static str {
        match self {
            Self::Woa => "application/woa+json, application/json",
            Self::AiCatalog => "application/ai-catalog+json, application/json",
            _ => "application/json",
        }
    }
}

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImportReport {
    /// The document read.
    pub url: String,
    /// (registry id, "created" | "updated" | "unchanged" | "removed").
    pub agents: Vec<(String, String)>,
    /// (source id, transport, reason) of agents not imported.
    pub skipped: Vec<(String, String, String)>,
    /// (source id, transport, reason) of transports listed as unsupported.
    pub unsupported: Vec<(String, String, String)>,
    /// The host answered 304 to the validators sent.
    pub not_modified: bool,
    /// (identifier, name, URL) of registries a catalog names: reported for
    /// an operator to add as peers, never followed.
    pub registries: Vec<(String, String, String)>,
}

/// The URL of the document to read for `url`.
pub fn document_url(format: ImportFormat, url: &str) -> Result<Url> {
    let mut u = Url::parse(url.trim()).map_err(|e| ServiceError::InvalidRequest {
        field: Some("/url".into()),
        message: format!("/url: '{url}' is not an absolute URL ({e})"),
    })?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(ServiceError::InvalidRequest {
            field: Some("/url".into()),
            message: format!("/url: scheme '{}' is not http(s)", u.scheme()),
        });
    }
    if let Some(path) = format.well_known() {
        if u.path().is_empty() || u.path() == "/" {
            u.set_path(path);
        }
    }
    Ok(u)
}

/// The source URL an imported record came from.
fn source_url(meta: &AgentMetadata) -> Option<&str> {
    meta.extra
        .get("source")
        .and_then(|s| s.get("url"))
        .and_then(Value::as_str)
}

fn bad_document(url: &Url, e: impl std::fmt::Display) -> ServiceError {
    ServiceError::BadUpstream(format!("the document at {url} is not acceptable: {e}"))
}

impl InvocationService {
    /// Imports agents from `url`. Without `validators` the document is
    /// always read; with them (the crawler's), a 304 ends the import.
    pub async fn import(
        &self,
        principal: Option<&Principal>,
        format: ImportFormat,
        url: &str,
    ) -> Result<ImportReport> {
        super::audit::begin("import", Some(url));
        let principal = require_writer(principal)?.clone();
        let url = document_url(format, url)?;
        let fetched = self.outbound().fetch(&url, format.accept(), &[]).await?;
        self.import_fetched(&principal, format, &url, fetched).await
    }

    /// Applies a fetched document.
    pub async fn import_fetched(
        &self,
        principal: &Principal,
        format: ImportFormat,
        url: &Url,
        fetched: Fetched,
    ) -> Result<ImportReport> {
        let mut report = ImportReport {
            url: url.to_string(),
            ..Default::default()
        };
        if fetched.status == 304 {
            report.not_modified = true;
            return Ok(report);
        }
        if fetched.status != 200 {
            return Err(ServiceError::BadUpstream(format!(
                "{url} answered {} instead of the {} document",
                fetched.status,
                format.name()
            )));
        }
        let doc =
            crate::domain::json::parse_json(&fetched.body).map_err(|e| bad_document(url, e))?;
        let allow_http = self.outbound().policy.allow_http;
        let agents = match format {
            ImportFormat::Woa => {
                let woa = woa_document(&doc, url, allow_http).map_err(|e| bad_document(url, e))?;
                report.skipped = woa
                    .skipped
                    .into_iter()
                    .map(|s| (s.agent_id, String::new(), s.reason))
                    .collect();
                report.unsupported = woa
                    .unsupported_transports
                    .into_iter()
                    .map(|u| (u.agent_id, u.transport, u.reason))
                    .collect();
                woa.agents
            }
            ImportFormat::A2a => vec![a2a_card(&doc, url).map_err(|e| bad_document(url, e))?],
            ImportFormat::AgentProtocol => {
                vec![ap_descriptor(&doc, url).map_err(|e| bad_document(url, e))?]
            }
            ImportFormat::AiCatalog => self.catalog_agents(url, &doc, &mut report).await?,
        };
        let mut kept = BTreeSet::new();
        for meta in agents {
            kept.insert(meta.id.clone());
            let id = meta.id.clone();
            match self.apply_import(principal, meta).await {
                Ok(outcome) => report.agents.push((id, outcome.into())),
                Err(e) => report.skipped.push((id, String::new(), e.to_string())),
            }
        }
        if format == ImportFormat::Woa {
            for id in self
                .previously_imported(principal, url.as_str(), &kept)
                .await?
            {
                match self.registry().delete(Some(principal), &id, None).await {
                    Ok(_) => report.agents.push((id, "removed".into())),
                    Err(e) => report.skipped.push((id, String::new(), e.to_string())),
                }
            }
        }
        Ok(report)
    }

    /// The agents of a catalog: its inline records, the documents its
    /// entries point at (fetched through the outbound guard and mapped by
    /// their format's importer), and nested catalogs, breadth first, at
    /// most `MAX_CATALOG_DEPTH` deep and `MAX_CATALOG_DOCUMENTS` in all.
    /// An entry whose document cannot be read is skipped, not fatal.
    async fn catalog_agents(
        &self,
        url: &Url,
        doc: &Value,
        report: &mut ImportReport,
    ) -> Result<Vec<AgentMetadata>> {
        let allow_http = self.outbound().policy.allow_http;
        let mut agents = Vec::new();
        let mut queue = vec![(url.clone(), doc.clone(), 0usize)];
        let mut read = 1usize;
        while let Some((at, doc, depth)) = queue.pop() {
            let catalog = match read_catalog(&doc, &at, allow_http) {
                Ok(c) => c,
                Err(e) if depth == 0 => return Err(bad_document(&at, e)),
                Err(e) => {
                    report
                        .skipped
                        .push((at.to_string(), String::new(), e.to_string()));
                    continue;
                }
            };
            for (identifier, reason) in catalog.skipped {
                report.skipped.push((identifier, String::new(), reason));
            }
            for r in catalog.registries {
                report
                    .registries
                    .push((r.identifier, r.display_name, r.url));
            }
            for item in catalog.items {
                match item {
                    CatalogItem::Record(meta) => agents.push(*meta),
                    CatalogItem::Fetch { format, url, entry } => {
                        match self.fetch_json(&url, "application/json").await {
                            Ok(doc) => match map_document(format, &doc, &url, allow_http) {
                                Ok(list) => agents
                                    .extend(list.into_iter().map(|m| merge(m, &entry, format))),
                                Err(e) => report.skipped.push((
                                    entry.id.clone(),
                                    String::new(),
                                    bad_document(&url, e).to_string(),
                                )),
                            },
                            Err(e) => report.skipped.push((
                                entry.id.clone(),
                                String::new(),
                                e.to_string(),
                            )),
                        }
                    }
                    CatalogItem::Catalog { identifier, url } => {
                        if depth + 1 > MAX_CATALOG_DEPTH || read >= MAX_CATALOG_DOCUMENTS {
                            report.skipped.push((
                                identifier,
                                String::new(),
                                format!("nested catalogs are followed {MAX_CATALOG_DEPTH} deep and {MAX_CATALOG_DOCUMENTS} documents at most"),
                            ));
                            continue;
                        }
                        read += 1;
                        match self
                            .fetch_json(&url, ImportFormat::AiCatalog.accept())
                            .await
                        {
                            Ok(doc) => queue.insert(0, (url, doc, depth + 1)),
                            Err(e) => {
                                report
                                    .skipped
                                    .push((identifier, String::new(), e.to_string()))
                            }
                        }
                    }
                }
            }
        }
        Ok(agents)
    }

    /// A JSON document read through the outbound guard.
    async fn fetch_json(&self, url: &Url, accept: &str) -> Result<Value> {
        let fetched = self.outbound().fetch(url, accept, &[]).await?;
        if fetched.status != 200 {
            return Err(ServiceError::BadUpstream(format!(
                "{url} answered {}",
                fetched.status
            )));
        }
        crate::domain::json::parse_json(&fetched.body).map_err(|e| bad_document(url, e))
    }

    /// Creates, updates or leaves alone one imported record.
    async fn apply_import(
        &self,
        principal: &Principal,
        meta: AgentMetadata,
    ) -> Result<&'static str> {
        let registry = self.registry();
        let current = registry
            .reader()
            .get(&meta.id)?
            .filter(|r| !r.envelope.deleted);
        let Some(current) = current else {
            registry.register(Some(principal), meta, None).await?;
            return Ok("created");
        };
        let mut normalised = meta.clone();
        normalise_and_validate(&mut normalised, registry.limits())?;
        if normalised == current.metadata {
            return Ok("unchanged");
        }
        let id = meta.id.clone();
        registry
            .update(Some(principal), &id, meta, None, None)
            .await?;
        Ok("updated")
    }

    /// Live records this principal imported from `url` that the document
    /// no longer lists.
    async fn previously_imported(
        &self,
        principal: &Principal,
        url: &str,
        kept: &BTreeSet<String>,
    ) -> Result<Vec<String>> {
        let reader = self.registry().reader().clone();
        let (owner, url, kept) = (principal.name.clone(), url.to_string(), kept.clone());
        tokio::task::spawn_blocking(move || {
            let mut gone = Vec::new();
            reader.scan(|r| {
                if !r.envelope.deleted
                    && r.envelope.owner == owner
                    && source_url(&r.metadata) == Some(url.as_str())
                    && !kept.contains(&r.metadata.id)
                {
                    gone.push(r.metadata.id);
                }
            })?;
            Ok::<_, ServiceError>(gone)
        })
        .await
        .map_err(|e| ServiceError::Internal(format!("scanning imported records: {e}")))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_origins_stand_for_their_well_known_documents() {
        let u = document_url(ImportFormat::Woa, "https://api.example.com").unwrap();
        assert_eq!(u.as_str(), "https://api.example.com/.well-known/woa.json");
        let u = document_url(ImportFormat::A2a, "https://agent.example/").unwrap();
        assert_eq!(
            u.as_str(),
            "https://agent.example/.well-known/agent-card.json"
        );
        let u = document_url(ImportFormat::Woa, "https://h.example/custom/woa.json").unwrap();
        assert_eq!(u.path(), "/custom/woa.json");
        assert!(document_url(ImportFormat::Woa, "ftp://h.example/").is_err());
        assert!(document_url(ImportFormat::AgentProtocol, "not a url").is_err());
        assert_eq!(ImportFormat::parse("AP"), Some(ImportFormat::AgentProtocol));
        assert_eq!(ImportFormat::parse("rss"), None);
    }
}
