//! The request head's own rules, checked before any route is chosen.
//!
//! hyper reads the framing strictly (a request with two different
//! `Content-Length`s never arrives here) but hands the other fields over as
//! they came. Two of anything the facade reads as one value, or a `Host`
//! that is missing, malformed or contradicts the request's authority, could
//! be read one way by a proxy in front and another here (the first of two
//! `Host`s routed, the second checked), so such a request is refused with
//! the error body instead of being read by a guess. RFC 9112 3.2 asks for
//! exactly this 400 on `Host`; the others are single-valued by their own
//! definitions.

use axum::extract::Request;
use axum::http::{header, HeaderMap, Uri, Version};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{invalid, ApiError};

/// Request headers the facade (or the MCP server behind it) reads as one
/// value. `Authorization` is the gate's, which refuses two for every
/// listener; list-valued ones (`Accept`, `Content-Encoding`, `If-Match`)
/// may repeat.
const SINGLE_VALUED: &[&str] = &[
    "content-type",
    "origin",
    "if-modified-since",
    "if-unmodified-since",
    "idempotency-key",
    "last-event-id",
    "mcp-session-id",
    "mcp-protocol-version",
    "agent-authorization",
    "x-request-id",
];

/// Middleware: the request as it came, or a 400 naming what is wrong.
pub(super) async fn check_request_head(req: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    match head_error(req.version(), req.uri(), req.headers()) {
        None => next.run(req).await,
        Some(e) => {
            let response = e.into_response();
            crate::metrics::observe_unrouted(
                "http",
                response.status().as_u16().to_string(),
                started.elapsed(),
            );
            response
        }
    }
}

fn head_error(version: Version, uri: &Uri, headers: &HeaderMap) -> Option<ApiError> {
    let mut hosts = headers.get_all(header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (None, _) if version == Version::HTTP_11 => {
            return Some(invalid(
                None,
                "an HTTP/1.1 request must name its host (a Host header)",
            ));
        }
        (None, _) => {}
        (Some(host), None) => {
            let text = host.to_str().unwrap_or("\u{fffd}");
            if !text.is_empty() && !valid_host(text) {
                return Some(invalid(
                    None,
                    format!("Host {text:?} is not a host name or address with an optional port"),
                ));
            }
            if let Some(authority) = uri.authority() {
                if !authority.as_str().eq_ignore_ascii_case(text) {
                    return Some(invalid(
                        None,
                        format!(
                            "Host {text:?} differs from the request's authority {:?}",
                            authority.as_str()
                        ),
                    ));
                }
            }
        }
        (Some(_), Some(_)) => {
            return Some(invalid(
                None,
                format!("send one Host header, not {}", 2 + hosts.count()),
            ));
        }
    }
    SINGLE_VALUED.iter().find_map(|name| {
        let n = headers.get_all(*name).iter().count();
        (n > 1).then(|| {
            invalid(
                None,
                format!("send one {} header, not {n}", display_name(name)),
            )
        })
    })
}

/// `host[:port]` as RFC 9110 7.2 has it: a name, an IPv4 address or a
/// bracketed IPv6 one, without user information.
fn valid_host(text: &str) -> bool {
    if text.contains('@') || text.parse::<axum::http::uri::Authority>().is_err() {
        return false;
    }
    // The parse above checks the characters; the port it leaves unread.
    let host_end = if text.starts_with('[') {
        text.find(']').map_or(0, |i| i + 1)
    } else {
        text.find(':').unwrap_or(text.len())
    };
    let port = &text[host_end..];
    host_end > 0
        && (port.is_empty()
            || port
                .strip_prefix(':')
                .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit())))
}

/// A header's name as people write it (`Content-Type`), for the message.
fn display_name(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect::<Vec<_>>()
        .join("-")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    /// Header lines, in order.
    type Lines = &'static [(&'static str, &'static str)];

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn refusal(
        version: Version,
        uri: &str,
        pairs: &[(&'static str, &'static str)],
    ) -> Option<String> {
        let uri: Uri = uri.parse().unwrap();
        head_error(version, &uri, &headers(pairs)).map(|e| e.0.message().to_string())
    }

    #[test]
    fn a_well_formed_head_passes() {
        let ok: &[(Version, &str, Lines)] = &[
            (
                Version::HTTP_11,
                "/agents",
                &[("host", "registry.example.com")],
            ),
            (
                Version::HTTP_11,
                "/agents",
                &[
                    ("host", "127.0.0.1:8470"),
                    ("content-type", "application/json"),
                ],
            ),
            (Version::HTTP_11, "/agents", &[("host", "[::1]:8470")]),
            // Empty when the target has no authority (RFC 9112 3.2).
            (Version::HTTP_11, "/agents", &[("host", "")]),
            (Version::HTTP_10, "/agents", &[]),
            // HTTP/2 names its host in :authority.
            (Version::HTTP_2, "http://127.0.0.1:8470/agents", &[]),
            (
                Version::HTTP_2,
                "http://Registry.Example.com/agents",
                &[("host", "registry.example.com")],
            ),
            // List-valued headers may repeat.
            (
                Version::HTTP_11,
                "/agents",
                &[
                    ("host", "a"),
                    ("accept", "text/html"),
                    ("accept", "*/*"),
                    ("if-none-match", "\"1\""),
                    ("if-none-match", "\"2\""),
                ],
            ),
        ];
        for (version, uri, pairs) in ok {
            assert_eq!(
                refusal(*version, uri, pairs),
                None,
                "{version:?} {uri} {pairs:?}"
            );
        }
    }

    #[test]
    fn a_host_missing_repeated_malformed_or_contradicting_is_refused() {
        let refused: &[(Version, &str, Lines, &str)] = &[
            (Version::HTTP_11, "/agents", &[], "must name its host"),
            (
                Version::HTTP_11,
                "/agents",
                &[("host", "a"), ("host", "b")],
                "one Host header, not 2",
            ),
            (
                Version::HTTP_2,
                "http://a/agents",
                &[("host", "a"), ("host", "a")],
                "one Host header, not 2",
            ),
            (
                Version::HTTP_11,
                "/agents",
                &[("host", "a b")],
                "is not a host name",
            ),
            (
                Version::HTTP_11,
                "/agents",
                &[("host", "user@a")],
                "is not a host name",
            ),
            (
                Version::HTTP_11,
                "/agents",
                &[("host", "a:port")],
                "is not a host name",
            ),
            (
                Version::HTTP_11,
                "/agents",
                &[("host", "::1")],
                "is not a host name",
            ),
            (
                Version::HTTP_11,
                "/agents",
                &[("host", "[::1]x")],
                "is not a host name",
            ),
            (
                Version::HTTP_2,
                "http://a/agents",
                &[("host", "b")],
                "differs from the request's authority",
            ),
            (
                Version::HTTP_11,
                "http://a/agents",
                &[("host", "b")],
                "differs from the request's authority",
            ),
        ];
        for (version, uri, pairs, says) in refused {
            let e = refusal(*version, uri, pairs).unwrap_or_default();
            assert!(e.contains(says), "{version:?} {uri} {pairs:?}: {e:?}");
        }
    }

    #[test]
    fn a_single_valued_header_sent_twice_is_refused_by_name() {
        for name in SINGLE_VALUED {
            let mut h = headers(&[("host", "a")]);
            h.append(*name, HeaderValue::from_static("x"));
            assert_eq!(
                head_error(Version::HTTP_11, &"/".parse().unwrap(), &h)
                    .map(|e| e.0.message().to_string()),
                None
            );
            h.append(*name, HeaderValue::from_static("x"));
            let e = head_error(Version::HTTP_11, &"/".parse().unwrap(), &h)
                .map(|e| e.0.message().to_string())
                .unwrap_or_default();
            assert!(
                e.contains(&format!("send one {} header, not 2", display_name(name))),
                "{name}: {e}"
            );
        }
        assert_eq!(display_name("content-type"), "Content-Type");
        assert_eq!(display_name("mcp-session-id"), "Mcp-Session-Id");
    }
}
