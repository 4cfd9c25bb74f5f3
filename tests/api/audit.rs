//! The audit trail of a single node: `GET /audit` over HTTP and gRPC, and
//! the JSON-lines copy an operator ships to a SIEM.

use std::time::Duration;

use agentry::pb::{self, cluster_client::ClusterClient};
use serde_json::Value;

use crate::harness::{
    eventually, minimal, Http, TestServer, Transport, ADMIN, ALICE, BOB, CAROL_READER,
};

/// The oldest entry of the node's trail with `outcome` (an admin's view).
async fn oldest_with_outcome(h: &Http, outcome: &str) -> Value {
    let path = format!("/audit?outcome={outcome}");
    let (_, page) = h
        .call(reqwest::Method::GET, &path, Some(ADMIN), None)
        .await
        .unwrap();
    page["entries"][0].clone()
}

#[tokio::test]
async fn attempts_are_listed_and_copied_to_the_audit_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("audit.jsonl");
    let path = file.clone();
    let s = TestServer::start_with(move |c| {
        c.audit.file = Some(path);
        c.max_record_bytes = 64 * 1024;
    })
    .await;
    let h = Http::new(&s.http);
    h.register(Some(ALICE), minimal("audit-a")).await.unwrap();
    // Refused in apply (Alice's id), refused before proposing (a reader).
    assert_eq!(h.delete(Some(BOB), "audit-a").await.unwrap_err().http, 403);
    assert_eq!(
        h.register(Some(CAROL_READER), minimal("audit-b"))
            .await
            .unwrap_err()
            .http,
        403
    );
    let outcomes = |v: &Value| -> Vec<(String, String, String)> {
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["operation"].as_str().unwrap().into(),
                    e["principal"].as_str().unwrap_or("").into(),
                    e["outcome"].as_str().unwrap().into(),
                )
            })
            .collect()
    };
    let expected = vec![
        (
            "register".to_string(),
            "alice".to_string(),
            "ok".to_string(),
        ),
        ("delete".into(), "bob".into(), "forbidden".into()),
        ("register".into(), "carol".into(), "forbidden".into()),
    ];
    let (_, page) = h
        .call(reqwest::Method::GET, "/audit", Some(ADMIN), None)
        .await
        .unwrap();
    assert_eq!(outcomes(&page), expected);
    // A filter that cannot be read is refused; so is an outcome the trail
    // never records, rather than answered with an empty page.
    for (path, field) in [
        ("/audit?since=yesterday", "/since"),
        ("/audit?outcome=denied", "/outcome"),
    ] {
        let e = h
            .call(reqwest::Method::GET, path, Some(ADMIN), None)
            .await
            .unwrap_err();
        assert_eq!((e.http, e.field.as_deref()), (400, Some(field)), "{path}");
    }
    assert_eq!(
        h.call(reqwest::Method::GET, "/audit", Some(ALICE), None)
            .await
            .unwrap_err()
            .http,
        403
    );

    // A refusal at the gate: the error body and the trail share the
    // client's request id.
    let resp = reqwest::Client::new()
        .post(format!("{}/agents", s.http))
        .bearer_auth("not-a-key-of-this-registry")
        .header("x-request-id", "trace-7")
        .json(&minimal("audit-c"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    // RFC 6750's challenge: how to authenticate, and that the token sent
    // was not good.
    assert_eq!(
        resp.headers()["www-authenticate"],
        "Bearer realm=\"agentry\", error=\"invalid_token\""
    );
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["correlation_id"], "trace-7");
    let e = oldest_with_outcome(&h, "unauthorized").await;
    assert_eq!(
        (e["correlation_id"].as_str(), e["operation"].as_str()),
        (Some("trace-7"), Some("POST /agents"))
    );
    // A body refused before any handler read it (too large) is recorded as
    // refused, not as done.
    let mut oversize = minimal("audit-e");
    oversize["x-blob"] = Value::String("a".repeat(300 * 1024));
    let resp = reqwest::Client::new()
        .post(format!("{}/agents", s.http))
        .bearer_auth(ALICE)
        .header("x-request-id", "trace-8")
        .json(&oversize)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let e = oldest_with_outcome(&h, "invalid_request").await;
    assert_eq!(
        (e["correlation_id"].as_str(), e["principal"].as_str()),
        (Some("trace-8"), Some("alice")),
        "{e}"
    );
    assert!(
        e["message"].as_str().unwrap_or("").contains("larger than"),
        "{e}"
    );
    let anonymous = reqwest::Client::new()
        .post(format!("{}/agents", s.http))
        .json(&minimal("audit-d"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    assert_eq!(
        anonymous.headers()["www-authenticate"],
        "Bearer realm=\"agentry\""
    );

    // gRPC lists the same entries.
    let mut req = tonic::Request::new(pb::ListAuditRequest {
        outcome: "forbidden".into(),
        ..Default::default()
    });
    req.metadata_mut()
        .insert("authorization", format!("Bearer {ADMIN}").parse().unwrap());
    let listed = ClusterClient::connect(s.grpc.clone())
        .await
        .unwrap()
        .list_audit(req)
        .await
        .unwrap()
        .into_inner();
    let who: Vec<_> = listed
        .entries
        .iter()
        .map(|e| e.principal.as_str())
        .collect();
    assert_eq!(who, ["bob", "carol"]);

    // The file holds the same entries, one JSON object per line.
    let mut lines = Vec::new();
    for _ in 0..50 {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        lines = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .collect::<Vec<_>>();
        if lines.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lines.truncate(3);
    assert_eq!(outcomes(&serde_json::json!({ "entries": lines })), expected);
    s.stop().await;
}

/// A backup holds the registry's signing keys: only admins get one, over
/// either transport, and a refusal is an error body, not a partial stream.
#[tokio::test]
async fn only_admins_get_a_backup() {
    let s = TestServer::start().await;
    let h = Http::new(&s.http);
    h.register(Some(ALICE), minimal("backup-secret"))
        .await
        .unwrap();
    let url = format!("{}/cluster/backup", s.http);
    for (key, status) in [(None, 401), (Some(ALICE), 403), (Some(CAROL_READER), 403)] {
        let mut req = h.client.get(&url);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), status, "{key:?}");
        let body: Value = resp.json().await.expect("an error body");
        assert!(
            body["code"].is_string() && body["correlation_id"].is_string(),
            "{body}"
        );
    }
    let mut grpc = ClusterClient::connect(s.grpc.clone()).await.unwrap();
    let mut req = tonic::Request::new(pb::BackupRequest {});
    req.metadata_mut()
        .insert("authorization", format!("Bearer {BOB}").parse().unwrap());
    let refused = grpc.backup(req).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);

    // An admin's backup is the whole file, ending with its checksum line.
    let resp = h.client.get(&url).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("\"backup-secret\""));
    let (_, end) = agentry::storage::verify_backup(text.as_bytes()).expect("valid backup");
    assert_eq!(end.records, 1);
}

/// The JSON-lines file is rotated at its size, only the newest rotated
/// files are kept, and a file moved away by another tool (logrotate) is
/// followed: the next line goes to a new file at the path.
#[tokio::test]
async fn the_audit_file_is_rotated_and_follows_a_move() {
    use std::os::unix::fs::PermissionsExt;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("audit.jsonl");
    let path = file.clone();
    let s = TestServer::start_with(move |c| {
        c.audit.file = Some(path);
        c.audit.file_max_bytes = 4096;
        c.audit.file_max_files = 2;
    })
    .await;
    let h = Http::new(&s.http);
    let ids: Vec<String> = (0..60).map(|i| format!("rotated-{i:02}")).collect();
    for id in &ids {
        h.register(Some(ALICE), minimal(id)).await.unwrap();
    }
    let read = |f: &std::path::Path| std::fs::read_to_string(f).unwrap_or_default();
    eventually(
        Duration::from_secs(10),
        "the last registration's line",
        || {
            let text = read(&file);
            async move { text.contains("\"rotated-59\"") }
        },
    )
    .await;
    let mut rotated: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p != &file)
        .collect();
    rotated.sort();
    assert_eq!(rotated.len(), 2, "{rotated:?}");
    let mut registered = Vec::new();
    for f in rotated.iter().chain([&file]) {
        let meta = std::fs::metadata(f).unwrap();
        assert!(
            meta.len() <= 4096,
            "{} holds {} bytes",
            f.display(),
            meta.len()
        );
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{}", f.display());
        for line in read(f).lines() {
            let e: Value = serde_json::from_str(line).unwrap();
            if e["operation"] == "register" {
                registered.push(e["target"].as_str().unwrap().to_string());
            }
        }
    }
    // The newest registrations, in order and each once; the oldest went
    // with the rotated files deleted.
    assert!(
        !registered.is_empty() && registered.len() < ids.len(),
        "{registered:?}"
    );
    assert_eq!(registered, ids[ids.len() - registered.len()..]);

    // logrotate's move: the next line starts a new file at the path.
    let moved = dir.path().join("moved-away.jsonl");
    std::fs::rename(&file, &moved).unwrap();
    h.register(Some(ALICE), minimal("after-the-move"))
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "a new file at the path", || {
        let text = read(&file);
        async move { text.contains("\"after-the-move\"") }
    })
    .await;
    assert!(!read(&moved).contains("after-the-move"));
    s.stop().await;
}
