//! The directory web page at `/ui`: one HTML document, one script and one
//! stylesheet, compiled into the binary so a node serves its own page with
//! no CDN, no external fonts and no build step beyond cargo.
//!
//! The page is static and carries no data: its script calls the same JSON
//! API as any client (`POST /discover`, `GET /agents/{id}`,
//! `GET /.well-known/agentry.json`, `GET /cluster`), sending the caller's
//! token as `Authorization: Bearer …` from the page's memory, never in a
//! URL. So the page itself loads without credentials (a Read-class route the
//! gate admits anonymously, rate-limited like any read), and what it then
//! shows is exactly what the caller's credentials may read.
//!
//! Records are written by untrusted publishers, so the script renders them
//! with DOM APIs and `textContent` only; the Content-Security-Policy below
//! allows scripts and styles from this origin alone (no inline script, no
//! `eval`), so even a rendering mistake could not run a publisher's markup.

use std::sync::LazyLock;

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::ApiError;
use crate::service::ServiceError;

const INDEX_HTML: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const STYLE_CSS: &str = include_str!("ui/style.css");

/// Same-origin scripts, styles and API calls only; nothing may frame the
/// page, and forms cannot post anywhere (the page submits through script).
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// One embedded file with its content type and strong validator.
struct Asset {
    body: &'static str,
    content_type: &'static str,
    etag: String,
}

impl Asset {
    fn new(body: &'static str, content_type: &'static str) -> Self {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(body.as_bytes());
        let etag = format!("\"{}\"", crate::crypto::hex(&digest[..12]));
        Self {
            body,
            content_type,
            etag,
        }
    }

    /// The file, or 304 when the browser already holds this version.
    /// `no-cache` rather than a max-age: the names are not fingerprinted,
    /// so a browser revalidates (a few bytes) and never runs a stale script
    /// against a newer node.
    fn respond(&self, headers: &HeaderMap) -> Response {
        let fresh = headers
            .get(header::IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(',').any(|t| t.trim() == self.etag));
        let status = if fresh {
            StatusCode::NOT_MODIFIED
        } else {
            StatusCode::OK
        };
        let body = if fresh { "" } else { self.body };
        let mut resp = (status, body).into_response();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(self.content_type),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        if let Ok(v) = HeaderValue::from_str(&self.etag) {
            h.insert(header::ETAG, v);
        }
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        );
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        h.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
        resp
    }
}

static PAGE: LazyLock<Asset> = LazyLock::new(|| Asset::new(INDEX_HTML, "text/html; charset=utf-8"));
static SCRIPT: LazyLock<Asset> =
    LazyLock::new(|| Asset::new(APP_JS, "text/javascript; charset=utf-8"));
static STYLE: LazyLock<Asset> = LazyLock::new(|| Asset::new(STYLE_CSS, "text/css; charset=utf-8"));

/// `GET /ui`: the page. Views are hash routes (`/ui#/agent/<id>`), so one
/// document serves them all and ids never reach the server's logs.
pub(super) async fn page(headers: HeaderMap) -> Response {
    PAGE.respond(&headers)
}

/// `GET /ui/assets/{name}`: the page's script and stylesheet.
pub(super) async fn asset(Path(name): Path<String>, headers: HeaderMap) -> Response {
    match name.as_str() {
        "app.js" => SCRIPT.respond(&headers),
        "style.css" => STYLE.respond(&headers),
        _ => ApiError::from(ServiceError::NotFound(format!(
            "the page has no asset '{name}'"
        )))
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page's first load (HTML, script, stylesheet; the facade does not
    /// compress) stays within the 200 KB budget.
    #[test]
    fn first_load_stays_small() {
        let bytes = INDEX_HTML.len() + APP_JS.len() + STYLE_CSS.len();
        assert!(bytes < 200 * 1024, "{bytes}");
    }

    #[test]
    fn the_page_has_no_inline_script_or_external_origin() {
        assert!(!INDEX_HTML.contains("<script>"));
        for text in [INDEX_HTML, APP_JS, STYLE_CSS] {
            assert!(!text.contains("http://") && !text.contains("https://"));
        }
        // Record data is never parsed as markup.
        assert!(!APP_JS.contains("innerHTML") && !APP_JS.contains("outerHTML"));
        assert!(!APP_JS.contains("insertAdjacentHTML") && !APP_JS.contains("eval("));
    }

    #[test]
    fn a_matching_validator_answers_not_modified() {
        let mut h = HeaderMap::new();
        h.insert(header::IF_NONE_MATCH, PAGE.etag.parse().unwrap());
        assert_eq!(PAGE.respond(&h).status(), StatusCode::NOT_MODIFIED);
        assert_eq!(PAGE.respond(&HeaderMap::new()).status(), StatusCode::OK);
    }
}
