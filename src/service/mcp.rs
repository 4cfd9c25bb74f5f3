//! The MCP Registry API v0.1 as a subregistry: reads over the MCP server
//! records (`domain::mcp`), and publishing and status changes as
//! read-modify-write of one record, made safe by a revision precondition
//! (`RegistryService::put_if`): a record that changed meanwhile is read
//! again and the change merged again, so concurrent publishes of two
//! versions both land.

use serde_json::{json, Value};
use tracing::{debug, instrument};

use super::{RegistryService, ServiceError, MAX_PAGE_BYTES};
use crate::domain::catalog::{record_url, urn_publisher};
use crate::domain::mcp::{self, ListFilter, McpStatus, SetStatusError, StoredVersion};
use crate::domain::write::{Rejection, WriteMode};
use crate::domain::{AgentRecord, Principal};

type Result<T> = std::result::Result<T, ServiceError>;

/// How often a write is merged again after losing a race.
const ATTEMPTS: usize = 16;

/// A page of `GET /v0.1/servers`.
#[derive(Debug, Clone)]
pub struct ServerPage {
    pub servers: Vec<Value>,
    pub next_cursor: Option<String>,
}

/// The MCP registry view of this registry.
#[derive(Clone)]
pub struct McpService {
    registry: RegistryService,
    /// Public base URL of the HTTP API (record links in `_meta`).
    base: String,
}

fn not_found() -> ServiceError {
    ServiceError::NotFound("Server not found".into())
}

/// A server mirrored from an upstream registry is a read-only copy: its
/// versions and statuses change only there (and reach this registry by
/// the mirror), so a write here would be overwritten or diverge.
fn refuse_mirrored(m: &crate::domain::AgentMetadata, name: &str) -> Result<()> {
    match mcp::upstream(m) {
        Some(upstream) => Err(ServiceError::Conflict(format!(
            "'{name}' is a read-only copy mirrored from {upstream}; publish and change its status there"
        ))),
        None => Ok(()),
    }
}

impl McpService {
    pub fn new(registry: RegistryService, base: String) -> Self {
        Self {
            registry,
            base: base.trim_end_matches('/').to_string(),
        }
    }

    /// This registry's `_meta` member of a response: the record behind
    /// the version, its revision and the registry's signature over it.
    fn own_meta(&self, record: &AgentRecord) -> (String, Value) {
        let key = mcp::own_meta_key(&urn_publisher(&self.registry.own_authority()));
        let mut v = json!({
            "recordId": record.metadata.id,
            "recordUrl": record_url(&self.base, &record.metadata.id),
            "revision": record.envelope.revision,
        });
        if let Some(sig) = &record.envelope.signature {
            v["signature"] = serde_json::to_value(sig).unwrap_or(Value::Null);
        }
        if let Some(p) = &record.envelope.provenance {
            v["origin"] = json!({"authority": p.origin_authority, "service": p.origin_service});
        }
        (key, v)
    }

    fn response(&self, record: &AgentRecord, versions: &[StoredVersion], i: usize) -> Value {
        let (key, own) = self.own_meta(record);
        versions[i].response(mcp::latest(versions) == Some(i), Some((&key, own)))
    }

    /// The live MCP server record `name` the caller may read.
    fn server(&self, principal: Option<&Principal>, name: &str) -> Result<AgentRecord> {
        self.registry
            .reader()
            .get(&mcp::record_id(name))?
            .filter(|r| !r.envelope.deleted && mcp::is_server(&r.metadata))
            .filter(|r| r.readable_by(principal))
            .ok_or_else(not_found)
    }

    /// `GET /v0.1/servers`: versions of every server, in name then publish
    /// order, from after `cursor`.
    #[instrument(skip_all)]
    pub async fn list(
        &self,
        principal: Option<&Principal>,
        filter: ListFilter,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<ServerPage> {
        self.registry.require_reader(principal)?;
        let limit = match limit {
            0 => mcp::DEFAULT_LIMIT,
            n => n.min(mcp::MAX_LIMIT),
        } as usize;
        let after = match cursor.filter(|c| !c.is_empty()) {
            None => None,
            Some(c) => Some(mcp::decode_cursor(c).ok_or_else(|| {
                crate::domain::FieldError::new("/cursor", "is not a cursor of this registry")
            })?),
        };
        let this = self.clone();
        let principal = principal.cloned();
        tokio::task::spawn_blocking(move || this.page(principal.as_ref(), &filter, after, limit))
            .await
            .map_err(|e| ServiceError::Internal(format!("listing servers: {e}")))?
    }

    fn page(
        &self,
        principal: Option<&Principal>,
        filter: &ListFilter,
        after: Option<(String, usize)>,
        limit: usize,
    ) -> Result<ServerPage> {
        let start = mcp::record_id(after.as_ref().map_or("", |(n, _)| n.as_str()));
        let mut servers = Vec::new();
        let mut last: Option<(String, usize)> = None;
        let mut more = false;
        let mut bytes = 0;
        self.registry.reader().scan_from(&start, |record| {
            let m = &record.metadata;
            let Some(name) = m.id.strip_prefix(mcp::ID_PREFIX) else {
                return false;
            };
            if record.envelope.deleted || !mcp::is_server(m) || !record.readable_by(principal) {
                return true;
            }
            let versions = mcp::versions(m);
            let latest = mcp::latest(&versions);
            for i in 0..versions.len() {
                if let Some((n, at)) = &after {
                    if n == name && i <= *at {
                        continue;
                    }
                }
                if !filter.admits(&versions, i, latest) {
                    continue;
                }
                if servers.len() == limit {
                    more = true;
                    return false;
                }
                // A page ends early once it holds about 2 MiB, as every
                // list of records does (`registry::MAX_PAGE_BYTES`).
                let server = self.response(&record, &versions, i);
                let size = json_size(&server);
                if !servers.is_empty() && bytes + size > MAX_PAGE_BYTES {
                    more = true;
                    return false;
                }
                bytes += size;
                servers.push(server);
                last = Some((name.to_string(), i));
            }
            true
        })?;
        Ok(ServerPage {
            servers,
            next_cursor: more
                .then(|| last.map(|(n, i)| mcp::encode_cursor(&n, i)))
                .flatten(),
        })
    }

    /// `GET /v0.1/servers/{name}/versions`: newest first.
    #[instrument(skip_all, fields(server = name))]
    pub async fn versions(
        &self,
        principal: Option<&Principal>,
        name: &str,
        include_deleted: bool,
    ) -> Result<Vec<Value>> {
        self.registry.require_reader(principal)?;
        let record = self.server(principal, name)?;
        let versions = mcp::versions(&record.metadata);
        let mut order: Vec<usize> = (0..versions.len())
            .filter(|&i| include_deleted || versions[i].status != McpStatus::Deleted)
            .collect();
        order.reverse();
        if order.is_empty() {
            return Err(not_found());
        }
        Ok(order
            .into_iter()
            .map(|i| self.response(&record, &versions, i))
            .collect())
    }

    /// `GET /v0.1/servers/{name}/versions/{version}` (`latest` allowed).
    #[instrument(skip_all, fields(server = name, version))]
    pub async fn version(
        &self,
        principal: Option<&Principal>,
        name: &str,
        version: &str,
    ) -> Result<Value> {
        self.registry.require_reader(principal)?;
        let record = self.server(principal, name)?;
        let versions = mcp::versions(&record.metadata);
        let i = mcp::resolve(&versions, version)
            .filter(|&i| version == "latest" || versions[i].status != McpStatus::Deleted)
            .ok_or_else(not_found)?;
        Ok(self.response(&record, &versions, i))
    }

    /// Writes what `change` makes of the current record, again on a lost
    /// race; returns the record written.
    async fn merge(
        &self,
        principal: Option<&Principal>,
        name: &str,
        change: impl Fn(Option<&AgentRecord>) -> Result<crate::domain::AgentMetadata>,
    ) -> Result<AgentRecord> {
        self.merge_if(principal, name, |live| change(live).map(Some))
            .await?
            .ok_or_else(|| ServiceError::Internal("a merge wrote nothing".into()))
    }

    /// `merge` for a change that may find nothing to write (`Ok(None)`:
    /// the record already is so; then nothing is proposed and `None`
    /// returned). Shared with the upstream mirror (`mcp_mirror`), whose
    /// re-read pages must write nothing.
    pub(super) async fn merge_if(
        &self,
        principal: Option<&Principal>,
        name: &str,
        change: impl Fn(Option<&AgentRecord>) -> Result<Option<crate::domain::AgentMetadata>>,
    ) -> Result<Option<AgentRecord>> {
        let id = mcp::record_id(name);
        for attempt in 0..ATTEMPTS {
            let current = self.registry.reader().get(&id)?;
            let live = current.as_ref().filter(|r| !r.envelope.deleted);
            let Some(metadata) = change(live)? else {
                return Ok(None);
            };
            let expected = current.as_ref().map_or(0, |r| r.envelope.revision);
            let mode = if live.is_some() {
                WriteMode::Update
            } else {
                WriteMode::Register
            };
            match self
                .registry
                .put_if(principal, metadata, expected, mode)
                .await?
            {
                Ok(record) => return Ok(Some(record)),
                Err(Rejection::RevisionChanged { .. }) => {
                    debug!(attempt, "the server changed meanwhile; merging again");
                }
                Err(other) => return Err(other.into()),
            }
        }
        Err(ServiceError::Unavailable {
            message: format!("'{name}' keeps changing; retry"),
            leader: None,
        })
    }

    /// `POST /v0.1/publish`: a new version of a server (a new server when
    /// the name is new), under the caller's namespace and ownership rules.
    #[instrument(skip_all, fields(principal = principal.map(|p| p.name.as_str())))]
    pub async fn publish(&self, principal: Option<&Principal>, server: Value) -> Result<Value> {
        let name = server
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        super::audit::begin("mcp_publish", Some(&name));
        super::registry::require_writer(principal)?;
        mcp::validate_server(&server)?;
        let version = server["version"].as_str().unwrap_or_default().to_string();
        let now = crate::domain::time::now();
        let record = self
            .merge(principal, &name, |live| {
                if let Some(r) = live.filter(|r| !mcp::is_server(&r.metadata)) {
                    return Err(ServiceError::Conflict(format!(
                        "'{}' is the id of an agent that is no MCP server",
                        r.metadata.id
                    )));
                }
                if let Some(r) = live {
                    refuse_mirrored(&r.metadata, &name)?;
                }
                Ok(mcp::publish(
                    live.map(|r| &r.metadata),
                    server.clone(),
                    &now,
                )?)
            })
            .await?;
        let versions = mcp::versions(&record.metadata);
        let i = mcp::resolve(&versions, &version)
            .ok_or_else(|| ServiceError::Internal("the published version is missing".into()))?;
        Ok(self.response(&record, &versions, i))
    }

    /// Sets the status of one version or of all versions of a server (all
    /// or none); returns the versions changed.
    #[instrument(skip_all, fields(server = name, version))]
    pub async fn set_status(
        &self,
        principal: Option<&Principal>,
        name: &str,
        version: Option<&str>,
        status: McpStatus,
        message: Option<String>,
    ) -> Result<Vec<Value>> {
        super::audit::begin("mcp_status", Some(name));
        super::registry::require_writer(principal)?;
        self.server(principal, name)?;
        let now = crate::domain::time::now();
        let changed = std::sync::Mutex::new(Vec::new());
        let record = self
            .merge(principal, name, |live| {
                let r = live
                    .filter(|r| mcp::is_server(&r.metadata))
                    .ok_or_else(not_found)?;
                refuse_mirrored(&r.metadata, name)?;
                let (m, which) =
                    mcp::set_status(&r.metadata, version, status, message.clone(), &now).map_err(
                        |e| match e {
                            SetStatusError::NoVersion => {
                                ServiceError::NotFound("Server version not found".into())
                            }
                            SetStatusError::Invalid(f) => f.into(),
                        },
                    )?;
                *changed.lock().unwrap_or_else(|p| p.into_inner()) = which;
                Ok(m)
            })
            .await?;
        let versions = mcp::versions(&record.metadata);
        let which = changed.into_inner().unwrap_or_else(|p| p.into_inner());
        Ok(which
            .into_iter()
            .filter(|&i| i < versions.len())
            .map(|i| self.response(&record, &versions, i))
            .collect())
    }
}

/// The length of `v` as JSON, counted without building the text.
fn json_size(v: &Value) -> usize {
    struct Counted(usize);
    impl std::io::Write for Counted {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counted = Counted(0);
    // Writing a `Value` to a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut counted, v);
    counted.0
}
