//! DNS-rebinding protection for `/mcp`: the names a request may reach the
//! MCP server by, checked before the MCP layer reads it.
//!
//! MCP's Streamable HTTP transport says a server MUST validate `Origin`,
//! because a web page can make the visitor's browser POST to it: across
//! origins (the page's own `Origin` travels along), or, after rebinding its
//! own DNS name to this server's address, as a same-origin request whose
//! `Host` and `Origin` both carry the attacker's name. So a request passes
//! when its `Host` is a name this registry answers to and its `Origin`, when
//! it has one, is a page allowed to call it. Clients that are not browsers
//! send no `Origin` and keep working as long as they use one of the names.
//!
//! `Host` (the header, else the URI's authority over HTTP/2) is accepted
//! when it is:
//! - an IP address: rebinding always arrives under a DNS name the attacker
//!   controls, never under an address, so clients that dial this node by
//!   number (a pod IP, a load balancer's health check) need no list;
//! - `localhost`, on any port;
//! - the host of a URL this node's configuration gives for itself
//!   (`gateway.public_url`, `identity.federation_endpoint`) or its
//!   `identity.authority`, on any port;
//! - an entry of `mcp.allowed_hosts`: `name` (any port), `name:port`,
//!   `*.domain` (every name under it), or `*` (the check off).
//!
//! `Origin`, when present, is accepted when it is the request's own origin
//! (same scheme-less host and port as the accepted `Host`: a page this
//! server served), when its host is loopback (`localhost`, `127.0.0.0/8`,
//! `::1`) or one of the names above (not any address: a page served from
//! another port of this machine is another origin; and not `*`, which
//! opens `Host` only), or when it is listed in `mcp.allowed_origins`
//! (`https://app.example.com`, or `*`). `null` (a sandboxed or local page)
//! is refused unless `*` is listed.
//!
//! `X-Forwarded-Host` and `Forwarded` are not read: a rebound page is
//! same-origin and may send any header it likes.

use std::net::IpAddr;

use axum::http::{header, HeaderMap, Uri};
use serde::Deserialize;

use crate::gateway::outbound::host_pattern_matches;
use crate::service::ServiceError;

/// `[mcp]`: the names and browser origins `/mcp` answers besides the
/// defaults in the module's doc (`mcp.allowed_hosts`,
/// `mcp.allowed_origins`; env `AGENTRY_MCP_ALLOWED_HOSTS`,
/// `AGENTRY_MCP_ALLOWED_ORIGINS`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// Host names clients use to reach this node: `name`, `name:port`,
    /// `*.domain`, or `*` to accept any `Host`.
    pub allowed_hosts: Vec<String>,
    /// Browser origins whose pages may call `/mcp` across origins
    /// (`https://app.example.com`), or `*` for any.
    pub allowed_origins: Vec<String>,
}

impl McpConfig {
    /// Checks the entries parse (the same parser the policy uses).
    pub fn validate(&self) -> Result<(), String> {
        OriginPolicy::new(self, Vec::new()).map(|_| ())
    }
}

/// An `mcp.allowed_hosts` entry.
#[derive(Debug, Clone, PartialEq)]
enum HostEntry {
    Any,
    /// A lower-case name or `*.domain`, with the one port it is good for.
    Name {
        pattern: String,
        port: Option<u16>,
    },
}

/// A `Host` or `Origin` host, normalised: lower case, no trailing dot, an
/// IPv6 address without brackets.
#[derive(Debug, Clone, PartialEq)]
struct HostPort {
    host: String,
    port: Option<u16>,
}

impl HostPort {
    /// `host[:port]` as the `Host` header carries it.
    fn parse(authority: &str) -> Option<Self> {
        let a: axum::http::uri::Authority = authority.trim().parse().ok()?;
        if a.as_str().contains('@') || a.host().is_empty() {
            return None;
        }
        Some(Self::new(a.host(), a.port_u16()))
    }

    fn new(host: &str, port: Option<u16>) -> Self {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        Self { host, port }
    }

    fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }

    fn is_loopback(&self) -> bool {
        self.host == "localhost" || self.ip().is_some_and(|ip| ip.to_canonical().is_loopback())
    }
}

/// The compiled allow-list of `/mcp`.
#[derive(Debug, Clone)]
pub struct OriginPolicy {
    /// Names this node's configuration gives for itself, any port.
    own: Vec<String>,
    hosts: Vec<HostEntry>,
    /// `mcp.allowed_origins`.
    origins: OriginList,
}

/// Browser origins an operator listed (`https://app.example.com`, or `*`
/// for any page): `mcp.allowed_origins` and `cors.allowed_origins`.
#[derive(Debug, Clone, Default)]
pub struct OriginList {
    /// The listed origins in their ASCII serialisation.
    origins: Vec<String>,
    any: bool,
}

impl OriginList {
    /// Parses `entries`; `setting` names the list in the error.
    pub fn parse(entries: &[String], setting: &str) -> Result<Self, String> {
        let mut list = Self::default();
        for e in entries {
            let e = e.trim();
            if e == "*" {
                list.any = true;
                continue;
            }
            let bad = || {
                format!("{setting}: '{e}' is not an origin such as https://app.example.com (scheme, host and port only)")
            };
            let url = url::Url::parse(e).map_err(|_| bad())?;
            let bare = url.path() == "/" && url.query().is_none() && url.fragment().is_none();
            if !matches!(url.scheme(), "http" | "https") || url.host().is_none() || !bare {
                return Err(bad());
            }
            list.origins.push(url.origin().ascii_serialization());
        }
        Ok(list)
    }

    /// `*` was listed.
    pub fn any(&self) -> bool {
        self.any
    }

    /// Nothing was listed.
    pub fn is_empty(&self) -> bool {
        !self.any && self.origins.is_empty()
    }

    /// `url`, a page's origin, is listed by name (`*` aside).
    fn names(&self, url: &url::Url) -> bool {
        self.origins.contains(&url.origin().ascii_serialization())
    }

    /// The `Origin` header `raw` is listed, by name or by `*`.
    pub fn admits(&self, raw: &str) -> bool {
        self.any || page_origin(raw).is_some_and(|url| self.names(&url))
    }

    /// The listed origins, for the start-up log.
    pub fn describe(&self) -> String {
        if self.any {
            return "any (*)".into();
        }
        self.origins.join(", ")
    }
}

/// An `Origin` header's value as an http(s) URL with a host: the only
/// origins a page an operator could list has.
fn page_origin(raw: &str) -> Option<url::Url> {
    let url = url::Url::parse(raw.trim()).ok()?;
    (matches!(url.scheme(), "http" | "https") && url.host().is_some()).then_some(url)
}

/// Longest header value quoted back in a refusal.
const QUOTED: usize = 200;

fn quoted(v: &str) -> String {
    v.chars().take(QUOTED).collect()
}

impl OriginPolicy {
    /// The policy of `config`, with `own` the host names this node's other
    /// settings give for itself.
    pub fn new(config: &McpConfig, own: Vec<String>) -> Result<Self, String> {
        let mut hosts = Vec::new();
        for e in &config.allowed_hosts {
            let e = e.trim();
            if e == "*" {
                hosts.push(HostEntry::Any);
                continue;
            }
            let bad = || {
                format!("mcp.allowed_hosts: '{e}' is not a host name, name:port or *.domain (no scheme or path)")
            };
            let (wildcard, rest) = match e.strip_prefix("*.") {
                Some(rest) => (true, rest),
                None => (false, e),
            };
            let hp = HostPort::parse(rest).ok_or_else(bad)?;
            let plain = hp
                .host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':'));
            if !plain || rest.contains('/') {
                return Err(bad());
            }
            hosts.push(HostEntry::Name {
                pattern: if wildcard {
                    format!("*.{}", hp.host)
                } else {
                    hp.host
                },
                port: hp.port,
            });
        }
        let origins = OriginList::parse(&config.allowed_origins, "mcp.allowed_origins")?;
        let own = own
            .into_iter()
            .map(|n| HostPort::new(&n, None).host)
            .filter(|n| !n.is_empty())
            .collect();
        Ok(Self {
            own,
            hosts,
            origins,
        })
    }

    /// A name this registry answers to (IP addresses aside). `*` counts
    /// for `Host` only: accepting any name a proxy forwards must not let
    /// any page call across sites.
    fn named(&self, h: &HostPort, star: bool) -> bool {
        h.is_loopback()
            || self.own.contains(&h.host)
            || self.hosts.iter().any(|e| match e {
                HostEntry::Any => star,
                HostEntry::Name { pattern, port } => {
                    host_pattern_matches(pattern, &h.host) && port.is_none_or(|p| h.port == Some(p))
                }
            })
    }

    /// Admits a request to `/mcp`, or says why not (403 `forbidden`).
    pub fn check(&self, headers: &HeaderMap, uri: &Uri) -> Result<(), ServiceError> {
        let refuse = |m: String| Err(ServiceError::Forbidden(m));
        let raw_host = match headers.get(header::HOST) {
            Some(v) => v.to_str().ok().map(str::to_string),
            None => uri.authority().map(|a| a.to_string()),
        };
        let Some(raw_host) = raw_host else {
            return refuse("the request names no host (Host header); /mcp answers only requests addressed to one of its names".into());
        };
        let host = match HostPort::parse(&raw_host) {
            Some(h) if h.ip().is_some() || self.named(&h, true) => h,
            _ => {
                return refuse(format!(
                    "Host '{}' is not a name this registry answers to on /mcp (DNS-rebinding protection); an operator adds names in mcp.allowed_hosts",
                    quoted(&raw_host)
                ))
            }
        };
        let Some(origin) = headers.get(header::ORIGIN) else {
            return Ok(());
        };
        let raw = origin.to_str().unwrap_or_default().trim();
        if self.origins.any() || self.origin_allowed(raw, &host) {
            return Ok(());
        }
        refuse(format!(
            "Origin '{}' may not call /mcp (DNS-rebinding and cross-site protection); an operator adds pages' origins in mcp.allowed_origins",
            quoted(raw)
        ))
    }

    fn origin_allowed(&self, raw: &str, host: &HostPort) -> bool {
        let Some(url) = page_origin(raw) else {
            return false;
        };
        let Some(name) = url.host_str() else {
            return false;
        };
        let port = url.port_or_known_default();
        let theirs = HostPort::new(name, port);
        // A `Host` without a port is at the default port of the scheme the
        // client used, which for a same-origin request is the origin's.
        let same_origin = theirs.host == host.host && port == host.port.or(port);
        same_origin || self.named(&theirs, false) || self.origins.names(&url)
    }

    /// What the policy admits, for the start-up log.
    pub fn describe(&self) -> String {
        let mut names = vec!["localhost, loopback and other IP addresses".to_string()];
        names.extend(self.own.iter().cloned());
        names.extend(self.hosts.iter().map(|e| match e {
            HostEntry::Any => "any name (*)".to_string(),
            HostEntry::Name {
                pattern,
                port: Some(p),
            } => format!("{pattern}:{p}"),
            HostEntry::Name { pattern, .. } => pattern.clone(),
        }));
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn policy(hosts: &[&str], origins: &[&str]) -> OriginPolicy {
        let config = McpConfig {
            allowed_hosts: hosts.iter().map(|s| s.to_string()).collect(),
            allowed_origins: origins.iter().map(|s| s.to_string()).collect(),
        };
        OriginPolicy::new(&config, vec!["registry.example.com".into()]).unwrap()
    }

    fn admits(p: &OriginPolicy, host: Option<&str>, origin: Option<&str>) -> bool {
        let mut h = HeaderMap::new();
        if let Some(v) = host {
            h.insert(header::HOST, HeaderValue::from_str(v).unwrap());
        }
        if let Some(v) = origin {
            h.insert(header::ORIGIN, HeaderValue::from_str(v).unwrap());
        }
        p.check(&h, &Uri::from_static("/mcp")).is_ok()
    }

    #[test]
    fn loopback_addresses_and_the_nodes_own_names_pass_by_default() {
        let p = policy(&[], &[]);
        for host in [
            "localhost",
            "localhost:8470",
            "127.0.0.1:51234",
            "[::1]:8470",
            "10.1.2.3:8470",
            "REGISTRY.example.com.",
            "registry.example.com:443",
        ] {
            assert!(admits(&p, Some(host), None), "{host}");
        }
        for host in [
            "evil.example.com",
            "evil.example.com:8470",
            "localhost.evil.example",
            "",
            "a@localhost",
        ] {
            assert!(!admits(&p, Some(host), None), "{host}");
        }
        assert!(!admits(&p, None, None), "no Host at all");
    }

    #[test]
    fn origins_must_be_the_requests_own_loopback_or_listed() {
        let p = policy(&[], &["https://app.example.org"]);
        let ok = [
            ("127.0.0.1:8470", "http://127.0.0.1:8470"),
            ("127.0.0.1:8470", "http://localhost:6274"),
            ("10.1.2.3:8470", "http://10.1.2.3:8470"),
            ("registry.example.com", "https://registry.example.com"),
            ("registry.example.com", "https://app.example.org"),
        ];
        for (host, origin) in ok {
            assert!(admits(&p, Some(host), Some(origin)), "{host} {origin}");
        }
        let refused = [
            // The conformance suite's rebinding request.
            ("evil.example.com", "http://evil.example.com"),
            // A cross-site page calling a loopback server.
            ("127.0.0.1:8470", "http://evil.example.com"),
            // Another port of the same address is another origin.
            ("10.1.2.3:8470", "http://10.1.2.3:9999"),
            ("127.0.0.1:8470", "null"),
            ("127.0.0.1:8470", "not a url"),
            ("registry.example.com", "https://app.example.org:8443"),
        ];
        for (host, origin) in refused {
            assert!(!admits(&p, Some(host), Some(origin)), "{host} {origin}");
        }
        let e = p
            .check(
                &HeaderMap::from_iter([
                    (header::HOST, HeaderValue::from_static("127.0.0.1")),
                    (
                        header::ORIGIN,
                        HeaderValue::from_static("http://evil.example.com"),
                    ),
                ]),
                &Uri::from_static("/mcp"),
            )
            .unwrap_err();
        assert!(
            matches!(&e, ServiceError::Forbidden(m) if m.contains("evil.example.com") && m.contains("mcp.allowed_origins")),
            "{e}"
        );
    }

    #[test]
    fn operator_entries_add_names_ports_domains_and_wildcards() {
        let p = policy(
            &[
                "agentry.internal",
                "*.svc.cluster.local",
                "edge.example.net:8443",
            ],
            &[],
        );
        assert!(admits(&p, Some("agentry.internal:8470"), None));
        assert!(admits(&p, Some("agentry.default.svc.cluster.local"), None));
        assert!(!admits(&p, Some("svc.cluster.local"), None));
        assert!(admits(&p, Some("edge.example.net:8443"), None));
        assert!(!admits(&p, Some("edge.example.net"), None));
        assert!(admits(
            &p,
            Some("127.0.0.1"),
            Some("https://agentry.internal")
        ));
        let open = policy(&["*"], &["*"]);
        assert!(admits(&open, Some("anything.example"), Some("null")));
        // Any Host does not mean any Origin.
        assert!(!admits(
            &policy(&["*"], &[]),
            Some("a.example"),
            Some("http://b.example")
        ));
    }

    #[test]
    fn entries_that_are_not_names_or_origins_are_refused_at_start() {
        for hosts in [
            &["https://registry.example.com"][..],
            &["a.example/mcp"],
            &["a b"],
            &["*x.example"],
        ] {
            let c = McpConfig {
                allowed_hosts: hosts.iter().map(|s| s.to_string()).collect(),
                allowed_origins: Vec::new(),
            };
            assert!(c.validate().is_err(), "{hosts:?}");
        }
        for origins in [
            &["app.example.org"][..],
            &["https://app.example.org/page"],
            &["ftp://a.example"],
        ] {
            let c = McpConfig {
                allowed_hosts: Vec::new(),
                allowed_origins: origins.iter().map(|s| s.to_string()).collect(),
            };
            assert!(c.validate().is_err(), "{origins:?}");
        }
        let c = McpConfig {
            allowed_hosts: vec![
                "Agentry.Internal".into(),
                "*.svc.cluster.local".into(),
                "[fd00::1]:8470".into(),
            ],
            allowed_origins: vec![
                "https://app.example.org/".into(),
                "http://localhost:3000".into(),
            ],
        };
        c.validate().unwrap();
    }
}
