//! The peer listener over TLS and mutual TLS: certificates made with the
//! `openssl` command for this test, a registry serving its peer listener
//! with them, and registries asking it with and without the CA and a client
//! certificate. A handshake that should fail must fail, so a peer that
//! skipped verification would be caught. And a peer marked `compress`,
//! whose answers come back in fewer bytes.

use std::path::Path;
use std::time::Duration;

use agentry::config::{PeerConfig, TlsConfig};
use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::*;

/// A CA and a leaf certificate for 127.0.0.1 signed by it (server and
/// client use), in `dir`: ca.pem, leaf.pem, leaf.key.
async fn certificates(dir: &Path) {
    crate::certs::ca(dir, "ca").await;
    crate::certs::leaf(dir, "ca", "leaf", "IP:127.0.0.1,DNS:localhost").await;
}

async fn signing_key(h: &Http) -> String {
    for _ in 0..100 {
        let (_, info) = h
            .call(Method::GET, "/.well-known/agentry.json", None, None)
            .await
            .expect("registry info");
        if info["established"] == true {
            let id = info["signing_key"].clone();
            return info["keys"]
                .as_array()
                .and_then(|ks| ks.iter().find(|k| k["key_id"] == id))
                .and_then(|k| k["public_key"].as_str())
                .expect("signing key")
                .to_string();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never established");
}

async fn federated(h: &Http) -> Value {
    let (status, body) = h
        .call(
            Method::POST,
            "/discover",
            Some(ADMIN),
            Some(json!({"query": "translate a contract", "scope": "federated", "limit": 5})),
        )
        .await
        .expect("discover");
    assert_eq!(status, 200, "{body}");
    body
}

/// Registers urn:b:translator at b.example.
async fn register_translator(b: &Http) {
    let (status, _) = b
        .call(
            Method::POST,
            "/agents",
            Some(ADMIN),
            Some(translator("urn:b:translator")),
        )
        .await
        .expect("register");
    assert_eq!(status, 201);
}

/// b.example with its peer listener on TLS (requiring client certificates
/// from the test CA when `client_ca`), its translator registered: the
/// server, its HTTP client, its signing key and its peer port.
async fn start_b(d: &Path, client_ca: bool) -> (TestServer, Http, String, u16) {
    let b = TestServer::start_with(|c| {
        c.identity.authority = Some("b.example".into());
        c.federation.tls = Some(TlsConfig {
            cert_file: d.join("leaf.pem"),
            key_file: d.join("leaf.key"),
            client_ca_file: client_ca.then(|| d.join("ca.pem")),
        });
    })
    .await;
    let b_http = Http::new(&b.http);
    let key = signing_key(&b_http).await;
    register_translator(&b_http).await;
    let port = b.server.as_ref().expect("running").peer_addr.port();
    (b, b_http, key, port)
}

fn found(body: &Value, id: &str) -> bool {
    body["candidates"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["id"] == id))
}

#[tokio::test]
async fn peers_reach_a_tls_listener_only_with_the_right_ca_and_client_certificate() {
    let certs = tempfile::tempdir().expect("tempdir");
    let d = certs.path();
    certificates(d).await;
    let (b, b_http, key, port) = start_b(d, true).await;
    let (_, info) = b_http
        .call(Method::GET, "/.well-known/agentry.json", None, None)
        .await
        .expect("info");
    assert!(info["federation_endpoint"]
        .as_str()
        .is_some_and(|e| e.starts_with("https://")));

    let peer = |ca: bool, client_cert: bool| PeerConfig {
        keys: vec![key.clone()],
        ca_file: ca.then(|| d.join("ca.pem")),
        client_cert_file: client_cert.then(|| d.join("leaf.pem")),
        client_key_file: client_cert.then(|| d.join("leaf.key")),
        ..PeerConfig::new("b.example", &format!("https://127.0.0.1:{port}"))
    };
    // (trusts b's CA, presents a client certificate, reaches b)
    for (ca, client_cert, reaches) in [
        (true, true, true),
        (true, false, false),
        (false, true, false),
    ] {
        let a = TestServer::start_with(|c| {
            c.identity.authority = Some("a.example".into());
            c.federation.peers = vec![peer(ca, client_cert)];
        })
        .await;
        let body = federated(&Http::new(&a.http)).await;
        assert_eq!(
            found(&body, "urn:b:translator"),
            reaches,
            "ca {ca}, client certificate {client_cert}: {body:#}"
        );
        let warned = body["warnings"].to_string().contains("peer b.example");
        assert_eq!(warned, !reaches, "{body:#}");
        a.stop().await;
    }
    b.stop().await;
}

/// b.example at `port`, its keys pinned from `well_known`.
fn pinned_from(port: u16, well_known: &str) -> PeerConfig {
    PeerConfig {
        well_known: Some(well_known.into()),
        ..PeerConfig::new("b.example", &format!("http://127.0.0.1:{port}"))
    }
}

#[tokio::test]
async fn keys_from_a_well_known_url_are_fetched_once_and_pinned() {
    let b = TestServer::start_with(|c| c.identity.authority = Some("b.example".into())).await;
    let b_http = Http::new(&b.http);
    signing_key(&b_http).await;
    register_translator(&b_http).await;
    let port = b.server.as_ref().expect("running").peer_addr.port();
    let a_dir = tempfile::tempdir().expect("tempdir");
    let data_dir = a_dir.path().to_path_buf();
    let well_known = format!("{}/.well-known/agentry.json", b.http);
    // a.example on the same data directory each time.
    let start_a = || {
        TestServer::start_with(|c| {
            c.data_dir = data_dir.clone();
            c.federation.peers = vec![pinned_from(port, &well_known)];
        })
    };
    let a = start_a().await;
    let pinned = data_dir.join("peers/b.example.json");
    for _ in 0..100 {
        if pinned.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The keys are pinned in memory right after the file is written.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let doc: Value =
        serde_json::from_slice(&std::fs::read(&pinned).expect("pinned file")).expect("pinned json");
    assert_eq!(doc["authority"], "b.example");
    let body = federated(&Http::new(&a.http)).await;
    assert!(found(&body, "urn:b:translator"), "{body:#}");

    // The pinned file is what counts from now on: a different key there
    // (as if b's web server had been swapped after pinning) makes every
    // record of b refused after a restart.
    let mut forged = doc.clone();
    for k in forged["keys"].as_array_mut().expect("keys") {
        k["public_key"] = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo".into();
    }
    a.stop().await;
    std::fs::write(&pinned, forged.to_string()).expect("rewrite pin");
    let a = start_a().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let body = federated(&Http::new(&a.http)).await;
    assert!(!found(&body, "urn:b:translator"), "{body:#}");
    assert!(
        body["warnings"]
            .to_string()
            .contains("not pinned for b.example"),
        "{body:#}"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_peer_listener_with_tls_but_no_client_ca_serves_without_client_certificates() {
    let certs = tempfile::tempdir().expect("tempdir");
    let d = certs.path();
    certificates(d).await;
    let (b, _, key, port) = start_b(d, false).await;
    let a = TestServer::start_with(|c| {
        c.identity.authority = Some("a.example".into());
        c.federation.peers = vec![PeerConfig {
            keys: vec![key.clone()],
            ca_file: Some(d.join("ca.pem")),
            ..PeerConfig::new("b.example", &format!("https://127.0.0.1:{port}"))
        }];
    })
    .await;
    let body = federated(&Http::new(&a.http)).await;
    assert!(found(&body, "urn:b:translator"), "{body:#}");
    a.stop().await;
    b.stop().await;
}

/// A TCP relay on loopback to `target`, counting the bytes that come back
/// from it: what a peer's answers cost on the wire.
async fn counting_relay(target: u16) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let back = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = back.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                continue;
            };
            let counted = counted.clone();
            let (mut client_in, mut client_out) = client.into_split();
            let (mut server_in, mut server_out) = server.into_split();
            tokio::spawn(async move { tokio::io::copy(&mut client_in, &mut server_out).await });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n) = server_in.read(&mut buf).await {
                    if n == 0 || client_out.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    counted.fetch_add(n, Ordering::SeqCst);
                }
            });
        }
    });
    (port, back)
}

/// A peer marked `compress` is sent compressed requests and so answers
/// compressed: the same federated discovery carries far fewer bytes back,
/// and finds the same agents.
#[tokio::test]
async fn a_peer_marked_compress_answers_in_fewer_bytes() {
    use std::sync::atomic::Ordering;
    let b = TestServer::start_with(|c| c.identity.authority = Some("b.example".into())).await;
    let b_http = Http::new(&b.http);
    let key = signing_key(&b_http).await;
    for i in 0..5 {
        let (status, _) = b_http
            .call(
                Method::POST,
                "/agents",
                Some(ADMIN),
                Some(translator(&format!("urn:b:translator-{i}"))),
            )
            .await
            .expect("register");
        assert_eq!(status, 201);
    }
    let port = b.server.as_ref().expect("running").peer_addr.port();
    let mut carried = Vec::new();
    for compress in [false, true] {
        let (relay, back) = counting_relay(port).await;
        let a = TestServer::start_with(|c| {
            c.identity.authority = Some("a.example".into());
            c.federation.peers = vec![PeerConfig {
                keys: vec![key.clone()],
                compress,
                ..PeerConfig::new("b.example", &format!("http://127.0.0.1:{relay}"))
            }];
        })
        .await;
        let a_http = Http::new(&a.http);
        // Until b's records are in its index, and then once more, counted.
        for _ in 0..100 {
            if found(&federated(&a_http).await, "urn:b:translator-4") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let before = back.load(Ordering::SeqCst);
        let body = federated(&a_http).await;
        let ids: Vec<&str> = body["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["id"].as_str())
            .collect();
        assert_eq!(ids.len(), 5, "compress {compress}: {body:#}");
        carried.push(back.load(Ordering::SeqCst) - before);
        a.stop().await;
    }
    let (plain, compressed) = (carried[0], carried[1]);
    assert!(
        compressed * 2 < plain,
        "{compressed} bytes compressed against {plain} plain"
    );
    b.stop().await;
}
