//! Discovery against a real server with the built-in model: ADP's three
//! interoperation examples, hard filters, evidence, detail levels and
//! redaction, policy penalties, the index following changes, gRPC and HTTP
//! agreeing, and AIDIP's ranked search.

use agentry::pb::{self, discovery_client::DiscoveryClient};
use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::*;

fn now() -> String {
    agentry::domain::time::now()
}

fn agent(id: &str, name: &str, description: &str, tags: &[&str], examples: &[&str]) -> Value {
    json!({
        "id": id,
        "name": name,
        "description": description,
        "tags": tags,
        "examples": examples.iter().enumerate().map(|(i, t)| json!({"id": format!("ex-{}", i + 1), "text": t})).collect::<Vec<_>>(),
        "bindings": [{"protocol": "https", "endpoint": format!("https://agents.example.net/{id}/invoke")}],
        "updated_at": now(),
    })
}

async fn discover(h: &Http, key: Option<&str>, body: Value) -> Value {
    h.call(Method::POST, "/discover", key, Some(body))
        .await
        .expect("discovery succeeds")
        .1
}

fn ids(resp: &Value) -> Vec<String> {
    resp["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_string())
        .collect()
}

async fn register(h: &Http, key: &str, meta: Value) {
    h.call(Method::POST, "/agents", Some(key), Some(meta))
        .await
        .expect("registers");
}

#[tokio::test]
async fn discovery_ranks_filters_explains_and_follows_changes() {
    let server = TestServer::start().await;
    let h = Http::new(&server.http);

    register(&h, ALICE, minimal("https://example.net/agents/minimal")).await;
    register(&h, ALICE, translator("translator")).await;
    register(
        &h,
        ALICE,
        agent(
            "hr-core",
            "HR Core Automator",
            "Optimizes HR workflows and onboarding checks.",
            &["hr", "workflow", "onboarding", "hcm", "api-automation"],
            &[
                "Prepare a new-employee onboarding workflow.",
                "Check an employee record for missing payroll fields.",
            ],
        ),
    )
    .await;
    register(
        &h,
        ALICE,
        agent(
            "weather",
            "Weather Forecaster",
            "Gives weather forecasts, temperatures and rain warnings for any city.",
            &["weather"],
            &[
                "Will it rain in Paris tomorrow?",
                "What is the temperature in Tokyo this weekend?",
            ],
        ),
    )
    .await;
    // The same agent again under another name and owner: a near-duplicate.
    register(
        &h,
        BOB,
        agent(
            "weather-copy",
            "Weather Forecaster",
            "Gives weather forecasts, temperatures and rain warnings for any city.",
            &["weather"],
            &[
                "Will it rain in Paris tomorrow?",
                "What is the temperature in Tokyo this weekend?",
            ],
        ),
    )
    .await;
    register(
        &h,
        ALICE,
        agent(
            "recipes",
            "Recipe Finder",
            "Finds cooking recipes from the ingredients you have.",
            &["cooking", "food"],
            &["What can I cook with eggs and spinach?"],
        ),
    )
    .await;
    let mut stuffed = agent(
        "stuffed",
        "Everything Agent",
        "Does many things.",
        &[],
        &["Do anything"],
    );
    stuffed["tags"] = json!((0..40)
        .map(|i| format!("tag-{i}"))
        .chain(["weather".to_string()])
        .collect::<Vec<_>>());
    register(&h, BOB, stuffed).await;
    let mut apac = agent(
        "apac-hr",
        "APAC Payroll",
        "Runs payroll for employees in Asia-Pacific.",
        &["hr", "payroll"],
        &["Run the monthly payroll"],
    );
    apac["constraints"] = json!({"region": "apac"});
    register(&h, ALICE, apac).await;
    let private = agent(
        "alice-private",
        "Private Weather Desk",
        "Weather forecasts for Alice's team only.",
        &["weather"],
        &["Will it rain in Paris tomorrow?"],
    );
    h.call(
        Method::POST,
        "/agents?visibility=private",
        Some(ALICE),
        Some(private),
    )
    .await
    .expect("private registers");
    let mut expired = agent(
        "expired-weather",
        "Old Weather Feed",
        "Weather forecasts, an old feed.",
        &["weather"],
        &[],
    );
    expired["expires_at"] = json!("2020-01-01T00:00:00Z");
    register(&h, ALICE, expired).await;

    // ADP interoperation example 2 (D1): no evidence asked, one candidate.
    let r = discover(
        &h,
        None,
        json!({"query": "answer a short factual question", "protocols": ["https"], "limit": 1}),
    )
    .await;
    assert_eq!(ids(&r), vec!["https://example.net/agents/minimal"], "{r}");
    assert_eq!(r["conformance_level"], "D2");
    assert!(r["request_id"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(r["generated_at"].as_str().is_some());
    assert!(r["candidates"][0].get("score_components").is_none());
    assert!(
        r["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| !w.as_str().unwrap().contains("no embedding model")),
        "the built-in model is loaded (scripts/setup.sh fetches it): {r}"
    );

    // ADP interoperation example 3: an unsupported hard filter is reported.
    let r = discover(
        &h,
        None,
        json!({"query": "find a translation agent", "required_tags": ["translation"],
        "constraints": {"unsupported_private_filter": "example"}}),
    )
    .await;
    assert_eq!(
        r["unsupported_filters"],
        json!(["unsupported_private_filter"])
    );
    assert_eq!(ids(&r), vec!["translator"]);
    assert!(r["warnings"]
        .to_string()
        .contains("unsupported_private_filter"));

    // ADP's request example: hard filters, preferred tags, evidence.
    let r = discover(
        &h,
        None,
        json!({
        "query": "Find an agent for onboarding validation and API setup.",
        "required_tags": ["HR"], "preferred_tags": ["onboarding", "api-automation"],
        "protocols": ["https"], "constraints": {"max_results_age_seconds": 300, "region": "emea"},
        "limit": 10, "detail": "summary", "include_evidence": true}),
    )
    .await;
    assert_eq!(
        ids(&r),
        vec!["hr-core"],
        "apac-hr is region-bound elsewhere: {r}"
    );
    let c = &r["candidates"][0];
    for k in [
        "tag",
        "context",
        "example",
        "protocol",
        "freshness",
        "policy",
    ] {
        assert!(c["score_components"][k].is_number(), "component {k}: {c}");
    }
    assert_eq!(c["score_components"]["tag"], 1.0);
    assert_eq!(
        c["matched_tags"],
        json!(["hr", "onboarding", "api-automation"])
    );
    assert!(
        c["matched_examples"][0]["score"].as_f64().unwrap() > 0.2,
        "{c}"
    );
    assert_eq!(c["matched_examples"][0]["id"], "ex-1");
    assert!(c["snippet"].as_str().unwrap().contains("onboarding"));
    assert_eq!(c["status"], "active");
    assert!(
        c["freshness"]["indexed_at"].is_string()
            && c["freshness"]["metadata_updated_at"].is_string()
    );
    assert_eq!(r["applied_filters"]["required_tags"], json!(["hr"]));
    assert_eq!(r["applied_filters"]["protocols"], json!(["https"]));
    assert_eq!(r["applied_filters"]["region"], json!(["emea"]));

    // Plain language finds the right agent; the copy is marked, pushed
    // down and reported; the private agent stays hidden from strangers.
    let weather =
        json!({"query": "is it going to rain in Lyon on Sunday?", "include_evidence": true});
    let r = discover(&h, None, weather.clone()).await;
    let order = ids(&r);
    assert_eq!(order[0], "weather", "{r}");
    assert!(!order.contains(&"alice-private".to_string()));
    assert!(
        !order.contains(&"expired-weather".to_string()),
        "expired records are not returned"
    );
    let copy = r["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "weather-copy")
        .expect("copy listed");
    assert_eq!(copy["duplicate_of"], "weather");
    assert!(copy["score_components"]["policy"].as_f64().unwrap() < 0.0);
    assert!(r["warnings"].to_string().contains("near-duplicate"));
    let stuffed = r["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "stuffed");
    if let Some(s) = stuffed {
        assert!(s["notes"].to_string().contains("tag stuffing"));
        assert!(s["score_components"]["tag"].as_f64().unwrap() < 1.0);
    }
    let r = discover(&h, Some(ALICE), weather.clone()).await;
    assert!(
        ids(&r).contains(&"alice-private".to_string()),
        "owners see their private agents"
    );
    let r = discover(
        &h,
        None,
        json!({"query": "weather forecast", "constraints": {"allow_stale": true}}),
    )
    .await;
    let stale = r["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "expired-weather")
        .expect("allow_stale returns it");
    assert_eq!(stale["freshness"]["expired"], true);

    // Excluded tags and status filters are hard.
    let r = discover(
        &h,
        None,
        json!({"query": "weather forecast", "excluded_tags": ["weather"]}),
    )
    .await;
    assert!(ids(&r).iter().all(|id| !id.contains("weather")), "{r}");

    // Detail levels and redaction.
    let q = json!({"query": "translate chinese text to english", "limit": 1, "detail": "full"});
    let r = discover(&h, None, q.clone()).await;
    let c = &r["candidates"][0];
    assert_eq!(c["id"], "translator");
    assert_eq!(c["redacted"], true);
    assert!(c.get("com.example/pricing").is_none());
    assert!(c["authentication"].get("instructions").is_none());
    assert_eq!(c["operations"][0]["name"], "translateText");
    assert!(r["warnings"].to_string().contains("omitted by policy"));
    let r = discover(&h, Some(ALICE), q).await;
    let c = &r["candidates"][0];
    assert_eq!(c["redacted"], false);
    assert_eq!(c["com.example/pricing"]["per_call_usd"], 0.002);
    let r = discover(
        &h,
        None,
        json!({"query": "translate chinese text", "limit": 1, "detail": "minimal"}),
    )
    .await;
    let c = &r["candidates"][0];
    assert!(c.get("name").is_none() && c.get("description").is_none());
    assert_eq!(
        c["bindings"][0]["endpoint"],
        "https://api.example.com/agents/translate"
    );

    // gRPC gives the same answer.
    let mut grpc = DiscoveryClient::connect(server.grpc.clone()).await.unwrap();
    let g = grpc
        .discover(pb::DiscoverRequest {
            query: "is it going to rain in Lyon on Sunday?".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let r = discover(
        &h,
        None,
        json!({"query": "is it going to rain in Lyon on Sunday?"}),
    )
    .await;
    assert_eq!(
        g.candidates
            .iter()
            .map(|c| c.id.clone())
            .collect::<Vec<_>>(),
        ids(&r)
    );

    // The index follows changes: a new description moves an agent, a
    // deletion removes it.
    let mut recipes = agent(
        "recipes",
        "Recipe Finder",
        "Finds hiking trails and mountain routes.",
        &["outdoor"],
        &["Suggest a hike near Grenoble"],
    );
    recipes["updated_at"] = json!(now());
    h.call(Method::PUT, "/agents/recipes", Some(ALICE), Some(recipes))
        .await
        .expect("update");
    let r = discover(
        &h,
        None,
        json!({"query": "a hiking trail in the mountains", "limit": 1}),
    )
    .await;
    assert_eq!(ids(&r), vec!["recipes"]);
    h.call(Method::DELETE, "/agents/recipes", Some(ALICE), None)
        .await
        .expect("delete");
    let r = discover(
        &h,
        None,
        json!({"query": "a hiking trail in the mountains"}),
    )
    .await;
    assert!(!ids(&r).contains(&"recipes".to_string()));

    // AIDIP semantic search: ranked summaries with scores, filters still AND.
    let (_, v) = h
        .call(
            Method::POST,
            "/agents/search",
            None,
            Some(json!({"query": "rain tomorrow?", "top": 3})),
        )
        .await
        .unwrap();
    let arr = v.as_array().unwrap();
    assert_eq!(arr[0]["id"], "weather");
    let scores: Vec<f64> = arr.iter().map(|a| a["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    let (_, v) = h
        .call(
            Method::POST,
            "/agents/search",
            None,
            Some(json!({"query": "rain tomorrow?", "filters": {"tags": ["hr"]}})),
        )
        .await
        .unwrap();
    assert!(v
        .as_array()
        .unwrap()
        .iter()
        .all(|a| a["tags"].as_array().unwrap().contains(&json!("hr"))));

    // ASR: intent, context and policy give candidates with the chosen
    // binding and what invoking needs; policy failures are reported.
    let intent = "translate this Chinese paragraph into English";
    let (_, v) = h
        .call(
            Method::POST,
            "/resolve",
            None,
            Some(json!({"intent": intent,
            "context": {"locale": "en-GB", "domain": "nlp"},
            "policy": {"protocols": ["https"], "max_candidates": 1}})),
        )
        .await
        .unwrap();
    let c = &v["candidates"][0];
    assert_eq!(c["agent_id"], "translator", "{v}");
    assert_eq!(v["candidates"].as_array().unwrap().len(), 1);
    assert_eq!(c["endpoint"], "https://api.example.com/agents/translate");
    assert_eq!(c["binding"]["protocol"], "https");
    assert_eq!(c["invocation"]["operation"], "translateText");
    assert_eq!(
        c["invocation"]["input_schema"]["required"],
        json!(["text", "source_language", "target_language"])
    );
    assert_eq!(c["invocation"]["authentication"]["type"], "api_key");
    assert_eq!(c["invocation"]["gateway_path"], "/agents/translator/invoke");
    let (_, v) = h
        .call(
            Method::POST,
            "/resolve",
            None,
            Some(json!({"intent": intent, "policy": {"required_tags": ["legal"]}})),
        )
        .await
        .unwrap();
    assert!(v["candidates"].as_array().unwrap().is_empty());
    let excluded = v["excluded"].as_array().unwrap();
    let t = excluded
        .iter()
        .find(|e| e["agent_id"] == "translator")
        .expect("the relevant agent is reported");
    assert!(t["reasons"][0].as_str().unwrap().contains("legal"));
    assert!(v["warnings"]
        .to_string()
        .contains("no agent satisfies the policy"));
    server.stop().await;
}

#[tokio::test]
async fn without_a_model_discovery_runs_on_lexical_and_tags_and_says_so() {
    let server = TestServer::start_with(|c| c.discovery.embedder = "none".into()).await;
    let h = Http::new(&server.http);
    register(&h, ALICE, translator("translator")).await;
    register(&h, ALICE, minimal("minimal")).await;
    let r = discover(
        &h,
        None,
        json!({"query": "translate text", "include_evidence": true}),
    )
    .await;
    assert_eq!(
        ids(&r),
        vec!["translator"],
        "only agents the words match: {r}"
    );
    assert!(r["warnings"].to_string().contains("no embedding model"));
    assert!(r["candidates"][0]["score_components"]
        .get("context")
        .is_none());
    server.stop().await;
}

#[tokio::test]
async fn the_index_is_rebuilt_from_storage_on_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(dir.path());
    let server = agentry::server::start(config.clone()).await.unwrap();
    let h = Http::new(&format!("http://{}", server.http_addr));
    register(&h, ALICE, translator("translator")).await;
    server.shutdown().await;
    let server = agentry::server::start(config).await.unwrap();
    let h = Http::new(&format!("http://{}", server.http_addr));
    let r = discover(&h, None, json!({"query": "translate chinese"})).await;
    assert_eq!(ids(&r), vec!["translator"]);
    server.shutdown().await;
}

#[tokio::test]
async fn the_demo_directory_gives_a_first_search_that_means_something() {
    let server = TestServer::start_with(|c| c.demo = true).await;
    let h = Http::new(&server.http);
    let mut total = 0;
    for _ in 0..300 {
        let (_, v) = h
            .call(Method::GET, "/agents?page_size=1", None, None)
            .await
            .unwrap();
        total = v["total_count"].as_u64().unwrap();
        if total == 199 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(total, 199, "every demo agent is registered");
    let r = discover(
        &h,
        None,
        json!({"query": "Will it rain in Paris this weekend?", "limit": 3, "include_evidence": true}),
    )
    .await;
    assert_eq!(r["candidates"][0]["id"], "WeatherTool", "{r}");
    assert!(!r["candidates"][0]["matched_examples"]
        .as_array()
        .unwrap()
        .is_empty());

    // The same search from the command line: a table, and ADP JSON.
    // (tokio's Command: a blocking wait would stall the server, which runs
    // on this test's runtime.)
    let grpc = server.grpc.as_str();
    let cli = |extra: &'static [&'static str]| async move {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
            .args(["agents", "--server", grpc])
            .args(extra)
            .args([
                "discover",
                "Will it rain in Paris this weekend?",
                "--limit",
                "3",
                "--evidence",
            ])
            .env("AGENTRY_LOG", "warn")
            .output()
            .await
            .expect("the CLI runs");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let table = cli(&[]).await;
    let first = table.lines().next().unwrap_or_default();
    assert!(
        first.trim_start().starts_with("1 ") && first.contains("WeatherTool"),
        "{table}"
    );
    assert!(table.contains("example ("), "evidence is shown: {table}");
    let json: Value = serde_json::from_str(&cli(&["--json"]).await).unwrap();
    assert_eq!(json["candidates"][0]["id"], "WeatherTool", "{json}");
    assert_eq!(json["candidates"].as_array().unwrap().len(), 3);
    server.stop().await;
}

/// An agent tagged `text` whose *capability* (not tag) is `summarise`.
fn summariser(id: &str) -> Value {
    let mut a = agent(
        id,
        "Summariser",
        "Summarises long documents into a few sentences.",
        &["text"],
        &["Summarise this report"],
    );
    a["capabilities"] = json!(["summarise"]);
    a
}

#[tokio::test]
async fn one_filter_selects_the_same_agents_on_every_route() {
    let server = TestServer::start().await;
    let h = Http::new(&server.http);
    register(&h, ALICE, summariser("by-capability")).await;
    register(
        &h,
        ALICE,
        agent(
            "by-tag",
            "Digest writer",
            "Writes a short digest of a document.",
            &["summarise"],
            &["Give me the gist of this article"],
        ),
    )
    .await;
    register(
        &h,
        ALICE,
        agent(
            "neither",
            "Spell checker",
            "Checks the spelling of a document.",
            &["text"],
            &["Fix the typos in this letter"],
        ),
    )
    .await;
    let set = |v: &Value| -> Vec<String> {
        let mut ids: Vec<String> = v
            .as_array()
            .unwrap_or_else(|| v["candidates"].as_array().expect("a list"))
            .iter()
            .map(|a| {
                a["id"]
                    .as_str()
                    .or(a["metadata"]["id"].as_str())
                    .expect("an id")
                    .to_string()
            })
            .collect();
        ids.sort();
        ids
    };
    let search = |body: Value| {
        let h = &h;
        async move {
            h.call(Method::POST, "/agents/search", None, Some(body))
                .await
                .expect("search")
                .1
        }
    };
    let query = "summarise a document";
    let tagged = ["by-capability", "by-tag"];

    // A tag filter: tags and capabilities alike, with or without a query
    // (the plain filter search used to look at tags only).
    assert_eq!(
        set(&search(json!({"filters": {"tags": ["summarise"]}})).await),
        tagged
    );
    assert_eq!(
        set(&search(json!({"query": query, "filters": {"tags": ["Summarise"]}})).await),
        tagged
    );
    let (_, listed) = h
        .call(Method::GET, "/agents?tags=summarise", None, None)
        .await
        .expect("list");
    assert_eq!(set(&listed["agents"]), tagged, "{listed}");
    let found = discover(
        &h,
        None,
        json!({"query": query, "required_tags": ["summarise"]}),
    )
    .await;
    assert_eq!(set(&found), tagged);
    assert_eq!(
        found["applied_filters"]["required_tags"],
        json!(["summarise"]),
        "{found}"
    );
    let ard = |filter: Value| {
        let h = &h;
        async move {
            let (_, v) = h
                .call(
                    Method::POST,
                    "/ard/search",
                    None,
                    Some(json!({"query": {"text": query, "filter": filter}, "federation": "none"})),
                )
                .await
                .expect("ARD search");
            let mut ids: Vec<String> = v["results"]
                .as_array()
                .expect("results")
                .iter()
                .map(|e| e["metadata"]["id"].as_str().expect("an id").to_string())
                .collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(ard(json!({"tags": ["Summarise"]})).await, tagged);

    // A capability filter: capabilities only, on every route.
    let capable = ["by-capability"];
    assert_eq!(
        set(&search(json!({"filters": {"capabilities": ["summarise"]}})).await),
        capable
    );
    assert_eq!(
        set(&search(json!({"query": query, "filters": {"capabilities": ["summarise"]}})).await),
        capable
    );
    let found = discover(
        &h,
        None,
        json!({"query": query, "constraints": {"capabilities": ["summarise"]}}),
    )
    .await;
    assert_eq!(set(&found), capable);
    assert_eq!(ard(json!({"capabilities": "summarise"})).await, capable);

    // A status filter, ranked or not: an agent whose status is `deleted`
    // is found only when that status is asked for.
    let (status, _) = h
        .call(
            Method::POST,
            "/agents/neither/status",
            Some(ALICE),
            Some(json!({"status": "deleted", "reason": "retired"})),
        )
        .await
        .expect("status");
    assert_eq!(status, 200);
    let spelling = "check the spelling of a letter";
    let deleted = ["neither"];
    assert_eq!(
        set(&search(json!({"filters": {"status": ["deleted"]}})).await),
        deleted
    );
    assert_eq!(
        set(&search(json!({"query": spelling, "filters": {"status": ["deleted"]}})).await),
        deleted
    );
    assert!(!set(&search(json!({"query": spelling})).await).contains(&"neither".to_string()));
    let (_, listed) = h
        .call(Method::GET, "/agents?status=deleted", None, None)
        .await
        .expect("list");
    assert_eq!(set(&listed["agents"]), deleted, "{listed}");

    // An unknown filter name is refused, naming the supported ones.
    let refused = h
        .call(
            Method::POST,
            "/agents/search",
            None,
            Some(json!({"filters": {"region": "eu"}})),
        )
        .await
        .expect_err("an unknown filter is refused");
    assert_eq!(refused.http, 400);
    assert_eq!(refused.field.as_deref(), Some("/filters/region"));
    server.stop().await;
}

/// A client built from nothing but server reflection: Python's
/// `grpcio-reflection` (v1alpha) lists the public services — and only
/// those — and calls `Registry.List` through descriptors it was served;
/// then again with every call gzip-compressed, as a channel configured for
/// compression sends them.
#[tokio::test]
async fn a_python_client_finds_and_calls_the_services_through_reflection() {
    let server = TestServer::start().await;
    let h = Http::new(&server.http);
    register(&h, ALICE, summariser("reflected")).await;
    let script = fixture("grpc_reflection_client.py");
    let target = server.grpc.trim_start_matches("http://").to_string();
    for compression in [None, Some("gzip")] {
        let out = tokio::process::Command::new(super::mcp::mcp_python())
            .arg(&script)
            .args([target.as_str(), "summarise"])
            .args(compression)
            .output()
            .await
            .expect("the Python client runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        let services: Vec<&str> = v["services"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        for public in [
            "agentry.v1.Registry",
            "agentry.v1.Discovery",
            "agentry.v1.Cluster",
            "agentry.v1.Gateway",
        ] {
            assert!(
                services.contains(&public),
                "{public} is listed: {services:?}"
            );
        }
        for internal in ["agentry.v1.RaftTransport", "agentry.v1.Peering"] {
            assert!(
                !services.contains(&internal),
                "{internal} is not: {services:?}"
            );
        }
        let records = v["list"]["records"].as_array().expect("records");
        assert_eq!(records.len(), 1, "{v}");
        assert_eq!(records[0]["metadata"]["id"], "reflected", "{v}");
        // Errors are in gRPC's rich error model: grpcio-status reads them, and
        // the detail inside is Agentry's ErrorDetail, typed by reflection.
        let error = &v["error"];
        assert_eq!(error["rich_status"], true, "{v}");
        assert_eq!(error["code"], "NOT_FOUND", "{v}");
        assert_eq!(error["status_code"], 5, "{v}");
        assert_eq!(error["details"][0]["type"], "agentry.v1.ErrorDetail", "{v}");
        let detail = &error["details"][0]["value"];
        assert_eq!(detail["code"], "not_found", "{v}");
        assert_eq!(detail["http_status"], 404, "{v}");
        assert!(
            detail["correlation_id"]
                .as_str()
                .is_some_and(|c| !c.is_empty()),
            "{v}"
        );
    }
    server.stop().await;
}
