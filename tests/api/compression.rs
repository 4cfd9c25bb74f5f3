//! Content codings on the facade: answers gzip-coded for clients that
//! accept it (Python's `requests` among them, as it comes), documents
//! compressed once per version, event streams left as they are, and
//! gzip-coded request bodies read within the size limit.

use std::io::{Read, Write};
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use super::harness::{translator, Grpc, Http, TestServer, ALICE};

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("the body is gzip");
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// A GET as raw bytes: (status, headers, body as it came on the wire).
async fn raw(
    h: &Http,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
    let mut req = h.client.get(format!("{}{path}", h.base)).bearer_auth(ALICE);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("the request is sent");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, headers, resp.bytes().await.unwrap().to_vec())
}

fn gz_only() -> [(&'static str, &'static str); 1] {
    [("accept-encoding", "gzip")]
}

fn header<'a>(h: &'a reqwest::header::HeaderMap, name: &str) -> &'a str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

async fn directory(h: &Http) {
    for i in 0..12 {
        let (status, _) = h
            .call(
                Method::POST,
                "/agents",
                Some(ALICE),
                Some(translator(&format!("translator-{i}"))),
            )
            .await
            .expect("registered");
        assert_eq!(status, 201);
    }
}

#[tokio::test]
async fn answers_and_documents_go_out_gzip_coded_to_clients_that_accept_it() {
    let server = TestServer::start().await;
    let h = Http::new(&server.http);
    directory(&h).await;

    // A list: compressed for a client that asks, the same JSON once
    // decoded, and a fraction of the bytes.
    let (status, plain_h, plain) = raw(&h, "/agents?page_size=50", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(header(&plain_h, "content-encoding"), "");
    assert_eq!(
        header(&plain_h, "vary").to_ascii_lowercase(),
        "accept-encoding"
    );
    let (status, gz_h, gz) = raw(
        &h,
        "/agents?page_size=50",
        &[("accept-encoding", "gzip, deflate, br")],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(header(&gz_h, "content-encoding"), "gzip");
    assert!(
        gz.len() * 4 < plain.len(),
        "{} of {}",
        gz.len(),
        plain.len()
    );
    let listed: Value = serde_json::from_slice(&gunzip(&gz)).unwrap();
    assert_eq!(listed, serde_json::from_slice::<Value>(&plain).unwrap());
    assert_eq!(
        listed["agents"].as_array().map(Vec::len),
        Some(12),
        "{listed}"
    );

    // Refused by weight: sent as it is.
    let (_, h0, _) = raw(&h, "/agents", &[("accept-encoding", "gzip;q=0, *")]).await;
    assert_eq!(header(&h0, "content-encoding"), "");

    // A small answer is not worth it.
    let (status, small_h, _) = raw(&h, "/healthz", &[("accept-encoding", "gzip")]).await;
    assert_eq!(status, 200);
    assert_eq!(header(&small_h, "content-encoding"), "");

    // A record's ETag is its revision whatever the coding, so a client
    // that accepts gzip can send it back in If-Match (a strong
    // comparison) and write.
    let (status, rec_h, rec) = raw(&h, "/agents/translator-3", &gz_only()).await;
    assert_eq!(status, 200);
    assert_eq!(header(&rec_h, "content-encoding"), "gzip");
    let tag = header(&rec_h, "etag").to_string();
    assert!(tag.starts_with('"'), "{tag}");
    let mut meta: Value = serde_json::from_slice(&gunzip(&rec)).unwrap();
    meta["description"] = json!("Translates text between Chinese and English, updated.");
    let resp = h
        .client
        .put(format!("{}/agents/translator-3", h.base))
        .bearer_auth(ALICE)
        .header("if-match", &tag)
        .header("accept-encoding", "gzip")
        .json(&meta)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "If-Match: {tag}");

    // The AI Catalog: compressed once per version (the same bytes for
    // every fetch), the same validator, and a conditional GET with it (or
    // its weak form) answered 304.
    let catalog = "/.well-known/ai-catalog.json";
    let (status, doc_h, doc) = raw(&h, catalog, &[]).await;
    assert_eq!(status, 200);
    let strong = header(&doc_h, "etag").to_string();
    assert!(strong.starts_with('"'), "{strong}");
    let gz_headers = [("accept-encoding", "gzip")];
    let (_, first_h, first) = raw(&h, catalog, &gz_headers).await;
    let (_, _, second) = raw(&h, catalog, &gz_headers).await;
    assert_eq!(header(&first_h, "content-encoding"), "gzip");
    assert_eq!(
        header(&first_h, "content-type"),
        "application/ai-catalog+json"
    );
    assert_eq!(
        header(&first_h, "vary").to_ascii_lowercase(),
        "accept-encoding"
    );
    assert_eq!(header(&first_h, "etag"), strong);
    assert_eq!(first, second);
    assert_eq!(gunzip(&first), doc);
    for tag in [strong.clone(), format!("W/{strong}")] {
        let (status, _, body) = raw(
            &h,
            catalog,
            &[("accept-encoding", "gzip"), ("if-none-match", &tag)],
        )
        .await;
        assert_eq!(status, 304, "If-None-Match: {tag}");
        assert!(body.is_empty());
    }

    // An event stream is never compressed: each event must arrive when it
    // is sent.
    let resp = h
        .client
        .get(format!("{}/changes?from_revision=1", h.base))
        .bearer_auth(ALICE)
        .header("accept", "text/event-stream")
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(header(resp.headers(), "content-type").starts_with("text/event-stream"));
    assert_eq!(header(resp.headers(), "content-encoding"), "");
    let mut resp = resp;
    let chunk = tokio::time::timeout(Duration::from_secs(10), resp.chunk())
        .await
        .expect("the first event arrives")
        .unwrap()
        .unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&chunk).contains("translator-"),
        "{chunk:?}"
    );
    drop(resp);

    // Python's requests, as it comes: it asks for gzip and decodes it.
    let script = r#"
import json, sys, requests
r = requests.get(sys.argv[1], headers={"Authorization": "Bearer " + sys.argv[2]})
print(json.dumps({"status": r.status_code,
                  "encoding": r.headers.get("Content-Encoding"),
                  "entries": len(r.json()["entries"]),
                  "wire": int(r.raw.tell())}))
"#;
    let out = tokio::process::Command::new(super::mcp::mcp_python())
        .arg("-c")
        .arg(script)
        .arg(format!("{}{catalog}", h.base))
        .arg(ALICE)
        .output()
        .await
        .expect("python runs");
    let got: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    let plain_doc: Value = serde_json::from_slice(&doc).unwrap();
    assert_eq!(got["status"], 200, "{got}");
    assert_eq!(got["encoding"], "gzip", "{got}");
    assert_eq!(
        got["entries"].as_u64(),
        plain_doc["entries"].as_array().map(|a| a.len() as u64)
    );
    assert_eq!(got["wire"].as_u64(), Some(first.len() as u64), "{got}");
    server.stop().await;
}

#[tokio::test]
async fn gzip_coded_request_bodies_are_read_within_the_size_limit() {
    let server = TestServer::start().await;
    let h = Http::new(&server.http);
    let post = |body: Vec<u8>, coding: &'static str| {
        h.client
            .post(format!("{}/agents", h.base))
            .bearer_auth(ALICE)
            .header("content-type", "application/json")
            .header("content-encoding", coding)
            .body(body)
            .send()
    };

    let record = translator("packed");
    let resp = post(gzip(record.to_string().as_bytes()), "gzip")
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    assert_eq!(h.record("packed", ALICE).await["name"], record["name"]);

    // A coding the facade does not read: 415, named, nothing stored.
    let resp = post(record.to_string().into_bytes(), "br").await.unwrap();
    assert_eq!(resp.status(), 415);
    assert_eq!(
        header(resp.headers(), "content-type"),
        "application/problem+json"
    );
    let problem: Value = resp.json().await.unwrap();
    assert!(
        problem["detail"].as_str().unwrap_or("").contains("'br'")
            || problem["message"].as_str().unwrap_or("").contains("'br'"),
        "{problem}"
    );

    // Not gzip after all: 400.
    let resp = post(record.to_string().into_bytes(), "gzip").await.unwrap();
    assert_eq!(resp.status(), 400);

    // A few kilobytes that inflate past the limit: 413 by what they decode
    // to, and nothing stored.
    let mut huge = translator("inflated");
    huge["description"] = json!(" ".repeat(8 << 20));
    let bomb = gzip(huge.to_string().as_bytes());
    assert!(bomb.len() < 64 << 10, "{}", bomb.len());
    let resp = post(bomb, "gzip").await.unwrap();
    assert_eq!(resp.status(), 413);
    let (status, _, _) = h
        .send(Method::GET, "/agents/inflated", Some(ALICE), None, &[])
        .await;
    assert_eq!(status, 404);
    server.stop().await;
}

/// gRPC answers are gzip-compressed for a client that compresses its own
/// requests, as grpc-go's servers answer, and plain for one that only says
/// it could read them (grpcio says so on every call).
#[tokio::test]
async fn grpc_answers_are_compressed_for_clients_that_compress_their_requests() {
    use agentry::pb::registry_client::RegistryClient;
    use tonic::codec::CompressionEncoding::Gzip;
    let server = TestServer::start().await;
    directory(&Http::new(&server.http)).await;
    let channel = tonic::transport::Endpoint::from_shared(server.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    for (compresses, answered) in [(false, None), (true, Some("gzip"))] {
        let mut client = RegistryClient::new(channel.clone()).accept_compressed(Gzip);
        if compresses {
            client = client.send_compressed(Gzip);
        }
        let req = Grpc::req(Some(ALICE), agentry::pb::ListRequest::default());
        let resp = client.list(req).await.expect("the list is answered");
        let encoding = resp.metadata().get("grpc-encoding");
        assert_eq!(
            encoding.and_then(|v| v.to_str().ok()),
            answered,
            "a client that compresses: {compresses}"
        );
        assert_eq!(resp.into_inner().records.len(), 12);
    }
    server.stop().await;
}
