//! Mirrors upstream MCP registries (`[[mcp_registry.upstreams]]`): the Raft
//! leader polls each upstream's `GET /v0.1/servers?updated_since=…` page by
//! page through the gateway's outbound guard and keeps every version it
//! reads in the server's record (`domain::mcp::mirror_version`), with the
//! upstream's times and statuses (a deletion upstream is a status here).
//!
//! Why it is built this way:
//! - Writes are the MCP service's read-modify-write (`McpService::merge_if`)
//!   as the mirror's owner, so they are replicated, audited, held to the
//!   registry's rules, and merged again when a publish races them.
//! - A mirrored record is marked with its upstream and is read-only here;
//!   a server published here (or owned by anyone but the mirror's owner,
//!   or mirrored from another upstream) is never overwritten: the upstream's
//!   copy is skipped with a warning.
//! - The cursor (the newest `updatedAt` read, in nanoseconds) is replicated
//!   (`Command::Cursor`, kept with the federation cursors), so a new leader
//!   or a restarted node resumes where the last poll ended. It moves only
//!   once a whole listing has been read: the upstream lists by name, not by
//!   time, so a cursor saved mid-listing could skip what later pages hold.
//! - Each poll asks from the cursor minus `OVERLAP`: an upstream that reads
//!   `updated_since` as "strictly after", or at whole seconds, still shows
//!   versions updated in the cursor's own instant (a burst with equal
//!   `updatedAt`, split by a page boundary or landing after the poll).
//!   Reading a version again writes nothing (`mirror_version` compares), so
//!   the overlap costs requests, never writes.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio::sync::watch;
use tracing::{debug, info, info_span, warn, Instrument};

use super::audit::{AuditLog, Scope};
use super::invocation::InvocationService;
use super::{McpService, ServiceError};
use crate::domain::mcp::{self, MirrorRefusal};
use crate::domain::{AgentMetadata, AgentRecord, Principal, Role};

type Result<T> = std::result::Result<T, ServiceError>;

/// How often a node that is not the leader checks again.
const LEADER_POLL: Duration = Duration::from_secs(1);
/// How far before the cursor each poll asks from (see the module docs).
const OVERLAP: time::Duration = time::Duration::seconds(1);
/// Pages read in one poll at most (an upstream whose cursors never end is
/// not followed forever; the next poll starts again from the cursor).
const MAX_PAGES: usize = 10_000;
/// The prefix of a mirror's cursor among the replicated cursors.
const CURSOR_PREFIX: &str = "mcp-upstream:";

/// `[mcp_registry]`: the MCP Registry API's own settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpRegistryConfig {
    /// Upstream registries this one mirrors.
    pub upstreams: Vec<McpUpstreamConfig>,
}

/// One upstream MCP registry mirrored by polling.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpUpstreamConfig {
    /// The upstream's base URL (`https://registry.modelcontextprotocol.io`);
    /// the API is under `<url>/v0.1/`.
    pub url: String,
    /// Seconds between polls.
    #[serde(default = "default_poll_interval")]
    pub poll_interval_secs: u64,
    /// Server-name prefixes to mirror (`io.github.acme/`); empty: all.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// The principal that owns the mirrored records.
    #[serde(default = "default_owner")]
    pub owner: String,
    /// `limit` of each page asked for (1–100).
    #[serde(default = "default_page_limit")]
    pub page_limit: u32,
}

fn default_poll_interval() -> u64 {
    300
}

fn default_owner() -> String {
    "mcp-mirror".into()
}

fn default_page_limit() -> u32 {
    100
}

impl McpUpstreamConfig {
    /// The base URL as the records' mark and the cursor name hold it.
    pub fn base(&self) -> &str {
        self.url.trim_end_matches('/')
    }
}

impl McpRegistryConfig {
    /// Checks what serde cannot (`Config::validate` calls it).
    pub fn validate(&self) -> std::result::Result<(), String> {
        let mut seen = std::collections::BTreeSet::new();
        for u in &self.upstreams {
            let bad = |m: &str| Err(format!("mcp_registry.upstreams '{}': {m}", u.url));
            match url::Url::parse(&u.url) {
                Ok(p) if matches!(p.scheme(), "http" | "https") && p.host().is_some() => {}
                _ => return bad("url must be an absolute http(s) URL"),
            }
            if u.poll_interval_secs == 0 {
                return bad("poll_interval_secs must be at least 1");
            }
            if u.owner.trim().is_empty() {
                return bad("owner must name a principal");
            }
            if !(1..=mcp::MAX_LIMIT).contains(&u.page_limit) {
                return bad(&format!("page_limit must be 1 to {}", mcp::MAX_LIMIT));
            }
            if u.namespaces.iter().any(|n| n.trim().is_empty()) {
                return bad("namespaces must be server-name prefixes, not empty");
            }
            // One cursor per upstream: two mirrors of one would share it.
            if !seen.insert(u.base().to_string()) {
                return bad("is configured twice");
            }
        }
        Ok(())
    }
}

/// What one poll did.
#[derive(Debug, Default)]
struct Polled {
    pages: usize,
    written: usize,
    unchanged: usize,
    ignored: usize,
    skipped: usize,
}

/// What importing one `ServerResponse` did.
enum Imported {
    Written,
    Unchanged,
    /// Outside the mirror's namespaces.
    Ignored,
}

/// Errors after which the poll stops and the cursor stays, to be retried
/// at the next interval; any other error concerns one server, which is
/// skipped (it would be refused again).
fn transient(e: &ServiceError) -> bool {
    matches!(
        e,
        ServiceError::Unavailable { .. }
            | ServiceError::Timeout(_)
            | ServiceError::Internal(_)
            | ServiceError::InsufficientStorage(_)
            | ServiceError::Overloaded { .. }
            | ServiceError::RateLimited { .. }
    )
}

/// The `updatedAt` of a `ServerResponse`, in nanoseconds since 1970.
fn updated_nanos(response: &Value) -> Option<u64> {
    let at = response
        .get("_meta")?
        .get(mcp::OFFICIAL)?
        .get("updatedAt")?
        .as_str()?;
    u64::try_from(crate::domain::time::parse(at)?.unix_timestamp_nanos()).ok()
}

/// `updated_since` for a stored cursor: `OVERLAP` before it, RFC 3339.
fn since(cursor: u64) -> Option<String> {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(cursor)).ok()?;
    Some(crate::domain::time::format(t - OVERLAP))
}

/// The URL of one page of the upstream's listing.
fn page_url(
    base: &str,
    updated_since: Option<&str>,
    limit: u32,
    cursor: Option<&str>,
) -> Result<url::Url> {
    let mut url = url::Url::parse(&format!("{base}/v0.1/servers"))
        .map_err(|e| ServiceError::Internal(format!("upstream URL {base}: {e}")))?;
    {
        let mut q = url.query_pairs_mut();
        if let Some(s) = updated_since {
            q.append_pair("updated_since", s);
        }
        q.append_pair("limit", &limit.to_string());
        if let Some(c) = cursor {
            q.append_pair("cursor", c);
        }
    }
    Ok(url)
}

/// The mirror of one upstream.
struct Mirror {
    gateway: InvocationService,
    mcp: McpService,
    audit: Arc<AuditLog>,
    upstream: McpUpstreamConfig,
    base: String,
    principal: Principal,
    cursor_name: String,
}

impl Mirror {
    /// The replicated cursor (0: nothing read yet).
    fn cursor(&self) -> Result<u64> {
        Ok(self
            .gateway
            .registry()
            .reader()
            .federation_cursor(&self.cursor_name)?)
    }

    /// Replicates the cursor (it only moves forward, in `apply`).
    async fn advance(&self, value: u64) -> Result<()> {
        self.gateway
            .registry()
            .advance_cursor(&self.cursor_name, value)
            .await
    }

    /// One poll: every page from the cursor, then the cursor moves to the
    /// newest `updatedAt` read.
    async fn poll(&self) -> Result<Polled> {
        let stored = self.cursor()?;
        let updated_since = (stored > 0).then(|| since(stored)).flatten();
        let mut newest = stored;
        let mut polled = Polled::default();
        let mut page_cursor: Option<String> = None;
        loop {
            // A node that lost the leadership leaves the rest to the new
            // leader, which starts from the replicated cursor.
            if !self.gateway.registry().is_leader() {
                return Err(ServiceError::Unavailable {
                    message: "no longer the leader; the new leader resumes from the cursor".into(),
                    leader: None,
                });
            }
            if polled.pages == MAX_PAGES {
                return Err(ServiceError::BadUpstream(format!(
                    "the listing goes on past {MAX_PAGES} pages"
                )));
            }
            let url = page_url(
                &self.base,
                updated_since.as_deref(),
                self.upstream.page_limit,
                page_cursor.as_deref(),
            )?;
            let fetched = self
                .gateway
                .outbound()
                .fetch(&url, "application/json", &[])
                .await?;
            if !(200..300).contains(&fetched.status) {
                return Err(ServiceError::BadUpstream(format!(
                    "{url} answered {}",
                    fetched.status
                )));
            }
            let page = crate::domain::json::parse_json(&fetched.body)
                .map_err(|e| ServiceError::BadUpstream(format!("{url}: not JSON: {e}")))?;
            let servers = page
                .get("servers")
                .and_then(Value::as_array)
                .ok_or_else(|| {
                    ServiceError::BadUpstream(format!("{url}: no 'servers' array (ServerList)"))
                })?;
            polled.pages += 1;
            for response in servers {
                // Read is read: a server refused here would be refused again.
                if let Some(t) = updated_nanos(response) {
                    newest = newest.max(t);
                }
                match self.import(response).await {
                    Ok(Imported::Written) => polled.written += 1,
                    Ok(Imported::Unchanged) => polled.unchanged += 1,
                    Ok(Imported::Ignored) => polled.ignored += 1,
                    Err(e) if transient(&e) => return Err(e),
                    Err(e) => {
                        polled.skipped += 1;
                        let server = response
                            .pointer("/server/name")
                            .and_then(Value::as_str)
                            .unwrap_or_default();
                        warn!(server, error = %e, "upstream server not mirrored");
                    }
                }
            }
            let next = page
                .pointer("/metadata/nextCursor")
                .and_then(Value::as_str)
                .filter(|c| !c.is_empty());
            match next {
                None => break,
                Some(c) if page_cursor.as_deref() == Some(c) => {
                    return Err(ServiceError::BadUpstream(format!(
                        "{url}: nextCursor repeats the page's own cursor"
                    )))
                }
                Some(c) => page_cursor = Some(c.to_string()),
            }
        }
        if newest > stored {
            self.advance(newest).await?;
        }
        Ok(polled)
    }

    /// What the record becomes with the upstream's `response` (`None`:
    /// nothing changes), refusing records the mirror does not own.
    fn change(
        &self,
        live: Option<&AgentRecord>,
        response: &Value,
    ) -> Result<Option<AgentMetadata>> {
        if let Some(r) = live {
            if r.envelope.owner != self.principal.name {
                return Err(ServiceError::Conflict(format!(
                    "'{}' is owned by '{}', not by the mirror's owner '{}'; the upstream's copy is not kept",
                    r.metadata.id, r.envelope.owner, self.principal.name
                )));
            }
        }
        mcp::mirror_version(live.map(|r| &r.metadata), response, &self.base).map_err(|e| match e {
            MirrorRefusal::Invalid(f) => f.into(),
            MirrorRefusal::NotMirrored(m) => ServiceError::Conflict(m),
        })
    }

    /// Keeps one upstream version.
    async fn import(&self, response: &Value) -> Result<Imported> {
        let name = response
            .pointer("/server/name")
            .and_then(Value::as_str)
            .ok_or_else(|| crate::domain::FieldError::new("/server/name", "is required"))?;
        if !mcp::in_namespaces(name, &self.upstream.namespaces) {
            return Ok(Imported::Ignored);
        }
        // Checked before the audited write, so a page read again leaves no
        // trace in the audit trail.
        let current = self
            .gateway
            .registry()
            .reader()
            .get(&mcp::record_id(name))?;
        let live = current.as_ref().filter(|r| !r.envelope.deleted);
        if self.change(live, response)?.is_none() {
            return Ok(Imported::Unchanged);
        }
        let scope = Scope::new(
            Some(self.principal.clone()),
            None,
            None,
            "mcp_mirror".into(),
        );
        let written = self
            .audit
            .run(scope, async {
                super::audit::begin("mcp_mirror", Some(name));
                self.mcp
                    .merge_if(Some(&self.principal), name, |live| {
                        self.change(live, response)
                    })
                    .await
            })
            .await?;
        Ok(match written {
            Some(_) => Imported::Written,
            None => Imported::Unchanged,
        })
    }
}

/// Mirrors one upstream for as long as the server runs.
pub async fn mirror(
    gateway: InvocationService,
    mcp: McpService,
    audit: Arc<AuditLog>,
    upstream: McpUpstreamConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let base = upstream.base().to_string();
    let span = info_span!("mcp_mirror", upstream = %base);
    async move {
        let interval = Duration::from_secs(upstream.poll_interval_secs);
        let mirror = Mirror {
            principal: Principal::new(upstream.owner.clone(), Role::Publisher),
            cursor_name: format!("{CURSOR_PREFIX}{base}"),
            base,
            gateway,
            mcp,
            audit,
            upstream,
        };
        loop {
            if *shutdown.borrow() {
                return;
            }
            if !mirror.gateway.registry().is_leader() {
                tokio::select! {
                    _ = tokio::time::sleep(LEADER_POLL) => {}
                    _ = shutdown.changed() => {}
                }
                continue;
            }
            tokio::select! {
                polled = mirror.poll().instrument(info_span!("mcp_mirror_poll")) => match polled {
                    Ok(p) if p.written > 0 || p.skipped > 0 => info!(
                        pages = p.pages, written = p.written, unchanged = p.unchanged,
                        ignored = p.ignored, skipped = p.skipped, "mirrored"
                    ),
                    Ok(p) => debug!(pages = p.pages, unchanged = p.unchanged, ignored = p.ignored, "nothing new upstream"),
                    Err(e) => warn!(error = %e, "poll stopped; the next one starts from the stored cursor"),
                },
                _ = shutdown.changed() => return,
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
    .instrument(span)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(url: &str) -> McpUpstreamConfig {
        McpUpstreamConfig {
            url: url.into(),
            poll_interval_secs: 300,
            namespaces: Vec::new(),
            owner: "mcp-mirror".into(),
            page_limit: 100,
        }
    }

    #[test]
    fn the_cursor_is_asked_from_with_an_overlap() {
        let at = time::macros::datetime!(2026-11-02 10:00:00 UTC);
        let nanos = u64::try_from(at.unix_timestamp_nanos()).unwrap();
        let response =
            serde_json::json!({"_meta": {mcp::OFFICIAL: {"updatedAt": "2026-11-02T10:00:00Z"}}});
        assert_eq!(updated_nanos(&response), Some(nanos));
        assert_eq!(since(nanos).as_deref(), Some("2026-11-02T09:59:59Z"));
        let url = page_url(
            "https://up.example",
            Some("2026-11-02T09:59:59Z"),
            50,
            Some("abc"),
        )
        .unwrap();
        assert_eq!(
            url.as_str(),
            "https://up.example/v0.1/servers?updated_since=2026-11-02T09%3A59%3A59Z&limit=50&cursor=abc"
        );
    }

    #[test]
    fn upstreams_are_validated() {
        let ok = McpRegistryConfig {
            upstreams: vec![upstream("https://registry.modelcontextprotocol.io/")],
        };
        ok.validate().unwrap();
        assert_eq!(
            ok.upstreams[0].base(),
            "https://registry.modelcontextprotocol.io"
        );
        let bad = |f: fn(&mut McpUpstreamConfig)| {
            let mut u = upstream("https://up.example");
            f(&mut u);
            McpRegistryConfig { upstreams: vec![u] }
                .validate()
                .unwrap_err()
        };
        assert!(bad(|u| u.url = "ftp://up.example".into()).contains("url"));
        assert!(bad(|u| u.poll_interval_secs = 0).contains("poll_interval_secs"));
        assert!(bad(|u| u.owner = " ".into()).contains("owner"));
        assert!(bad(|u| u.page_limit = 0).contains("page_limit"));
        assert!(bad(|u| u.page_limit = 101).contains("page_limit"));
        assert!(bad(|u| u.namespaces = vec![String::new()]).contains("namespaces"));
        let twice = McpRegistryConfig {
            upstreams: vec![
                upstream("https://up.example"),
                upstream("https://up.example/"),
            ],
        };
        assert!(twice.validate().unwrap_err().contains("twice"));
    }
}
