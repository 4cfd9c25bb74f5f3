//! AI Catalog manifests (ARD §4, `/.well-known/ai-catalog.json`): which
//! entries become records, which documents to fetch and import with the
//! format's own importer, which nested catalogs to read, and which
//! registries the catalog names (reported to the operator, never
//! followed).
//!
//! An entry's identifier (`urn:air:...`) becomes the record id of the one
//! agent its document describes, so the registry serves the agent under
//! the publisher's URN again (ARD: URN ids are kept); a WoA document's
//! agents keep their own ids. The entry's `representativeQueries` become
//! example tasks when the document has none, and its tags are added.

use serde_json::{json, Value};
use url::Url;

use super::{add_tag, http_url, ptr, source, Dropped, Obj, Result};
use crate::domain::catalog::{AIDIP_TYPE, CATALOG_TYPE, REGISTRY_TYPE};
use crate::domain::{AgentMetadata, Binding, FieldError, TaskExample};

/// The document formats a catalog entry can point at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryFormat {
    Woa,
    A2a,
    AgentProtocol,
    /// A record as an Agentry registry serves it (`application/aidip+json`).
    Aidip,
}

/// One thing a catalog asks for.
#[derive(Debug, Clone)]
pub enum CatalogItem {
    /// An agent made from the entry (and its inline document).
    Record(Box<AgentMetadata>),
    /// A document to fetch and import; `entry` is what the entry says of
    /// the agent, merged into what the document maps to.
    Fetch {
        format: EntryFormat,
        url: Url,
        entry: Box<AgentMetadata>,
    },
    /// A nested catalog to fetch.
    Catalog { identifier: String, url: Url },
}

/// A registry the catalog names (`application/ai-registry+json`).
#[derive(Debug, Clone, PartialEq)]
pub struct RegistryRef {
    pub identifier: String,
    pub display_name: String,
    pub url: String,
}

/// What a catalog holds.
#[derive(Debug, Clone, Default)]
pub struct CatalogRead {
    pub items: Vec<CatalogItem>,
    pub registries: Vec<RegistryRef>,
    /// (identifier, reason) of entries not taken.
    pub skipped: Vec<(String, String)>,
}

/// Nested inline catalogs read within one document.
const MAX_INLINE_DEPTH: usize = 4;

/// Reads a catalog manifest fetched from `url`. A manifest that breaks
/// the format is refused (pointer into the document); an entry that
/// cannot be taken is skipped with its reason.
pub fn read_catalog(doc: &Value, url: &Url, allow_http: bool) -> Result<CatalogRead> {
    let mut out = CatalogRead::default();
    read_into(doc, "", url, allow_http, 0, &mut out)?;
    Ok(out)
}

fn read_into(
    doc: &Value,
    at: &str,
    url: &Url,
    allow_http: bool,
    depth: usize,
    out: &mut CatalogRead,
) -> Result<()> {
    let c = Obj::of(doc, at, "an AI Catalog manifest (a JSON object)")?;
    match c.get("specVersion").and_then(Value::as_str) {
        Some("1.0") => {}
        _ => {
            return Err(FieldError::new(
                c.at("specVersion"),
                "must be \"1.0\" (an AI Catalog manifest)",
            ))
        }
    }
    let entries = c.get("entries").and_then(Value::as_array).ok_or_else(|| {
        FieldError::new(c.at("entries"), "is required (an array of catalog entries)")
    })?;
    for (i, e) in entries.iter().enumerate() {
        let at = ptr(&c.at("entries"), i);
        let entry = Obj::of(e, at.clone(), "a catalog entry object")?;
        let identifier = entry.text("identifier")?.to_string();
        match read_entry(&entry, url, allow_http, depth, out) {
            Ok(()) => {}
            Err(e) => out.skipped.push((identifier, e.to_string())),
        }
    }
    Ok(())
}

fn read_entry(
    e: &Obj,
    url: &Url,
    allow_http: bool,
    depth: usize,
    out: &mut CatalogRead,
) -> Result<()> {
    let identifier = e.text("identifier")?.to_string();
    let name = e.text("displayName")?;
    let kind = e.text("type")?.to_ascii_lowercase();
    let data = e.get("data");
    let link = match e.get("url") {
        Some(_) => Some(http_url(e, "url", allow_http)?),
        None => None,
    };
    if data.is_some() == link.is_some() {
        return Err(FieldError::new(
            e.at("url"),
            "an entry has exactly one of url and data",
        ));
    }
    if kind == REGISTRY_TYPE || kind == "application/ai-registry" {
        out.registries.push(RegistryRef {
            identifier,
            display_name: name.to_string(),
            url: link.map(String::from).unwrap_or_default(),
        });
        return Ok(());
    }
    if kind == CATALOG_TYPE {
        return match (data, link) {
            (Some(d), _) if depth + 1 < MAX_INLINE_DEPTH => {
                read_into(d, &e.at("data"), url, allow_http, depth + 1, out)
            }
            (Some(_), _) => Err(FieldError::new(
                e.at("data"),
                format!("catalogs nest deeper than {MAX_INLINE_DEPTH} levels"),
            )),
            (None, Some(u)) => {
                out.items.push(CatalogItem::Catalog { identifier, url: u });
                Ok(())
            }
            (None, None) => Ok(()),
        };
    }
    let entry = entry_metadata(e, url)?;
    let format = match kind.as_str() {
        "application/woa+json" => Some(EntryFormat::Woa),
        "application/a2a-agent-card+json" => Some(EntryFormat::A2a),
        "application/agent-protocol+json" => Some(EntryFormat::AgentProtocol),
        AIDIP_TYPE => Some(EntryFormat::Aidip),
        "application/mcp-server-card+json" => None,
        other => {
            return Err(FieldError::new(
                e.at("type"),
                format!("'{other}' is not an agent format this registry imports"),
            ))
        }
    };
    match (format, data, link) {
        (Some(format), None, Some(url)) => out.items.push(CatalogItem::Fetch {
            format,
            url,
            entry: Box::new(entry),
        }),
        (Some(format), Some(d), _) => {
            for meta in map_document(format, d, url, allow_http)? {
                out.items
                    .push(CatalogItem::Record(Box::new(merge(meta, &entry, format))));
            }
        }
        // An MCP server card: the entry is the record; the card (inline
        // or at its URL) says where the server is when it can.
        (_, data, link) => out
            .items
            .push(CatalogItem::Record(Box::new(mcp_entry(entry, data, link)))),
    }
    Ok(())
}

/// The records a fetched (or inline) document of `format` maps to.
pub fn map_document(
    format: EntryFormat,
    doc: &Value,
    url: &Url,
    allow_http: bool,
) -> Result<Vec<AgentMetadata>> {
    Ok(match format {
        EntryFormat::Woa => super::woa_document(doc, url, allow_http)?.agents,
        EntryFormat::A2a => vec![super::a2a_card(doc, url)?],
        EntryFormat::AgentProtocol => vec![super::ap_descriptor(doc, url)?],
        EntryFormat::Aidip => {
            let mut record = doc.clone();
            if let Some(o) = record.as_object_mut() {
                // The serving registry's envelope is its own, not metadata.
                o.remove(crate::domain::ENVELOPE_MEMBER);
            }
            let mut meta: AgentMetadata = serde_json::from_value(record)
                .map_err(|e| FieldError::new("", format!("is not an AIDIP record: {e}")))?;
            meta.extra.insert(
                "source".into(),
                source("aidip", url, doc.clone(), Dropped::default()),
            );
            vec![meta]
        }
    })
}

/// What the entry itself says of the agent, as metadata (no bindings).
fn entry_metadata(e: &Obj, catalog: &Url) -> Result<AgentMetadata> {
    let mut dropped = Dropped::default();
    let mut tags = Vec::new();
    for (p, t) in e.strings("tags")? {
        add_tag(&mut tags, t, p, "tag", &mut dropped);
    }
    let mut capabilities = Vec::new();
    for (p, t) in e.strings("capabilities")? {
        add_tag(&mut capabilities, t, p, "capability", &mut dropped);
    }
    let examples = e
        .strings("representativeQueries")?
        .into_iter()
        .map(|(_, q)| TaskExample {
            text: q.to_string(),
            ..Default::default()
        })
        .collect();
    let name = e.text("displayName")?;
    let mut meta = AgentMetadata {
        id: e.text("identifier")?.to_string(),
        name: name.to_string(),
        description: e.opt_text("description")?.unwrap_or(name).to_string(),
        version: e.opt_text("version")?.map(String::from),
        updated_at: e
            .opt_text("updatedAt")?
            .filter(|t| crate::domain::time::parse(t).is_some())
            .map(String::from),
        tags,
        capabilities,
        examples,
        ..Default::default()
    };
    meta.extra.insert(
        "source".into(),
        source("ai-catalog", catalog, Value::Object(e.map.clone()), dropped),
    );
    Ok(meta)
}

/// A document's agent with what its catalog entry adds: the entry's URN
/// as id (one-agent documents), its tags, and its queries when the
/// document has no examples.
pub fn merge(mut meta: AgentMetadata, entry: &AgentMetadata, format: EntryFormat) -> AgentMetadata {
    if format != EntryFormat::Woa {
        meta.id = entry.id.clone();
    }
    for t in &entry.tags {
        if !meta.tags.contains(t) {
            meta.tags.push(t.clone());
        }
    }
    if meta.examples.is_empty() {
        meta.examples = entry.examples.clone();
    }
    if meta.version.is_none() {
        meta.version = entry.version.clone();
    }
    if let (Some(src), Some(catalog)) = (meta.extra.get_mut("source"), entry.extra.get("source")) {
        src["catalog"] = json!({"url": catalog["url"], "identifier": entry.id});
    }
    meta
}

/// The record of an MCP server card entry: the server's endpoint from the
/// card when it names one (`remotes[].url`, `url`, `endpoint`), else the
/// card's own address as an `mcp-server-card` binding (found by discovery,
/// not callable by the gateway).
fn mcp_entry(mut meta: AgentMetadata, data: Option<&Value>, link: Option<Url>) -> AgentMetadata {
    let from_card = data.and_then(|d| {
        d.get("remotes")
            .and_then(Value::as_array)
            .and_then(|r| r.first())
            .and_then(|r| r.get("url"))
            .or_else(|| d.get("url"))
            .or_else(|| d.get("endpoint"))
            .and_then(Value::as_str)
            .filter(|u| Url::parse(u).is_ok())
            .map(String::from)
    });
    let (protocol, endpoint) = match (from_card, link) {
        (Some(u), _) => ("mcp", u),
        (None, Some(l)) => ("mcp-server-card", l.to_string()),
        (None, None) => ("mcp-server-card", String::new()),
    };
    if let Some(tools) = data.and_then(|d| d.get("tools")).and_then(Value::as_array) {
        for t in tools {
            if let Some(n) = t.get("name").and_then(Value::as_str) {
                meta.operations.push(crate::domain::Operation {
                    name: n.to_string(),
                    description: t
                        .get("description")
                        .and_then(Value::as_str)
                        .map(String::from),
                    inputs: t.get("inputSchema").cloned(),
                    ..Default::default()
                });
            }
        }
    }
    if !endpoint.is_empty() {
        meta.bindings.push(Binding {
            protocol: protocol.into(),
            endpoint,
            ..Default::default()
        });
    }
    meta
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    fn catalog() -> Value {
        json!({
            "specVersion": "1.0",
            "host": {"displayName": "Acme"},
            "entries": [
                {"identifier": "urn:air:acme.com:agent:assistant", "displayName": "Assistant",
                 "type": "application/a2a-agent-card+json", "url": "https://api.acme.com/agents/assistant.json",
                 "tags": ["corporate"], "representativeQueries": ["draft an email", "summarize my inbox"]},
                {"identifier": "urn:air:acme.com:server:weather", "displayName": "Weather",
                 "type": "application/mcp-server-card+json", "capabilities": ["WeatherTool"],
                 "data": {"name": "Weather", "tools": [{"name": "get_weather", "description": "Weather for a city",
                   "inputSchema": {"type": "object"}}], "remotes": [{"type": "streamable-http", "url": "https://mcp.acme.com/weather"}]}},
                {"identifier": "urn:air:acme.com:plugin:bundle", "displayName": "Bundle", "type": "application/ai-catalog+json",
                 "data": {"specVersion": "1.0", "entries": [
                    {"identifier": "urn:air:acme.com:market:2026", "displayName": "Dataset", "type": "application/parquet", "url": "https://data.acme.com/m.parquet"}
                 ]}},
                {"identifier": "urn:air:acme.com:registry:global", "displayName": "Acme Registry",
                 "type": "application/ai-registry+json", "url": "https://registry.acme.com/api/v1/"},
                {"identifier": "urn:air:acme.com:catalog:eng", "displayName": "Engineering",
                 "type": "application/ai-catalog+json", "url": "https://acme.com/catalogs/eng.json"},
                {"identifier": "urn:air:acme.com:bad:both", "displayName": "Both", "type": "application/a2a-agent-card+json",
                 "url": "https://a.acme.com/x.json", "data": {}}
            ]
        })
    }

    #[test]
    fn a_catalog_is_read_into_fetches_records_catalogs_and_registries() {
        let read = read_catalog(
            &catalog(),
            &url("https://acme.com/.well-known/ai-catalog.json"),
            false,
        )
        .unwrap();
        assert_eq!(read.items.len(), 3, "{:?}", read.items);
        match &read.items[0] {
            CatalogItem::Fetch { format, url, entry } => {
                assert_eq!(*format, EntryFormat::A2a);
                assert_eq!(url.as_str(), "https://api.acme.com/agents/assistant.json");
                assert_eq!(entry.id, "urn:air:acme.com:agent:assistant");
                assert_eq!(entry.examples.len(), 2);
            }
            other => panic!("{other:?}"),
        }
        match &read.items[1] {
            CatalogItem::Record(m) => {
                assert_eq!(m.id, "urn:air:acme.com:server:weather");
                assert_eq!(m.bindings[0].protocol, "mcp");
                assert_eq!(m.bindings[0].endpoint, "https://mcp.acme.com/weather");
                assert_eq!(m.operations[0].name, "get_weather");
                assert_eq!(m.capabilities, ["weathertool"]);
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(&read.items[2], CatalogItem::Catalog { url, .. } if url.path() == "/catalogs/eng.json")
        );
        assert_eq!(read.registries[0].url, "https://registry.acme.com/api/v1/");
        let skipped: Vec<&str> = read.skipped.iter().map(|(i, _)| i.as_str()).collect();
        assert_eq!(
            skipped,
            ["urn:air:acme.com:market:2026", "urn:air:acme.com:bad:both"]
        );
    }

    #[test]
    fn cards_the_registry_writes_into_its_catalog_import_again() {
        // What Agentry's catalog writes for an A2A and an MCP agent reads
        // back through the importers (registry-to-registry crawling).
        let meta: AgentMetadata = serde_json::from_value(json!({
            "id": "travel", "name": "Travel", "description": "Books trips.", "tags": ["travel"],
            "examples": [{"text": "Book a flight"}, {"text": "Find a hotel"}],
            "operations": [{"name": "book", "description": "Book a trip", "inputs": {"type": "object"}}],
            "bindings": [{"protocol": "a2a", "endpoint": "https://travel.example/a2a"}]
        }))
        .unwrap();
        let record = crate::domain::AgentRecord {
            metadata: meta,
            envelope: Default::default(),
        };
        let ctx = crate::domain::catalog::EntryContext {
            base: "https://reg.example.org",
            publisher: "reg.example.org",
        };
        let entry = crate::domain::catalog::entry(&record, &ctx);
        let doc = json!({"specVersion": "1.0", "entries": [entry]});
        let read = read_catalog(
            &doc,
            &url("https://reg.example.org/.well-known/ai-catalog.json"),
            false,
        )
        .unwrap();
        assert!(read.skipped.is_empty(), "{:?}", read.skipped);
        let CatalogItem::Record(m) = &read.items[0] else {
            panic!("{:?}", read.items)
        };
        assert_eq!(m.id, "urn:air:reg.example.org:agents:travel");
        assert_eq!(m.bindings[0].protocol, "a2a");
        assert_eq!(m.bindings[0].endpoint, "https://travel.example/a2a");
        let mut mcp = record.clone();
        mcp.metadata.bindings[0].protocol = "mcp".into();
        mcp.metadata.bindings[0].endpoint = "https://travel.example/mcp".into();
        let doc =
            json!({"specVersion": "1.0", "entries": [crate::domain::catalog::entry(&mcp, &ctx)]});
        let read = read_catalog(&doc, &url("https://reg.example.org/c.json"), false).unwrap();
        let CatalogItem::Record(m) = &read.items[0] else {
            panic!("{:?}", read.items)
        };
        assert_eq!(m.bindings[0].protocol, "mcp");
        assert_eq!(m.bindings[0].endpoint, "https://travel.example/mcp");
        assert_eq!(m.operations[0].name, "book");
    }

    #[test]
    fn a_manifest_that_breaks_the_format_is_refused() {
        let u = url("https://acme.com/c.json");
        assert_eq!(
            read_catalog(&json!({"entries": []}), &u, false)
                .unwrap_err()
                .pointer,
            "/specVersion"
        );
        assert_eq!(
            read_catalog(&json!({"specVersion": "1.0"}), &u, false)
                .unwrap_err()
                .pointer,
            "/entries"
        );
        assert_eq!(
            read_catalog(
                &json!({"specVersion": "1.0", "entries": [{"displayName": "x"}]}),
                &u,
                false
            )
            .unwrap_err()
            .pointer,
            "/entries/0/identifier"
        );
    }

    #[test]
    fn an_entrys_urn_and_queries_join_its_documents_agent() {
        let card = json!({"name": "Assistant", "description": "Helps.", "version": "1.0.0",
            "supportedInterfaces": [{"url": "https://api.acme.com/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
            "url": "https://api.acme.com/a2a",
            "capabilities": {}, "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"], "skills": []});
        let read = read_catalog(&catalog(), &url("https://acme.com/c.json"), false).unwrap();
        let CatalogItem::Fetch {
            format,
            url: u,
            entry,
        } = &read.items[0]
        else {
            panic!("a fetch")
        };
        let mapped = map_document(*format, &card, u, false).unwrap();
        let m = merge(mapped.into_iter().next().unwrap(), entry, *format);
        assert_eq!(m.id, "urn:air:acme.com:agent:assistant");
        assert!(m.tags.contains(&"corporate".to_string()));
        assert_eq!(m.examples.len(), 2);
        assert_eq!(
            m.extra["source"]["catalog"]["identifier"],
            "urn:air:acme.com:agent:assistant"
        );
    }
}
