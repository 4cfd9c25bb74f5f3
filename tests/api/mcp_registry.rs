//! The MCP Registry API v0.1 against a real server: publishing versions,
//! the three reads in the API's shapes (validated with JSON Schemas written
//! from the facts page), status changes, the published validation rules,
//! stable cursors under concurrent writes, concurrent publishes of one
//! server, and servers found by the other discovery surfaces.

use std::collections::BTreeSet;

use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::*;

const AUTHORITY: &str = "registry.example.org";
const OFFICIAL: &str = "io.modelcontextprotocol.registry/official";

fn server(name: &str, version: &str) -> Value {
    json!({
        "$schema": "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json",
        "name": name,
        "description": "Weather forecasts and rain warnings for any city.",
        "version": version,
        "repository": {"url": "https://github.com/acme/weather-mcp", "source": "github"},
        "remotes": [{"type": "streamable-http", "url": "https://mcp.acme.example/weather"}],
        "packages": [{
            "registryType": "npm", "identifier": "@acme/weather-mcp", "version": version,
            "transport": {"type": "stdio"},
            "environmentVariables": [{"name": "WEATHER_API_KEY", "isSecret": true}]
        }],
        "_meta": {"io.modelcontextprotocol.registry/publisher-provided": {"tool": "mcp-publisher"}}
    })
}

async fn start() -> (TestServer, Http) {
    let s = TestServer::start_with(|c| c.identity.authority = Some(AUTHORITY.into())).await;
    let h = Http::new(&s.http);
    (s, h)
}

/// (status, body) of a request whose errors are the MCP registry's.
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

fn shapes() -> Value {
    let path = fixture("mcp-registry/shapes.schema.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("JSON")
}

fn assert_shape(def: &str, v: &Value) {
    let s = shapes();
    let schema = json!({"$ref": format!("#/$defs/{def}"), "$defs": s["$defs"]});
    let validator = jsonschema::draft202012::new(&schema).expect("schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(v)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{def}: {errors:#?}\n{v:#}");
}

/// An MCP error: `{"error": …}` and nothing else; its message.
fn mcp_error(status: u16, body: &Value, want: u16) -> String {
    assert_eq!(status, want, "{body}");
    assert_shape("Error", body);
    body["error"].as_str().unwrap_or_default().to_string()
}

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn official(r: &Value) -> &Value {
    &r["_meta"][OFFICIAL]
}

fn versions_of(list: &Value) -> Vec<String> {
    list["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .map(|s| {
            s["server"]["version"]
                .as_str()
                .expect("version")
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn servers_are_published_read_and_retired_in_the_apis_shapes() {
    let (s, h) = start().await;
    let name = "io.acme/weather";
    for v in ["1.0.0", "2.0.0", "1.0.1"] {
        let (status, body) = call(
            &h,
            Method::POST,
            "/v0.1/publish",
            Some(ALICE),
            Some(server(name, v)),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_shape("ServerResponse", &body);
        assert_eq!(body["server"], server(name, v), "kept as published");
        assert_eq!(official(&body)["status"], "active");
        assert_eq!(official(&body)["isLatest"], v != "1.0.1", "{v}: {body}");
    }
    let (status, list) = call(&h, Method::GET, "/v0.1/servers", None, None).await;
    assert_eq!(status, 200);
    assert_shape("ServerList", &list);
    assert_eq!(versions_of(&list), ["1.0.0", "2.0.0", "1.0.1"]);
    assert_eq!(list["metadata"]["count"], 3);
    assert!(list["metadata"].get("nextCursor").is_none());
    let latest: Vec<&Value> = list["servers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| official(s)["isLatest"] == true)
        .collect();
    assert_eq!(latest.len(), 1);
    assert_eq!(latest[0]["server"]["version"], "2.0.0");
    // This registry's own metadata: the signed record behind the version.
    let own = &latest[0]["_meta"]["org.example.registry/agentry"];
    assert_eq!(own["recordId"], format!("mcp:{name}"));
    assert_eq!(own["signature"]["authority"], AUTHORITY);

    let path = format!("/v0.1/servers/{}/versions", enc(name));
    let (status, versions) = call(&h, Method::GET, &path, None, None).await;
    assert_eq!(status, 200);
    assert_shape("ServerList", &versions);
    assert_eq!(
        versions_of(&versions),
        ["1.0.1", "2.0.0", "1.0.0"],
        "newest first"
    );
    let (_, one) = call(&h, Method::GET, &format!("{path}/latest"), None, None).await;
    assert_shape("ServerResponse", &one);
    assert_eq!(one["server"]["version"], "2.0.0");
    let (_, one) = call(&h, Method::GET, &format!("{path}/1.0.0"), None, None).await;
    assert_eq!(one["server"], server(name, "1.0.0"));
    let (status, e) = call(
        &h,
        Method::GET,
        "/v0.1/servers/io.acme%2Fnothing/versions",
        None,
        None,
    )
    .await;
    assert_eq!(mcp_error(status, &e, 404), "Server not found");
    let (status, e) = call(&h, Method::GET, &format!("{path}/9.9.9"), None, None).await;
    mcp_error(status, &e, 404);

    // Filters.
    let (_, found) = call(
        &h,
        Method::GET,
        "/v0.1/servers?search=WEATH&version=latest",
        None,
        None,
    )
    .await;
    assert_eq!(versions_of(&found), ["2.0.0"]);
    let (_, found) = call(&h, Method::GET, "/v0.1/servers?version=1.0.1", None, None).await;
    assert_eq!(versions_of(&found), ["1.0.1"]);
    let (_, found) = call(&h, Method::GET, "/v0.1/servers?search=flights", None, None).await;
    assert_eq!(found["servers"], json!([]));

    // The server is a record like any other: one agent, the latest version.
    let (_, record) = h
        .call(
            Method::GET,
            &format!("/agents/{}", enc(&format!("mcp:{name}"))),
            None,
            None,
        )
        .await
        .expect("record");
    assert_eq!(record["version"], "2.0.0");
    assert_eq!(record["bindings"][0]["protocol"], "mcp");
    let (_, found) = h
        .call(
            Method::POST,
            "/discover",
            None,
            Some(json!({"query": "will it rain in Paris"})),
        )
        .await
        .expect("discover");
    assert_eq!(
        found["candidates"][0]["id"],
        format!("mcp:{name}"),
        "{found:#}"
    );

    // Status: one version, then every version (all or none).
    let before = time_now();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (status, body) = call(
        &h,
        Method::PATCH,
        &format!("{path}/2.0.0/status"),
        Some(ALICE),
        Some(json!({"status": "deleted", "statusMessage": "security issue"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_shape("ServerResponse", &body);
    assert_eq!(official(&body)["status"], "deleted");
    assert_eq!(official(&body)["statusMessage"], "security issue");
    let (status, e) = call(
        &h,
        Method::PATCH,
        &format!("{path}/2.0.0/status"),
        Some(ALICE),
        Some(json!({"status": "deleted", "statusMessage": "security issue"})),
    )
    .await;
    mcp_error(status, &e, 400);
    let (_, list) = call(&h, Method::GET, "/v0.1/servers", None, None).await;
    assert_eq!(versions_of(&list), ["1.0.0", "1.0.1"]);
    let latest: Vec<String> = list["servers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| official(s)["isLatest"] == true)
        .map(|s| s["server"]["version"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(latest, ["1.0.1"]);
    let (_, all) = call(
        &h,
        Method::GET,
        "/v0.1/servers?include_deleted=true",
        None,
        None,
    )
    .await;
    assert_eq!(versions_of(&all), ["1.0.0", "2.0.0", "1.0.1"]);
    let (_, since) = call(
        &h,
        Method::GET,
        &format!("/v0.1/servers?updated_since={}", enc(&before)),
        None,
        None,
    )
    .await;
    assert_eq!(versions_of(&since), ["2.0.0"], "a mirror sees the deletion");
    let (status, body) = call(
        &h,
        Method::PATCH,
        &format!("/v0.1/servers/{}/status", enc(name)),
        Some(ALICE),
        Some(json!({"status": "deprecated"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_shape("StatusUpdate", &body);
    assert_eq!(body["updatedCount"], 3);

    // Another publisher may neither publish nor retire it.
    let (status, e) = call(
        &h,
        Method::POST,
        "/v0.1/publish",
        Some(BOB),
        Some(server(name, "3.0.0")),
    )
    .await;
    mcp_error(status, &e, 403);
    let (status, e) = call(
        &h,
        Method::PATCH,
        &format!("{path}/1.0.0/status"),
        Some(BOB),
        Some(json!({"status": "active"})),
    )
    .await;
    mcp_error(status, &e, 403);
    let (status, e) = call(
        &h,
        Method::POST,
        "/v0.1/publish",
        None,
        Some(server(name, "3.0.0")),
    )
    .await;
    mcp_error(status, &e, 401);
    for method in [Method::PUT, Method::DELETE] {
        let (status, e) = call(
            &h,
            method,
            &format!("{path}/1.0.0"),
            Some(ALICE),
            Some(server(name, "1.0.0")),
        )
        .await;
        assert!(mcp_error(status, &e, 501).contains("not supported"));
    }
    s.stop().await;
}

fn time_now() -> String {
    agentry::domain::time::now()
}

#[tokio::test]
async fn bad_servers_are_refused_by_field_and_nothing_is_stored() {
    let (s, h) = start().await;
    let (status, _) = call(
        &h,
        Method::POST,
        "/v0.1/publish",
        Some(ALICE),
        Some(server("io.acme/weather", "1.0.0")),
    )
    .await;
    assert_eq!(status, 200);
    let mut cases: Vec<(Value, &str)> = Vec::new();
    let with = |k: &str, v: Value| {
        let mut x = server("io.acme/weather", "1.1.0");
        x[k] = v;
        x
    };
    cases.push((with("version", json!("^1.2.3")), "/version"));
    cases.push((with("version", json!(">=1.0.0")), "/version"));
    cases.push((with("version", json!("1.x")), "/version"));
    cases.push((with("version", json!("latest")), "/version"));
    cases.push((with("version", json!("1.0.0")), "/version"));
    cases.push((with("description", json!("d".repeat(101))), "/description"));
    cases.push((with("name", json!("weather")), "/name"));
    cases.push((with("name", json!("io.acme/wea/ther")), "/name"));
    let mut bad_sha = server("io.acme/weather", "1.1.0");
    bad_sha["packages"][0]["fileSha256"] = json!("not-a-sha");
    cases.push((bad_sha, "/packages/0/fileSha256"));
    let mut bad_remote = server("io.acme/weather", "1.1.0");
    bad_remote["remotes"][0]["type"] = json!("carrier-pigeon");
    cases.push((bad_remote, "/remotes/0/type"));
    for (body, field) in cases {
        let (status, e) = call(
            &h,
            Method::POST,
            "/v0.1/publish",
            Some(ALICE),
            Some(body.clone()),
        )
        .await;
        let message = mcp_error(status, &e, 400);
        assert!(message.starts_with(field), "{field}: {message} ({body})");
    }
    let (status, e) = call(&h, Method::GET, "/v0.1/servers?limit=1000", None, None).await;
    mcp_error(status, &e, 400);
    let (status, e) = call(&h, Method::GET, "/v0.1/servers?cursor=bogus", None, None).await;
    mcp_error(status, &e, 400);
    let (status, e) = call(
        &h,
        Method::GET,
        "/v0.1/servers?updated_since=yesterday",
        None,
        None,
    )
    .await;
    mcp_error(status, &e, 400);
    let (status, e) = call(
        &h,
        Method::PATCH,
        "/v0.1/servers/io.acme%2Fweather/status",
        Some(ALICE),
        Some(json!({"status": "gone"})),
    )
    .await;
    mcp_error(status, &e, 400);
    let (_, all) = call(
        &h,
        Method::GET,
        "/v0.1/servers?include_deleted=true",
        None,
        None,
    )
    .await;
    assert_eq!(versions_of(&all), ["1.0.0"], "nothing stored");
    s.stop().await;
}

#[tokio::test]
async fn cursors_never_skip_or_repeat_under_concurrent_writes() {
    let (s, h) = start().await;
    let names: Vec<String> = (0..24).map(|i| format!("io.acme/server-{i:02}")).collect();
    for n in &names {
        let (status, body) = call(
            &h,
            Method::POST,
            "/v0.1/publish",
            Some(ALICE),
            Some(server(n, "1.0.0")),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    // Writers keep adding versions and servers while a reader pages.
    let writer = {
        let h = Http::new(&h.base);
        tokio::spawn(async move {
            for i in 0..20 {
                let n = format!("io.acme/server-{:02}", (i * 7) % 24);
                call(
                    &h,
                    Method::POST,
                    "/v0.1/publish",
                    Some(ALICE),
                    Some(server(&n, &format!("1.1.{i}"))),
                )
                .await;
                call(
                    &h,
                    Method::POST,
                    "/v0.1/publish",
                    Some(ALICE),
                    Some(server(&format!("io.acme/new-{i:02}"), "1.0.0")),
                )
                .await;
            }
        })
    };
    let mut seen: Vec<(String, String)> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            None => "/v0.1/servers?limit=5".to_string(),
            Some(c) => format!("/v0.1/servers?limit=5&cursor={}", enc(c)),
        };
        let (status, page) = call(&h, Method::GET, &path, None, None).await;
        assert_eq!(status, 200, "{page}");
        assert_shape("ServerList", &page);
        for sv in page["servers"].as_array().unwrap() {
            seen.push((
                sv["server"]["name"].as_str().unwrap().into(),
                sv["server"]["version"].as_str().unwrap().into(),
            ));
        }
        match page["metadata"]["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    writer.await.expect("writer");
    let unique: BTreeSet<&(String, String)> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no entry twice: {seen:?}");
    for n in &names {
        assert!(
            seen.contains(&(n.clone(), "1.0.0".into())),
            "{n} 1.0.0 listed"
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn concurrent_publishes_of_one_server_all_land() {
    let (s, h) = start().await;
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let h = Http::new(&h.base);
            tokio::spawn(async move {
                call(
                    &h,
                    Method::POST,
                    "/v0.1/publish",
                    Some(ALICE),
                    Some(server("io.acme/busy", &format!("1.0.{i}"))),
                )
                .await
            })
        })
        .collect();
    for t in tasks {
        let (status, body) = t.await.expect("task");
        assert_eq!(status, 200, "{body}");
    }
    let (_, versions) = call(
        &h,
        Method::GET,
        "/v0.1/servers/io.acme%2Fbusy/versions",
        None,
        None,
    )
    .await;
    let mut got = versions_of(&versions);
    got.sort();
    let want: Vec<String> = (0..8).map(|i| format!("1.0.{i}")).collect();
    assert_eq!(got, want);
    let latest: Vec<&Value> = versions["servers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| official(s)["isLatest"] == true)
        .collect();
    assert_eq!(latest.len(), 1);
    assert_eq!(latest[0]["server"]["version"], "1.0.7");

    // The same name filter through the MCP list and ARD search.
    let (_, mcp) = call(
        &h,
        Method::GET,
        "/v0.1/servers?search=busy&version=latest",
        None,
        None,
    )
    .await;
    let (_, ard) = h
        .call(
            Method::POST,
            "/ard/search",
            None,
            Some(json!({"query": {"text": "weather forecasts", "filter": {"displayName": "busy"}}, "federation": "none"})),
        )
        .await
        .expect("ARD search");
    let from_mcp: Vec<&str> = mcp["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["server"]["name"].as_str().unwrap())
        .collect();
    let from_ard: Vec<&str> = ard["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            e["metadata"]["id"]
                .as_str()
                .unwrap()
                .trim_start_matches("mcp:")
        })
        .collect();
    assert_eq!(from_mcp, from_ard);
    assert_eq!(from_mcp, ["io.acme/busy"]);
    s.stop().await;
}

#[tokio::test]
async fn one_filter_selects_the_same_servers_on_all_four_routes() {
    let (s, h) = start().await;
    for n in ["io.acme/weather", "io.acme/rain", "io.other/forecast"] {
        let (status, body) = call(
            &h,
            Method::POST,
            "/v0.1/publish",
            Some(ALICE),
            Some(server(n, "1.0.0")),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    // Two agents that are no MCP servers, about the same thing.
    for id in ["weather-agent", "rain-agent"] {
        h.call(
            Method::POST,
            "/agents",
            Some(ALICE),
            Some(json!({"id": id, "name": id, "description": "Weather forecasts and rain warnings for any city.",
                        "bindings": [{"protocol": "https", "endpoint": format!("https://{id}.example/invoke")}]})),
        )
        .await
        .expect("registered");
    }
    // The sorted strings at `pointer` in each element of `list`.
    let ids = |list: &Value, pointer: &str| -> Vec<String> {
        let mut v: Vec<String> = list
            .as_array()
            .expect("a list")
            .iter()
            .map(|e| {
                e.pointer(pointer)
                    .and_then(Value::as_str)
                    .expect("an id")
                    .to_string()
            })
            .collect();
        v.sort();
        v
    };
    let want = ["io.acme/rain", "io.acme/weather", "io.other/forecast"].map(|n| format!("mcp:{n}"));
    // MCP list: every server (its latest version).
    let (_, mcp) = call(&h, Method::GET, "/v0.1/servers?version=latest", None, None).await;
    let from_mcp: Vec<String> = ids(&mcp["servers"], "/server/name")
        .into_iter()
        .map(|n| format!("mcp:{n}"))
        .collect();
    assert_eq!(from_mcp, want);
    // The same set by the servers' tag through AIDIP search, ADP discover
    // and ARD search, with a query that also fits the other agents.
    let query = "weather forecasts for a city";
    let (_, aidip) = h
        .call(
            Method::POST,
            "/agents/search",
            None,
            Some(json!({"query": query, "filters": {"tags": ["mcp-server"]}})),
        )
        .await
        .expect("AIDIP search");
    assert_eq!(ids(&aidip, "/id"), want);
    let (_, adp) = h
        .call(
            Method::POST,
            "/discover",
            None,
            Some(json!({"query": query, "required_tags": ["mcp-server"]})),
        )
        .await
        .expect("discover");
    assert_eq!(ids(&adp["candidates"], "/id"), want);
    let (_, ard) = h
        .call(
            Method::POST,
            "/ard/search",
            None,
            Some(json!({"query": {"text": query, "filter": {"tags": "mcp-server"}}, "federation": "none"})),
        )
        .await
        .expect("ARD search");
    let from_ard = ids(&ard["results"], "/metadata/id");
    assert_eq!(from_ard, want);
    s.stop().await;
}

/// A page of large servers ends at about 2 MiB, well under `limit`, and
/// the cursor goes on: a reader gets every version once, in pages it can
/// hold, however large the published documents are.
#[tokio::test]
async fn pages_of_large_servers_end_early_and_go_on() {
    let (s, h) = start().await;
    let names: Vec<String> = (0..12).map(|i| format!("io.acme/large-{i:02}")).collect();
    for n in &names {
        let mut large = server(n, "1.0.0");
        large["_meta"]["io.modelcontextprotocol.registry/publisher-provided"]["notes"] =
            json!("x".repeat(200_000));
        let (status, body) =
            call(&h, Method::POST, "/v0.1/publish", Some(ALICE), Some(large)).await;
        assert_eq!(status, 200, "{body}");
    }
    let (mut seen, mut cursor, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let path = match &cursor {
            None => "/v0.1/servers?limit=100".to_string(),
            Some(c) => format!("/v0.1/servers?limit=100&cursor={}", enc(c)),
        };
        let (status, page) = call(&h, Method::GET, &path, None, None).await;
        assert_eq!(status, 200, "{page}");
        let bytes = serde_json::to_vec(&page).unwrap().len();
        assert!(bytes < 3 << 20, "a page of {bytes} bytes");
        assert_shape("ServerList", &page);
        let servers = page["servers"].as_array().unwrap();
        assert!(!servers.is_empty());
        pages += 1;
        seen.extend(
            servers
                .iter()
                .map(|sv| sv["server"]["name"].as_str().unwrap().to_string()),
        );
        match page["metadata"]["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert!(pages >= 2, "{pages} pages");
    assert_eq!(seen, names);
    s.stop().await;
}
