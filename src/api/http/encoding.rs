//! Content codings on the facade (RFC 9110 8.4).
//!
//! Answers go out gzip-compressed to clients that accept it, which is
//! nearly all of them (browsers, Python's requests and httpx, Go's
//! net/http, `curl --compressed`, Prometheus): a directory's JSON shrinks
//! five- to tenfold on the wire. The documents crawlers fetch again and
//! again (the AI Catalog, the Web of Agents document) are compressed once
//! per version and kept, so a large directory's catalog costs no CPU per
//! fetch. Request bodies may arrive gzip-compressed as well (as gRPC's
//! may); the size limit applies to what they decode to, so a small
//! compressed body cannot inflate past it.

use std::collections::VecDeque;
use std::io::Read;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::OnceCell;
use tower_http::compression::predicate::{NotForContentType, Predicate, SizeAbove};
use tower_http::compression::{CompressionLayer, CompressionLevel};

use super::transport_refusal;

/// Answers smaller than this go out as they are: below it, gzip's framing
/// and the CPU cost more than the bytes saved.
pub(super) const MIN_COMPRESSED: usize = 1024;

/// gzip level 1 for answers and documents alike. Measured with zlib on the
/// demo directory's answers: a 10-hit discovery answer with evidence goes from 11.2 KB to
/// 3.1 KB in about 57 µs at level 1, and to 2.8 KB in 127 µs at level 6;
/// the 199-agent AI Catalog from 324 KB to 101 KB in 3.1 ms, or 89 KB in
/// 8.4 ms. A document is compressed again for each new version (at most
/// once a second under writes), so level 6's extra 12 % is not worth
/// nearly three times the CPU on a large directory either.
const LEVEL: u8 = 1;

/// `LEVEL` for flate2.
fn level() -> flate2::Compression {
    flate2::Compression::new(u32::from(LEVEL))
}

/// Compressed documents kept, each by its validator: the AI Catalog and
/// the Web of Agents document, each with room for the version before.
const DOCUMENTS_KEPT: usize = 4;

/// Compresses the facade's answers for clients that accept gzip, at
/// `LEVEL`. ETags stay as they are: a record's names its revision, which
/// clients send back in `If-Match` (a strong comparison); weakened, or
/// suffixed as Apache's `mod_deflate` once did, it would make every
/// conditional write of a client that accepts gzip fail with 412. Never event streams (each event must reach the client
/// when it is sent, not when a compressed block fills) and never answers
/// under `MIN_COMPRESSED`.
pub(super) fn compression() -> CompressionLayer<impl Predicate> {
    let size = u16::try_from(MIN_COMPRESSED).unwrap_or(u16::MAX);
    CompressionLayer::new()
        .no_br()
        .no_deflate()
        .no_zstd()
        .quality(CompressionLevel::Precise(i32::from(LEVEL)))
        .compress_when(
            SizeAbove::new(size)
                .and(NotForContentType::GRPC)
                .and(NotForContentType::SSE)
                .and(NotForContentType::IMAGES),
        )
}

/// Whether the client accepts a gzip-coded answer: `gzip` (or `x-gzip`)
/// or `*` listed with a non-zero weight, an explicit `gzip;q=0` winning
/// over `*`.
pub(super) fn accepts_gzip(headers: &HeaderMap) -> bool {
    let (mut gzip, mut any) = (None, None);
    let listed = headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    for item in listed {
        let mut params = item.split(';');
        let coding = params.next().unwrap_or("").trim().to_ascii_lowercase();
        let weight = params
            .filter_map(|p| {
                let (name, value) = p.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("q")
                    .then(|| value.trim().parse::<f32>().ok())?
            })
            .next()
            .unwrap_or(1.0);
        match coding.as_str() {
            "gzip" | "x-gzip" => gzip = Some(weight > 0.0),
            "*" => any = Some(weight > 0.0),
            _ => {}
        }
    }
    gzip.or(any).unwrap_or(false)
}

/// Compressed copies of whole documents, by their strong validator.
/// Several requests for a version not yet compressed wait for one
/// compression rather than each running their own.
#[derive(Default)]
pub struct DocumentCodings {
    kept: Mutex<VecDeque<(String, Arc<OnceCell<Bytes>>)>>,
}

impl DocumentCodings {
    /// A 200 answer carrying `body` as `content_type`, gzip-coded from the
    /// cache when the client accepts it and the body is worth it.
    pub(super) async fn answer(
        &self,
        request: &HeaderMap,
        etag: &str,
        content_type: &'static str,
        body: &Bytes,
    ) -> Response {
        let ctype = [(header::CONTENT_TYPE, content_type)];
        if body.len() < MIN_COMPRESSED || !accepts_gzip(request) {
            return (StatusCode::OK, ctype, body.clone()).into_response();
        }
        let Some(gz) = self.gzipped(etag, body).await else {
            return (StatusCode::OK, ctype, body.clone()).into_response();
        };
        (
            StatusCode::OK,
            ctype,
            [
                (header::CONTENT_ENCODING, "gzip"),
                (header::VARY, "accept-encoding"),
            ],
            gz,
        )
            .into_response()
    }

    /// The document compressed (once per version), or `None` if
    /// compressing failed, in which case it goes out as it is.
    async fn gzipped(&self, etag: &str, body: &Bytes) -> Option<Bytes> {
        let cell = {
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            match kept.iter().find(|(tag, _)| tag == etag) {
                Some((_, cell)) => cell.clone(),
                None => {
                    let cell = Arc::new(OnceCell::new());
                    if kept.len() == DOCUMENTS_KEPT {
                        kept.pop_front();
                    }
                    kept.push_back((etag.to_string(), cell.clone()));
                    cell
                }
            }
        };
        let body = body.clone();
        cell.get_or_try_init(|| async move {
            tokio::task::spawn_blocking(move || gzip(&body, level()))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())
        })
        .await
        .inspect_err(|e| tracing::warn!(error = %e, "compressing a document failed"))
        .ok()
        .cloned()
    }
}

fn gzip(body: &[u8], level: flate2::Compression) -> std::io::Result<Bytes> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 4), level);
    enc.write_all(body)?;
    Ok(Bytes::from(enc.finish()?))
}

/// The request body as sent, decoded when it came gzip-coded, and at most
/// `limit` bytes either way: 413 past it, 415 for a coding other than
/// gzip (RFC 9110 15.5.16), 400 for gzip that does not decode.
pub(crate) async fn decoded_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, tonic::Status> {
    let coding = request_coding(headers)?;
    let raw = super::read_body(body, limit).await?;
    if !coding {
        return Ok(raw);
    }
    let mut out = Vec::new();
    let read = flate2::read::MultiGzDecoder::new(&raw[..])
        .take(limit as u64 + 1)
        .read_to_end(&mut out);
    match read {
        Err(e) => Err(transport_refusal(
            400,
            format!("the request body is not valid gzip: {e}"),
        )),
        Ok(n) if n > limit => Err(transport_refusal(
            413,
            format!("request body is larger than the limit of {limit} bytes once decompressed"),
        )),
        Ok(_) => Ok(Bytes::from(out)),
    }
}

/// Whether the request body is gzip-coded (`Content-Encoding: gzip`);
/// an error for any coding the facade does not read.
fn request_coding(headers: &HeaderMap) -> Result<bool, tonic::Status> {
    let mut gzip = false;
    let codings = headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .map(|v| v.to_str().unwrap_or("?"))
        .flat_map(|v| v.split(','))
        .map(|c| c.trim().to_ascii_lowercase())
        .filter(|c| !c.is_empty() && c != "identity");
    for coding in codings {
        let is_gzip = coding == "gzip" || coding == "x-gzip";
        let why = if is_gzip && !gzip {
            gzip = true;
            continue;
        } else if is_gzip {
            "request bodies are read gzip-coded once, not twice (Content-Encoding names gzip twice)"
                .to_string()
        } else {
            format!(
                "request bodies may be sent gzip-coded or as they are, not as Content-Encoding '{coding}'"
            )
        };
        return Err(transport_refusal(415, why));
    }
    Ok(gzip)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with(name: header::HeaderName, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn accept_encoding_is_read_with_its_weights() {
        let accepts = |v: &str| accepts_gzip(&with(header::ACCEPT_ENCODING, v));
        assert!(accepts("gzip"));
        assert!(accepts("gzip, deflate, br, zstd"));
        assert!(accepts("br;q=1.0, GZIP;q=0.5"));
        assert!(accepts("*"));
        assert!(accepts("x-gzip"));
        assert!(!accepts("identity"));
        assert!(!accepts("br, deflate"));
        assert!(!accepts("gzip;q=0"));
        assert!(!accepts("gzip; q=0.0, *"));
        assert!(!accepts("*;q=0"));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[tokio::test]
    async fn gzip_request_bodies_decode_within_the_limit() {
        let json = br#"{"name":"Echo","description":"Echoes its input."}"#;
        let gz = gzip(json, flate2::Compression::default()).unwrap();
        let coded = with(header::CONTENT_ENCODING, "gzip");
        let got = decoded_body(&coded, Body::from(gz.clone()), 1024)
            .await
            .unwrap();
        assert_eq!(&got[..], &json[..]);

        // A body sent as it is passes through untouched.
        let plain = decoded_body(&HeaderMap::new(), Body::from(&json[..]), 1024)
            .await
            .unwrap();
        assert_eq!(&plain[..], &json[..]);

        // A few kilobytes that inflate past the limit are refused by what
        // they decode to.
        let bomb = gzip(&vec![b' '; 1 << 20], flate2::Compression::best()).unwrap();
        assert!(bomb.len() < 4096);
        let e = decoded_body(&coded, Body::from(bomb), 64 << 10)
            .await
            .unwrap_err();
        assert_eq!(crate::api::error::detail_of(&e).http_status, 413);

        let e = decoded_body(&coded, Body::from(&json[..]), 1024)
            .await
            .unwrap_err();
        assert_eq!(crate::api::error::detail_of(&e).http_status, 400);

        let br = with(header::CONTENT_ENCODING, "br");
        let e = decoded_body(&br, Body::from(gz), 1024).await.unwrap_err();
        let d = crate::api::error::detail_of(&e);
        assert_eq!(d.http_status, 415);
        assert!(d.message.contains("'br'"), "{}", d.message);
    }

    #[tokio::test]
    async fn a_document_is_compressed_once_per_version() {
        let codings = DocumentCodings::default();
        let body = Bytes::from(format!("[{}]", vec!["{\"a\":1}"; 400].join(",")));
        let gz = with(header::ACCEPT_ENCODING, "gzip");
        let first = codings.gzipped("\"v1\"", &body).await.unwrap();
        let again = codings.gzipped("\"v1\"", &body).await.unwrap();
        // The same allocation: served from the cache, not compressed again.
        assert_eq!(first.as_ptr(), again.as_ptr());
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&first[..])
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, body);

        let resp = codings
            .answer(&gz, "\"v1\"", "application/json", &body)
            .await;
        assert_eq!(resp.headers()[header::CONTENT_ENCODING], "gzip");
        let resp = codings
            .answer(&HeaderMap::new(), "\"v1\"", "application/json", &body)
            .await;
        assert!(!resp.headers().contains_key(header::CONTENT_ENCODING));
        let small = Bytes::from_static(b"{}");
        let resp = codings
            .answer(&gz, "\"v0\"", "application/json", &small)
            .await;
        assert!(!resp.headers().contains_key(header::CONTENT_ENCODING));

        // Older versions make way for newer ones.
        for v in 2..=(DOCUMENTS_KEPT + 1) {
            codings.gzipped(&format!("\"v{v}\""), &body).await.unwrap();
        }
        let kept = codings.kept.lock().unwrap();
        assert_eq!(kept.len(), DOCUMENTS_KEPT);
        assert!(kept.iter().all(|(tag, _)| tag != "\"v1\""));
    }
}
