//! ARD and the AI Catalog against real servers: the catalog document
//! validated with the ARD schema and its trust manifests checked with the
//! registry's published key; search, explore, list and get over HTTP and
//! gRPC; ARD's error shape for bad input; the three federation modes with
//! two registries.

use std::time::Duration;

use agentry::pb::{self, ard_client::ArdClient};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ed25519_dalek::{Signature, Verifier, VerifyingKey};
use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::*;

const AUTHORITY: &str = "registry.example.org";
const A2A: &str = "application/a2a-agent-card+json";
const MCP: &str = "application/mcp-server-card+json";

fn agent(
    id: &str,
    name: &str,
    description: &str,
    protocol: &str,
    tags: &[&str],
    examples: &[&str],
) -> Value {
    json!({
        "id": id,
        "name": name,
        "description": description,
        "tags": tags,
        "version": "1.0.0",
        "examples": examples.iter().map(|t| json!({"text": t})).collect::<Vec<_>>(),
        "bindings": [{"protocol": protocol, "endpoint": format!("https://agents.example.net/{}", name.replace(' ', "-"))}],
    })
}

/// The demo-like directory: four public agents of different kinds and one
/// private one.
async fn directory(h: &Http) {
    let agents = [
        agent(
            "weather",
            "Weather Forecaster",
            "Gives weather forecasts, temperatures and rain warnings for any city.",
            "https",
            &["weather", "forecast"],
            &[
                "Will it rain in Paris tomorrow?",
                "Temperature in Oslo this weekend",
            ],
        ),
        agent(
            "urn:air:acme.com:travel:flights",
            "Flight Booker",
            "Searches and books airline flights between airports.",
            "a2a",
            &["travel", "flights"],
            &[
                "Book a flight from Berlin to Rome",
                "Find cheap flights to Tokyo in May",
            ],
        ),
        agent(
            "translator_v2",
            "Translator",
            "Translates text between English, German, French and Chinese.",
            "mcp",
            &["translation", "language"],
            &[
                "Translate this letter into German",
                "What is 'thank you' in Chinese?",
            ],
        ),
        agent(
            "hotels",
            "Hotel Finder",
            "Finds and books hotel rooms near a place.",
            "a2a",
            &["travel", "hotels"],
            &[
                "A hotel near the Louvre for two nights",
                "Book a room in Kyoto",
            ],
        ),
    ];
    for a in agents {
        let (status, _) = h
            .call(Method::POST, "/agents", Some(ALICE), Some(a))
            .await
            .expect("registers");
        assert_eq!(status, 201);
    }
    let (status, _) = h
        .call(
            Method::POST,
            "/agents?visibility=private",
            Some(BOB),
            Some(agent(
                "secret-weather",
                "Private Weather",
                "Weather forecasts for Bob's team only.",
                "https",
                &["weather"],
                &["Rain in Paris?", "Sun in Rome?"],
            )),
        )
        .await
        .expect("registers");
    assert_eq!(status, 201);
}

async fn start() -> (TestServer, Http) {
    let server = TestServer::start_with(|c| c.identity.authority = Some(AUTHORITY.into())).await;
    let h = Http::new(&server.http);
    (server, h)
}

/// Asserts an ARD error (`{errorCode, message}`, nothing else) and returns
/// its message.
fn ard_error(status: u16, body: &Value, want_status: u16, code: &str) -> String {
    assert_eq!(status, want_status, "{body}");
    assert_eq!(body["errorCode"], code, "{body}");
    let keys: Vec<&String> = body.as_object().expect("an object").keys().collect();
    assert_eq!(keys, ["errorCode", "message"], "ARD's error shape: {body}");
    body["message"].as_str().unwrap_or_default().to_string()
}

fn schema() -> Value {
    let path = fixture("ard/ai-catalog.schema.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("schema fixture")).expect("JSON")
}

fn assert_valid(schema: &Value, doc: &Value) {
    let validator = jsonschema::draft202012::new(schema).expect("schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}\n{doc:#}");
}

/// The schema of one catalog entry.
fn entry_schema() -> Value {
    let s = schema();
    json!({"$ref": "#/$defs/catalogEntry", "$defs": s["$defs"]})
}

async fn registry_key(h: &Http) -> (String, VerifyingKey) {
    for _ in 0..100 {
        let (_, info) = h
            .call(Method::GET, "/.well-known/agentry.json", None, None)
            .await
            .expect("registry info");
        if info["established"] == true {
            let id = info["signing_key"].as_str().expect("key id").to_string();
            let public = info["keys"]
                .as_array()
                .and_then(|ks| ks.iter().find(|k| k["key_id"] == id.as_str()))
                .and_then(|k| k["public_key"].as_str())
                .expect("signing key");
            let bytes: [u8; 32] = URL_SAFE_NO_PAD
                .decode(public)
                .expect("b64")
                .try_into()
                .expect("32 bytes");
            return (id, VerifyingKey::from_bytes(&bytes).expect("key"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the registry never established its identity");
}

/// Checks an entry's trust manifest as a client would: the detached JWS
/// over the manifest with the registry's published key, and the record at
/// the registry against the manifest's digest and its own signature.
async fn check_trust(h: &Http, entry: &Value, key_id: &str, key: &VerifyingKey) {
    let manifest = &entry["trustManifest"];
    assert_eq!(manifest["identity"], format!("https://{AUTHORITY}"));
    let jws = manifest["signature"].as_str().expect("a signature");
    let (header, rest) = jws.split_once("..").expect("a detached JWS");
    let header: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).expect("b64")).expect("JSON");
    assert_eq!(header, json!({"alg": "EdDSA", "kid": key_id}));
    let mut unsigned = manifest.clone();
    unsigned.as_object_mut().unwrap().remove("signature");
    let payload = URL_SAFE_NO_PAD.encode(agentry::crypto::canonical::canonical(&unsigned));
    let signing_input = format!("{}.{payload}", jws.split_once("..").unwrap().0);
    let sig: [u8; 64] = URL_SAFE_NO_PAD
        .decode(rest)
        .expect("b64")
        .try_into()
        .expect("64 bytes");
    key.verify(signing_input.as_bytes(), &Signature::from_bytes(&sig))
        .expect("the trust manifest verifies with the published key");
    // The record it points at is the one the digest names.
    let published = &manifest["provenance"][0];
    assert_eq!(published["relation"], "publishedFrom");
    let url = published["sourceId"].as_str().expect("source");
    let path = url
        .strip_prefix(&h.base)
        .expect("a record at this registry");
    let (_, served) = h
        .call(Method::GET, path, None, None)
        .await
        .expect("the record");
    let bytes = agentry::crypto::signature::signed_bytes(&served).expect("signed");
    assert_eq!(
        published["sourceDigest"],
        agentry::domain::catalog::digest(bytes.as_bytes())
    );
    agentry::crypto::signature::verify_served(&served, key).expect("the record verifies");
}

async fn catalog(h: &Http, headers: &[(&str, &str)]) -> (u16, reqwest::header::HeaderMap, Value) {
    h.send(
        Method::GET,
        "/.well-known/ai-catalog.json",
        None,
        None,
        headers,
    )
    .await
}

fn identifiers(entries: &Value) -> Vec<String> {
    entries
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["identifier"].as_str().expect("identifier").to_string())
        .collect()
}

fn minted(id: &str) -> String {
    format!("urn:air:{AUTHORITY}:agents:{id}")
}

#[tokio::test]
async fn the_ai_catalog_lists_public_agents_with_verifiable_trust_manifests() {
    let (server, h) = start().await;
    directory(&h).await;
    let (key_id, key) = registry_key(&h).await;

    let (status, headers, doc) = catalog(&h, &[]).await;
    assert_eq!(status, 200, "{doc}");
    assert_eq!(headers["content-type"], "application/ai-catalog+json");
    assert!(headers["cache-control"]
        .to_str()
        .unwrap()
        .starts_with("public, max-age="));
    assert_valid(&schema(), &doc);
    assert_eq!(doc["specVersion"], "1.0");
    assert_eq!(doc["host"]["identifier"], AUTHORITY);
    let entries = doc["entries"].as_array().unwrap();
    let registry = &entries[0];
    assert_eq!(registry["type"], "application/ai-registry+json");
    assert_eq!(registry["url"], format!("{}/ard", h.base));
    let ids = identifiers(&doc["entries"]);
    // Public agents only; URN ids kept, others minted reversibly.
    assert_eq!(
        ids[1..],
        [
            minted("hotels"),
            minted("translator__v2"),
            "urn:air:acme.com:travel:flights".to_string(),
            minted("weather"),
        ]
    );
    let by_id = |id: &str| {
        entries
            .iter()
            .find(|e| e["metadata"]["id"] == id)
            .expect("listed")
            .clone()
    };
    let weather = by_id("weather");
    assert_eq!(weather["type"], "application/aidip+json");
    assert_eq!(weather["url"], format!("{}/agents/weather", h.base));
    assert_eq!(weather["tags"], json!(["weather", "forecast"]));
    assert_eq!(
        weather["representativeQueries"],
        json!([
            "Will it rain in Paris tomorrow?",
            "Temperature in Oslo this weekend"
        ])
    );
    assert_eq!(by_id("urn:air:acme.com:travel:flights")["type"], A2A);
    assert_eq!(by_id("translator_v2")["type"], MCP);
    for e in &entries[1..] {
        check_trust(&h, e, &key_id, &key).await;
    }

    // Conditional requests; a change shows within the rebuild interval.
    let etag = headers["etag"].to_str().unwrap().to_string();
    let (status, _, _) = catalog(&h, &[("if-none-match", &etag)]).await;
    assert_eq!(status, 304);
    let (status, _) = h
        .call(Method::DELETE, "/agents/hotels", Some(ALICE), None)
        .await
        .expect("deleted");
    assert_eq!(status, 200);
    let mut changed = None;
    for _ in 0..60 {
        let (status, headers, doc) = catalog(&h, &[("if-none-match", &etag)]).await;
        if status == 200 {
            assert_ne!(headers["etag"].to_str().unwrap(), etag);
            changed = Some(doc);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let doc = changed.expect("the catalog changes after a deletion");
    assert!(!identifiers(&doc["entries"]).contains(&minted("hotels")));
    assert_valid(&schema(), &doc);
    server.stop().await;
}

async fn search(h: &Http, body: Value) -> Value {
    let (status, _, v) = h
        .send(Method::POST, "/ard/search", None, Some(body), &[])
        .await;
    assert_eq!(status, 200, "{v}");
    v
}

#[tokio::test]
async fn ard_search_explore_list_and_get_agree_over_http_and_grpc() {
    let (server, h) = start().await;
    directory(&h).await;
    let entry_schema = entry_schema();

    // Search: the right agent first, scored 0–100, from this registry.
    let found = search(
        &h,
        json!({"query": {"text": "will it rain in Paris tomorrow"}, "federation": "none"}),
    )
    .await;
    let results = found["results"].as_array().expect("results");
    assert_eq!(results[0]["identifier"], minted("weather"), "{found:#}");
    for r in results {
        let score = r["score"].as_u64().expect("an integer score");
        assert!((1..=100).contains(&score), "{r}");
        assert_eq!(r["source"], format!("{}/ard", h.base));
        assert_valid(&entry_schema, r);
    }
    assert!(found.get("referrals").is_none());
    assert!(
        !identifiers(&found["results"]).contains(&minted("secret-weather")),
        "another publisher's private agent stays hidden"
    );
    // Bob sees his own.
    let (_, _, bobs) = h
        .send(
            Method::POST,
            "/ard/search",
            Some(BOB),
            Some(json!({"query": {"text": "rain in Paris"}, "federation": "none"})),
            &[],
        )
        .await;
    assert!(
        identifiers(&bobs["results"]).contains(&minted("secret-weather")),
        "{bobs}"
    );

    // Filters: OR within a key, AND across keys.
    let travel = search(
        &h,
        json!({"query": {"text": "book my trip", "filter": {"type": [A2A, MCP], "tags": "travel"}}, "federation": "none"}),
    )
    .await;
    let mut ids = identifiers(&travel["results"]);
    ids.sort();
    assert_eq!(
        ids,
        [
            "urn:air:acme.com:travel:flights".to_string(),
            minted("hotels")
        ]
    );
    let acme = search(
        &h,
        json!({"query": {"text": "book my trip", "filter": {"publisher": "acme.com"}}, "federation": "none"}),
    )
    .await;
    assert_eq!(
        identifiers(&acme["results"]),
        ["urn:air:acme.com:travel:flights"]
    );
    // No URN has an empty publisher: the registry's own agents (ids that
    // are no URN) are not named by one either.
    let empty = search(
        &h,
        json!({"query": {"text": "book my trip", "filter": {"publisher": ""}}, "federation": "none"}),
    )
    .await;
    assert_eq!(empty["results"], json!([]));

    // Pages: disjoint, and a token belongs to its query.
    let first = search(
        &h,
        json!({"query": {"text": "book travel"}, "federation": "none", "pageSize": 1}),
    )
    .await;
    let token = first["pageToken"]
        .as_str()
        .expect("a next page")
        .to_string();
    let second = search(
        &h,
        json!({"query": {"text": "book travel"}, "federation": "none", "pageSize": 1, "pageToken": token}),
    )
    .await;
    assert_eq!(second["results"].as_array().unwrap().len(), 1);
    assert_ne!(
        first["results"][0]["identifier"],
        second["results"][0]["identifier"]
    );
    let (status, _, e) = h
        .send(
            Method::POST,
            "/ard/search",
            None,
            Some(json!({"query": {"text": "weather"}, "pageToken": token})),
            &[],
        )
        .await;
    ard_error(status, &e, 400, "INVALID_ARGUMENT");

    // Explore: facets over every visible entry, or the relevant ones.
    let (status, _, facets) = h.send(
        Method::POST,
        "/ard/explore",
        None,
        Some(json!({"resultType": {"facets": [{"field": "type"}, {"field": "tags", "limit": 1}, {"field": "publisher"}]}})),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{facets}");
    assert_eq!(facets["resultType"], "facets");
    assert_eq!(
        facets["facets"]["type"]["buckets"],
        json!([{"value": A2A, "count": 2}, {"value": "application/aidip+json", "count": 1}, {"value": MCP, "count": 1}])
    );
    assert_eq!(
        facets["facets"]["tags"]["buckets"],
        json!([{"value": "travel", "count": 2}])
    );
    assert_eq!(facets["facets"]["tags"]["otherCount"], 6);
    assert_eq!(
        facets["facets"]["publisher"]["buckets"],
        json!([{"value": AUTHORITY, "count": 3}, {"value": "acme.com", "count": 1}])
    );
    let (_, _, narrowed) = h.send(
        Method::POST,
        "/ard/explore",
        None,
        Some(json!({"query": {"text": "book a flight", "filter": {"tags": ["travel"]}}, "resultType": {"facets": [{"field": "tags"}]}})),
        &[],
    )
    .await;
    let buckets = narrowed["facets"]["tags"]["buckets"]
        .as_array()
        .expect("buckets");
    assert!(
        buckets.iter().any(|b| b["value"] == "flights"),
        "{narrowed}"
    );
    assert!(
        buckets.iter().all(|b| b["value"] != "weather"),
        "{narrowed}"
    );

    // List: Appendix A filters, ordering, stable pages.
    let filter: String =
        url::form_urlencoded::byte_serialize(format!("type = '{A2A}','{MCP}'").as_bytes())
            .collect();
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let path = format!(
            "/ard/agents?filter={filter}&orderBy=displayName%20DESC&pageSize=2{}",
            if token.is_empty() {
                String::new()
            } else {
                format!("&pageToken={token}")
            }
        );
        let (status, _, page) = h.send(Method::GET, &path, None, None, &[]).await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(page["total"], 3);
        for item in page["items"].as_array().unwrap() {
            assert_valid(&entry_schema, item);
            seen.push(item["displayName"].as_str().unwrap().to_string());
        }
        match page["pageToken"].as_str() {
            Some(t) => token = t.to_string(),
            None => break,
        }
    }
    assert_eq!(seen, ["Translator", "Hotel Finder", "Flight Booker"]);

    // Get: by URN (percent-encoded or not), with validators.
    let path = format!(
        "/ard/agents/{}",
        url::form_urlencoded::byte_serialize(minted("weather").as_bytes()).collect::<String>()
    );
    let (status, headers, weather) = h.send(Method::GET, &path, None, None, &[]).await;
    assert_eq!(status, 200, "{weather}");
    assert_eq!(weather["displayName"], "Weather Forecaster");
    assert_valid(&entry_schema, &weather);
    let etag = headers["etag"].to_str().unwrap().to_string();
    let (status, _, _) = h
        .send(Method::GET, &path, None, None, &[("if-none-match", &etag)])
        .await;
    assert_eq!(status, 304);
    let (status, _, _) = h
        .send(
            Method::GET,
            "/ard/agents/urn:air:acme.com:travel:flights",
            None,
            None,
            &[],
        )
        .await;
    assert_eq!(status, 200);

    // The same over gRPC.
    let mut grpc = ArdClient::connect(server.grpc.clone()).await.expect("gRPC");
    let resp = grpc
        .search(pb::ArdSearchRequest {
            text: "will it rain in Paris tomorrow".into(),
            federation: "none".into(),
            ..Default::default()
        })
        .await
        .expect("search")
        .into_inner();
    let grpc_ids: Vec<String> = resp
        .results
        .iter()
        .map(|s| {
            agentry::convert::struct_to_map(s)["identifier"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(grpc_ids, identifiers(&found["results"]));
    let got = grpc
        .get_agent(pb::ArdGetRequest {
            identifier: minted("weather"),
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got.etag, etag);
    let listed = grpc
        .list_agents(pb::ArdListRequest {
            filter: "tags = travel".into(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(listed.total, 2);
    let refused = grpc
        .search(pb::ArdSearchRequest {
            text: "x".into(),
            page_size: 1000,
            ..Default::default()
        })
        .await
        .expect_err("pageSize over 100");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    server.stop().await;
}

#[tokio::test]
async fn bad_ard_requests_get_ard_errors_and_change_nothing() {
    let (server, h) = start().await;
    directory(&h).await;
    let (_, before) = h
        .call(Method::GET, "/agents", None, None)
        .await
        .expect("list");
    let post = |path: &'static str, body: Value| {
        let h = &h;
        async move { h.send(Method::POST, path, None, Some(body), &[]).await }
    };
    let (s, _, e) = post("/ard/search", json!({"query": {"text": "x", "filter": {"trustManifest.attestations.type": ["SOC2-Type2"]}}})).await;
    let m = ard_error(s, &e, 400, "INVALID_ARGUMENT");
    assert!(m.contains("trustManifest.attestations.type"), "{m}");
    let (s, _, e) = post(
        "/ard/search",
        json!({"query": {"text": "x"}, "pageSize": 1000}),
    )
    .await;
    assert!(ard_error(s, &e, 400, "INVALID_ARGUMENT").contains("/pageSize"));
    let (s, _, e) = post(
        "/ard/search",
        json!({"query": {"text": "x"}, "pageToken": "not-a-token!"}),
    )
    .await;
    assert!(ard_error(s, &e, 400, "INVALID_ARGUMENT").contains("/pageToken"));
    let (s, _, e) = post("/ard/search", json!({"query": {"filter": {"tags": "x"}}})).await;
    assert!(ard_error(s, &e, 400, "INVALID_ARGUMENT").contains("/query/text"));
    let (s, _, e) = post(
        "/ard/search",
        json!({"query": {"text": "x"}, "federation": "everywhere"}),
    )
    .await;
    ard_error(s, &e, 400, "INVALID_ARGUMENT");
    let (s, _, e) = post(
        "/ard/search",
        json!({"query": {"text": "x"}, "colour": "red"}),
    )
    .await;
    ard_error(s, &e, 400, "INVALID_ARGUMENT");
    let (s, _, e) = post(
        "/ard/explore",
        json!({"resultType": {"facets": [{"field": "metadata.cost"}]}}),
    )
    .await;
    assert!(ard_error(s, &e, 400, "INVALID_ARGUMENT").contains("metadata.cost"));
    let (s, _, e) = h
        .send(
            Method::GET,
            "/ard/agents?filter=colour%20%3D%20red",
            None,
            None,
            &[],
        )
        .await;
    assert!(ard_error(s, &e, 400, "INVALID_ARGUMENT").contains("colour"));
    let (s, _, e) = h
        .send(Method::GET, "/ard/agents?pageSize=1000", None, None, &[])
        .await;
    ard_error(s, &e, 400, "INVALID_ARGUMENT");
    let (s, _, e) = h
        .send(Method::GET, "/ard/agents/not-a-urn", None, None, &[])
        .await;
    ard_error(s, &e, 400, "INVALID_ARGUMENT");
    let (s, _, e) = h
        .send(
            Method::GET,
            &format!("/ard/agents/{}", minted("nobody")),
            None,
            None,
            &[],
        )
        .await;
    ard_error(s, &e, 404, "NOT_FOUND");
    // Another publisher's private agent reads as absent.
    let (s, _, e) = h
        .send(
            Method::GET,
            &format!("/ard/agents/{}", minted("secret-weather")),
            Some(ALICE),
            None,
            &[],
        )
        .await;
    ard_error(s, &e, 404, "NOT_FOUND");
    let (s, _, e) = h
        .send(
            Method::POST,
            "/ard/search",
            Some("wrong-key"),
            Some(json!({"query": {"text": "x"}})),
            &[],
        )
        .await;
    ard_error(s, &e, 401, "UNAUTHENTICATED");
    let (s, _, e) = h
        .send(
            Method::POST,
            "/ard/nothing-here",
            None,
            Some(json!({})),
            &[],
        )
        .await;
    ard_error(s, &e, 404, "NOT_FOUND");
    let (_, after) = h
        .call(Method::GET, "/agents", None, None)
        .await
        .expect("list");
    assert_eq!(before, after, "nothing changed");
    server.stop().await;
}

#[tokio::test]
async fn ard_federation_modes_reach_a_peer_registry() {
    let b = TestServer::start_with(|c| c.identity.authority = Some("b.example".into())).await;
    let bh = Http::new(&b.http);
    let (status, _) = bh
        .call(
            Method::POST,
            "/agents",
            Some(ALICE),
            Some(agent(
                "flights-b",
                "Skyways Flight Search",
                "Searches and books airline flights between airports worldwide.",
                "https",
                &["travel", "flights"],
                &[
                    "Book a flight from Berlin to Rome",
                    "Cheapest flight to Tokyo",
                ],
            )),
        )
        .await
        .expect("registers at b");
    assert_eq!(status, 201);
    let (_, b_key) = registry_key(&bh).await;
    let b_peer = b.server.as_ref().expect("running").peer_addr;
    let well_known = format!("{}/.well-known/agentry.json", b.http);
    let a = TestServer::start_with(|c| {
        c.identity.authority = Some(AUTHORITY.into());
        c.federation.peers = vec![agentry::config::PeerConfig {
            keys: vec![URL_SAFE_NO_PAD.encode(b_key.as_bytes())],
            well_known: Some(well_known.clone()),
            ..agentry::config::PeerConfig::new("b.example", &format!("http://{b_peer}"))
        }];
    })
    .await;
    let h = Http::new(&a.http);
    directory(&h).await;
    let text = "book a flight from Berlin to Rome";

    let none = search(&h, json!({"query": {"text": text}, "federation": "none"})).await;
    assert!(
        !identifiers(&none["results"])
            .iter()
            .any(|i| i.contains("flights-b")),
        "{none:#}"
    );

    let auto = search(&h, json!({"query": {"text": text}, "federation": "auto"})).await;
    let remote = auto["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["metadata"]["id"] == "flights-b")
        .unwrap_or_else(|| panic!("b's agent in the merged results: {auto:#}"));
    assert_eq!(remote["identifier"], "urn:air:b.example:agents:flights-b");
    assert_eq!(remote["source"], format!("{}/ard", b.http));
    assert_eq!(
        remote["trustManifest"]["provenance"][1]["relation"],
        "copiedFrom"
    );
    assert_valid(&entry_schema(), remote);
    assert!(identifiers(&auto["results"]).contains(&"urn:air:acme.com:travel:flights".to_string()));

    let referrals = search(
        &h,
        json!({"query": {"text": text}, "federation": "referrals"}),
    )
    .await;
    assert_eq!(
        identifiers(&referrals["results"]),
        identifiers(&none["results"])
    );
    assert_eq!(
        referrals["referrals"],
        json!([{
            "identifier": "urn:air:b.example:registry:agentry",
            "displayName": "b.example agent registry",
            "type": "application/ai-registry+json",
            "url": format!("{}/ard", b.http),
        }])
    );
    // The referral answers as an ARD registry.
    let (status, _, at_b) = Http::new(&b.http)
        .send(
            Method::POST,
            "/ard/search",
            None,
            Some(json!({"query": {"text": text}, "federation": "none"})),
            &[],
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(at_b["results"][0]["metadata"]["id"], "flights-b");
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn another_registry_imports_the_catalog_and_serves_the_same_urns() {
    let (b, bh) = start().await;
    directory(&bh).await;
    let a = TestServer::start_with(|c| {
        c.identity.authority = Some("a.example".into());
        c.gateway.outbound.allow = vec!["127.0.0.1".into()];
        c.gateway.outbound.allow_http = true;
    })
    .await;
    let h = Http::new(&a.http);
    let import = || {
        let h = &h;
        let url = b.http.clone();
        async move {
            let (status, report) = h
                .call(
                    Method::POST,
                    "/import/ai-catalog",
                    Some(ALICE),
                    Some(json!({"url": url})),
                )
                .await
                .expect("imported");
            assert_eq!(status, 200, "{report}");
            report
        }
    };
    let report = import().await;
    let outcomes: Vec<(String, String)> = report["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .map(|a| {
            (
                a["id"].as_str().unwrap().to_string(),
                a["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut ids: Vec<&str> = outcomes.iter().map(|(i, _)| i.as_str()).collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            "urn:air:acme.com:travel:flights",
            "urn:air:registry.example.org:agents:hotels",
            "urn:air:registry.example.org:agents:translator__v2",
            "urn:air:registry.example.org:agents:weather",
        ],
        "{report:#}"
    );
    assert!(outcomes.iter().all(|(_, o)| o == "created"), "{report:#}");
    assert_eq!(
        report["registries"][0]["url"],
        format!("{}/ard", b.http),
        "{report:#}"
    );
    // The AIDIP record came whole; the cards gave their bindings.
    let (_, weather) = h
        .call(
            Method::GET,
            &format!("/agents/{}", Http::url_id(&minted("weather"))),
            None,
            None,
        )
        .await
        .expect("imported record");
    assert_eq!(
        weather["examples"][0]["text"],
        "Will it rain in Paris tomorrow?"
    );
    let (_, flights) = h
        .call(
            Method::GET,
            &format!(
                "/agents/{}",
                Http::url_id("urn:air:acme.com:travel:flights")
            ),
            None,
            None,
        )
        .await
        .expect("imported record");
    assert_eq!(flights["bindings"][0]["protocol"], "a2a");
    assert_eq!(
        flights["source"]["catalog"]["identifier"],
        "urn:air:acme.com:travel:flights"
    );
    // Found at a.example under the publisher's URN.
    let (_, found) = h
        .call(
            Method::POST,
            "/ard/search",
            None,
            Some(
                json!({"query": {"text": "will it rain in Paris tomorrow"}, "federation": "none"}),
            ),
        )
        .await
        .expect("search");
    assert_eq!(
        found["results"][0]["identifier"],
        minted("weather"),
        "{found:#}"
    );
    // A second crawl of an unchanged catalog changes nothing.
    let again = import().await;
    assert!(
        again["agents"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["outcome"] == "unchanged"),
        "{again:#}"
    );
    a.stop().await;
    b.stop().await;
}

/// The count of answers with `code` to `GET /.well-known/ai-catalog.json`
/// in this process (instruments are process-wide).
async fn catalog_answers(h: &Http, code: &str) -> u64 {
    let text = h
        .client
        .get(format!("{}/metrics", h.base))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    text.lines()
        .filter(|l| {
            l.starts_with("agentry_requests_total{")
                && l.contains("/.well-known/ai-catalog.json")
                && l.contains(&format!("code=\"{code}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test]
async fn a_configured_catalog_is_crawled_with_conditional_gets() {
    // The crawler waits at least the catalog's max-age between crawls.
    let b = TestServer::start_with(|c| {
        c.identity.authority = Some(AUTHORITY.into());
        c.gateway.woa_max_age_secs = 1;
    })
    .await;
    let bh = Http::new(&b.http);
    directory(&bh).await;
    let url = b.http.clone();
    let a = TestServer::start_with(move |c| {
        c.identity.authority = Some("a.example".into());
        c.gateway.outbound.allow = vec!["127.0.0.1".into()];
        c.gateway.outbound.allow_http = true;
        c.gateway.woa_sources = vec![agentry::config::WoaSourceConfig {
            url,
            interval_secs: 1,
            owner: "crawler".into(),
            format: agentry::config::SourceFormat::AiCatalog,
        }];
    })
    .await;
    let h = Http::new(&a.http);
    let path = format!("/agents/{}", Http::url_id(&minted("weather")));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok((_, rec)) = h.call(Method::GET, &path, None, None).await {
            assert_eq!(rec["registry"]["owner"], "crawler");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the catalog was never crawled"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Later crawls revalidate (304) instead of reading the catalog again.
    while catalog_answers(&bh, "304").await == 0 {
        assert!(
            std::time::Instant::now() < deadline + Duration::from_secs(10),
            "no conditional GET was answered 304"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A new agent at b reaches a on a later crawl.
    bh.call(
        Method::POST,
        "/agents",
        Some(ALICE),
        Some(agent(
            "news",
            "News Digest",
            "Summarises today's news.",
            "https",
            &["news"],
            &["What happened today?", "Top stories"],
        )),
    )
    .await
    .expect("registered at b");
    let path = format!("/agents/{}", Http::url_id(&minted("news")));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while h.call(Method::GET, &path, None, None).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the change never reached a"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    a.stop().await;
    b.stop().await;
}
