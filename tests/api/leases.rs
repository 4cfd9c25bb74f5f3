//! Refreshing agents and shared leases (issue 20, point 3): keep-alives that
//! move an agent's expiry without sending or rewriting its record.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::*;
use agentry::pb;

fn agent(id: &str, description: &str) -> Value {
    json!({
        "id": id,
        "name": format!("{id} agent"),
        "description": description,
        "tags": ["weather"],
        "bindings": [{"protocol": "https", "endpoint": format!("https://agents.example.net/{id}")}],
        // Long past: without a lease the agent is expired.
        "expires_at": "2020-01-01T00:00:00Z",
    })
}

/// Ids discovery returns for a weather question (expired agents hidden).
async fn discovered(h: &Http) -> Vec<String> {
    let (_, r) = h
        .call(
            Method::POST,
            "/discover",
            Some(CAROL_READER),
            Some(json!({"query": "weather forecast for a city", "required_tags": ["weather"]})),
        )
        .await
        .expect("discovery succeeds");
    let mut ids: Vec<String> = r["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

async fn post(h: &Http, path: &str, key: &str, body: Option<Value>) -> (u16, Value) {
    let (status, _, v) = h.send(Method::POST, path, Some(key), body, &[]).await;
    (status, v)
}

fn unix(rfc3339: &Value) -> i64 {
    time::OffsetDateTime::parse(
        rfc3339.as_str().expect("a timestamp"),
        &time::format_description::well_known::Rfc3339,
    )
    .expect("RFC 3339")
    .unix_timestamp()
}

fn now_unix() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

#[tokio::test]
async fn a_refresh_keeps_an_agent_fresh_without_rewriting_its_record() {
    let server = TestServer::start().await;
    let h = Http::new(&server.http);
    h.call(
        Method::POST,
        "/agents",
        Some(ALICE),
        Some(agent("forecast", "Weather forecasts for any city.")),
    )
    .await
    .expect("registers");
    assert!(discovered(&h).await.is_empty(), "expired before a refresh");
    let before = h.record("forecast", ALICE).await;

    // No body at all: the default TTL.
    let (status, r) = post(&h, "/agents/forecast/refresh", ALICE, None).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["id"], "forecast");
    assert_eq!(r["ttl_seconds"], 60);
    assert_eq!(r["agents"], 1);
    let expires = unix(&r["expires_at"]);
    assert!((expires - now_unix() - 60).abs() <= 2, "{r}");
    assert_eq!(discovered(&h).await, vec!["forecast"]);
    // The freshness discovery reports is the lease's.
    let (_, d) = h
        .call(
            Method::POST,
            "/discover",
            None,
            Some(json!({"query": "weather forecast", "include_evidence": true})),
        )
        .await
        .unwrap();
    assert_eq!(
        unix(&d["candidates"][0]["freshness"]["expires_at"]),
        expires,
        "{d}"
    );
    // Federated discovery ranks this registry's agents by their lease too
    // (no peer configured: the pool holds the local candidates).
    let (_, d) = h
        .call(
            Method::POST,
            "/discover",
            None,
            Some(json!({"query": "weather forecast", "scope": "federated",
                "include_evidence": true})),
        )
        .await
        .unwrap();
    assert_eq!(d["candidates"][0]["id"], "forecast", "{d}");
    assert_eq!(
        unix(&d["candidates"][0]["freshness"]["expires_at"]),
        expires,
        "{d}"
    );
    // The record is the one stored before: same revision, same signature;
    // only the flag computed when it is read follows the lease.
    let after = h.record("forecast", ALICE).await;
    assert_eq!(before["registry"]["expired"], true, "{before}");
    assert_eq!(after["registry"]["expired"], false, "{after}");
    let (mut before, mut after) = (before, after);
    before["registry"]
        .as_object_mut()
        .unwrap()
        .remove("expired");
    after["registry"].as_object_mut().unwrap().remove("expired");
    assert_eq!(before, after);

    // Over gRPC, with a TTL of its own; the next refresh keeps that TTL.
    let mut grpc = Grpc::connect(&server.grpc).await;
    let mut req = tonic::Request::new(pb::RefreshRequest {
        id: "forecast".into(),
        ttl_seconds: Some(1),
        lease: None,
    });
    req.metadata_mut()
        .insert("authorization", format!("Bearer {ALICE}").parse().unwrap());
    let got = grpc
        .client
        .refresh(req)
        .await
        .expect("gRPC refresh")
        .into_inner();
    assert_eq!(got.ttl_seconds, 1);
    assert_eq!(got.id.as_deref(), Some("forecast"));
    eventually(Duration::from_secs(5), "the 1 s lease to lapse", || async {
        discovered(&h).await.is_empty()
    })
    .await;
    let (_, r) = post(&h, "/agents/forecast/refresh", ALICE, Some(json!({}))).await;
    assert_eq!(r["ttl_seconds"], 1, "{r}");
    let (_, r) = post(
        &h,
        "/agents/forecast/refresh",
        ALICE,
        Some(json!({"ttl_seconds": 300})),
    )
    .await;
    assert_eq!(r["ttl_seconds"], 300);
    assert_eq!(discovered(&h).await, vec!["forecast"]);

    // Bad refreshes are refused and change nothing.
    for (key, path, body, code, field) in [
        (BOB, "/agents/forecast/refresh", None, 403, None),
        (CAROL_READER, "/agents/forecast/refresh", None, 403, None),
        (ALICE, "/agents/nobody/refresh", None, 404, None),
        (
            ALICE,
            "/agents/forecast/refresh",
            Some(json!({"ttl_seconds": 0})),
            400,
            Some("/ttl_seconds"),
        ),
        (
            ALICE,
            "/agents/forecast/refresh",
            Some(json!({"ttl_seconds": 9_999_999})),
            400,
            Some("/ttl_seconds"),
        ),
        (
            ALICE,
            "/agents/forecast/refresh",
            Some(json!({"ttl_seconds": "300"})),
            400,
            Some("/ttl_seconds"),
        ),
        (
            ALICE,
            "/agents/forecast/refresh",
            Some(json!({"ttl": 5})),
            400,
            None,
        ),
        (
            ALICE,
            "/agents/forecast/refresh",
            Some(json!({"lease": "no such/lease"})),
            400,
            Some("/lease"),
        ),
        (
            ALICE,
            "/agents/forecast/refresh",
            Some(json!({"lease": "missing"})),
            404,
            None,
        ),
    ] {
        let (status, r) = post(&h, path, key, body.clone()).await;
        assert_eq!(status, code, "{path} {body:?}: {r}");
        if let Some(f) = field {
            assert_eq!(r["field"], f, "{r}");
            // The message names the field too, as every field error's does.
            let message = r["message"].as_str().unwrap_or_default();
            assert!(message.starts_with(&format!("{f}: ")), "{r}");
        }
        assert!(r["error"]["code"].is_string(), "the one error body: {r}");
    }
    let (status, _, r) = h
        .send(
            Method::POST,
            "/agents/forecast/refresh",
            Some(ALICE),
            None,
            &[("content-type", "text/plain")],
        )
        .await;
    assert_eq!(status, 415, "{r}");
    // Without credentials: refused at the gate, on every lease route.
    for (method, path) in [
        (Method::POST, "/agents/forecast/refresh"),
        (Method::POST, "/leases/any/refresh"),
        (Method::GET, "/leases/any"),
        (Method::DELETE, "/leases/any"),
    ] {
        let (status, _, r) = h.send(method, path, None, None, &[]).await;
        assert_eq!(status, 401, "{path}: {r}");
        assert!(r["error"]["code"].is_string(), "the one error body: {r}");
    }
    let (_, r) = post(&h, "/agents/forecast/refresh", ALICE, None).await;
    assert_eq!(
        r["ttl_seconds"], 300,
        "refused refreshes changed nothing: {r}"
    );

    // Registering the agent again ends the hold: its own (past) expires_at
    // governs, as ADP's re-send refresh says.
    h.call(
        Method::POST,
        "/agents",
        Some(ALICE),
        Some(agent(
            "forecast",
            "Weather forecasts for any city, now hourly.",
        )),
    )
    .await
    .expect("registers again");
    assert!(discovered(&h).await.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn a_shared_lease_keeps_many_agents_and_revoking_it_expires_them() {
    let server = TestServer::start().await;
    let h = Http::new(&server.http);
    for id in ["north", "south", "east"] {
        h.call(
            Method::POST,
            "/agents",
            Some(ALICE),
            Some(agent(id, &format!("Weather forecasts for the {id}."))),
        )
        .await
        .expect("registers");
    }
    let (status, r) = post(
        &h,
        "/leases/fleet-a/refresh",
        ALICE,
        Some(json!({"ttl_seconds": 120})),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["lease"], "fleet-a");
    assert_eq!(r["agents"], 0);
    for (i, id) in ["north", "south"].into_iter().enumerate() {
        let (status, r) = post(
            &h,
            &format!("/agents/{id}/refresh"),
            ALICE,
            Some(json!({"lease": "fleet-a"})),
        )
        .await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["lease"], "fleet-a");
        assert_eq!(r["ttl_seconds"], 120);
        assert_eq!(r["agents"], i as u64 + 1);
    }
    assert_eq!(discovered(&h).await, vec!["north", "south"]);

    // One refresh of the lease keeps both.
    let (_, r) = post(&h, "/leases/fleet-a/refresh", ALICE, None).await;
    assert_eq!(r["agents"], 2);
    assert_eq!(r["ttl_seconds"], 120);
    let (status, _, r) = h
        .send(Method::GET, "/leases/fleet-a", Some(ALICE), None, &[])
        .await;
    assert_eq!((status, r["agents"].clone()), (200, json!(2)), "{r}");

    // Only its owner (or an admin) uses or sees it.
    let (status, _) = post(&h, "/leases/fleet-a/refresh", BOB, None).await;
    assert_eq!(status, 403);
    let (status, _, _) = h
        .send(Method::GET, "/leases/fleet-a", Some(BOB), None, &[])
        .await;
    assert_eq!(status, 404);
    let (status, _, _) = h
        .send(Method::GET, "/leases/fleet-a", Some(ADMIN), None, &[])
        .await;
    assert_eq!(status, 200);
    let (status, r) = post(
        &h,
        "/agents/east/refresh",
        ALICE,
        Some(json!({"lease": "fleet-a", "ttl_seconds": 5})),
    )
    .await;
    assert_eq!((status, r["field"].clone()), (400, json!("/ttl_seconds")));

    // Revoked: the agents it held expire at once.
    let (status, _, r) = h
        .send(Method::DELETE, "/leases/fleet-a", Some(ALICE), None, &[])
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["revoked"], true);
    assert_eq!(r["agents"], 2);
    assert!(discovered(&h).await.is_empty());
    let (status, _, _) = h
        .send(Method::GET, "/leases/fleet-a", Some(ALICE), None, &[])
        .await;
    assert_eq!(status, 404);
    let (status, _, _) = h
        .send(Method::DELETE, "/leases/fleet-a", Some(ALICE), None, &[])
        .await;
    assert_eq!(status, 404);
    // Refreshing an agent on its own again brings it back.
    post(&h, "/agents/north/refresh", ALICE, None).await;
    assert_eq!(discovered(&h).await, vec!["north"]);

    // The same from the command line (tokio's Command: a blocking wait
    // would stall the server, which runs on this test's runtime).
    let cli = |args: &'static [&'static str]| {
        let grpc = server.grpc.clone();
        async move {
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
                .args(["agents", "--server", &grpc, "--api-key", ALICE, "--json"])
                .args(args)
                .env("AGENTRY_LOG", "warn")
                .output()
                .await
                .expect("the CLI runs");
            assert!(out.status.success(), "{out:?}");
            serde_json::from_slice::<Value>(&out.stdout).expect("JSON out")
        }
    };
    let r = cli(&["lease", "fleet-b", "--ttl", "90"]).await;
    assert_eq!(
        (r["lease"].clone(), r["ttl_seconds"].clone()),
        (json!("fleet-b"), json!(90))
    );
    let r = cli(&["refresh", "south", "--lease", "fleet-b"]).await;
    assert_eq!(r["agents"], 1, "{r}");
    assert_eq!(discovered(&h).await, vec!["north", "south"]);
    let r = cli(&["lease", "fleet-b", "--show"]).await;
    assert_eq!(r["agents"], 1, "{r}");
    cli(&["lease", "fleet-b", "--revoke"]).await;
    assert_eq!(discovered(&h).await, vec!["north"]);

    // Restarted, discovery reads the holds from storage: north on its own
    // expiry, south on a shared lease, east on its own (past) expires_at.
    let (status, _) = post(&h, "/leases/fleet-c/refresh", ALICE, None).await;
    assert_eq!(status, 200);
    let (status, _) = post(
        &h,
        "/agents/south/refresh",
        ALICE,
        Some(json!({"lease": "fleet-c"})),
    )
    .await;
    assert_eq!(status, 200);
    let server = server.restart().await;
    let h = Http::new(&server.http);
    eventually(
        Duration::from_secs(10),
        "the restarted node to find the agents its holds keep",
        || async { discovered(&h).await == ["north", "south"] },
    )
    .await;
    let (status, _, _) = h
        .send(Method::DELETE, "/leases/fleet-c", Some(ALICE), None, &[])
        .await;
    assert_eq!(status, 200);
    assert_eq!(discovered(&h).await, vec!["north"]);
    server.stop().await;
}
