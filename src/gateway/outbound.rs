//! Outbound safety (WoA 8.2): every request the gateway or the WoA crawler
//! sends leaves through one guarded HTTP client.
//!
//! A target is refused when it resolves only to loopback, private,
//! link-local or otherwise internal addresses, unless the operator's allow
//! list names the host or the address range. The check sits in the DNS
//! resolver the client connects with, so the address that was checked is the
//! address that is dialled (a second lookup cannot rebind it); IP literals,
//! which never reach a resolver, and every redirect target are checked
//! before the request goes out. Responses are read against a size limit and
//! a deadline; nothing in them is interpreted here.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use url::Url;

/// Why an outbound request was not sent, or its answer not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutboundError {
    /// The policy refuses the target (internal address, scheme, redirect).
    #[error("the outbound policy refuses {target}: {reason}")]
    Refused { target: String, reason: String },
    /// The answer is larger than the limit.
    #[error("the response from {target} is larger than the limit of {limit} bytes")]
    TooLarge { target: String, limit: usize },
    /// No answer within the deadline.
    #[error("{target} did not answer within {ms} ms")]
    Timeout { target: String, ms: u128 },
    /// The target could not be reached or the connection broke.
    #[error("cannot reach {target}: {reason}")]
    Unreachable { target: String, reason: String },
}

/// An IP address range in CIDR notation (a bare address is a /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let net: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("'{s}' is not an IP address or CIDR range"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("'{s}': the prefix length must be 0..={max}"))?,
        };
        Ok(Self { net, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, canonical(ip)) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), self.prefix),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), self.prefix),
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let whole = usize::from(bits / 8);
    let rest = bits % 8;
    if a[..whole] != b[..whole] {
        return false;
    }
    rest == 0 || {
        let mask = 0xffu8 << (8 - rest);
        a[whole] & mask == b[whole] & mask
    }
}

/// An IPv4 address written as IPv6 (mapped or compatible) is judged as
/// the IPv4 address it carries.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

fn v4_internal(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        // Shared address space (RFC 6598, carrier-grade NAT).
        || (a == 100 && (64..128).contains(&b))
        // IETF protocol assignments (RFC 6890), benchmarking (RFC 2544).
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (b == 18 || b == 19))
        // Reserved for future use.
        || a >= 240
}

fn v6_internal(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        // Unique local (fc00::/7) and link-local (fe80::/10).
        || (s[0] & 0xfe00) == 0xfc00
        || (s[0] & 0xffc0) == 0xfe80
        // Documentation (2001:db8::/32).
        || (s[0] == 0x2001 && s[1] == 0x0db8)
        // Tunnels that can carry an internal IPv4 address: Teredo
        // (2001::/32), 6to4 (2002::/16) and NAT64 (64:ff9b::/96).
        || (s[0] == 0x2001 && s[1] == 0)
        || s[0] == 0x2002
        || (s[0] == 0x64 && s[1] == 0xff9b)
}

/// Whether an address is loopback, private, link-local or otherwise not a
/// public unicast address.
pub fn is_internal(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => v4_internal(v4),
        IpAddr::V6(v6) => v6_internal(v6),
    }
}

/// Whether a lower-case host name matches a lower-case allow-list entry:
/// the name itself, or `*.example.internal` for every name under that
/// domain (not the domain itself). The one reading of host-name entries,
/// for what the gateway may call and for the names `/mcp` answers to.
pub fn host_pattern_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(domain) => host
            .strip_suffix(domain)
            .is_some_and(|rest| rest.ends_with('.')),
        None => pattern == host,
    }
}

/// What may be contacted, and how patiently.
#[derive(Debug, Clone)]
pub struct OutboundPolicy {
    /// Internal ranges the operator allows.
    pub allowed_nets: Vec<Cidr>,
    /// Host names the operator allows whatever they resolve to: exact
    /// names, or `*.example.internal` for every name under a domain.
    pub allowed_hosts: Vec<String>,
    /// Plain `http://` targets (WoA 8.1: never on the open Internet).
    pub allow_http: bool,
    pub connect_timeout: Duration,
    /// Deadline for a whole answer (or, when streaming, between events).
    pub timeout: Duration,
    pub max_response_bytes: usize,
    pub max_redirects: usize,
}

impl Default for OutboundPolicy {
    fn default() -> Self {
        Self {
            allowed_nets: Vec::new(),
            allowed_hosts: Vec::new(),
            allow_http: false,
            connect_timeout: Duration::from_secs(3),
            timeout: Duration::from_secs(30),
            max_response_bytes: 4 * 1024 * 1024,
            max_redirects: 5,
        }
    }
}

impl OutboundPolicy {
    /// Reads allow-list entries: CIDR ranges or addresses, else host names.
    pub fn allow(mut self, entries: &[String]) -> Result<Self, String> {
        for e in entries {
            let e = e.trim();
            if e.is_empty() {
                continue;
            }
            if e.parse::<IpAddr>().is_ok() || e.contains('/') {
                self.allowed_nets.push(Cidr::parse(e)?);
            } else if e
                .trim_start_matches("*.")
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
            {
                self.allowed_hosts.push(e.to_ascii_lowercase());
            } else {
                return Err(format!(
                    "'{e}' is neither an IP range nor a host name (use e.g. 10.0.0.0/8 or agents.internal)"
                ));
            }
        }
        Ok(self)
    }

    pub fn permits_ip(&self, ip: IpAddr) -> bool {
        !is_internal(ip) || self.allowed_nets.iter().any(|n| n.contains(ip))
    }

    pub fn host_allowed(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.allowed_hosts
            .iter()
            .any(|h| host_pattern_matches(h, &host))
    }

    /// The checks that need no DNS: scheme, credentials in the URL, and IP
    /// literals (which a resolver never sees).
    pub fn check_url(&self, url: &Url) -> Result<(), OutboundError> {
        let refuse = |reason: String| OutboundError::Refused {
            target: redacted(url),
            reason,
        };
        match url.scheme() {
            "https" => {}
            "http" if self.allow_http => {}
            "http" => {
                return Err(refuse(
                    "plain http is not allowed (gateway.outbound.allow_http)".into(),
                ))
            }
            other => return Err(refuse(format!("scheme '{other}' is not allowed"))),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(refuse("URLs with credentials are not followed".into()));
        }
        let ip = match url.host() {
            Some(url::Host::Ipv4(v4)) => IpAddr::V4(v4),
            Some(url::Host::Ipv6(v6)) => IpAddr::V6(v6),
            Some(url::Host::Domain(_)) => return Ok(()),
            None => return Err(refuse("the URL names no host".into())),
        };
        if self.permits_ip(ip) {
            Ok(())
        } else {
            Err(refuse(format!(
                "{ip} is an internal address (allow it in gateway.outbound.allow)"
            )))
        }
    }

    /// Filters resolved addresses: all of them for an allowed host, else
    /// only those the policy permits; none left is a refusal.
    pub fn filter_resolved(
        &self,
        host: &str,
        addrs: Vec<SocketAddr>,
    ) -> Result<Vec<SocketAddr>, OutboundError> {
        if self.host_allowed(host) {
            return Ok(addrs);
        }
        let (ok, refused): (Vec<_>, Vec<_>) =
            addrs.into_iter().partition(|a| self.permits_ip(a.ip()));
        if ok.is_empty() {
            let shown: Vec<String> = refused.iter().map(|a| a.ip().to_string()).collect();
            return Err(OutboundError::Refused {
                target: host.to_string(),
                reason: if shown.is_empty() {
                    "the name does not resolve".into()
                } else {
                    format!(
                        "it resolves only to internal addresses ({}); allow the host or range in gateway.outbound.allow",
                        shown.join(", ")
                    )
                },
            });
        }
        Ok(ok)
    }
}

/// A URL as shown in errors and logs: no credentials, no query.
pub fn redacted(url: &Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.set_fragment(None);
    u.to_string()
}

type LookupFuture = Pin<Box<dyn Future<Output = std::io::Result<Vec<SocketAddr>>> + Send>>;

/// Name lookup, replaceable so tests can make a name resolve to a private
/// address without touching the system's resolver.
pub type Lookup = Arc<dyn Fn(String) -> LookupFuture + Send + Sync>;

/// The system resolver (getaddrinfo through tokio).
pub fn system_lookup() -> Lookup {
    Arc::new(|host: String| {
        Box::pin(async move { Ok(tokio::net::lookup_host((host.as_str(), 0)).await?.collect()) })
    })
}

struct GuardedResolver {
    policy: Arc<OutboundPolicy>,
    lookup: Lookup,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        let lookup = self.lookup.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs = lookup(host.clone()).await?;
            let ok = policy.filter_resolved(&host, addrs)?;
            let addrs: reqwest::dns::Addrs = Box::new(ok.into_iter());
            Ok(addrs)
        })
    }
}

/// Builds the guarded client outbound traffic uses, trusting `tls`'s
/// roots besides the web PKI's and presenting its certificate, if any.
pub fn client(
    policy: Arc<OutboundPolicy>,
    lookup: Lookup,
    tls: super::tls::TlsMaterial,
) -> Result<reqwest::Client, String> {
    let redirects = policy.clone();
    let mut builder = reqwest::Client::builder();
    for root in tls.roots {
        builder = builder.add_root_certificate(root);
    }
    if let Some(identity) = tls.identity {
        builder = builder.identity(identity);
    }
    builder
        .dns_resolver(Arc::new(GuardedResolver {
            policy: policy.clone(),
            lookup,
        }))
        .redirect(reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > redirects.max_redirects {
                let target = redacted(attempt.url());
                return attempt.error(OutboundError::Refused {
                    target,
                    reason: format!("more than {} redirects", redirects.max_redirects),
                });
            }
            match redirects.check_url(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(e) => attempt.error(e),
            }
        }))
        // The guard must see the real target, never a proxy's address.
        .no_proxy()
        .connect_timeout(policy.connect_timeout)
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(60))
        .user_agent(concat!("agentry/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| crate::error_chain(&e))
}

/// Turns a client error into the outbound error it stands for: a policy
/// refusal raised in the resolver or the redirect check is found in the
/// error's source chain.
pub fn classify(e: &reqwest::Error, target: &Url, timeout: Duration) -> OutboundError {
    if let Some(refusal) = refusal_in(e) {
        return refusal;
    }
    let target = redacted(target);
    if e.is_timeout() {
        return OutboundError::Timeout {
            target,
            ms: timeout.as_millis(),
        };
    }
    OutboundError::Unreachable {
        target,
        reason: crate::error_chain(e),
    }
}

/// The outbound guard's refusal somewhere in `e`'s chain of causes (a
/// client that connects through the guard reports it as a cause).
pub fn refusal_in(e: &(dyn std::error::Error + 'static)) -> Option<OutboundError> {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(o) = c.downcast_ref::<OutboundError>() {
            return Some(o.clone());
        }
        cause = c.source();
    }
    None
}

/// Reads a whole answer body, refusing it once it passes `limit` bytes.
pub async fn read_limited(
    mut resp: reqwest::Response,
    limit: usize,
    timeout: Duration,
) -> Result<Vec<u8>, OutboundError> {
    let target = redacted(resp.url());
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Err(OutboundError::TooLarge { target, limit });
    }
    let mut body = Vec::new();
    let read = async {
        while let Some(chunk) = resp.chunk().await.map_err(|e| OutboundError::Unreachable {
            target: target.clone(),
            reason: format!("the answer broke off: {e}"),
        })? {
            if body.len() + chunk.len() > limit {
                return Err(OutboundError::TooLarge {
                    target: target.clone(),
                    limit,
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(r) => r.map(|()| body),
        Err(_) => Err(OutboundError::Timeout {
            target,
            ms: timeout.as_millis(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn internal_ranges_are_recognised() {
        for s in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:10.0.0.1",
            "::ffff:127.0.0.1",
            "2002:7f00:1::",
            "64:ff9b::a00:1",
        ] {
            assert!(is_internal(ip(s)), "{s} should be internal");
        }
        for s in ["93.184.216.34", "8.8.8.8", "172.32.0.1", "2606:4700::1111"] {
            assert!(!is_internal(ip(s)), "{s} should be public");
        }
    }

    #[test]
    fn cidr_allow_lists_match_by_prefix() {
        let p = OutboundPolicy::default()
            .allow(&[
                "10.20.0.0/16".into(),
                "127.0.0.1".into(),
                "*.svc.internal".into(),
            ])
            .unwrap();
        assert!(p.permits_ip(ip("10.20.3.4")));
        assert!(!p.permits_ip(ip("10.21.0.1")));
        assert!(p.permits_ip(ip("127.0.0.1")));
        assert!(!p.permits_ip(ip("127.0.0.2")));
        assert!(p.host_allowed("echo.svc.internal"));
        assert!(!p.host_allowed("svc.internal"));
        assert!(!p.host_allowed("evilsvc.internal"));
        assert!(OutboundPolicy::default()
            .allow(&["10.0.0.0/33".into()])
            .is_err());
        assert!(OutboundPolicy::default()
            .allow(&["bad host!".into()])
            .is_err());
    }

    #[test]
    fn urls_are_checked_before_any_lookup() {
        let p = OutboundPolicy::default();
        let check = |u: &str| p.check_url(&Url::parse(u).unwrap());
        assert!(check("https://agents.example/x").is_ok());
        assert!(check("http://agents.example/x").is_err());
        assert!(check("https://127.0.0.1/x").is_err());
        assert!(check("https://[::1]:8443/x").is_err());
        assert!(check("https://169.254.169.254/latest/meta-data").is_err());
        assert!(check("https://user:pw@agents.example/").is_err());
        assert!(check("ftp://agents.example/").is_err());
    }

    #[test]
    fn resolved_names_keep_only_permitted_addresses() {
        let p = OutboundPolicy::default();
        let sa = |s: &str| SocketAddr::new(ip(s), 0);
        let err = p
            .filter_resolved("db.corp.example", vec![sa("10.0.0.5")])
            .unwrap_err();
        assert!(err.to_string().contains("10.0.0.5"), "{err}");
        let mixed = p
            .filter_resolved("cdn.example", vec![sa("10.0.0.5"), sa("93.184.216.34")])
            .unwrap();
        assert_eq!(mixed, vec![sa("93.184.216.34")]);
        let allowed = OutboundPolicy::default()
            .allow(&["db.corp.example".into()])
            .unwrap()
            .filter_resolved("db.corp.example", vec![sa("10.0.0.5")])
            .unwrap();
        assert_eq!(allowed.len(), 1);
    }

    /// A name that resolves to a private address is refused at connect
    /// time by the client itself: the request never leaves.
    #[tokio::test]
    async fn the_client_refuses_a_name_resolving_to_a_private_address() {
        let policy = Arc::new(OutboundPolicy {
            allow_http: true,
            ..Default::default()
        });
        let lookup: Lookup = Arc::new(|_host: String| {
            Box::pin(async { Ok(vec![SocketAddr::new(ip("192.168.7.7"), 0)]) })
        });
        let c = client(policy.clone(), lookup, Default::default()).unwrap();
        let url = Url::parse("http://printer.example/").unwrap();
        let e = c.get(url.clone()).send().await.unwrap_err();
        match classify(&e, &url, policy.timeout) {
            OutboundError::Refused { target, reason } => {
                assert_eq!(target, "printer.example");
                assert!(reason.contains("192.168.7.7"), "{reason}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}
