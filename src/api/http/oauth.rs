//! OAuth 2.0 Protected Resource Metadata (RFC 9728): how a client that got
//! a 401 finds the authorization server whose tokens this registry takes.
//!
//! MCP clients (coding assistants, agent frameworks, the MCP SDKs) sign in
//! this way: on a 401 they read `resource_metadata` from the
//! `WWW-Authenticate` challenge, fetch that document, and run OAuth against
//! the authorization server it names, asking for a token for the resource
//! (RFC 8707); the token then passes the gate as any `[jwt]` token does.
//! So with `[jwt]` configured, every 401 of the facade names the document,
//! and the document names `jwt.issuer`. Without `[jwt]` there is no
//! authorization server to name: the documents answer 404 and challenges
//! stay plain, which sends such clients to their configured keys.
//!
//! The resource is `/mcp` for the MCP server (its document at
//! `/.well-known/oauth-protected-resource/mcp`, RFC 9728's path form) and
//! the registry's base URL for the rest of the API. The base is
//! `gateway.public_url` when set, else the scheme of this listener and the
//! request's `Host`, which is the URL the client itself used.

use axum::extract::State;
use axum::http::uri::Authority;
use axum::http::{header, HeaderMap, HeaderValue, Uri};
use axum::response::IntoResponse;
use serde_json::json;

use super::{ApiResult, HttpState};
use crate::service::ServiceError;

/// What the metadata needs from the configuration.
#[derive(Debug, Clone)]
pub struct ResourceServer {
    /// `jwt.issuer`: the one authorization server.
    pub issuer: String,
    /// `gateway.public_url`, without a trailing `/`.
    pub public_url: Option<String>,
    /// `https` when the public listeners speak TLS.
    pub scheme: &'static str,
}

/// Where the metadata documents live.
const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

impl ResourceServer {
    /// The registry's base URL as a request with this `Host` reached it.
    fn base(&self, host: Option<&HeaderValue>, uri: &Uri) -> String {
        if let Some(u) = &self.public_url {
            return u.clone();
        }
        // Only a host and port: the `Host` is the client's to write, and
        // anything else in it (a quote, user info) would change the
        // challenge or the document it is quoted in.
        let host = host
            .and_then(|v| v.to_str().ok())
            .and_then(|h| h.parse::<Authority>().ok())
            .or_else(|| uri.authority().cloned())
            .map(|a| match a.port() {
                Some(port) => format!("{}:{port}", a.host()),
                None => a.host().to_string(),
            })
            .unwrap_or_else(|| "localhost".into());
        format!("{}://{host}", self.scheme)
    }

    /// The `WWW-Authenticate` parameter of a 401 to a request for `uri`
    /// with this `Host`: the metadata of the resource it was for.
    pub fn challenge_parameter(&self, host: Option<&HeaderValue>, uri: &Uri) -> String {
        let suffix = if uri.path() == crate::api::mcp_server::MCP_PATH {
            crate::api::mcp_server::MCP_PATH
        } else {
            ""
        };
        format!(
            "resource_metadata=\"{}{WELL_KNOWN}{suffix}\"",
            self.base(host, uri)
        )
    }

    fn document(&self, resource: String) -> serde_json::Value {
        json!({
            "resource": resource,
            "authorization_servers": [self.issuer],
            "bearer_methods_supported": ["header"],
            "resource_name": "Agentry registry",
        })
    }
}

fn answer(s: &HttpState, headers: &HeaderMap, uri: &Uri, path: &str) -> ApiResult {
    let Some(server) = &s.oauth else {
        return Err(ServiceError::NotFound(
            "this registry names no OAuth authorization server ([jwt] is not configured); use an API key".into(),
        )
        .into());
    };
    let doc = server.document(format!(
        "{}{path}",
        server.base(headers.get(header::HOST), uri)
    ));
    let mut resp = super::json_response(axum::http::StatusCode::OK, &doc);
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    Ok(resp.into_response())
}

/// `GET /.well-known/oauth-protected-resource`: the registry's API.
pub(super) async fn registry(
    State(s): State<HttpState>,
    headers: HeaderMap,
    uri: Uri,
) -> ApiResult {
    answer(&s, &headers, &uri, "")
}

/// `GET /.well-known/oauth-protected-resource/mcp`: the MCP server.
pub(super) async fn mcp(State(s): State<HttpState>, headers: HeaderMap, uri: Uri) -> ApiResult {
    answer(&s, &headers, &uri, crate::api::mcp_server::MCP_PATH)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The base is the host and port the client used, and nothing else it
    /// wrote in its `Host`.
    #[test]
    fn the_base_takes_only_the_host_and_port_of_the_host_header() {
        let server = ResourceServer {
            issuer: "https://id.example".into(),
            public_url: None,
            scheme: "https",
        };
        let uri: Uri = "/mcp".parse().unwrap();
        let base = |host: &str| server.base(Some(&HeaderValue::from_str(host).unwrap()), &uri);
        assert_eq!(
            base("registry.example:8470"),
            "https://registry.example:8470"
        );
        assert_eq!(base("[::1]:8470"), "https://[::1]:8470");
        assert_eq!(base("user@registry.example"), "https://registry.example");
        assert_eq!(base("a\", b=\"c"), "https://localhost");
        assert_eq!(
            server.challenge_parameter(Some(&HeaderValue::from_static("x\"y")), &uri),
            "resource_metadata=\"https://localhost/.well-known/oauth-protected-resource/mcp\""
        );
    }
}
