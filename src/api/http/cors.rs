//! Cross-origin requests (CORS): which browser pages on other origins may
//! call the facade and read its answers.
//!
//! A page served from another origin (an operator's console, a catalogue
//! browser, a web-based MCP client) can only read an answer that names its
//! origin in `Access-Control-Allow-Origin`, and before any request that is
//! not "simple" (a bearer key, a JSON body, PUT or DELETE) the browser asks
//! first with an `OPTIONS` preflight. Without both, a browser client of
//! another origin cannot use the registry at all.
//!
//! Who may: on every route but `/mcp`, the pages of `cors.allowed_origins`
//! (none by default: an intranet registry read anonymously must not become
//! readable to any site its users visit; `*` opens it to every page). On
//! `/mcp`, the pages its own DNS-rebinding check admits (`mcp_origin`:
//! loopback, the node's own names, `mcp.allowed_origins`), so a page that
//! may call `/mcp` can also read the answer.
//!
//! Answers name the page's origin (or `*` when every page may) and never
//! allow credentials: callers authenticate with a bearer key or token that
//! the page sends itself, not with cookies. A preflight is answered here,
//! before the gate: browsers send it without credentials by definition, it
//! reads nothing and its answer is constant, like the answers to unrouted
//! requests; the request that follows passes the gate as always. A
//! preflight from a page that may not call is refused with 403 and the
//! error body, which the page's developer sees in the browser's network
//! log.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::{ApiError, HttpState};
use crate::api::mcp_origin::OriginList;
use crate::service::ServiceError;

/// `[cors]`: browser origins whose pages may call the facade's routes
/// other than `/mcp` (env `AGENTRY_CORS_ALLOWED_ORIGINS`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CorsConfig {
    /// `https://console.example.com`, or `*` for every page.
    pub allowed_origins: Vec<String>,
}

impl CorsConfig {
    /// Checks the entries parse (the same parser the policy uses).
    pub fn validate(&self) -> Result<(), String> {
        CorsPolicy::new(self).map(|_| ())
    }
}

/// The compiled `[cors]`.
#[derive(Debug, Clone, Default)]
pub struct CorsPolicy {
    origins: OriginList,
}

impl CorsPolicy {
    pub fn new(config: &CorsConfig) -> Result<Self, String> {
        Ok(Self {
            origins: OriginList::parse(&config.allowed_origins, "cors.allowed_origins")?,
        })
    }

    /// The origins admitted, for the start-up log; `None` when none are.
    pub fn describe(&self) -> Option<String> {
        (!self.origins.is_empty()).then(|| self.origins.describe())
    }
}

/// Headers of the facade's answers that a page reads beyond the ones
/// browsers always show it (`content-type`, `cache-control`,
/// `last-modified`, ...).
const EXPOSED: &str = "etag, location, retry-after, www-authenticate, content-disposition, \
     x-request-id, x-agentry-leader, x-agentry-applied-revision, x-agentry-binding, \
     x-agentry-output-check, x-agentry-output-error, idempotent-replayed, agent-authenticate, \
     mcp-session-id, mcp-protocol-version";

/// Every method a route of the facade answers.
const METHODS: &str = "GET, HEAD, POST, PUT, PATCH, DELETE";

/// How long a browser may reuse a preflight's answer (Chromium caps it at
/// two hours, Firefox at a day).
const PREFLIGHT_MAX_AGE_SECS: &str = "600";

/// What a request's page may see.
enum Grant {
    /// Every page (`*`).
    Any,
    /// The page whose origin the request carries.
    Page(HeaderValue),
    None,
}

/// The CORS layer around the whole facade (its refusals, the gate's among
/// them, carry the headers too, so a page can read why it was refused).
pub async fn cors(State(state): State<HttpState>, req: Request, next: Next) -> Response {
    let mcp = req.uri().path() == crate::api::mcp_server::MCP_PATH;
    let origin = req.headers().get(header::ORIGIN).cloned();
    let grant = match origin.clone() {
        // `/mcp` follows its own check, which explains a refusal itself.
        Some(o) if mcp => state
            .mcp_origins
            .check(req.headers(), req.uri())
            .map(|()| Grant::Page(o)),
        None if mcp => Ok(Grant::None),
        _ if state.cors.origins.any() => Ok(Grant::Any),
        Some(o) if state.cors.origins.admits(o.to_str().unwrap_or_default()) => Ok(Grant::Page(o)),
        Some(o) => Err(ServiceError::Forbidden(format!(
            "pages of origin '{}' may not call this registry from a browser; an operator lists them in cors.allowed_origins",
            o.to_str().unwrap_or_default().chars().take(200).collect::<String>()
        ))),
        None => Ok(Grant::None),
    };
    // Answers differ by `Origin` wherever a list decides: caches must not
    // serve one page's answer to another.
    let varies = mcp || !state.cors.origins.any() && !state.cors.origins.is_empty();
    let preflight = req.method() == Method::OPTIONS
        && origin.is_some()
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if preflight {
        return match grant {
            Ok(grant) => preflight_answer(grant, req.headers(), varies),
            Err(e) => {
                let mut refused = ApiError::from(e).into_response();
                vary(refused.headers_mut(), varies);
                refused
            }
        };
    }
    let mut response = next.run(req).await;
    let headers = response.headers_mut();
    allow(headers, grant.unwrap_or(Grant::None));
    vary(headers, varies);
    response
}

fn allow(headers: &mut HeaderMap, grant: Grant) {
    let origin = match grant {
        Grant::Any => HeaderValue::from_static("*"),
        Grant::Page(o) => o,
        Grant::None => return,
    };
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(EXPOSED),
    );
}

fn vary(headers: &mut HeaderMap, varies: bool) {
    if varies {
        headers.append(header::VARY, HeaderValue::from_static("origin"));
    }
}

/// 204 with what an admitted page may send: every method, the headers it
/// asked for (any: the page is trusted, and SDKs add their own), and, when
/// the page is public and this node private, Chromium's Private Network
/// Access consent (the operator listed the page). A preflight carries an
/// `Origin`, so its grant names a page or every page.
fn preflight_answer(grant: Grant, asked: &HeaderMap, varies: bool) -> Response {
    let mut response = axum::http::StatusCode::NO_CONTENT.into_response();
    let headers = response.headers_mut();
    allow(headers, grant);
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static(METHODS),
    );
    if let Some(h) = asked.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, h.clone());
    }
    headers.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static(PREFLIGHT_MAX_AGE_SECS),
    );
    if asked
        .get("access-control-request-private-network")
        .is_some_and(|v| v == "true")
    {
        headers.insert(
            "access-control-allow-private-network",
            HeaderValue::from_static("true"),
        );
    }
    vary(headers, varies);
    if varies {
        headers.append(
            header::VARY,
            HeaderValue::from_static(
                "access-control-request-method, access-control-request-headers",
            ),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(origins: &[&str]) -> CorsConfig {
        CorsConfig {
            allowed_origins: origins.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn listed_origins_are_matched_as_origins_and_bad_entries_refused_at_start() {
        let p = CorsPolicy::new(&config(&[
            "https://Console.Example.com/",
            "http://localhost:3000",
        ]))
        .unwrap();
        assert!(p.origins.admits("https://console.example.com"));
        assert!(p.origins.admits("https://console.example.com:443"));
        assert!(p.origins.admits("http://localhost:3000"));
        for other in [
            "https://console.example.com:8443",
            "http://console.example.com",
            "http://localhost:3001",
            "null",
            "",
        ] {
            assert!(!p.origins.admits(other), "{other}");
        }
        assert_eq!(CorsPolicy::default().describe(), None);
        assert_eq!(
            CorsPolicy::new(&config(&["*"]))
                .unwrap()
                .describe()
                .as_deref(),
            Some("any (*)")
        );
        for bad in [
            "console.example.com",
            "https://a.example/app",
            "ftp://a.example",
        ] {
            let e = config(&[bad]).validate().unwrap_err();
            assert!(e.contains("cors.allowed_origins") && e.contains(bad), "{e}");
        }
    }
}
