//! The trust boundary, tried as a hostile client would: Raft RPCs without
//! cluster proof, nodes with the wrong certificate, TLS on the public
//! listeners (with rotation and client certificates), slow and oversized
//! requests, floods, streams held open, and the empty id. Every refusal is
//! checked to have changed nothing.

use std::path::Path;
use std::time::{Duration, Instant};

use agentry::config::{ClusterTlsConfig, ConnectionLimits, TlsConfig};
use agentry::consensus::cluster_auth::{ClusterAuth, SECRET_FILE};
use agentry::consensus::{Command, Forwarded};
use agentry::domain::write::WriteMode;
use agentry::domain::{AgentMetadata, Principal, Role};
use agentry::pb::{self, raft_transport_client::RaftTransportClient};
use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::certs;
use crate::harness::*;

fn forwarded(f: &Forwarded) -> Vec<u8> {
    serde_json::to_vec(f).unwrap()
}

/// A Raft message from `from`, with a cluster proof made with `auth` when
/// given.
fn raft_message(
    auth: Option<&ClusterAuth>,
    method: &str,
    from: u64,
    json: Vec<u8>,
) -> tonic::Request<pb::RaftMessage> {
    let mut req = tonic::Request::new(pb::RaftMessage {
        from,
        payload: json.clone(),
        stamp: None,
        encoding: 0,
        batches: false,
        rules: 0,
    });
    if let Some(a) = auth {
        a.prove(req.metadata_mut(), method, from, &json);
    }
    req.set_timeout(Duration::from_secs(5));
    req
}

async fn raft_client(
    url: String,
    tls: Option<ClientTlsConfig>,
) -> Result<RaftTransportClient<Channel>, String> {
    let mut e = Endpoint::from_shared(url).map_err(|e| e.to_string())?;
    if let Some(t) = tls {
        e = e.tls_config(t).map_err(|e| e.to_string())?;
    }
    let channel = e
        .connect_timeout(Duration::from_secs(3))
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(RaftTransportClient::new(channel))
}

async fn cluster_status(s: &TestServer) -> pb::ClusterStatus {
    let mut c = pb::cluster_client::ClusterClient::connect(s.grpc.clone())
        .await
        .unwrap();
    let mut req = tonic::Request::new(pb::ClusterStatusRequest {});
    req.metadata_mut()
        .insert("authorization", format!("Bearer {ADMIN}").parse().unwrap());
    c.status(req).await.unwrap().into_inner()
}

async fn agent_count(h: &Http) -> u64 {
    let (status, body) = h
        .call(Method::GET, "/agents?page_size=1", Some(ADMIN), None)
        .await
        .expect("list");
    assert_eq!(status, 200, "{body}");
    body["total_count"]
        .as_u64()
        .or_else(|| body["total"].as_u64())
        .unwrap_or_else(|| panic!("no count in {body}"))
}

#[tokio::test]
async fn raft_rpcs_without_cluster_proof_are_refused_and_change_nothing() {
    let s = TestServer::start().await;
    let h = Http::new(&s.http);
    let raft_addr = s.server.as_ref().unwrap().raft_addr;
    let before = cluster_status(&s).await;
    let count_before = agent_count(&h).await;

    let secret = std::fs::read_to_string(s.data_dir().join(SECRET_FILE))
        .expect("a single node generates its cluster secret");
    let right = ClusterAuth::from_secret(secret.trim()).unwrap();
    let wrong = ClusterAuth::from_secret("somebody-elses-cluster-secret").unwrap();

    let write = Forwarded::Write(Command::Put {
        metadata: Box::new(AgentMetadata {
            id: "written-by-an-intruder".into(),
            name: "Intruder".into(),
            description: "should never be stored".into(),
            ..Default::default()
        }),
        visibility: None,
        readers: Vec::new(),
        quota: None,
        principal: Principal::new("admin", Role::Admin),
        mode: WriteMode::Register,
        now: "2026-11-24T00:00:00Z".into(),
        publisher: None,
        expected_revision: None,
        rules: 0,
    });
    let learner = Forwarded::AddLearner {
        id: 99,
        addr: "127.0.0.1:9".into(),
        wait: false,
    };
    // A vote for a far higher term would depose the leader if it counted.
    let vote = serde_json::to_vec(&json!({
        "vote": {"leader_id": {"term": 1000, "node_id": 99}, "committed": false},
        "last_log_id": null
    }))
    .unwrap();

    let mut client = raft_client(format!("http://{raft_addr}"), None)
        .await
        .unwrap();
    for proof in [None, Some(&wrong)] {
        let refused = |r: Result<tonic::Response<pb::RaftMessage>, tonic::Status>, what: &str| {
            let e = r.expect_err(what);
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{what}: {e:?}");
        };
        for (what, body) in [
            ("forward write", forwarded(&write)),
            ("forward add learner", forwarded(&learner)),
            ("forward status", forwarded(&Forwarded::Status)),
        ] {
            refused(
                client
                    .forward(raft_message(proof, "forward", 1, body))
                    .await,
                what,
            );
        }
        refused(
            client
                .vote(raft_message(proof, "vote", 99, vote.clone()))
                .await,
            "vote",
        );
        refused(
            client
                .append_entries(raft_message(proof, "append_entries", 99, b"{}".to_vec()))
                .await,
            "append entries",
        );
        let mut snapshot = tonic::Request::new(tokio_stream::iter(vec![pb::SnapshotChunk {
            from: 99,
            header: b"{}".to_vec(),
            data: vec![0; 1024],
            stamp: None,
        }]));
        if let Some(a) = proof {
            a.prove(snapshot.metadata_mut(), "install_snapshot", 99, b"{}");
        }
        refused(client.install_snapshot(snapshot).await, "install snapshot");
    }
    // A real proof for one message does not carry another.
    let mut replayed = raft_message(Some(&right), "forward", 1, forwarded(&Forwarded::Status));
    replayed.get_mut().payload = forwarded(&learner);
    let e = client.forward(replayed).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);

    // Nothing changed: no learner, no record, same term.
    let after = cluster_status(&s).await;
    let ids = |st: &pb::ClusterStatus| st.members.iter().map(|m| m.id).collect::<Vec<_>>();
    assert_eq!(ids(&after), ids(&before));
    assert!(!ids(&after).contains(&99));
    let term = |st: &pb::ClusterStatus| st.node.as_ref().map(|n| n.term);
    assert_eq!(term(&after), term(&before));
    assert_eq!(agent_count(&h).await, count_before);
    let e = h
        .call(
            Method::GET,
            "/agents/written-by-an-intruder",
            Some(ADMIN),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(e.http, 404);

    // The same call with the cluster's own proof is served: the refusals
    // above were the proof's doing.
    let ok = client
        .forward(raft_message(
            Some(&right),
            "forward",
            1,
            forwarded(&Forwarded::Status),
        ))
        .await;
    assert!(ok.is_ok(), "{ok:?}");
    s.stop().await;
}

#[tokio::test]
async fn cluster_tls_refuses_other_cas_and_checks_the_node_identity() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    certs::ca(d, "cluster-ca").await;
    certs::ca(d, "other-ca").await;
    let (node_cert, node_key) = certs::leaf(d, "cluster-ca", "node1", "IP:127.0.0.1").await;
    let (elsewhere_cert, elsewhere_key) =
        certs::leaf(d, "cluster-ca", "elsewhere", "IP:127.0.0.2").await;
    let (intruder_cert, intruder_key) =
        certs::leaf(d, "other-ca", "intruder", "IP:127.0.0.1").await;
    let s = TestServer::start_with(|c| {
        c.cluster.tls = Some(ClusterTlsConfig {
            cert_file: node_cert.clone(),
            key_file: node_key.clone(),
            ca_file: d.join("cluster-ca.pem"),
        });
    })
    .await;
    assert!(
        !s.data_dir().join(SECRET_FILE).exists(),
        "with cluster TLS no secret is made"
    );
    let raft = s.server.as_ref().unwrap().raft_addr;
    let url = format!("https://{raft}");
    let tls = |cert: Option<(&Path, &Path)>| {
        let mut t = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(
            std::fs::read(d.join("cluster-ca.pem")).unwrap(),
        ));
        if let Some((c, k)) = cert {
            t = t.identity(Identity::from_pem(
                std::fs::read(c).unwrap(),
                std::fs::read(k).unwrap(),
            ));
        }
        t
    };
    let status = || raft_message(None, "forward", 1, forwarded(&Forwarded::Status));

    // No client certificate, or one from another CA: no connection at all.
    for cert in [
        None,
        Some((intruder_cert.as_path(), intruder_key.as_path())),
    ] {
        let outcome = match raft_client(url.clone(), Some(tls(cert))).await {
            Err(e) => Err(e),
            Ok(mut c) => c.forward(status()).await.map_err(|e| format!("{e:?}")),
        };
        assert!(outcome.is_err(), "served without a cluster certificate");
    }
    // Plain text to the TLS listener fails cleanly.
    let plain = match raft_client(format!("http://{raft}"), None).await {
        Err(e) => Err(e),
        Ok(mut c) => c.forward(status()).await.map_err(|e| format!("{e:?}")),
    };
    assert!(plain.is_err());
    // A cluster certificate for another host cannot speak as node 1.
    let mut c = raft_client(
        url.clone(),
        Some(tls(Some((&elsewhere_cert, &elsewhere_key)))),
    )
    .await
    .unwrap();
    let e = c.forward(status()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("127.0.0.1"), "{}", e.message());
    // Node 1's own certificate is served.
    let mut c = raft_client(url, Some(tls(Some((&node_cert, &node_key)))))
        .await
        .unwrap();
    c.forward(status()).await.expect("a member is served");
    s.stop().await;
}

fn https_client(ca: &Path, identity: Option<(&Path, &Path)>) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap());
    if let Some((c, k)) = identity {
        let mut pem = std::fs::read(c).unwrap();
        pem.extend(std::fs::read(k).unwrap());
        b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    b.build().unwrap()
}

#[tokio::test]
async fn public_listeners_speak_tls_rotate_certificates_and_accept_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    certs::ca(d, "public-ca").await;
    certs::ca(d, "rotated-ca").await;
    certs::ca(d, "client-ca").await;
    certs::ca(d, "stranger-ca").await;
    let (cert, key) = certs::leaf(d, "public-ca", "server", "IP:127.0.0.1,DNS:localhost").await;
    let (client_cert, client_key) =
        certs::leaf(d, "client-ca", "client", "DNS:client.example").await;
    let (stranger_cert, stranger_key) =
        certs::leaf(d, "stranger-ca", "stranger", "DNS:stranger.example").await;
    let s = TestServer::start_with(|c| {
        c.tls = Some(TlsConfig {
            cert_file: cert.clone(),
            key_file: key.clone(),
            client_ca_file: Some(d.join("client-ca.pem")),
        });
        c.client_certificates = vec![agentry::api::auth::CertPrincipal {
            dns_name: "client.example".into(),
            name: "cert-client".into(),
            role: agentry::domain::Role::Publisher,
            tenant: None,
        }];
    })
    .await;
    let http_addr = s.server.as_ref().unwrap().http_addr;
    let grpc_addr = s.server.as_ref().unwrap().grpc_addr;
    let base = format!("https://{http_addr}");
    let public_ca = d.join("public-ca.pem");

    // HTTPS with and without a client certificate from the client CA.
    for identity in [None, Some((client_cert.as_path(), client_key.as_path()))] {
        let r = https_client(&public_ca, identity)
            .get(format!("{base}/healthz"))
            .send()
            .await
            .expect("https works");
        assert_eq!(r.status(), 200);
    }
    let r = https_client(&public_ca, None)
        .post(format!("{base}/agents"))
        .bearer_auth(ADMIN)
        .json(&minimal("https-registered"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    // A client certificate for a configured name is that principal.
    let r = https_client(&public_ca, Some((&client_cert, &client_key)))
        .post(format!("{base}/agents"))
        .json(&minimal("by-certificate"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["registry"]["owner"], "cert-client", "{body}");
    // Without a certificate (or a key) the same write is anonymous: 401.
    let r = https_client(&public_ca, None)
        .post(format!("{base}/agents"))
        .json(&minimal("by-nobody"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // A certificate from a CA the listener does not trust ends the
    // handshake.
    let stranger = https_client(&public_ca, Some((&stranger_cert, &stranger_key)))
        .get(format!("{base}/healthz"))
        .send()
        .await;
    assert!(stranger.is_err(), "{stranger:?}");
    // Plain text to a TLS listener fails cleanly and quickly.
    let started = Instant::now();
    let plain = reqwest::Client::new()
        .get(format!("http://{http_addr}/healthz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(plain.is_err() || plain.is_ok_and(|r| r.status() == 400));
    assert!(started.elapsed() < Duration::from_secs(4));

    // gRPC over TLS, and the CLI with https:// and --ca-file.
    let channel = Endpoint::from_shared(format!("https://{grpc_addr}"))
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(std::fs::read(&public_ca).unwrap())),
        )
        .unwrap()
        .connect()
        .await
        .expect("gRPC over TLS");
    let got = pb::registry_client::RegistryClient::new(channel)
        .get(pb::GetRequest {
            id: "https-registered".into(),
            ..Default::default()
        })
        .await
        .expect("get over TLS");
    assert_eq!(
        got.into_inner()
            .record
            .and_then(|r| r.metadata)
            .map(|m| m.id),
        Some("https-registered".into())
    );
    let cli = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .args(["agents", "get", "https-registered", "--json", "--server"])
        .arg(format!("https://{grpc_addr}"))
        .arg("--ca-file")
        .arg(&public_ca)
        .env_remove("AGENTRY_API_KEY")
        .output()
        .await
        .unwrap();
    assert!(
        cli.status.success() && String::from_utf8_lossy(&cli.stdout).contains("https-registered"),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );

    // Rotation: new files on disk are served without a restart.
    let (new_cert, new_key) =
        certs::leaf(d, "rotated-ca", "server2", "IP:127.0.0.1,DNS:localhost").await;
    std::fs::copy(&new_key, &key).unwrap();
    std::fs::copy(&new_cert, &cert).unwrap();
    let rotated_ca = d.join("rotated-ca.pem");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let fresh = https_client(&rotated_ca, None)
            .get(format!("{base}/healthz"))
            .send()
            .await;
        if fresh.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rotated certificate never served: {fresh:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let old = https_client(&public_ca, None)
        .get(format!("{base}/healthz"))
        .send()
        .await;
    assert!(old.is_err(), "the old certificate is still served");
    s.stop().await;
}

/// Reads until the server closes the connection; how long that took.
async fn closed_within(stream: &mut tokio::net::TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(
            limit.saturating_sub(started.elapsed()),
            stream.read(&mut buf),
        )
        .await
        {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => continue,
        }
    }
}

/// Connects to `addr`, sends `bytes` and nothing more, and expects the
/// server to close the connection after `at_least` and within 5 s.
async fn closed_after_sending(addr: std::net::SocketAddr, bytes: &[u8], at_least: Duration) {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(bytes).await.unwrap();
    let took = closed_within(&mut tcp, Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("{addr}: the connection was kept"));
    assert!(took >= at_least, "{addr}: closed after {took:?}");
}

/// The node's `/metrics` page.
async fn metrics_page(h: &Http) -> String {
    let page = h.client.get(format!("{}/metrics", h.base)).send().await;
    page.unwrap().text().await.unwrap()
}

/// The value of the Prometheus sample `name` (up to its labels) with all of
/// `labels`.
fn sample(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} {labels:?} in\n{metrics}"))
}

/// Connections the node closed on `listener` for `reason`, from its
/// metrics (process-wide: other tests' servers count too).
fn closed_for(metrics: &str, listener: &str, reason: &str) -> f64 {
    sample(
        metrics,
        "agentry_connections_closed_total{",
        &[
            &format!("listener=\"{listener}\""),
            &format!("reason=\"{reason}\""),
        ],
    )
}

/// A connection to `to` from the loopback address `local` (a client of
/// its own: every 127/8 address reaches the loopback listeners).
async fn from(local: &str, to: std::net::SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(std::net::SocketAddr::new(local.parse().unwrap(), 0))
        .unwrap();
    socket.connect(to).await.unwrap()
}

#[tokio::test]
async fn slow_oversized_and_excess_connections_are_cut_off() {
    let s = TestServer::start_with(|c| {
        c.connections = ConnectionLimits {
            header_timeout_ms: 600,
            max_connections: 8,
            max_connections_per_client: 5,
            ..Default::default()
        };
    })
    .await;
    let server = s.server.as_ref().unwrap();
    let (http_addr, grpc_addr) = (server.http_addr, server.grpc_addr);

    // Half a request header (HTTP, and HTTP/1.1 on the gRPC listener) and
    // half a preface (gRPC): closed.
    for (addr, partial) in [
        (http_addr, &b"GET /healthz HTTP/1.1\r\nHost: x\r\n"[..]),
        (grpc_addr, &b"PRI * HTTP/2.0\r\n"[..]),
        (grpc_addr, &b"GET / HTTP/1.1\r\nHost: x\r\n"[..]),
    ] {
        closed_after_sending(addr, partial, Duration::from_millis(400)).await;
    }

    // A whole HTTP/1.1 request on the gRPC listener: 505 with the error
    // body, and the connection closed; it reaches no service.
    let mut tcp = tokio::net::TcpStream::connect(grpc_addr).await.unwrap();
    tcp.write_all(
        b"POST /agentry.v1.Registry/Register HTTP/1.1\r\nHost: x\r\ncontent-type: application/grpc\r\ncontent-length: 0\r\n\r\n",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut answer))
        .await
        .expect("answered and closed")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 505"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert!(answer.contains("HTTP/2 only"), "{answer}");

    // A 100 KiB header: 431, and the server carries on.
    let h = Http::new(&s.http);
    let big = "x".repeat(100 * 1024);
    let r = h
        .client
        .get(format!("{}/healthz", s.http))
        .header("x-big", big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 431);

    // Past a client's cap, its new connections are closed at once, and
    // another client (another loopback address) still gets in.
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(tokio::net::TcpStream::connect(http_addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut extra = tokio::net::TcpStream::connect(http_addr).await.unwrap();
    let took = closed_within(&mut extra, Duration::from_millis(400)).await;
    assert!(took.is_some(), "a sixth connection of one client was kept");
    let mut other = Vec::new();
    for _ in 0..2 {
        other.push(from("127.0.0.2", http_addr).await);
    }
    let mut ping = from("127.0.0.2", http_addr).await;
    ping.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(5), ping.read_exact(&mut answer))
        .await
        .expect("another client is answered")
        .unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");
    other.push(ping);
    // Past the listener's cap (8 open now), new connections are closed at
    // once whoever sends them.
    let mut extra = from("127.0.0.3", http_addr).await;
    let took = closed_within(&mut extra, Duration::from_millis(400)).await;
    assert!(took.is_some(), "the ninth connection was kept");
    drop(held);
    drop(other);
    // Slots come back once those connections are gone.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, _) = h.call(Method::GET, "/healthz", None, None).await.unwrap();
    assert_eq!(status, 200);
    // The metrics count each kind of closing.
    let metrics = metrics_page(&h).await;
    for (listener, reason) in [
        ("http", "header_timeout"),
        ("grpc", "header_timeout"),
        ("http", "client_cap"),
        ("http", "connection_cap"),
    ] {
        let closed = closed_for(&metrics, listener, reason);
        assert!(closed >= 1.0, "{listener} {reason}: {closed}");
    }

    // The empty id is refused, and nothing is stored.
    let before = agent_count(&h).await;
    let mut meta = minimal("x");
    meta["id"] = json!("");
    let e = h
        .call(Method::POST, "/agents", Some(ALICE), Some(meta))
        .await
        .unwrap_err();
    assert_eq!((e.http, e.field.as_deref()), (400, Some("/id")));
    assert_eq!(agent_count(&h).await, before);
    s.stop().await;
}

/// A client that opens an HTTP/2 connection to the Raft listener (preface
/// and SETTINGS) and then says nothing, not even the PING answers any HTTP/2
/// peer gives, is cut off by the keep-alive (here a PING after 1 s, 1 s
/// for its answer) instead of holding a slot of the listener's cap for
/// ever.
#[tokio::test]
async fn a_silent_connection_to_the_raft_listener_is_closed_by_the_keep_alive() {
    let s = TestServer::start_with(|c| {
        c.connections.keep_alive_interval_secs = 1;
        c.connections.keep_alive_timeout_secs = 1;
    })
    .await;
    let raft = s.server.as_ref().unwrap().raft_addr;
    let mut tcp = tokio::net::TcpStream::connect(raft).await.unwrap();
    // The client preface, then an empty SETTINGS frame.
    tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let took = closed_within(&mut tcp, Duration::from_secs(8)).await;
    let took = took.expect("the silent Raft connection was kept");
    assert!(took >= Duration::from_secs(2), "closed after {took:?}");
    s.stop().await;
}

/// A gRPC watch of the changes from now on.
async fn watch_from_now(s: &TestServer) -> tonic::Streaming<pb::WatchResponse> {
    let g = Grpc::connect(&s.grpc).await;
    g.client
        .clone()
        .watch(pb::WatchRequest { from_revision: 0 })
        .await
        .unwrap()
        .into_inner()
}

/// The id of the agent the watch's next change is about, delivered within
/// 5 s on a connection still open.
async fn next_change(watch: &mut tonic::Streaming<pb::WatchResponse>) -> String {
    use futures::StreamExt;
    let change = tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await
        .expect("the watch delivers")
        .expect("the watch is open")
        .expect("no error");
    change.record.unwrap().metadata.unwrap().id
}

/// Opens an HTTP/2 connection to `addr` and leaves it idle, speaking just
/// enough of the protocol to be a well-behaved client: the preface, an
/// empty SETTINGS, and an ACK for every SETTINGS and PING the server
/// sends. Returns, once the server has closed the connection, how long
/// after connecting its first GOAWAY came and that GOAWAY's error code.
async fn idle_http2_until_goaway(addr: std::net::SocketAddr) -> (Duration, u32) {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
    const SETTINGS: u8 = 0x4;
    const PING: u8 = 0x6;
    const GOAWAY: u8 = 0x7;
    const ACK: u8 = 0x1;
    let started = Instant::now();
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(PREFACE).await.unwrap();
    let mut goaway = None;
    loop {
        let mut head = [0u8; 9];
        let read = tokio::time::timeout(Duration::from_secs(10), tcp.read_exact(&mut head)).await;
        match read.unwrap_or_else(|_| panic!("{addr}: no frame and no close for 10 s")) {
            Ok(_) => {}
            // The server closed the connection.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => panic!("{addr}: the connection failed instead of closing: {e}"),
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let mut payload = vec![0u8; len];
        tcp.read_exact(&mut payload).await.unwrap();
        match kind {
            SETTINGS if flags & ACK == 0 => {
                tcp.write_all(&[0, 0, 0, SETTINGS, ACK, 0, 0, 0, 0])
                    .await
                    .unwrap();
            }
            PING if flags & ACK == 0 => {
                tcp.write_all(&[0, 0, 8, PING, ACK, 0, 0, 0, 0])
                    .await
                    .unwrap();
                tcp.write_all(&payload).await.unwrap();
            }
            GOAWAY if goaway.is_none() => {
                let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                goaway = Some((started.elapsed(), code));
            }
            _ => {}
        }
    }
    goaway.unwrap_or_else(|| panic!("{addr}: closed without a GOAWAY"))
}

/// A connection with no request open for the idle timeout is closed, on
/// the HTTP and the gRPC listener alike, with a GOAWAY that tells an
/// HTTP/2 client so (gRPC's MAX_CONNECTION_IDLE); streams open for longer
/// keep their connections and go on delivering.
#[tokio::test]
async fn idle_connections_are_closed_and_open_streams_keep_theirs() {
    use futures::StreamExt;
    let s = TestServer::start_with(|c| c.connections.idle_timeout_secs = 1).await;
    let server = s.server.as_ref().unwrap();
    for addr in [server.http_addr, server.grpc_addr] {
        let (after, code) = idle_http2_until_goaway(addr).await;
        assert!(
            after >= Duration::from_millis(900),
            "{addr}: GOAWAY after {after:?}"
        );
        assert_eq!(
            code, 0,
            "{addr}: GOAWAY with error code {code}, not NO_ERROR"
        );
    }
    // The metrics say why, per listener, and how many are open (at least
    // the one asking).
    let h = Http::new(&s.http);
    let metrics = metrics_page(&h).await;
    for listener in ["http", "grpc"] {
        let closed = closed_for(&metrics, listener, "idle");
        assert!(closed >= 1.0, "{listener}: {closed}");
    }
    let open = sample(
        &metrics,
        "agentry_open_connections{",
        &["listener=\"http\""],
    );
    assert!(open >= 1.0, "{open}");

    // A gRPC watch and the HTTP change feed, both quiet for 2.5 s.
    let mut watch = watch_from_now(&s).await;
    let feed = reqwest::Client::new()
        .get(format!("{}/changes", s.http))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(feed.status(), 200);
    let mut feed = feed.bytes_stream();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    h.register(Some(ALICE), minimal("idle-a")).await.unwrap();
    assert_eq!(next_change(&mut watch).await, "idle-a");
    let mut text = String::new();
    while !text.contains("idle-a") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), feed.next())
            .await
            .expect("the feed delivers")
            .expect("the feed is open")
            .expect("no transport error");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    s.stop().await;
}

#[tokio::test]
async fn floods_get_429_and_resource_exhausted_with_retry_after() {
    let s = TestServer::start_with(|c| {
        c.rate_limits.enabled = true;
        c.rate_limits.anonymous.discover = agentry::api::gate::Rate {
            per_second: 1,
            burst: 3,
        };
        c.rate_limits.authenticated.write = agentry::api::gate::Rate {
            per_second: 1,
            burst: 2,
        };
    })
    .await;
    let h = Http::new(&s.http);
    let mut statuses = Vec::new();
    let mut limited = None;
    for _ in 0..6 {
        let r = h
            .client
            .post(format!("{}/discover", s.http))
            .json(&json!({"query": "weather in Paris"}))
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
        if r.status() == 429 {
            let retry: u64 = r.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            let body: serde_json::Value = r.json().await.unwrap();
            limited = Some((retry, body));
        }
    }
    assert_eq!(&statuses[..3], &[200, 200, 200], "{statuses:?}");
    let (retry, body) = limited.expect("a flood is limited");
    assert!(retry >= 1);
    assert_eq!(body["code"], "rate_limited");
    assert_eq!(body["retry_after"].as_u64(), Some(retry));

    // The same bucket over gRPC.
    let mut d = pb::discovery_client::DiscoveryClient::connect(s.grpc.clone())
        .await
        .unwrap();
    let e = d
        .discover(pb::DiscoverRequest {
            query: "weather in Paris".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    let detail = agentry::api::error::detail_of(&e);
    assert_eq!(detail.code, "rate_limited");
    assert!(detail.retry_after.is_some_and(|r| r >= 1));

    // Writes past the publisher's burst are refused and not stored.
    let before = agent_count(&h).await;
    let mut accepted = 0;
    let mut refused = 0;
    for i in 0..4 {
        match h
            .call(
                Method::POST,
                "/agents",
                Some(ALICE),
                Some(minimal(&format!("flood-{i}"))),
            )
            .await
        {
            Ok((201, _)) => accepted += 1,
            Err(f) if f.http == 429 && f.code == "rate_limited" => refused += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((accepted, refused), (2, 2));
    assert_eq!(agent_count(&h).await, before + 2);
    s.stop().await;
}

/// Opens `GET /changes` as an anonymous client would; the answer's status
/// and, while the returned response lives, the stream.
async fn follow_changes(http: &str) -> reqwest::Response {
    follow_changes_from(http, "127.0.0.1").await
}

/// Asserts `r` refused a stream: 429 with a retry and the problem body,
/// whose detail says `why`.
async fn stream_refused(r: reqwest::Response, why: &str) {
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "5");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "rate_limited", "{body}");
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(why), "{body}");
}

/// `GET /changes` from the loopback address `from` (any of 127/8).
async fn follow_changes_from(http: &str, from: &str) -> reqwest::Response {
    reqwest::Client::builder()
        .local_address(from.parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap()
        .get(format!("{http}/changes"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap()
}

async fn grpc_watch(
    grpc: &str,
    key: Option<&str>,
) -> Result<tonic::Streaming<pb::WatchResponse>, tonic::Status> {
    let mut client = pb::registry_client::RegistryClient::connect(grpc.to_string())
        .await
        .unwrap();
    let mut req = tonic::Request::new(pb::WatchRequest { from_revision: 0 });
    if let Some(key) = key {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    client.watch(req).await.map(|r| r.into_inner())
}

/// Many anonymous addresses together hold at most `max_anonymous_streams`;
/// callers with credentials keep their own allowance, and `/metrics` shows
/// both.
#[tokio::test]
async fn anonymous_callers_together_hold_at_most_their_share_of_streams() {
    let s = TestServer::start_with(|c| {
        c.rate_limits.enabled = true;
        c.rate_limits.max_open_streams = 2;
        c.rate_limits.max_anonymous_streams = 3;
    })
    .await;
    let mut held = vec![
        follow_changes_from(&s.http, "127.0.0.1").await,
        follow_changes_from(&s.http, "127.0.0.1").await,
        follow_changes_from(&s.http, "127.0.0.2").await,
    ];
    for r in &held {
        assert_eq!(r.status(), 200);
    }
    // 127.0.0.2 and 127.0.0.3 are under their own limit of 2, but the
    // anonymous share is taken: 429 over HTTP, RESOURCE_EXHAUSTED over gRPC.
    for from in ["127.0.0.2", "127.0.0.3"] {
        let r = follow_changes_from(&s.http, from).await;
        stream_refused(r, "anonymous callers already hold 3 streams").await;
    }
    let e = grpc_watch(&s.grpc, None).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    // A caller with credentials is served from its own allowance.
    let alices = grpc_watch(&s.grpc, Some(ALICE))
        .await
        .expect("a principal's stream");
    let metrics = reqwest::get(format!("{}/metrics", s.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for sample in [
        "agentry_open_streams{node_id=\"1\",caller=\"anonymous\"} 3\n",
        "agentry_open_streams{node_id=\"1\",caller=\"authenticated\"} 1\n",
    ] {
        assert!(metrics.contains(sample), "{sample} in:\n{metrics}");
    }
    // A closed anonymous stream frees a place for another address.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    let again = loop {
        let r = follow_changes_from(&s.http, "127.0.0.3").await;
        if r.status() == 200 || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(again.status(), 200, "the closed stream's place came back");
    drop((held, again, alices));
    s.stop().await;
}

#[tokio::test]
async fn one_caller_holds_at_most_its_share_of_open_streams() {
    let s = TestServer::start_with(|c| {
        c.rate_limits.enabled = true;
        c.rate_limits.max_open_streams = 3;
    })
    .await;
    let h = Http::new(&s.http);

    // Three streams of one anonymous address, over both transports.
    let sse = [follow_changes(&s.http).await, follow_changes(&s.http).await];
    for r in &sse {
        assert_eq!(r.status(), 200);
    }
    let watch = grpc_watch(&s.grpc, None).await.expect("a third stream");

    // A fourth is refused on either, with the problem body and a retry.
    stream_refused(follow_changes(&s.http).await, "3 streams").await;
    let e = grpc_watch(&s.grpc, None).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert_eq!(agentry::api::error::detail_of(&e).code, "rate_limited");
    // Plain requests of the same client, and another caller's streams,
    // are not affected.
    let (status, _) = h.call(Method::GET, "/healthz", None, None).await.unwrap();
    assert_eq!(status, 200);
    let mut alices = grpc_watch(&s.grpc, Some(ALICE))
        .await
        .expect("another caller's stream");

    // Routes that stream only when asked take a slot only then: at her
    // cap, Alice's plain invocation and event read are answered (here: the
    // agent does not exist), her streamed ones refused before any work.
    let client = reqwest::Client::new();
    let alice_feed = || {
        client
            .get(format!("{}/changes", s.http))
            .bearer_auth(ALICE)
            .send()
    };
    let alice_feeds = [alice_feed().await.unwrap(), alice_feed().await.unwrap()];
    for feed in &alice_feeds {
        assert_eq!(feed.status(), 200);
    }
    for (method, path, status) in [
        (Method::POST, "/agents/nobody/invoke", 404),
        (Method::POST, "/agents/nobody/invoke?stream=true", 429),
        (Method::GET, "/agents/nobody/get_events/r1", 404),
        (Method::GET, "/agents/nobody/get_events/r1?stream=true", 429),
    ] {
        let r = client
            .request(method, format!("{}{path}", s.http))
            .bearer_auth(ALICE)
            .json(&json!({"text": "hi"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{path}");
    }

    // A closed stream gives its slot back.
    drop(watch);
    let deadline = Instant::now() + Duration::from_secs(5);
    let again = loop {
        let r = follow_changes(&s.http).await;
        if r.status() == 200 || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(again.status(), 200, "the closed stream's slot came back");

    // The streams admitted are live: a registration reaches them.
    h.register(Some(ALICE), minimal("streamed")).await.unwrap();
    let change = tokio::time::timeout(Duration::from_secs(10), alices.message())
        .await
        .expect("a change arrives")
        .unwrap()
        .expect("stream open");
    assert_eq!(change.record.unwrap().metadata.unwrap().id, "streamed");
    drop((sse, alice_feeds));
    s.stop().await;
}

/// An HTTP/2 client that opens a request and then gives the server
/// `window` bytes of flow-control window to answer it, and no more: the
/// answer cannot all be sent, and without a limit it would hold its memory
/// (and the connection) for as long as the client likes, as a stopped
/// reader's would over TCP. How long the connection lasted.
async fn starved(
    addr: std::net::SocketAddr,
    window: u32,
    request: http::Request<()>,
    body: &[u8],
) -> Duration {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut client, connection) = h2::client::Builder::new()
        .initial_window_size(window)
        .handshake::<_, hyper::body::Bytes>(tcp)
        .await
        .unwrap();
    let started = Instant::now();
    let connection = tokio::spawn(connection);
    let (response, mut send) = client.send_request(request, body.is_empty()).unwrap();
    if !body.is_empty() {
        send.send_data(hyper::body::Bytes::copy_from_slice(body), true)
            .unwrap();
    }
    // Headers are not flow-controlled; the body is.
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200, "{addr}");
    let _kept = response.into_body();
    tokio::time::timeout(Duration::from_secs(15), connection)
        .await
        .unwrap_or_else(|_| panic!("{addr}: a starved answer kept its connection"))
        .ok();
    started.elapsed()
}

#[tokio::test]
async fn an_answer_the_client_gives_no_window_for_ends_at_the_write_timeout() {
    let s = TestServer::start_with(|c| c.connections.write_timeout_secs = 2).await;
    let h = Http::new(&s.http);
    // A page of the list well above the 16 KiB parts an answer is handed
    // to the connection in.
    for i in 0..40 {
        let mut meta = minimal(&format!("starved-{i:02}"));
        meta["description"] = json!(format!("Answers questions on topic {i}. ").repeat(30));
        h.register(Some(ALICE), meta).await.unwrap();
    }
    let server = s.server.as_ref().unwrap();
    // No window at all, and one byte of it (the server hands the
    // connection a part whole; the next one then waits for room).
    for window in [0, 1] {
        let list = http::Request::get(format!("http://{}/agents", server.http_addr))
            .body(())
            .unwrap();
        let took = starved(server.http_addr, window, list, b"").await;
        assert!(
            took >= Duration::from_millis(1500),
            "http, {window}: {took:?}"
        );
    }
    // gRPC `List` with an empty request: a 5-byte frame header and no
    // message bytes.
    let list = http::Request::post(format!(
        "http://{}/agentry.v1.Registry/List",
        server.grpc_addr
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let took = starved(server.grpc_addr, 1, list, &[0, 0, 0, 0, 0]).await;
    assert!(took >= Duration::from_millis(1500), "grpc: {took:?}");
    let metrics = metrics_page(&h).await;
    for listener in ["http", "grpc"] {
        let closed = closed_for(&metrics, listener, "write_timeout");
        assert!(closed >= 1.0, "{listener}: {closed}");
    }
    // A client that reads is not cut off by any of this, and streams with
    // nothing to send for longer than the write timeout are not waiting
    // for their clients: they keep their connections and deliver.
    let (_, page) = h
        .call(Method::GET, "/agents", Some(ALICE), None)
        .await
        .unwrap();
    assert_eq!(page["agents"].as_array().map(Vec::len), Some(40));
    let mut watch = watch_from_now(&s).await;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    h.register(Some(ALICE), minimal("quiet-b")).await.unwrap();
    assert_eq!(next_change(&mut watch).await, "quiet-b");
    s.stop().await;
}
