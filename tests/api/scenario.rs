//! One scenario, run once through a tonic client and once through HTTP; both
//! must give the same answers.

use agentry::pb;
use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::*;

async fn registry_lifecycle(t: &impl Transport) {
    let n = t.name();
    let id = format!("https://agents.example.net/id/{n}-translator");

    // Create: 201, normalised, unknown members kept, envelope filled in.
    let (rec, created) = t
        .register(Some(ALICE), translator(&id))
        .await
        .expect("register");
    assert!(created, "{n}: first registration creates");
    assert_eq!(
        rec["tags"],
        json!(["nlp", "chinese", "english", "cloud"]),
        "{n}: tags normalised"
    );
    assert_eq!(
        rec["com.example/pricing"],
        json!({"per_call_usd": 0.002, "free_tier": true}),
        "{n}: unknown member kept"
    );
    assert_eq!(
        rec["bindings"][0]["endpoint"], "https://api.example.com/agents/translate",
        "{n}: endpoint exposed as binding"
    );
    assert_eq!(
        rec["auth"]["type"], "api_key",
        "{n}: auth mirrors authentication"
    );
    assert_eq!(rec["registry"]["owner"], "alice");
    let first_rev = rec["registry"]["revision"].as_u64().unwrap();

    // Get returns the same record.
    let got = t.get(None, &id).await.expect("anonymous get");
    assert_eq!(got, rec, "{n}: get returns what register stored");

    // Refresh with the same endpoint and a newer timestamp: 200, not created.
    let mut newer = translator(&id);
    newer["updated_at"] = json!("2026-06-01T00:00:00Z");
    newer["version"] = json!("1.3.0");
    let (rec2, created) = t
        .register(Some(ALICE), newer.clone())
        .await
        .expect("refresh");
    assert!(!created, "{n}: same id and endpoint refreshes");
    assert!(rec2["registry"]["revision"].as_u64().unwrap() > first_rev);
    assert_eq!(
        rec2["registry"]["created_revision"].as_u64().unwrap(),
        first_rev
    );

    // A stale write never replaces the newer record.
    let err = t
        .register(Some(ALICE), translator(&id))
        .await
        .expect_err("stale");
    assert_eq!(
        (err.code.as_str(), err.http),
        ("stale_metadata", 409),
        "{n}"
    );
    assert_eq!(
        t.get(None, &id).await.unwrap()["version"],
        "1.3.0",
        "{n}: stale write changed nothing"
    );

    // Another owner: conflict on register, forbidden on update/delete/status.
    let err = t
        .register(Some(BOB), newer.clone())
        .await
        .expect_err("other owner");
    assert_eq!((err.code.as_str(), err.http), ("conflict", 409), "{n}");
    let err = t
        .update(Some(BOB), &id, newer.clone())
        .await
        .expect_err("other owner update");
    assert_eq!((err.code.as_str(), err.http), ("forbidden", 403), "{n}");
    let err = t
        .delete(Some(BOB), &id)
        .await
        .expect_err("other owner delete");
    assert_eq!(err.code, "forbidden", "{n}");
    let err = t
        .set_status(Some(BOB), &id, "inactive", "x")
        .await
        .expect_err("other owner status");
    assert_eq!(err.code, "forbidden", "{n}");
    // No key, or a reader key, may not write.
    assert_eq!(
        t.register(None, minimal(&format!("{n}-anon")))
            .await
            .unwrap_err()
            .code,
        "unauthorized"
    );
    assert_eq!(
        t.register(Some(CAROL_READER), minimal(&format!("{n}-reader")))
            .await
            .unwrap_err()
            .code,
        "forbidden"
    );

    // Update with new bindings by the owner; then an admin may update too.
    let mut moved = newer.clone();
    moved["endpoint"] = json!("https://api2.example.com/translate");
    moved["updated_at"] = json!("2026-07-01T00:00:00Z");
    let rec3 = t
        .update(Some(ALICE), &id, moved.clone())
        .await
        .expect("owner update");
    assert_eq!(rec3["endpoint"], "https://api2.example.com/translate");
    // Registering with an endpoint the record no longer has: incompatible.
    let err = t
        .register(Some(ALICE), newer.clone())
        .await
        .expect_err("incompatible bindings");
    assert_eq!(err.code, "conflict", "{n}");
    moved["updated_at"] = json!("2026-08-01T00:00:00Z");
    let rec4 = t
        .update(Some(ADMIN), &id, moved.clone())
        .await
        .expect("admin update");
    assert_eq!(
        rec4["registry"]["owner"], "alice",
        "{n}: admin update keeps the owner"
    );

    // Lifecycle status with a reason; deprecated agents still list.
    let rec5 = t
        .set_status(Some(ALICE), &id, "deprecated", "use v2")
        .await
        .expect("status");
    assert_eq!(rec5["status"], "deprecated");
    assert_eq!(rec5["registry"]["status_reason"], "use v2");
    // The owner's next update, which leaves `status` out, keeps it.
    moved["updated_at"] = json!("2026-09-01T00:00:00Z");
    moved["description"] = json!("Translates text, now with glossaries.");
    moved.as_object_mut().expect("object").remove("status");
    let rec6 = t
        .update(Some(ALICE), &id, moved)
        .await
        .expect("update without status");
    assert_eq!(rec6["status"], "deprecated", "{n}: {rec6:#}");
    assert_eq!(rec6["registry"]["status_reason"], "use v2", "{n}");

    // Filters: AND semantics over tags, capabilities and languages.
    let other = format!("{n}-summarizer");
    let mut s = minimal(&other);
    s["tags"] = json!(["nlp", "legal"]);
    s["capabilities"] = json!(["summarization"]);
    s["supported_languages"] = json!(["en"]);
    t.register(Some(BOB), s).await.expect("second agent");
    let (ids, _, _) = t.list(None, &["nlp"], &[], None, 100, "").await.unwrap();
    assert!(ids.contains(&id) && ids.contains(&other), "{n}: {ids:?}");
    let (ids, _, _) = t
        .list(None, &["nlp", "chinese"], &[], None, 100, "")
        .await
        .unwrap();
    assert!(
        ids.contains(&id) && !ids.contains(&other),
        "{n}: AND over tags {ids:?}"
    );
    let (ids, _, _) = t
        .list(None, &[], &["summarization"], Some("en"), 100, "")
        .await
        .unwrap();
    assert!(
        ids.contains(&other) && !ids.contains(&id),
        "{n}: capability + language {ids:?}"
    );
    let (ids, _, _) = t
        .list(None, &["NLP"], &[], Some("zh"), 100, "")
        .await
        .unwrap();
    assert!(
        ids.contains(&id) && !ids.contains(&other),
        "{n}: filters normalised like tags {ids:?}"
    );

    // Delete leaves a tombstone: get says gone, list hides it, update fails.
    let rev = t.delete(Some(ALICE), &id).await.expect("delete");
    assert!(rev > first_rev);
    let err = t.get(None, &id).await.expect_err("deleted");
    assert_eq!((err.code.as_str(), err.http), ("not_found", 410), "{n}");
    let (ids, _, _) = t.list(None, &["nlp"], &[], None, 100, "").await.unwrap();
    assert!(!ids.contains(&id), "{n}: deleted agent not listed");
    let err = t.delete(Some(ALICE), &id).await.expect_err("twice");
    assert_eq!(err.http, 410);
    let err = t.get(None, "never-registered").await.expect_err("unknown");
    assert_eq!((err.code.as_str(), err.http), ("not_found", 404));

    // Past expires_at: still readable by id and flagged, hidden from lists.
    let exp = format!("{n}-expired");
    let mut m = minimal(&exp);
    m["expires_at"] = json!("2020-01-01T00:00:00Z");
    m["tags"] = json!([format!("{n}-exp")]);
    t.register(Some(ALICE), m)
        .await
        .expect("expired record accepted");
    assert_eq!(
        t.get(None, &exp).await.unwrap()["registry"]["expired"],
        true,
        "{n}"
    );
    let tag = format!("{n}-exp");
    let (ids, _, total) = t.list(None, &[&tag], &[], None, 10, "").await.unwrap();
    assert!(
        ids.is_empty() && total == 0,
        "{n}: expired records are hidden from lists"
    );
}

async fn pagination(t: &impl Transport) {
    let n = t.name();
    for i in 0..7 {
        let mut m = minimal(&format!("{n}-page-{i}"));
        m["tags"] = json!([format!("{n}-paged")]);
        t.register(Some(ALICE), m).await.expect("register");
    }
    let tag = format!("{n}-paged");
    let (mut seen, mut token) = (Vec::new(), String::new());
    loop {
        let (ids, next, total) = t
            .list(None, &[&tag], &[], None, 3, &token)
            .await
            .expect("page");
        assert_eq!(total, 7, "{n}: total is the same on every page");
        assert!(ids.len() <= 3);
        seen.extend(ids);
        if next.is_empty() {
            break;
        }
        token = next;
    }
    let expected: Vec<String> = (0..7).map(|i| format!("{n}-page-{i}")).collect();
    assert_eq!(seen, expected, "{n}: every record once, in id order");
}

#[tokio::test]
async fn lifecycle_over_http() {
    let s = TestServer::start().await;
    let t = Http::new(&s.http);
    registry_lifecycle(&t).await;
    pagination(&t).await;
    s.stop().await;
}

#[tokio::test]
async fn lifecycle_over_grpc() {
    let s = TestServer::start().await;
    let t = Grpc::connect(&s.grpc).await;
    registry_lifecycle(&t).await;
    pagination(&t).await;
    s.stop().await;
}

#[tokio::test]
async fn both_transports_see_the_same_records() {
    let s = TestServer::start().await;
    let (h, g) = (Http::new(&s.http), Grpc::connect(&s.grpc).await);
    let (via_grpc, _) = g
        .register(Some(ALICE), translator("shared-1"))
        .await
        .unwrap();
    let (via_http, _) = h
        .register(Some(ALICE), translator("shared-2"))
        .await
        .unwrap();
    assert_eq!(h.get(None, "shared-1").await.unwrap(), via_grpc);
    assert_eq!(g.get(None, "shared-2").await.unwrap(), via_http);
    assert_eq!(
        h.get(None, "shared-1").await.unwrap(),
        g.get(None, "shared-1").await.unwrap()
    );
    s.stop().await;
}

#[tokio::test]
async fn adp_minimal_record_and_assigned_ids() {
    let s = TestServer::start().await;
    let h = Http::new(&s.http);
    let (rec, created) = h
        .register(Some(ALICE), minimal("https://example.net/agents/minimal"))
        .await
        .expect("ADP D0 record accepted");
    assert!(created);
    assert_eq!(rec["id"], "https://example.net/agents/minimal");
    // AIDIP: the registry assigns an id when the publisher gives none.
    let mut no_id = minimal("x");
    no_id.as_object_mut().unwrap().remove("id");
    let (rec, _) = h.register(Some(ALICE), no_id).await.expect("no id");
    let assigned = rec["id"].as_str().unwrap().to_string();
    assert!(assigned.starts_with("agent-"), "{assigned}");
    assert_eq!(
        h.get(None, &assigned).await.unwrap()["name"],
        "Minimal Agent"
    );
    s.stop().await;
}

#[tokio::test]
async fn private_records_and_anonymous_reads() {
    let s = TestServer::start_with(|c| c.anonymous_reads = false).await;
    let h = Http::new(&s.http);
    let resp = h
        .client
        .post(format!("{}/agents?visibility=private", s.http))
        .bearer_auth(ALICE)
        .json(&minimal("secret-agent"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    assert_eq!(
        h.get(None, "secret-agent").await.unwrap_err().code,
        "unauthorized",
        "anonymous reads off"
    );
    assert_eq!(
        h.get(Some(BOB), "secret-agent").await.unwrap_err().http,
        404,
        "private to others"
    );
    assert_eq!(
        h.get(Some(ALICE), "secret-agent").await.unwrap()["registry"]["visibility"],
        "private"
    );
    assert!(h.get(Some(ADMIN), "secret-agent").await.is_ok());
    let (ids, _, _) = h.list(Some(BOB), &[], &[], None, 100, "").await.unwrap();
    assert!(!ids.contains(&"secret-agent".to_string()));
    s.stop().await;
}

#[tokio::test]
async fn search_health_readiness_and_openapi() {
    let s = TestServer::start().await;
    let h = Http::new(&s.http);
    h.register(Some(ALICE), translator("agent-12345"))
        .await
        .unwrap();
    let mut legal = minimal("legal-sum");
    legal["capabilities"] = json!(["summarization"]);
    legal["supported_languages"] = json!(["en"]);
    h.register(Some(ALICE), legal).await.unwrap();
    let c = &h.client;
    let found: serde_json::Value = c
        .post(format!("{}/agents/search", s.http))
        .json(&json!({"filters": {"capabilities": ["translation"], "supported_languages": ["en", "zh"], "tags": ["nlp"]}, "top": 10}))
        .send().await.unwrap().json().await.unwrap();
    let arr = found.as_array().expect("AIDIP search answers a JSON array");
    assert_eq!(arr.len(), 1);
    assert_eq!(arr[0]["id"], "agent-12345");
    assert_eq!(
        arr[0]["endpoint"],
        "https://api.example.com/agents/translate"
    );
    assert_eq!(arr[0]["capabilities"], json!(["translation"]));
    // The AIDIP 7 example: query text plus a single-language filter.
    let found: serde_json::Value = c
        .post(format!("{}/agents/search", s.http))
        .json(&json!({"query": "summarize an English document", "filters": {"capabilities": ["summarization"], "supported_language": "en"}, "top": 3}))
        .send().await.unwrap().json().await.unwrap();
    assert_eq!(
        found
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["id"].as_str().unwrap())
            .collect::<Vec<_>>(),
        vec!["legal-sum"]
    );

    assert_eq!(
        c.get(format!("{}/healthz", s.http))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // A GET of one of the node's documents, as JSON.
    let fetch = |path: &'static str| {
        let req = c.get(format!("{}/{path}", s.http));
        async move {
            req.send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    };
    let ready = fetch("readyz").await;
    assert_eq!(ready["status"], "ready");
    let doc = fetch("openapi.json").await;
    assert_eq!(doc["openapi"], "3.1.0");
    // Every documented operation is served (answers something other than
    // the router's "no route" / "method not allowed").
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let url = format!("{}{}", s.http, path.replace("{id}", "agent-12345"));
            let resp = c
                .request(method.to_uppercase().parse().unwrap(), url)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            // A feed of server-sent events never ends: its answer is enough.
            let feed = resp
                .headers()
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
            if feed {
                assert_eq!(status, 200, "{method} {path}");
                continue;
            }
            let body: serde_json::Value = resp.json().await.unwrap_or_default();
            let msg = body["message"].as_str().unwrap_or("");
            assert!(
                status != 405 && !msg.starts_with("no route"),
                "{method} {path} is not served: {status} {body}"
            );
        }
    }

    // Prometheus metrics: this single node leads, and has applied the writes.
    let resp = c.get(format!("{}/metrics", s.http)).send().await.unwrap();
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let text = resp.text().await.unwrap();
    let sample = |name: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")))
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(sample("agentry_raft_is_leader"), 1);
    assert_eq!(sample("agentry_raft_voters"), 1);
    assert!(sample("agentry_raft_term") >= 1);
    // Each applied entry takes at least one revision (a batch entry one per
    // write), so the revision read after the index is never behind it.
    let applied_index = sample("agentry_raft_applied_index");
    assert!(applied_index >= 1);
    let ready_after = fetch("readyz").await;
    assert!(ready_after["applied_revision"].as_u64().unwrap() >= applied_index);
    // The discovery index was built at start and reports its size.
    assert!(sample("agentry_discovery_index_rebuilds_total") >= 1);
    sample("agentry_discovery_indexed_agents");

    // gRPC health and reflection on the public listener.
    let channel = tonic::transport::Channel::from_shared(s.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let r = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "agentry.v1.Registry".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    use tonic_reflection::pb::v1::{
        server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        ServerReflectionRequest,
    };
    let mut refl = ServerReflectionClient::new(channel);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = refl
        .server_reflection_info(futures::stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let resp = stream.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
        panic!("list services answer")
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"agentry.v1.Registry".to_string()),
        "{names:?}"
    );
    s.stop().await;
}

/// HTTP conditional requests on a record: its ETag is its revision; a GET
/// with a matching `If-None-Match` gets 304, and a PUT with `If-Match`
/// applies only while the record still has that revision (412 otherwise,
/// nothing changed). gRPC's `expected_revision` is the same precondition.
#[tokio::test]
async fn conditional_requests_on_a_record() {
    let s = TestServer::start().await;
    let h = Http::new(&s.http);
    let path = "/agents/conditional";
    let (status, _, _) = h
        .send(
            Method::POST,
            "/agents",
            Some(ALICE),
            Some(minimal("conditional")),
            &[],
        )
        .await;
    assert_eq!(status, 201);
    let (status, headers, first) = h.send(Method::GET, path, Some(ALICE), None, &[]).await;
    assert_eq!(status, 200);
    let tag = headers["etag"].to_str().expect("etag").to_string();
    assert_eq!(tag, format!("\"{}\"", first["registry"]["revision"]));

    let (status, headers, body) = h
        .send(
            Method::GET,
            path,
            Some(ALICE),
            None,
            &[("if-none-match", &tag)],
        )
        .await;
    assert_eq!((status, body), (304, Value::Null));
    assert_eq!(headers["etag"].to_str().expect("etag"), tag);
    let (status, _, _) = h
        .send(
            Method::GET,
            path,
            Some(ALICE),
            None,
            &[("if-none-match", "\"1\"")],
        )
        .await;
    assert_eq!(status, 200);

    let mut changed = minimal("conditional");
    changed["description"] = json!("Changed once, by the one who saw the latest revision.");
    let (status, _, updated) = h
        .send(
            Method::PUT,
            path,
            Some(ALICE),
            Some(changed.clone()),
            &[("if-match", &tag)],
        )
        .await;
    assert_eq!(status, 200, "{updated}");
    // The same precondition again: the record has moved on.
    changed["description"] = json!("A lost update.");
    for stale in [tag.as_str(), "W/\"1\"", "not-an-etag"] {
        let (status, _, problem) = h
            .send(
                Method::PUT,
                path,
                Some(ALICE),
                Some(changed.clone()),
                &[("if-match", stale)],
            )
            .await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (412, Some("conflict")),
            "{stale}: {problem}"
        );
    }
    let (_, _, now) = h.send(Method::GET, path, Some(ALICE), None, &[]).await;
    assert_eq!(now["description"], updated["description"]);
    // Deletions and status changes hold to it too: a stale tag changes
    // nothing, the current one applies.
    let current = format!("\"{}\"", now["registry"]["revision"]);
    let deprecate = json!({"status": "deprecated", "reason": "replaced"});
    let status_path = format!("{path}/status");
    for (method, route, body) in [
        (Method::DELETE, path, None),
        (Method::POST, status_path.as_str(), Some(deprecate.clone())),
    ] {
        let (status, _, problem) = h
            .send(method, route, Some(ALICE), body, &[("if-match", &tag)])
            .await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (412, Some("conflict")),
            "{route}: {problem}"
        );
    }
    let (_, _, still) = h.send(Method::GET, path, Some(ALICE), None, &[]).await;
    assert_eq!(still["registry"]["revision"], now["registry"]["revision"]);
    // Of a record the caller may not read, a failed precondition says no
    // more than a GET would: not found.
    let (status, _, _) = h
        .send(
            Method::POST,
            "/agents?visibility=private",
            Some(ALICE),
            Some(minimal("conditional-private")),
            &[],
        )
        .await;
    assert_eq!(status, 201);
    for (method, route, body) in [
        (
            Method::DELETE,
            "/agents/conditional-private".to_string(),
            None,
        ),
        (
            Method::POST,
            "/agents/conditional-private/status".to_string(),
            Some(json!({"status": "inactive"})),
        ),
        (
            Method::PUT,
            "/agents/conditional-private".to_string(),
            Some(minimal("conditional-private")),
        ),
    ] {
        let (status, _, problem) = h
            .send(method, &route, Some(BOB), body, &[("if-match", "\"1\"")])
            .await;
        assert_eq!(status, 404, "{route}: {problem}");
    }
    assert_ne!(still["status"], "deprecated", "nothing changed: {still}");
    let (status, _, deprecated) = h
        .send(
            Method::POST,
            &status_path,
            Some(ALICE),
            Some(deprecate),
            &[("if-match", &current)],
        )
        .await;
    assert_eq!(status, 200, "{deprecated}");
    assert_eq!(deprecated["status"], "deprecated");
    let (status, _, _) = h
        .send(
            Method::DELETE,
            path,
            Some(ALICE),
            None,
            &[("if-match", &current)],
        )
        .await;
    assert_eq!(status, 412, "the status change moved the revision on");
    let latest = format!("\"{}\"", deprecated["registry"]["revision"]);
    let (status, _, deleted) = h
        .send(
            Method::DELETE,
            path,
            Some(ALICE),
            None,
            &[("if-match", &latest)],
        )
        .await;
    assert_eq!(
        (status, &deleted["deleted"]),
        (200, &json!(true)),
        "{deleted}"
    );

    // Served as expired, the same revision has another ETag: a client
    // that cached it fresh is not told it is unchanged.
    let mut lapsed = minimal("conditional-lapsed");
    lapsed["expires_at"] = json!("2020-01-01T00:00:00Z");
    let (status, _, _) = h
        .send(Method::POST, "/agents", Some(ALICE), Some(lapsed), &[])
        .await;
    assert_eq!(status, 201);
    let lapsed_path = "/agents/conditional-lapsed";
    let (_, headers, body) = h
        .send(Method::GET, lapsed_path, Some(ALICE), None, &[])
        .await;
    let revision = &body["registry"]["revision"];
    assert_eq!(
        headers["etag"].to_str().expect("etag"),
        format!("\"{revision}.expired\"")
    );
    let fresh_tag = format!("\"{revision}\"");
    let (status, _, _) = h
        .send(
            Method::GET,
            lapsed_path,
            Some(ALICE),
            None,
            &[("if-none-match", &fresh_tag)],
        )
        .await;
    assert_eq!(status, 200);

    let g = Grpc::connect(&s.grpc).await;
    let e = g
        .client
        .clone()
        .update(Grpc::req(
            Some(ALICE),
            agentry::pb::UpdateRequest {
                id: "conditional".into(),
                metadata: Some(agentry::convert::metadata_from_json(changed).expect("metadata")),
                expected_revision: Some(1),
                ..Default::default()
            },
        ))
        .await
        .expect_err("stale revision");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert_eq!(agentry::api::error::detail_of(&e).http_status, 412);
    let mut client = g.client.clone();
    let (status, _, _) = h
        .send(
            Method::POST,
            "/agents",
            Some(ALICE),
            Some(minimal("conditional-grpc")),
            &[],
        )
        .await;
    assert_eq!(status, 201);
    let e = client
        .set_status(Grpc::req(
            Some(ALICE),
            agentry::pb::SetStatusRequest {
                id: "conditional-grpc".into(),
                status: agentry::pb::AgentStatus::Inactive as i32,
                expected_revision: Some(1),
                ..Default::default()
            },
        ))
        .await
        .expect_err("stale revision");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    let e = client
        .delete(Grpc::req(
            Some(ALICE),
            agentry::pb::DeleteRequest {
                id: "conditional-grpc".into(),
                expected_revision: Some(1),
            },
        ))
        .await
        .expect_err("stale revision");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    let (_, _, kept) = h
        .send(
            Method::GET,
            "/agents/conditional-grpc",
            Some(ALICE),
            None,
            &[],
        )
        .await;
    assert_ne!(kept["status"], "inactive", "{kept}");
    let revision = kept["registry"]["revision"].as_u64().expect("revision");
    client
        .delete(Grpc::req(
            Some(ALICE),
            agentry::pb::DeleteRequest {
                id: "conditional-grpc".into(),
                expected_revision: Some(revision),
            },
        ))
        .await
        .expect("deleted at the revision read");
}

/// A list page of large records ends before stock gRPC clients' 4 MiB
/// limit (the harness's client keeps tonic's default), and the pages still
/// cover every record exactly once.
#[tokio::test]
async fn pages_of_large_records_stay_within_grpc_limits() {
    let s = TestServer::start().await;
    let h = Http::new(&s.http);
    let expected: Vec<String> = (0..30).map(|i| format!("large-{i:02}")).collect();
    for id in &expected {
        let mut a = minimal(id);
        a["notes"] = json!("x".repeat(160_000));
        let (status, _, body) = h
            .send(Method::POST, "/agents", Some(ALICE), Some(a), &[])
            .await;
        assert_eq!(status, 201, "{body}");
    }
    let g = Grpc::connect(&s.grpc).await;
    let (mut seen, mut token, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let (ids, next, total) = g
            .list(Some(ALICE), &[], &[], None, 100, &token)
            .await
            .expect("a page the client can take");
        assert_eq!(total, 30);
        assert!(!ids.is_empty());
        pages += 1;
        seen.extend(ids);
        if next.is_empty() {
            break;
        }
        token = next;
    }
    assert!(pages >= 3, "{pages} pages");
    assert_eq!(seen, expected);

    // A ranked search of them all comes in pages too, best first, with the
    // same request and the token; each page is one the client can take.
    const QUERY: &str = "answers short factual questions";
    let ranked_page = |page_token: String| {
        let mut client = g.client.clone();
        async move {
            let request = pb::ListRequest {
                query: QUERY.into(),
                page_size: 30,
                page_token,
                ..Default::default()
            };
            client.list(Grpc::req(Some(ALICE), request)).await
        }
    };
    let (mut ranked, mut scores, mut token, mut pages) = (Vec::new(), Vec::new(), String::new(), 0);
    loop {
        let page = ranked_page(token.clone())
            .await
            .expect("a ranked page the client can take")
            .into_inner();
        assert_eq!(page.total_count, 30);
        assert_eq!(page.records.len(), page.scores.len());
        assert!(!page.records.is_empty());
        pages += 1;
        ranked.extend(
            page.records
                .iter()
                .map(|r| r.metadata.as_ref().unwrap().id.clone()),
        );
        scores.extend(page.scores);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert!(pages >= 3, "{pages} ranked pages");
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    ranked.sort();
    assert_eq!(ranked, expected);
    // A token that is no page of a ranked search is refused.
    let bad = ranked_page("r30".into())
        .await
        .expect_err("an offset past the search");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);

    // The JSON search answers with summaries, all of them.
    let (status, _, body) = h
        .send(
            Method::POST,
            "/agents/search",
            Some(ALICE),
            Some(json!({"query": QUERY, "top": 30})),
            &[],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body.as_array().map(Vec::len), Some(30), "{body}");

    // Discovery at full detail serves what fits and says what it left out.
    let d = pb::discovery_client::DiscoveryClient::connect(s.grpc.clone())
        .await
        .unwrap();
    let discover = |detail: &str| {
        let mut d = d.clone();
        let request = pb::DiscoverRequest {
            query: QUERY.into(),
            limit: 30,
            detail: detail.into(),
            ..Default::default()
        };
        async move { d.discover(Grpc::req(Some(ALICE), request)).await }
    };
    let full = discover("full")
        .await
        .expect("a discovery answer the client can take")
        .into_inner();
    let kept = full.candidates.len();
    assert!((1..30).contains(&kept), "{kept} candidates");
    assert!(
        full.warnings
            .iter()
            .any(|w| w.contains(&format!("{} more candidate(s) were left out", 30 - kept))),
        "{:?}",
        full.warnings
    );
    let summary = discover("").await.unwrap().into_inner();
    assert_eq!(summary.candidates.len(), 30);
    assert!(!summary.warnings.iter().any(|w| w.contains("left out")));
    s.stop().await;
}
