//! Mirroring an upstream MCP registry (`[[mcp_registry.upstreams]]`)
//! against an upstream served by the test on a loopback port: every version
//! kept with the upstream's times, pages followed (a boundary inside a burst
//! of equal `updatedAt`), the upstream's changes followed (a new version, a
//! deletion, a status change, a late member of a burst), a local
//! publisher's server never overwritten, mirrored servers read-only, and
//! the cursor resumed after a restart of the node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::*;

/// How long the mirror gets to reach a state.
const PATIENCE: Duration = Duration::from_secs(30);

const OFFICIAL: &str = "io.modelcontextprotocol.registry/official";
const T1: &str = "2026-11-01T08:00:00Z";
const T2: &str = "2026-11-01T09:00:00Z";
const T3: &str = "2026-11-01T10:00:00Z";
/// A burst: several servers updated in the same instant.
const BURST: &str = "2026-11-01T11:00:00Z";
const T5: &str = "2026-11-02T12:00:00Z";

fn server_json(name: &str, version: &str) -> Value {
    json!({
        "$schema": "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json",
        "name": name,
        "description": "Weather forecasts and rain warnings for any city.",
        "title": "Acme Weather",
        "version": version,
        "repository": {"url": "https://github.com/acme/weather-mcp", "source": "github"},
        "websiteUrl": "https://acme.example/weather",
        "remotes": [{"type": "streamable-http", "url": "https://mcp.acme.example/weather",
                     "headers": [{"name": "X-Api-Key", "isRequired": true, "isSecret": true}]}],
        "packages": [{
            "registryType": "npm", "registryBaseUrl": "https://registry.npmjs.org",
            "identifier": "@acme/weather-mcp", "version": version,
            "transport": {"type": "stdio"},
            "environmentVariables": [{"name": "WEATHER_API_KEY", "isSecret": true}]
        }, {
            "registryType": "oci", "identifier": "ghcr.io/acme/weather-mcp:1",
            "transport": {"type": "streamable-http", "url": "http://localhost:{port}/mcp"}
        }],
        "_meta": {"io.modelcontextprotocol.registry/publisher-provided": {"tool": "mcp-publisher"}}
    })
}

/// A `ServerResponse` as the upstream serves it.
fn response(name: &str, version: &str, published: &str, updated: &str) -> Value {
    json!({
        "server": server_json(name, version),
        "_meta": {OFFICIAL: {
            "status": "active", "statusChangedAt": published, "publishedAt": published,
            "updatedAt": updated, "isLatest": true
        }}
    })
}

/// The upstream registry: its versions in publish order, and the
/// `(updated_since, cursor)` of every listing request it answered.
#[derive(Default)]
struct Upstream {
    entries: Vec<Value>,
    requests: Vec<(Option<String>, Option<String>)>,
}

impl Upstream {
    fn set_status(&mut self, name: &str, version: &str, status: &str, message: Option<&str>) {
        let e = self
            .entries
            .iter_mut()
            .find(|e| e["server"]["name"] == name && e["server"]["version"] == version)
            .expect("known version");
        let o = &mut e["_meta"][OFFICIAL];
        o["status"] = json!(status);
        o["statusChangedAt"] = json!(T5);
        o["updatedAt"] = json!(T5);
        if let Some(m) = message {
            o["statusMessage"] = json!(m);
        }
    }

    /// `GET /v0.1/servers`: in name then publish order, `updated_since`
    /// strictly after (as the official registry reads it), offset cursors.
    fn list(&mut self, q: &HashMap<String, String>) -> Value {
        self.requests
            .push((q.get("updated_since").cloned(), q.get("cursor").cloned()));
        let since = q.get("updated_since");
        let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(30);
        let offset: usize = q.get("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
        let mut all: Vec<&Value> = self
            .entries
            .iter()
            .filter(|e| {
                // Every time here is written alike, so text order is time order.
                since.is_none_or(|s| {
                    e["_meta"][OFFICIAL]["updatedAt"].as_str().unwrap() > s.as_str()
                })
            })
            .collect();
        all.sort_by_key(|e| e["server"]["name"].as_str().unwrap().to_string());
        let page: Vec<&Value> = all.iter().skip(offset).take(limit).copied().collect();
        let mut metadata = json!({"count": page.len()});
        if offset + limit < all.len() {
            metadata["nextCursor"] = json!((offset + limit).to_string());
        }
        json!({"servers": page, "metadata": metadata})
    }
}

async fn serve(upstream: Arc<Mutex<Upstream>>) -> String {
    let app = axum::Router::new().route(
        "/v0.1/servers",
        axum::routing::get(
            move |axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>| {
                let v = upstream.lock().unwrap().list(&q);
                async move { axum::Json(v) }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn config(dir: &std::path::Path, upstream: &str) -> agentry::config::Config {
    let mut c = test_config(dir);
    c.gateway.outbound.allow = vec!["127.0.0.1".into()];
    c.gateway.outbound.allow_http = true;
    c.mcp_registry.upstreams = vec![agentry::service::McpUpstreamConfig {
        url: format!("{upstream}/"),
        poll_interval_secs: 1,
        namespaces: vec!["io.acme/".into(), "io.alice/".into()],
        owner: "mcp-mirror".into(),
        page_limit: 2,
    }];
    c
}

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// (status, body) of an MCP registry request.
async fn call(
    h: &Http,
    method: Method,
    path: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let (status, _, body) = h.send(method, path, key, body, &[]).await;
    (status, body)
}

/// The versions of a server this registry serves, newest first.
async fn versions(h: &Http, name: &str, deleted: bool) -> Vec<Value> {
    let path = format!(
        "/v0.1/servers/{}/versions?include_deleted={deleted}",
        enc(name)
    );
    match call(h, Method::GET, &path, None, None).await {
        (200, body) => body["servers"].as_array().cloned().unwrap_or_default(),
        _ => Vec::new(),
    }
}

fn version_names(list: &[Value]) -> Vec<String> {
    list.iter()
        .map(|r| r["server"]["version"].as_str().unwrap().to_string())
        .collect()
}

fn requests(u: &Arc<Mutex<Upstream>>) -> Vec<(Option<String>, Option<String>)> {
    u.lock().unwrap().requests.clone()
}

/// Polls that asked from `since` (their first page).
fn polls_since(u: &Arc<Mutex<Upstream>>, since: &str) -> usize {
    requests(u)
        .iter()
        .filter(|(s, c)| s.as_deref() == Some(since) && c.is_none())
        .count()
}

async fn revision(h: &Http, id: &str) -> u64 {
    let rec = h.get(None, id).await.expect("record");
    rec["registry"]["revision"].as_u64().unwrap()
}

#[tokio::test]
async fn an_upstream_registry_is_mirrored_and_followed_across_a_restart() {
    let upstream = Arc::new(Mutex::new(Upstream::default()));
    {
        let mut u = upstream.lock().unwrap();
        u.entries = vec![
            response("io.acme/weather", "1.0.0", T1, T1),
            response("io.acme/weather", "1.1.0", T2, T2),
            response("io.acme/weather", "2.0.0", T3, T3),
            // Pages of two: the boundary falls between dice and echo.
            response("io.acme/clock", "1.0.0", BURST, BURST),
            response("io.acme/dice", "1.0.0", BURST, BURST),
            response("io.acme/echo", "1.0.0", BURST, BURST),
            // Outside the mirror's namespaces.
            response("io.other/skip", "1.0.0", BURST, BURST),
        ];
        for (i, e) in u.entries.iter_mut().enumerate() {
            e["_meta"][OFFICIAL]["isLatest"] = json!(i >= 2);
        }
    }
    let url = serve(upstream.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let server = agentry::server::start(config(dir.path(), &url))
        .await
        .expect("server starts");
    let h = Http::new(&format!("http://{}", server.http_addr));

    // Alice publishes a server here under a name the upstream will use too.
    let mut notes = server_json("io.alice/notes", "1.0.0");
    notes["description"] = json!("Alice's own notes server.");
    let (status, body) = call(&h, Method::POST, "/v0.1/publish", Some(ALICE), Some(notes)).await;
    assert_eq!(status, 200, "{body}");

    // Every version mirrored, with the upstream's times; one is latest.
    eventually(PATIENCE, "the upstream mirrored", || async {
        versions(&h, "io.acme/weather", false).await.len() == 3
            && versions(&h, "io.acme/echo", false).await.len() == 1
    })
    .await;
    let weather = versions(&h, "io.acme/weather", false).await;
    assert_eq!(version_names(&weather), ["2.0.0", "1.1.0", "1.0.0"]);
    for (r, t) in weather.iter().zip([T3, T2, T1]) {
        let o = &r["_meta"][OFFICIAL];
        assert_eq!(o["publishedAt"], t, "{r}");
        assert_eq!(o["updatedAt"], t);
        assert_eq!(o["statusChangedAt"], t);
        assert_eq!(o["status"], "active");
        assert_eq!(
            r["server"],
            server_json("io.acme/weather", r["server"]["version"].as_str().unwrap())
        );
    }
    let latest: Vec<bool> = weather
        .iter()
        .map(|r| r["_meta"][OFFICIAL]["isLatest"].as_bool().unwrap())
        .collect();
    assert_eq!(latest, [true, false, false]);
    let (status, list) = call(&h, Method::GET, "/v0.1/servers?limit=100", None, None).await;
    assert_eq!(status, 200);
    let listed: Vec<(String, String)> = list["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["server"]["name"].as_str().unwrap().to_string(),
                r["server"]["version"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for (n, v) in [
        ("io.acme/clock", "1.0.0"),
        ("io.acme/dice", "1.0.0"),
        ("io.acme/echo", "1.0.0"),
        ("io.acme/weather", "1.0.0"),
        ("io.acme/weather", "2.0.0"),
    ] {
        assert!(
            listed.contains(&(n.into(), v.into())),
            "{n} {v} in {listed:?}"
        );
    }
    assert!(
        versions(&h, "io.other/skip", true).await.is_empty(),
        "outside the namespaces"
    );
    // The record: owned by the mirror's owner, its fields from the latest.
    let rec = h.get(None, "mcp:io.acme/weather").await.unwrap();
    assert_eq!(rec["registry"]["owner"], "mcp-mirror");
    assert_eq!(rec["version"], "2.0.0");
    assert_eq!(rec["name"], "Acme Weather");
    let first = requests(&upstream);
    assert_eq!(first[0], (None, None), "the first poll reads everything");
    assert!(
        first.iter().any(|(_, c)| c.as_deref() == Some("2")),
        "pages followed: {first:?}"
    );

    // The next polls ask from the cursor (less an overlap) and re-read the
    // burst, which writes nothing.
    let clock = revision(&h, "mcp:io.acme/clock").await;
    eventually(PATIENCE, "two polls from the cursor", || async {
        polls_since(&upstream, "2026-11-01T10:59:59Z") >= 2
    })
    .await;
    assert_eq!(
        revision(&h, "mcp:io.acme/clock").await,
        clock,
        "reading a version again changes nothing"
    );

    // Mirrored servers are read-only here.
    let (status, body) = call(
        &h,
        Method::POST,
        "/v0.1/publish",
        Some(ALICE),
        Some(server_json("io.acme/weather", "9.0.0")),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(message.contains(&url), "{message}");
    let (status, body) = call(
        &h,
        Method::PATCH,
        &format!(
            "/v0.1/servers/{}/versions/2.0.0/status",
            enc("io.acme/weather")
        ),
        Some(ADMIN),
        Some(json!({"status": "deprecated"})),
    )
    .await;
    assert_eq!(status, 409, "{body}");

    // The upstream changes: a new version, a deletion, a status change, a
    // late member of the burst, and a server under Alice's name.
    {
        let mut u = upstream.lock().unwrap();
        u.entries.push(response("io.acme/weather", "3.0.0", T5, T5));
        u.set_status("io.acme/weather", "1.0.0", "deleted", None);
        u.set_status("io.acme/weather", "1.1.0", "deprecated", Some("use 3.x"));
        u.entries
            .push(response("io.acme/fox", "1.0.0", BURST, BURST));
        u.entries.push(response("io.alice/notes", "9.0.0", T5, T5));
    }
    eventually(PATIENCE, "the upstream's changes followed", || async {
        versions(&h, "io.acme/weather", true).await.len() == 4
            && versions(&h, "io.acme/fox", false).await.len() == 1
            && polls_since(&upstream, "2026-11-02T11:59:59Z") >= 1
    })
    .await;
    let weather = versions(&h, "io.acme/weather", false).await;
    assert_eq!(version_names(&weather), ["3.0.0", "2.0.0", "1.1.0"]);
    assert_eq!(weather[0]["_meta"][OFFICIAL]["isLatest"], true);
    assert_eq!(weather[0]["_meta"][OFFICIAL]["publishedAt"], T5);
    let o = &weather[2]["_meta"][OFFICIAL];
    assert_eq!(
        (
            &o["status"],
            &o["statusMessage"],
            &o["statusChangedAt"],
            &o["updatedAt"],
            &o["publishedAt"]
        ),
        (
            &json!("deprecated"),
            &json!("use 3.x"),
            &json!(T5),
            &json!(T5),
            &json!(T2)
        )
    );
    let all = versions(&h, "io.acme/weather", true).await;
    let deleted = &all[3]["_meta"][OFFICIAL];
    assert_eq!(
        (&deleted["status"], &deleted["publishedAt"]),
        (&json!("deleted"), &json!(T1))
    );
    assert_eq!(
        h.get(None, "mcp:io.acme/weather").await.unwrap()["version"],
        "3.0.0"
    );
    // Alice's server is hers alone.
    let alice = versions(&h, "io.alice/notes", true).await;
    assert_eq!(version_names(&alice), ["1.0.0"]);
    assert_eq!(
        h.get(None, "mcp:io.alice/notes").await.unwrap()["registry"]["owner"],
        "alice"
    );

    // Each version written is one entry of the audit trail, by the
    // mirror's owner; versions read again left none.
    let (_, trail) = h
        .call(
            Method::GET,
            "/audit?operation=mcp_mirror&page_size=100",
            Some(ADMIN),
            None,
        )
        .await
        .unwrap();
    let mirrored: Vec<&Value> = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["operation"] == "mcp_mirror")
        .collect();
    assert_eq!(mirrored.len(), 6 + 4, "{mirrored:#?}");
    assert!(mirrored
        .iter()
        .all(|e| e["principal"] == "mcp-mirror" && e["outcome"] == "ok"));

    // A restart resumes from the replicated cursor.
    let weather_rev = revision(&h, "mcp:io.acme/weather").await;
    server.shutdown().await;
    let before = requests(&upstream).len();
    let server = agentry::server::start(config(dir.path(), &url))
        .await
        .expect("server restarts");
    let h = Http::new(&format!("http://{}", server.http_addr));
    eventually(PATIENCE, "a poll after the restart", || async {
        requests(&upstream).len() > before
    })
    .await;
    assert_eq!(
        requests(&upstream)[before],
        (Some("2026-11-02T11:59:59Z".to_string()), None),
        "the first poll after the restart asks from the stored cursor"
    );
    // A second poll starts only once the first has ended.
    eventually(PATIENCE, "a whole poll after the restart", || async {
        requests(&upstream)[before..]
            .iter()
            .filter(|(_, c)| c.is_none())
            .count()
            >= 2
    })
    .await;
    assert_eq!(
        version_names(&versions(&h, "io.acme/weather", false).await),
        ["3.0.0", "2.0.0", "1.1.0"]
    );
    assert_eq!(revision(&h, "mcp:io.acme/weather").await, weather_rev);
    server.shutdown().await;
}
