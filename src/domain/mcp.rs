//! MCP Registry API v0.1 as a subregistry (`../shared/specs/mcp-registry-v0.1.md`):
//! MCP servers are records, and this module is the mapping between the two,
//! as pure functions.
//!
//! One record per server name; its id is the name behind `mcp:`
//! (`mcp:io.github.acme/weather`: record ids with a `/` must be URIs), so
//! the servers are one contiguous range of ids. Every published version is kept, in publish
//! order, in the record's extension member `x-mcp-registry.versions`: the
//! `server.json` exactly as published plus the registry-managed status and
//! times. The record's own fields follow the latest version (the one
//! `isLatest`): name (its `title`, else the server name), description,
//! version, status, and bindings — each remote as an `mcp` binding, each
//! package as an `mcp-package` binding at its package registry's page, else
//! the repository or website. Discovery therefore finds one agent per
//! server, and ARD and AIDIP show it like any other.
//!
//! `isLatest`: among versions not deleted (all of them when every one is),
//! the highest by semantic-version order when both versions parse as
//! semver, else the later published.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::filter::{self, AgentFacts, HardFilters, Surface};
use super::record::{AgentMetadata, AgentStatus, AuthRequirement, Binding};
use super::validate::FieldError;

/// The record member that holds the versions.
pub const EXTENSION: &str = "x-mcp-registry";
/// The `_meta` key of the registry-managed fields.
pub const OFFICIAL: &str = "io.modelcontextprotocol.registry/official";
/// Binding protocol of a package (not callable by the gateway; found by
/// discovery).
pub const PACKAGE_PROTOCOL: &str = "mcp-package";
/// What a record id of a server starts with.
pub const ID_PREFIX: &str = "mcp:";

/// The record id of the server `name`.
pub fn record_id(name: &str) -> String {
    format!("{ID_PREFIX}{name}")
}

/// The tag every MCP server record has.
pub const TAG: &str = "mcp-server";
pub const MAX_STATUS_MESSAGE: usize = 500;
/// `limit` of a page: default and largest.
pub const DEFAULT_LIMIT: u32 = 30;
pub const MAX_LIMIT: u32 = 100;

/// A version's lifecycle status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum McpStatus {
    Active,
    Deprecated,
    Deleted,
}

impl McpStatus {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "active" => Some(Self::Active),
            "deprecated" => Some(Self::Deprecated),
            "deleted" => Some(Self::Deleted),
            _ => None,
        }
    }

    fn agent_status(self) -> AgentStatus {
        match self {
            Self::Active => AgentStatus::Active,
            Self::Deprecated => AgentStatus::Deprecated,
            Self::Deleted => AgentStatus::Deleted,
        }
    }
}

/// One published version as the record keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredVersion {
    /// The `server.json`, as published.
    pub server: Value,
    pub status: McpStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_message: Option<String>,
    pub status_changed_at: String,
    pub published_at: String,
    pub updated_at: String,
}

impl StoredVersion {
    pub fn version(&self) -> &str {
        self.server
            .get("version")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.server
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    pub fn description(&self) -> &str {
        self.server
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// `ServerResponse`: the server.json and the registry's `_meta`
    /// (`OFFICIAL`, and this registry's own key with `own`).
    pub fn response(&self, is_latest: bool, own: Option<(&str, Value)>) -> Value {
        let mut official = Map::new();
        official.insert("status".into(), json!(self.status));
        if let Some(m) = &self.status_message {
            official.insert("statusMessage".into(), json!(m));
        }
        official.insert("statusChangedAt".into(), json!(self.status_changed_at));
        official.insert("publishedAt".into(), json!(self.published_at));
        official.insert("updatedAt".into(), json!(self.updated_at));
        official.insert("isLatest".into(), json!(is_latest));
        let mut meta = Map::new();
        meta.insert(OFFICIAL.into(), Value::Object(official));
        if let Some((key, v)) = own {
            meta.insert(key.into(), v);
        }
        // Built member by member: `json!` would re-serialise the whole
        // server.json through serde, the larger part of a list page's cost.
        let mut response = Map::new();
        response.insert("server".into(), self.server.clone());
        response.insert("_meta".into(), Value::Object(meta));
        Value::Object(response)
    }
}

/// The versions a record keeps (none for a record that is no MCP server).
pub fn versions(m: &AgentMetadata) -> Vec<StoredVersion> {
    m.extra
        .get(EXTENSION)
        .and_then(|x| x.get("versions"))
        .and_then(|v| Vec::<StoredVersion>::deserialize(v).ok())
        .unwrap_or_default()
}

/// Whether a record is an MCP server of this registry's API.
pub fn is_server(m: &AgentMetadata) -> bool {
    m.extra.get(EXTENSION).is_some()
}

/// `true` when `a` is newer than `b` by the isLatest rule.
fn newer(a: &StoredVersion, b: &StoredVersion) -> bool {
    match (
        semver::Version::parse(a.version()),
        semver::Version::parse(b.version()),
    ) {
        (Ok(x), Ok(y)) if x != y => x > y,
        _ => match (
            super::time::parse(&a.published_at),
            super::time::parse(&b.published_at),
        ) {
            (Some(x), Some(y)) => x.cmp(&y) == Ordering::Greater,
            _ => false,
        },
    }
}

/// The index of the version that is `isLatest`.
pub fn latest(versions: &[StoredVersion]) -> Option<usize> {
    let live: Vec<usize> = (0..versions.len())
        .filter(|&i| versions[i].status != McpStatus::Deleted)
        .collect();
    let pool = if live.is_empty() {
        (0..versions.len()).collect()
    } else {
        live
    };
    pool.into_iter().reduce(|best, i| {
        if newer(&versions[i], &versions[best]) {
            i
        } else {
            best
        }
    })
}

/// A refusal that names the member of the server.json to blame.
fn refuse(pointer: &str, message: impl Into<String>) -> FieldError {
    FieldError::new(pointer, message)
}

fn text<'a>(o: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, FieldError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(refuse(&format!("/{key}"), "must be a string")),
    }
}

fn check_len(s: &str, pointer: &str, min: usize, max: usize) -> Result<(), FieldError> {
    let n = s.chars().count();
    if n < min || n > max {
        return Err(refuse(
            pointer,
            format!("must be {min} to {max} characters (is {n})"),
        ));
    }
    Ok(())
}

/// Validates a server name: reverse-DNS namespace, one slash.
pub fn check_name(name: &str, pointer: &str) -> Result<(), FieldError> {
    check_len(name, pointer, 3, 200)?;
    let ok = name.split_once('/').is_some_and(|(ns, rest)| {
        !ns.is_empty()
            && !rest.is_empty()
            && ns
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'))
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    });
    if !ok {
        return Err(refuse(
            pointer,
            format!("'{name}' must match ^[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+$ (a reverse-DNS namespace, one slash, a name)"),
        ));
    }
    Ok(())
}

/// A version must be one specific version: no range, not `latest`.
pub fn check_version(v: &str, pointer: &str) -> Result<(), FieldError> {
    check_len(v, pointer, 1, 255)?;
    if v.eq_ignore_ascii_case("latest") {
        return Err(refuse(
            pointer,
            "'latest' is not a version; publish a specific version",
        ));
    }
    let range = v.starts_with(['^', '~', '>', '<', '=', '*'])
        || v.contains("||")
        || v.contains(' ')
        || v.split('.').any(|p| matches!(p, "x" | "X" | "*"));
    if range {
        return Err(refuse(
            pointer,
            format!("'{v}' is a version range; publish a specific version"),
        ));
    }
    Ok(())
}

fn check_url(u: &str, pointer: &str, allow_template: bool) -> Result<(), FieldError> {
    let templated = allow_template && u.starts_with('{');
    if !(templated || u.starts_with("http://") || u.starts_with("https://")) {
        return Err(refuse(pointer, "must start with http:// or https://"));
    }
    if !templated && !u.contains('{') && url::Url::parse(u).is_err() {
        return Err(refuse(pointer, format!("'{u}' is not a URL")));
    }
    Ok(())
}

fn objects<'a>(
    o: &'a Map<String, Value>,
    key: &str,
) -> Result<Vec<&'a Map<String, Value>>, FieldError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_object()
                    .ok_or_else(|| refuse(&format!("/{key}/{i}"), "must be an object"))
            })
            .collect(),
        Some(_) => Err(refuse(&format!("/{key}"), "must be an array")),
    }
}

fn required<'a>(o: &'a Map<String, Value>, key: &str, at: &str) -> Result<&'a str, FieldError> {
    match o.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            Err(refuse(&format!("{at}/{key}"), "is required"))
        }
        Some(_) => Err(refuse(&format!("{at}/{key}"), "must be a string")),
    }
}

/// Validates a `server.json` (ServerDetail) by the published rules; every
/// refusal names the member (a JSON pointer into the body).
pub fn validate_server(server: &Value) -> Result<(), FieldError> {
    let o = server
        .as_object()
        .ok_or_else(|| refuse("", "the server must be a JSON object (server.json)"))?;
    let name = required(o, "name", "")?;
    check_name(name, "/name")?;
    let description = required(o, "description", "")?;
    check_len(description, "/description", 1, 100)?;
    check_version(required(o, "version", "")?, "/version")?;
    if let Some(t) = text(o, "title")? {
        check_len(t, "/title", 1, 100)?;
    }
    if let Some(u) = text(o, "websiteUrl")? {
        check_url(u, "/websiteUrl", false)?;
    }
    if let Some(r) = o.get("repository").filter(|r| !r.is_null()) {
        let r = r
            .as_object()
            .ok_or_else(|| refuse("/repository", "must be an object"))?;
        check_url(required(r, "url", "/repository")?, "/repository/url", false)?;
        required(r, "source", "/repository")?;
    }
    for (i, icon) in objects(o, "icons")?.into_iter().enumerate() {
        let at = format!("/icons/{i}");
        let src = required(icon, "src", &at)?;
        if !src.starts_with("https://") || src.len() > 255 {
            return Err(refuse(
                &format!("{at}/src"),
                "must be an https URL of at most 255 characters",
            ));
        }
    }
    for (i, r) in objects(o, "remotes")?.into_iter().enumerate() {
        let at = format!("/remotes/{i}");
        let kind = required(r, "type", &at)?;
        if !matches!(kind, "streamable-http" | "sse") {
            return Err(refuse(
                &format!("{at}/type"),
                format!("'{kind}' is not a remote transport (streamable-http or sse)"),
            ));
        }
        check_url(required(r, "url", &at)?, &format!("{at}/url"), true)?;
        check_headers(r, &at)?;
    }
    for (i, p) in objects(o, "packages")?.into_iter().enumerate() {
        let at = format!("/packages/{i}");
        required(p, "registryType", &at)?;
        required(p, "identifier", &at)?;
        if let Some(v) = text(p, "version")
            .map_err(|e| refuse(&format!("{at}{}", e.pointer), "must be a string"))?
        {
            check_version(v, &format!("{at}/version"))?;
        }
        if let Some(sha) = p.get("fileSha256").filter(|v| !v.is_null()) {
            let ok = sha
                .as_str()
                .is_some_and(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()));
            if !ok {
                return Err(refuse(
                    &format!("{at}/fileSha256"),
                    "must be 64 hexadecimal characters (a SHA-256)",
                ));
            }
        }
        let transport = p
            .get("transport")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                refuse(
                    &format!("{at}/transport"),
                    "is required (an object with type)",
                )
            })?;
        let kind = required(transport, "type", &format!("{at}/transport"))?;
        match kind {
            "stdio" => {}
            "streamable-http" | "sse" => {
                let at = format!("{at}/transport");
                check_url(required(transport, "url", &at)?, &format!("{at}/url"), true)?;
                check_headers(transport, &at)?;
            }
            other => {
                return Err(refuse(
                    &format!("{at}/transport/type"),
                    format!("'{other}' is not a transport (stdio, streamable-http or sse)"),
                ))
            }
        }
    }
    Ok(())
}

/// The `headers` a remote (or a package's HTTP transport) asks its clients
/// to send: each `name` must be one an HTTP request can carry, or no
/// client could follow the document.
fn check_headers(o: &Map<String, Value>, at: &str) -> Result<(), FieldError> {
    let headers =
        objects(o, "headers").map_err(|e| refuse(&format!("{at}{}", e.pointer), e.message))?;
    for (j, h) in headers.into_iter().enumerate() {
        let at = format!("{at}/headers/{j}");
        let name = required(h, "name", &at)?;
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(refuse(
                &format!("{at}/name"),
                format!("'{name}' is not an HTTP header name"),
            ));
        }
    }
    Ok(())
}

/// Where a package can be looked at: its registry's page.
fn package_url(p: &Map<String, Value>) -> Option<String> {
    let id = p.get("identifier")?.as_str()?;
    if id.starts_with("https://") {
        return Some(id.to_string());
    }
    let base = p.get("registryBaseUrl").and_then(Value::as_str);
    let url = match (p.get("registryType")?.as_str()?, base) {
        (_, Some(b)) => format!("{}/{id}", b.trim_end_matches('/')),
        ("npm", None) => format!("https://www.npmjs.com/package/{id}"),
        ("pypi", None) => format!("https://pypi.org/project/{id}"),
        ("cargo", None) => format!("https://crates.io/crates/{id}"),
        ("nuget", None) => format!("https://www.nuget.org/packages/{id}"),
        ("oci", None) => format!("https://{id}"),
        _ => return None,
    };
    url::Url::parse(&url).ok().map(|_| url)
}

/// The record's bindings from a server.json.
fn bindings(server: &Value) -> Vec<Binding> {
    let mut out = Vec::new();
    let list = |k: &str| {
        server
            .get(k)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    for r in list("remotes") {
        if let Some(u) = r.get("url").and_then(Value::as_str) {
            if !u.contains('{') && url::Url::parse(u).is_ok() {
                let mut b = Binding {
                    protocol: "mcp".into(),
                    endpoint: u.to_string(),
                    priority: Some(out.len() as i64),
                    ..Default::default()
                };
                if let Some(t) = r.get("type").and_then(Value::as_str) {
                    b.interaction_model = Some(t.to_string());
                }
                let settings = fixed_headers(&r);
                if !settings.is_empty() {
                    b.extra.insert("headers".into(), Value::Object(settings));
                }
                out.push(b);
            }
        }
    }
    for p in list("packages") {
        if let Some(u) = p.as_object().and_then(package_url) {
            out.push(Binding {
                protocol: PACKAGE_PROTOCOL.into(),
                endpoint: u,
                priority: Some(out.len() as i64),
                ..Default::default()
            });
        }
    }
    if out.is_empty() {
        let fallback = server
            .get("repository")
            .and_then(|r| r.get("url"))
            .or_else(|| server.get("websiteUrl"))
            .and_then(Value::as_str);
        if let Some(u) = fallback {
            out.push(Binding {
                protocol: PACKAGE_PROTOCOL.into(),
                endpoint: u.to_string(),
                ..Default::default()
            });
        }
    }
    out
}

/// The headers a remote asks every client to send that are no secret and
/// have a value the document gives: a `value` (or `default`) whose
/// `{variables}` all have defaults, as `"X-Region": "{region}"` with
/// `region` defaulting to `eu`. They become the binding's `headers`, which
/// the gateway sends with every request. Secrets are the caller's
/// credential (`authentication`); a header whose value the client must
/// choose, or that the gateway could not send (`validate::declared_header`),
/// is left to the server's other clients.
fn fixed_headers(remote: &Value) -> Map<String, Value> {
    let secret = |v: &Value| v.get("isSecret").and_then(Value::as_bool) == Some(true);
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let mut out = Map::new();
    let headers = remote.get("headers").and_then(Value::as_array);
    for h in headers.into_iter().flatten() {
        let (Some(name), Some(template)) =
            (text(h, "name"), text(h, "value").or(text(h, "default")))
        else {
            continue;
        };
        if secret(h) || out.len() == super::validate::MAX_BINDING_HEADERS {
            continue;
        }
        let variables = h.get("variables");
        let Some(value) = fill(&template, |var| {
            let v = variables?.get(var)?;
            if secret(v) {
                return None;
            }
            text(v, "default")
        }) else {
            continue;
        };
        if super::validate::declared_header(&name, &value).is_ok() {
            out.insert(name, Value::String(value));
        }
    }
    out
}

/// `template` with each `{name}` replaced by `value(name)`; None when one
/// has no value or a brace is left open.
fn fill(template: &str, value: impl Fn(&str) -> Option<String>) -> Option<String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}')? + open;
        out.push_str(&value(&rest[open + 1..close])?);
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    Some(out)
}

/// The credential the server's first Streamable HTTP remote (the binding
/// the gateway calls) declares: the first of its `headers` that is
/// required and secret, itself or through one of its `variables` (a
/// `value` such as `Bearer {token}`). `Authorization` is AIDIP's
/// `oauth2_bearer`, any other header an `api_key` sent in that header;
/// the header's description is the record's `instructions` where it is a
/// valid one (a record's limits are not a publisher's). So a caller's
/// `Agent-Authorization` reaches the server in the header it reads, and a
/// call without one is refused before it is sent.
fn authentication(server: &Value) -> Option<AuthRequirement> {
    let remote = server
        .get("remotes")?
        .as_array()?
        .iter()
        .find(|r| r.get("type").and_then(Value::as_str) == Some("streamable-http"))?;
    let flag = |v: &Value, k: &str| v.get(k).and_then(Value::as_bool) == Some(true);
    let header = remote.get("headers")?.as_array()?.iter().find(|h| {
        let secret_variable = h
            .get("variables")
            .and_then(Value::as_object)
            .is_some_and(|vars| vars.values().any(|v| flag(v, "isSecret")));
        // A header the gateway sets itself cannot carry a credential
        // (validate::agent_header); the server's clients set it.
        let usable = h
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| super::validate::agent_header(n).is_ok());
        usable && flag(h, "isRequired") && (flag(h, "isSecret") || secret_variable)
    })?;
    let name = header.get("name")?.as_str()?;
    let mut auth = AuthRequirement {
        instructions: header
            .get("description")
            .and_then(Value::as_str)
            .filter(|d| super::validate::short_text(d))
            .map(str::to_string),
        ..Default::default()
    };
    if name.eq_ignore_ascii_case("authorization") {
        auth.kind = Some("oauth2_bearer".into());
    } else {
        auth.kind = Some("api_key".into());
        auth.extra.insert("header".into(), json!(name));
    }
    Some(auth)
}

/// The record's metadata for a set of versions (record fields from the
/// latest); `base` is what the record kept besides (tags, extension
/// members of other kinds).
pub fn metadata(
    versions: Vec<StoredVersion>,
    base: Option<&AgentMetadata>,
    now: &str,
) -> Result<AgentMetadata, FieldError> {
    let i = latest(&versions).ok_or_else(|| refuse("", "a server needs a version"))?;
    let l = &versions[i];
    let name = l.name();
    let bindings = bindings(&l.server);
    if bindings.is_empty() {
        return Err(refuse(
            "/remotes",
            "a server needs a remote, a package, a repository or a website to be found at",
        ));
    }
    let mut m = base.cloned().unwrap_or_default();
    m.id = record_id(name);
    m.name = l
        .server
        .get("title")
        .and_then(Value::as_str)
        .unwrap_or(name)
        .to_string();
    m.description = l.description().to_string();
    m.version = Some(l.version().to_string());
    m.status = Some(l.status.agent_status());
    m.bindings = bindings;
    m.endpoint = None;
    // ADP's `auth` and AIDIP's `authentication` are one requirement, kept
    // the same (an earlier version's would otherwise differ from this one's).
    m.authentication = authentication(&l.server);
    m.auth = m.authentication.clone();
    // Never older than the record this replaces: a publish that lost a race
    // and merges again, or one taken by a node whose clock is behind the
    // one that wrote last, would otherwise be refused as stale.
    let stored = base.and_then(|b| b.updated_at.as_deref());
    m.updated_at = Some(match stored {
        Some(t) if super::time::parse(t) > super::time::parse(now) => t.to_string(),
        _ => now.to_string(),
    });
    if !m.tags.iter().any(|t| t == TAG) {
        m.tags.push(TAG.into());
    }
    if let Some(Value::String(w)) = l.server.get("websiteUrl") {
        m.extra.insert("websiteUrl".into(), json!(w));
    }
    m.extra
        .insert(EXTENSION.into(), json!({ "versions": versions }));
    Ok(m)
}

/// A new version published on top of what the record holds (`current`,
/// none for a new server). A version already published is refused.
pub fn publish(
    current: Option<&AgentMetadata>,
    server: Value,
    now: &str,
) -> Result<AgentMetadata, FieldError> {
    validate_server(&server)?;
    let name = server["name"].as_str().unwrap_or_default();
    let version = server["version"].as_str().unwrap_or_default().to_string();
    let mut all = current.map(versions).unwrap_or_default();
    if all.iter().any(|v| v.version() == version) {
        return Err(refuse(
            "/version",
            format!("version '{version}' of '{name}' is already published; versions are immutable, publish a new one"),
        ));
    }
    all.push(StoredVersion {
        server,
        status: McpStatus::Active,
        status_message: None,
        status_changed_at: now.to_string(),
        published_at: now.to_string(),
        updated_at: now.to_string(),
    });
    metadata(all, current, now)
}

/// Sets the status of one version (`Some(v)`) or all; refused when
/// nothing would change. Returns the new metadata and the indexes changed.
pub fn set_status(
    current: &AgentMetadata,
    version: Option<&str>,
    status: McpStatus,
    message: Option<String>,
    now: &str,
) -> Result<(AgentMetadata, Vec<usize>), SetStatusError> {
    if let Some(m) = &message {
        if m.chars().count() > MAX_STATUS_MESSAGE {
            return Err(SetStatusError::Invalid(refuse(
                "/statusMessage",
                format!("must be at most {MAX_STATUS_MESSAGE} characters"),
            )));
        }
    }
    let mut all = versions(current);
    let targets: Vec<usize> = match version {
        None => (0..all.len()).collect(),
        Some(v) => {
            let i = resolve(&all, v).ok_or(SetStatusError::NoVersion)?;
            vec![i]
        }
    };
    let changed: Vec<usize> = targets
        .into_iter()
        .filter(|&i| all[i].status != status || all[i].status_message != message)
        .collect();
    if changed.is_empty() {
        return Err(SetStatusError::Invalid(refuse(
            "/status",
            "nothing changes: the status and message are already so",
        )));
    }
    for &i in &changed {
        let v = &mut all[i];
        if v.status != status {
            v.status_changed_at = now.to_string();
        }
        v.status = status;
        v.status_message = message.clone();
        v.updated_at = now.to_string();
    }
    let m = metadata(all, Some(current), now).map_err(SetStatusError::Invalid)?;
    Ok((m, changed))
}

/// Why a status change was refused.
#[derive(Debug)]
pub enum SetStatusError {
    NoVersion,
    Invalid(FieldError),
}

/// The index of `version` (`latest` names the latest).
pub fn resolve(versions: &[StoredVersion], version: &str) -> Option<usize> {
    if version == "latest" {
        return latest(versions);
    }
    versions.iter().position(|v| v.version() == version)
}

/// The filters of `GET /v0.1/servers`, per version: `search`, an exact
/// `version` and `updated_since` are clauses of the one filter engine
/// (`Surface::McpList`) over a view of each version; `latest` and
/// `include_deleted` are this API's own.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub filters: HardFilters,
    pub latest_only: bool,
    pub include_deleted: bool,
}

impl ListFilter {
    /// The filter of a request's parameters (`pointer`s name them).
    pub fn new(
        search: Option<&str>,
        version: Option<&str>,
        updated_since: Option<&str>,
        include_deleted: bool,
    ) -> Result<Self, FieldError> {
        let mut filters = HardFilters {
            statuses: AgentStatus::ALL.to_vec(),
            allow_stale: true,
            ..Default::default()
        };
        let mut set = |name: &str, v: &str| -> Result<(), FieldError> {
            let key = filter::key(Surface::McpList, name)
                .ok_or_else(|| refuse(&format!("/{name}"), "is not a filter of this API"))?;
            filters.set(key, &Value::String(v.to_string()), &format!("/{name}"))
        };
        if let Some(s) = search.filter(|s| !s.trim().is_empty()) {
            set("search", s)?;
        }
        let latest_only = version == Some("latest");
        if let Some(v) = version.filter(|v| *v != "latest") {
            set("version", v)?;
        }
        if let Some(t) = updated_since {
            if super::time::parse(t).is_none() {
                return Err(refuse(
                    "/updated_since",
                    format!("'{t}' is not an RFC 3339 time"),
                ));
            }
            set("updated_since", t)?;
        }
        Ok(Self {
            // Mirrors following `updated_since` must see deletions.
            include_deleted: include_deleted || updated_since.is_some(),
            filters,
            latest_only,
        })
    }

    /// Whether the `i`th of `versions` is listed.
    pub fn admits(&self, versions: &[StoredVersion], i: usize, latest: Option<usize>) -> bool {
        let v = &versions[i];
        if v.status == McpStatus::Deleted && !self.include_deleted {
            return false;
        }
        if self.latest_only && latest != Some(i) {
            return false;
        }
        self.filters.admit(&version_facts(v), None, 0)
    }
}

/// A version as the filter engine sees it (access is the record's, checked
/// before its versions are).
fn version_facts(v: &StoredVersion) -> AgentFacts {
    AgentFacts {
        access: super::record::Access {
            public: true,
            ..Default::default()
        },
        status: v.status.agent_status(),
        name: v.name().to_lowercase().into(),
        version: Some(v.version().into()),
        updated_unix: super::time::parse(&v.updated_at).map_or(0, |t| t.unix_timestamp()),
        ..Default::default()
    }
}

/// A list cursor: the position after (server name, publish index).
pub fn encode_cursor(name: &str, index: usize) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{index}:{name}"))
}

pub fn decode_cursor(cursor: &str) -> Option<(String, usize)> {
    use base64::Engine;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor.trim_end_matches('='))
        .ok()?;
    let raw = String::from_utf8(raw).ok()?;
    let (i, name) = raw.split_once(':')?;
    check_name(name, "").ok()?;
    Some((name.to_string(), i.parse().ok()?))
}

/// The member of `EXTENSION` that marks a server mirrored from an upstream
/// registry: the upstream's base URL. Such a record is a read-only copy;
/// only the mirror of that upstream changes it.
pub const UPSTREAM: &str = "upstream";

/// The upstream registry a server is mirrored from (none: published here).
pub fn upstream(m: &AgentMetadata) -> Option<&str> {
    m.extra.get(EXTENSION)?.get(UPSTREAM)?.as_str()
}

/// Why an upstream's version was not mirrored.
#[derive(Debug, Clone, PartialEq)]
pub enum MirrorRefusal {
    /// The upstream's `ServerResponse` is none this registry can keep
    /// (the member to blame named).
    Invalid(FieldError),
    /// The record is no copy of this upstream (published here, mirrored
    /// from another upstream, or no MCP server): the mirror never
    /// overwrites it.
    NotMirrored(String),
}

impl std::fmt::Display for MirrorRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Invalid(e) => write!(f, "{e}"),
            Self::NotMirrored(m) => f.write_str(m),
        }
    }
}

/// One upstream `ServerResponse` as this registry keeps it: the
/// `server.json` as the upstream serves it and the registry-managed fields
/// of its `_meta[OFFICIAL]`, the upstream's times kept as they are (so a
/// mirror of the mirror sees the same `updatedAt`s). `isLatest` is not
/// kept: this registry decides it by the same rule over what it holds.
pub fn upstream_version(response: &Value) -> Result<StoredVersion, FieldError> {
    let server = response
        .get("server")
        .filter(|s| s.is_object())
        .ok_or_else(|| refuse("/server", "is required (a server.json object)"))?;
    validate_server(server).map_err(|e| refuse(&format!("/server{}", e.pointer), e.message))?;
    let official = response
        .get("_meta")
        .and_then(|m| m.get(OFFICIAL))
        .and_then(Value::as_object)
        .ok_or_else(|| refuse(&format!("/_meta/{OFFICIAL}"), "is required (an object)"))?;
    let at = |key: &str| -> Result<Option<String>, FieldError> {
        let pointer = format!("/_meta/{OFFICIAL}/{key}");
        match text(official, key).map_err(|_| refuse(&pointer, "must be a string"))? {
            None => Ok(None),
            Some(t) if super::time::parse(t).is_some() => Ok(Some(t.to_string())),
            Some(t) => Err(refuse(&pointer, format!("'{t}' is not an RFC 3339 time"))),
        }
    };
    // `updatedAt` is what a mirror's cursor follows: it must be there.
    let updated_at = at("updatedAt")?.ok_or_else(|| {
        refuse(
            &format!("/_meta/{OFFICIAL}/updatedAt"),
            "is required (an RFC 3339 time)",
        )
    })?;
    let published_at = at("publishedAt")?.unwrap_or_else(|| updated_at.clone());
    let status_changed_at = at("statusChangedAt")?.unwrap_or_else(|| published_at.clone());
    let status = match text(official, "status") {
        Ok(None) => McpStatus::Active,
        Ok(Some(s)) => McpStatus::parse(s).ok_or_else(|| {
            refuse(
                &format!("/_meta/{OFFICIAL}/status"),
                format!("'{s}' is not a status (active, deprecated or deleted)"),
            )
        })?,
        Err(_) => {
            return Err(refuse(
                &format!("/_meta/{OFFICIAL}/status"),
                "must be a string",
            ))
        }
    };
    let status_message = text(official, "statusMessage")
        .map_err(|_| {
            refuse(
                &format!("/_meta/{OFFICIAL}/statusMessage"),
                "must be a string",
            )
        })?
        .map(String::from);
    Ok(StoredVersion {
        server: server.clone(),
        status,
        status_message,
        status_changed_at,
        published_at,
        updated_at,
    })
}

fn time_of(t: &str) -> Option<time::OffsetDateTime> {
    super::time::parse(t)
}

/// The record after mirroring one upstream `ServerResponse` onto what the
/// record holds (`current`, none for a server new here), marked as a copy
/// of `upstream`; `None` when it already holds exactly that version (or a
/// newer state of it), so reading a page again writes nothing.
///
/// A version new here is appended (in the order the upstream lists it), a
/// known one takes the upstream's status, message, server.json and times. The record's fields follow the latest version,
/// as for published servers, and its `updated_at` is the newest
/// `updatedAt` of its versions (the upstream's clock, not this
/// registry's, so the result depends on nothing but the inputs).
pub fn mirror_version(
    current: Option<&AgentMetadata>,
    response: &Value,
    upstream_url: &str,
) -> Result<Option<AgentMetadata>, MirrorRefusal> {
    let incoming = upstream_version(response).map_err(MirrorRefusal::Invalid)?;
    let name = incoming.name().to_string();
    if let Some(m) = current {
        if !is_server(m) {
            return Err(MirrorRefusal::NotMirrored(format!(
                "'{}' is the id of an agent that is no MCP server",
                m.id
            )));
        }
        match upstream(m) {
            Some(u) if u == upstream_url => {}
            Some(u) => {
                return Err(MirrorRefusal::NotMirrored(format!(
                    "'{name}' is mirrored from {u}, not from {upstream_url}"
                )))
            }
            None => {
                return Err(MirrorRefusal::NotMirrored(format!(
                    "'{name}' is published at this registry; the upstream's copy is not kept"
                )))
            }
        }
    }
    let mut all = current.map(versions).unwrap_or_default();
    match all.iter().position(|v| v.version() == incoming.version()) {
        Some(i) => {
            let stored = &all[i];
            let older = match (time_of(&incoming.updated_at), time_of(&stored.updated_at)) {
                (Some(n), Some(o)) => n < o,
                _ => false,
            };
            if older || *stored == incoming {
                return Ok(None);
            }
            all[i] = incoming;
        }
        // Appended, as published versions are: list cursors are positions
        // in this order and must stay valid (the upstream lists a server's
        // versions in its publish order, so a first poll keeps that order).
        None => all.push(incoming),
    }
    let newest = all
        .iter()
        .filter_map(|v| time_of(&v.updated_at).map(|t| (t, v.updated_at.clone())))
        .max_by_key(|(t, _)| *t)
        .map(|(_, s)| s)
        .unwrap_or_default();
    let mut m = metadata(all, current, &newest).map_err(MirrorRefusal::Invalid)?;
    if let Some(Value::Object(x)) = m.extra.get_mut(EXTENSION) {
        x.insert(UPSTREAM.into(), json!(upstream_url));
    }
    Ok(Some(m))
}

/// Whether a server name is among a mirror's `namespaces` (name
/// prefixes; none: every name).
pub fn in_namespaces(name: &str, namespaces: &[String]) -> bool {
    namespaces.is_empty() || namespaces.iter().any(|p| name.starts_with(p.as_str()))
}

/// This registry's own `_meta` key: its authority in reverse-DNS order,
/// then `/agentry` (`registry.example.org` → `org.example.registry/agentry`).
pub fn own_meta_key(publisher: &str) -> String {
    let mut labels: Vec<&str> = publisher.split('.').collect();
    labels.reverse();
    format!("{}/agentry", labels.join("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(name: &str, version: &str) -> Value {
        json!({
            "$schema": "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json",
            "name": name, "description": "Weather forecasts.", "version": version,
            "title": "Weather",
            "remotes": [{"type": "streamable-http", "url": "https://mcp.acme.example/weather"}],
            "packages": [{"registryType": "npm", "identifier": "@acme/weather-mcp", "version": version,
                          "transport": {"type": "stdio"}}]
        })
    }

    const T1: &str = "2026-11-01T00:00:00Z";
    const T2: &str = "2026-11-02T00:00:00Z";
    const T3: &str = "2026-11-03T00:00:00Z";

    /// A publish merged again after losing a race carries the time it
    /// started, which may be older than the winner's; the record's
    /// `updated_at` must not go back, or the write is refused as stale.
    #[test]
    fn the_record_time_never_goes_back() {
        let m = publish(None, server("io.acme/weather", "1.0.0"), T2).unwrap();
        let late = publish(Some(&m), server("io.acme/weather", "1.0.1"), T1).unwrap();
        assert_eq!(late.updated_at.as_deref(), Some(T2));
        assert_eq!(versions(&late).len(), 2);
        let on = publish(Some(&late), server("io.acme/weather", "1.0.2"), T3).unwrap();
        assert_eq!(on.updated_at.as_deref(), Some(T3));
    }

    /// The latest version's remote says which credential a call needs.
    #[test]
    fn a_remotes_secret_header_is_the_records_authentication() {
        let with_headers = |version: &str, headers: Value| {
            let mut s = server("io.acme/weather", version);
            s["remotes"][0]["headers"] = headers;
            s
        };
        let key = json!([
            {"name": "X-Region", "isRequired": true, "value": "eu"},
            {"name": "X-Weather-Key", "description": "From your account page.",
             "isRequired": true, "isSecret": true}
        ]);
        let m = publish(None, with_headers("1.0.0", key), T1).unwrap();
        let auth = m.authentication.clone().unwrap();
        assert_eq!(auth.kind.as_deref(), Some("api_key"));
        assert_eq!(auth.extra["header"], "X-Weather-Key");
        assert_eq!(
            auth.instructions.as_deref(),
            Some("From your account page.")
        );
        assert_eq!(m.auth, m.authentication);
        // A token in Authorization, secret through its variable; a
        // description that could not stand in a record is left out.
        let bearer = json!([{"name": "Authorization", "description": "x".repeat(2000),
            "isRequired": true, "value": "Bearer {token}",
            "variables": {"token": {"isRequired": true, "isSecret": true}}}]);
        let m = publish(Some(&m), with_headers("1.1.0", bearer), T2).unwrap();
        let auth = m.authentication.clone().unwrap();
        assert_eq!(auth.kind.as_deref(), Some("oauth2_bearer"));
        assert!(auth.extra.get("header").is_none());
        assert_eq!(auth.instructions, None);
        assert_eq!(m.auth, m.authentication);
        // A header the gateway sets itself is the server's clients' to
        // set, never a credential: the next secret one is.
        let reserved = json!([
            {"name": "User-Agent", "isRequired": true, "isSecret": true},
            {"name": "X-Weather-Key", "isRequired": true, "isSecret": true}
        ]);
        let m = publish(Some(&m), with_headers("1.1.5", reserved), T2).unwrap();
        let auth = m.authentication.clone().unwrap();
        assert_eq!(auth.extra["header"], "X-Weather-Key");
        // An optional secret, or none: no requirement, whatever came before.
        let optional = json!([{"name": "X-Weather-Key", "isSecret": true}]);
        let m = publish(Some(&m), with_headers("1.2.0", optional), T3).unwrap();
        assert_eq!((m.authentication.as_ref(), m.auth.as_ref()), (None, None));
    }

    #[test]
    fn a_remotes_settings_become_its_bindings_headers() {
        let mut s = server("io.acme/weather", "1.0.0");
        s["remotes"][0]["headers"] = json!([
            {"name": "X-Region", "value": "{region}-1", "isRequired": true,
             "variables": {"region": {"default": "eu"}}},
            {"name": "X-Client", "default": "registry"},
            {"name": "X-Key", "isRequired": true, "isSecret": true},
            {"name": "X-Token", "value": "Bearer {t}", "variables": {"t": {"isSecret": true, "default": "x"}}},
            {"name": "X-Tenant", "value": "{tenant}", "variables": {"tenant": {"description": "yours"}}},
            {"name": "X-Open", "value": "{unclosed"},
            {"name": "User-Agent", "value": "mine/1.0"},
            {"name": "X-Plain", "description": "chosen by the client"}
        ]);
        let m = publish(None, s, T1).unwrap();
        assert_eq!(
            m.bindings[0].extra["headers"],
            json!({"X-Region": "eu-1", "X-Client": "registry"})
        );
        // What the record's validation holds the binding to, it passes.
        let mut stored = m.clone();
        super::super::validate::normalise_and_validate(&mut stored, &Default::default()).unwrap();
        // A remote without such headers declares none.
        let m = publish(None, server("io.acme/plain", "1.0.0"), T1).unwrap();
        assert!(m.bindings[0].extra.get("headers").is_none());
    }

    #[test]
    fn versions_are_kept_and_one_is_latest() {
        let m = publish(None, server("io.acme/weather", "1.0.0"), T1).unwrap();
        assert_eq!(m.id, "mcp:io.acme/weather");
        assert_eq!(m.name, "Weather");
        assert_eq!(m.bindings[0].protocol, "mcp");
        assert_eq!(m.bindings[0].endpoint, "https://mcp.acme.example/weather");
        assert_eq!(m.bindings[1].protocol, PACKAGE_PROTOCOL);
        assert_eq!(
            m.bindings[1].endpoint,
            "https://www.npmjs.com/package/@acme/weather-mcp"
        );
        let m = publish(Some(&m), server("io.acme/weather", "2.0.0"), T2).unwrap();
        // An older line published later is not the latest.
        let m = publish(Some(&m), server("io.acme/weather", "1.0.1"), T3).unwrap();
        let all = versions(&m);
        assert_eq!(all.len(), 3);
        assert_eq!(latest(&all), Some(1));
        assert_eq!(m.version.as_deref(), Some("2.0.0"));
        // The same version twice is refused.
        let e = publish(Some(&m), server("io.acme/weather", "2.0.0"), T3).unwrap_err();
        assert_eq!(e.pointer, "/version");
        // Deleting the latest makes the next one latest; the record follows.
        let (m, changed) = set_status(&m, Some("2.0.0"), McpStatus::Deleted, None, T3).unwrap();
        assert_eq!(changed, [1]);
        assert_eq!(
            m.id, "mcp:io.acme/weather",
            "a status change keeps the record"
        );
        assert_eq!(latest(&versions(&m)), Some(2));
        assert_eq!(m.version.as_deref(), Some("1.0.1"));
        assert!(matches!(
            set_status(&m, Some("2.0.0"), McpStatus::Deleted, None, T3),
            Err(SetStatusError::Invalid(_))
        ));
        assert!(matches!(
            set_status(&m, Some("9.9.9"), McpStatus::Active, None, T3),
            Err(SetStatusError::NoVersion)
        ));
        let (m, changed) =
            set_status(&m, None, McpStatus::Deprecated, Some("old".into()), T3).unwrap();
        assert_eq!(changed, [0, 1, 2]);
        assert_eq!(m.status, Some(AgentStatus::Deprecated));
        // Non-semver versions: the later published is the latest.
        let a = publish(None, server("io.acme/x", "2026.11a"), T1).unwrap();
        let b = publish(Some(&a), server("io.acme/x", "2026.10b"), T2).unwrap();
        assert_eq!(latest(&versions(&b)), Some(1));
    }

    #[test]
    fn published_rules_refuse_and_name_the_member() {
        let cases = [
            (
                json!({"name": "noslash", "description": "d", "version": "1.0.0"}),
                "/name",
            ),
            (
                json!({"name": "a/b/c", "description": "d", "version": "1.0.0"}),
                "/name",
            ),
            (
                json!({"name": "io.acme/x", "description": "d".repeat(101), "version": "1.0.0"}),
                "/description",
            ),
            (
                json!({"name": "io.acme/x", "version": "1.0.0"}),
                "/description",
            ),
            (
                json!({"name": "io.acme/x", "description": "d", "version": "^1.2.3"}),
                "/version",
            ),
            (
                json!({"name": "io.acme/x", "description": "d", "version": "~1.2.3"}),
                "/version",
            ),
            (
                json!({"name": "io.acme/x", "description": "d", "version": ">=1.2.3"}),
                "/version",
            ),
            (
                json!({"name": "io.acme/x", "description": "d", "version": "1.x"}),
                "/version",
            ),
            (
                json!({"name": "io.acme/x", "description": "d", "version": "1.*"}),
                "/version",
            ),
            (
                json!({"name": "io.acme/x", "description": "d", "version": "latest"}),
                "/version",
            ),
            (
                json!({"name": "io.acme/x", "description": "d", "version": "1.0.0",
                    "packages": [{"registryType": "npm", "identifier": "x", "fileSha256": "abc", "transport": {"type": "stdio"}}]}),
                "/packages/0/fileSha256",
            ),
            (
                json!({"name": "io.acme/x", "description": "d", "version": "1.0.0",
                    "remotes": [{"type": "websocket", "url": "https://a.example"}]}),
                "/remotes/0/type",
            ),
            (
                json!({"name": "io.acme/x", "description": "d", "version": "1.0.0",
                    "remotes": [{"type": "sse", "url": "ftp://a.example"}]}),
                "/remotes/0/url",
            ),
            (
                json!({"name": "io.acme/x", "description": "d", "version": "1.0.0",
                    "remotes": [{"type": "streamable-http", "url": "https://a.example/mcp",
                        "headers": [{"name": "X-Ok"}, {"name": "X Api Key", "isSecret": true}]}]}),
                "/remotes/0/headers/1/name",
            ),
            (
                json!({"name": "io.acme/x", "description": "d", "version": "1.0.0",
                    "remotes": [{"type": "streamable-http", "url": "https://a.example/mcp",
                        "headers": [{"description": "no name"}]}]}),
                "/remotes/0/headers/0/name",
            ),
            (
                json!({"name": "io.acme/x", "description": "d", "version": "1.0.0",
                    "remotes": [{"type": "streamable-http", "url": "https://a.example/mcp",
                        "headers": {"name": "X-Key"}}]}),
                "/remotes/0/headers",
            ),
            (
                json!({"name": "io.acme/x", "description": "d", "version": "1.0.0",
                    "packages": [{"registryType": "npm", "identifier": "x", "transport":
                        {"type": "sse", "url": "https://a.example/sse", "headers": [{"name": "X-Key:"}]}}]}),
                "/packages/0/transport/headers/0/name",
            ),
            (
                json!({"name": "io.acme/x", "description": "d", "version": "1.0.0", "title": ""}),
                "/title",
            ),
        ];
        for (body, pointer) in cases {
            let e = validate_server(&body).unwrap_err();
            assert_eq!(e.pointer, pointer, "{body}");
        }
        // Templated URLs are allowed; a server with nothing to find it by is not.
        let templated = json!({"name": "io.acme/x", "description": "d", "version": "1.0.0-rc.1+build.5",
            "remotes": [{"type": "sse", "url": "https://{tenant}.acme.example/sse"}]});
        validate_server(&templated).unwrap();
        assert_eq!(
            publish(None, templated, T1).unwrap_err().pointer,
            "/remotes"
        );
    }

    #[test]
    fn list_filters_and_cursors() {
        let m = publish(None, server("io.acme/weather", "1.0.0"), T1).unwrap();
        let m = publish(Some(&m), server("io.acme/weather", "2.0.0"), T2).unwrap();
        let (m, _) = set_status(&m, Some("1.0.0"), McpStatus::Deleted, None, T3).unwrap();
        let all = versions(&m);
        let l = latest(&all);
        let listed = |f: ListFilter| -> Vec<usize> {
            (0..all.len()).filter(|&i| f.admits(&all, i, l)).collect()
        };
        let f = |search, version, since, deleted| {
            ListFilter::new(search, version, since, deleted).unwrap()
        };
        assert_eq!(listed(f(None, None, None, false)), [1]);
        assert_eq!(listed(f(None, None, None, true)), [0, 1]);
        // updated_since sees deletions.
        assert_eq!(listed(f(None, None, Some(T2), false)), [0]);
        assert_eq!(listed(f(None, Some("latest"), None, false)), [1]);
        assert_eq!(listed(f(None, Some("1.0.0"), None, true)), [0]);
        assert_eq!(listed(f(Some("WEATH"), None, None, false)), [1]);
        assert!(listed(f(Some("flights"), None, None, false)).is_empty());
        assert_eq!(
            ListFilter::new(None, None, Some("yesterday"), false)
                .unwrap_err()
                .pointer,
            "/updated_since"
        );
        let c = encode_cursor("io.acme/weather", 1);
        assert_eq!(decode_cursor(&c), Some(("io.acme/weather".into(), 1)));
        assert_eq!(decode_cursor("garbage!"), None);
        assert_eq!(
            own_meta_key("registry.example.org"),
            "org.example.registry/agentry"
        );
    }

    const UP: &str = "https://registry.modelcontextprotocol.io";

    fn upstream_response(version: &str, status: &str, published: &str, updated: &str) -> Value {
        json!({
            "server": server("io.acme/weather", version),
            "_meta": {OFFICIAL: {
                "status": status, "statusChangedAt": updated, "publishedAt": published,
                "updatedAt": updated, "isLatest": true
            }}
        })
    }

    #[test]
    fn mirroring_keeps_the_upstreams_versions_and_times() {
        let r1 = upstream_response("1.0.0", "active", T1, T1);
        let m = mirror_version(None, &r1, UP).unwrap().unwrap();
        assert_eq!(m.id, "mcp:io.acme/weather");
        assert_eq!(upstream(&m), Some(UP));
        assert_eq!(m.updated_at.as_deref(), Some(T1), "the upstream's clock");
        // The same response again changes nothing.
        assert_eq!(mirror_version(Some(&m), &r1, UP).unwrap(), None);
        // A version seen later is appended (list cursors stay valid), with
        // the upstream's times; isLatest is this registry's rule.
        let r0 = upstream_response("0.9.0", "active", "2026-10-01T00:00:00Z", T2);
        let m = mirror_version(Some(&m), &r0, UP).unwrap().unwrap();
        let all = versions(&m);
        assert_eq!(
            all.iter().map(StoredVersion::version).collect::<Vec<_>>(),
            ["1.0.0", "0.9.0"]
        );
        assert_eq!(all[1].published_at, "2026-10-01T00:00:00Z");
        assert_eq!(all[1].updated_at, T2);
        assert_eq!(m.updated_at.as_deref(), Some(T2));
        assert_eq!(latest(&all), Some(0));
        // A deletion upstream is a status; the record follows the latest.
        let gone = upstream_response("1.0.0", "deleted", T1, T3);
        let m = mirror_version(Some(&m), &gone, UP).unwrap().unwrap();
        let all = versions(&m);
        assert_eq!(all[0].status, McpStatus::Deleted);
        assert_eq!(all[0].published_at, T1);
        assert_eq!(latest(&all), Some(1));
        assert_eq!(m.version.as_deref(), Some("0.9.0"));
        assert_eq!(upstream(&m), Some(UP), "the mark survives a change");
        // An older state of a known version never wins.
        assert_eq!(mirror_version(Some(&m), &r1, UP).unwrap(), None);
    }

    #[test]
    fn mirroring_never_overwrites_what_it_does_not_own() {
        let local = publish(None, server("io.acme/weather", "1.0.0"), T1).unwrap();
        let r = upstream_response("2.0.0", "active", T2, T2);
        assert!(matches!(
            mirror_version(Some(&local), &r, UP),
            Err(MirrorRefusal::NotMirrored(_))
        ));
        let theirs = mirror_version(None, &r, "https://other.example")
            .unwrap()
            .unwrap();
        assert!(matches!(
            mirror_version(Some(&theirs), &r, UP),
            Err(MirrorRefusal::NotMirrored(_))
        ));
        let agent = AgentMetadata {
            id: "mcp:io.acme/weather".into(),
            ..Default::default()
        };
        assert!(matches!(
            mirror_version(Some(&agent), &r, UP),
            Err(MirrorRefusal::NotMirrored(_))
        ));
        // Responses this registry cannot keep name the member.
        let mut bad = r.clone();
        bad["server"]["version"] = json!("^2.0.0");
        assert_eq!(
            mirror_version(None, &bad, UP),
            Err(MirrorRefusal::Invalid(FieldError::new(
                "/server/version",
                "'^2.0.0' is a version range; publish a specific version"
            )))
        );
        let mut bad = r.clone();
        bad["_meta"][OFFICIAL]["updatedAt"] = json!("yesterday");
        match mirror_version(None, &bad, UP) {
            Err(MirrorRefusal::Invalid(e)) => {
                assert_eq!(e.pointer, format!("/_meta/{OFFICIAL}/updatedAt"))
            }
            other => panic!("{other:?}"),
        }
        let mut bad = r;
        bad["_meta"][OFFICIAL]["status"] = json!("gone");
        assert!(matches!(
            mirror_version(None, &bad, UP),
            Err(MirrorRefusal::Invalid(_))
        ));
        assert!(in_namespaces("io.acme/weather", &[]));
        assert!(in_namespaces("io.acme/weather", &["io.acme/".into()]));
        assert!(!in_namespaces("io.other/weather", &["io.acme/".into()]));
    }
}
