//! The registry as an MCP server (`/mcp`), driven by real MCP clients: the
//! official Python SDK (`tests/fixtures/mcp_client.py`), the MCP Inspector
//! in CLI mode and the MCP conformance suite (`scripts/fetch-node-tools.sh`
//! installs the last two), plus raw JSON-RPC for the gate's refusals.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use super::agents::Agents;
use super::harness::{Http, TestServer, Transport, ALICE, BOB};
use super::mcp::{mcp_python, start_mcp_server, start_mcp_server_with_key, SDK_TOOLS};

/// Where `scripts/fetch-node-tools.sh` put Node.js 22 and the tools.
fn node_bin() -> PathBuf {
    let dir = std::env::var_os("AGENTRY_NODE_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            std::path::Path::new(&home).join(".cache/agentry/node-tools")
        });
    let bin = dir.join("node_modules/.bin");
    assert!(
        bin.join("mcp-inspector").exists() && bin.join("conformance").exists(),
        "the MCP Inspector and conformance suite are not installed in {}: run scripts/fetch-node-tools.sh (scripts/test.sh does)",
        dir.display()
    );
    bin
}

/// A command from the node tools, with their Node.js first on PATH.
fn node_tool(name: &str) -> tokio::process::Command {
    let bin = node_bin();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![bin.clone()];
    paths.extend(std::env::split_paths(&path));
    let mut cmd = tokio::process::Command::new(bin.join(name));
    cmd.env("PATH", std::env::join_paths(paths).unwrap())
        .kill_on_drop(true);
    cmd
}

/// Runs the Python SDK client with `steps`; one JSON answer per step.
async fn python_client(url: &str, key: Option<&str>, steps: Value) -> Vec<Value> {
    let script = super::harness::fixture("mcp_client.py");
    let mut cmd = tokio::process::Command::new(mcp_python());
    cmd.arg(script).arg(url);
    if let Some(k) = key {
        cmd.arg(k);
    }
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the Python client starts");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(steps.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("the Python client finishes")
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str::<Vec<Value>>(text.trim()).unwrap_or_else(|e| {
        panic!(
            "the client printed no JSON ({e}): {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// One JSON-RPC request to `/mcp` as raw HTTP (the server is stateless, so
/// no session is needed): (HTTP status, the JSON-RPC answer or the body).
async fn raw_rpc(s: &TestServer, key: Option<&str>, method: &str, params: Value) -> (u16, Value) {
    raw_rpc_with(s, key, method, params, &[]).await
}

/// `raw_rpc` with extra headers (`Host`, `Origin`).
async fn raw_rpc_with(
    s: &TestServer,
    key: Option<&str>,
    method: &str,
    params: Value,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/mcp", s.http))
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    for (h, v) in headers {
        req = req.header(*h, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let data = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .find(|d| !d.is_empty())
        .map(String::from)
        .unwrap_or(text);
    (
        status,
        serde_json::from_str(&data).unwrap_or(Value::String(data)),
    )
}

async fn register(s: &TestServer, key: &str, query: &str, meta: Value) {
    Http::new(&s.http)
        .call(
            reqwest::Method::POST,
            &format!("/agents{query}"),
            Some(key),
            Some(meta),
        )
        .await
        .expect("agent registers");
}

/// The agents of the scenario: a public echo agent over HTTP, a private
/// one of Alice's, and the SDK's MCP server as a directory entry whose
/// operations are its tools.
async fn directory(s: &TestServer, agents: &Agents, mcp_port: u16) {
    register(
        s,
        ALICE,
        "",
        json!({
            "id": "echo-agent",
            "name": "Echo agent",
            "description": "Repeats back the text it is sent, word for word, as an echo.",
            "tags": ["echo", "text"],
            "bindings": [{"protocol": "http", "endpoint": format!("{}/echo", agents.base)}],
            "operations": [{
                "name": "echo",
                "description": "Echoes its input.",
                "inputs": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
                "outputs": {"type": "object", "properties": {"echo": {"type": "object"}}, "required": ["echo"]}
            }]
        }),
    )
    .await;
    register(
        s,
        ALICE,
        "?visibility=private",
        json!({
            "id": "private-echo",
            "name": "Private echo agent",
            "description": "Repeats back the text it is sent, only for its owner.",
            "tags": ["echo", "text"],
            "bindings": [{"protocol": "http", "endpoint": format!("{}/echo", agents.base)}]
        }),
    )
    .await;
    let text =
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]});
    register(
        s,
        ALICE,
        "",
        json!({
            "id": "sdk-mcp-server",
            "name": "Translation tools",
            "description": "An MCP server with text tools: translate text and count words.",
            "tags": ["mcp", "translation"],
            "bindings": [{"protocol": "mcp", "endpoint": format!("http://127.0.0.1:{mcp_port}/mcp"), "tool_field": "operation"}],
            "operations": [
                {"name": "translate", "description": "Translates text.",
                 "inputs": {"type": "object", "properties": {"text": {"type": "string"}, "target_language": {"type": "string"}}, "required": ["text", "target_language"]},
                 "outputs": {"type": "object", "properties": {"translated_text": {"type": "string"}}, "required": ["translated_text"]}},
                {"name": "word_count", "description": "Counts words.", "inputs": text}
            ]
        }),
    )
    .await;
    // Discovery's index follows the log; wait until it has the three.
    let http = Http::new(&s.http);
    for _ in 0..100 {
        let (_, body) = http
            .call(
                reqwest::Method::POST,
                "/discover",
                Some(ALICE),
                Some(json!({"query": "echo text", "limit": 10})),
            )
            .await
            .unwrap();
        if body["candidates"].as_array().map_or(0, Vec::len) >= 3 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the agents were not indexed");
}

async fn start() -> (TestServer, Agents, tokio::process::Child, u16) {
    let (sdk, port) = start_mcp_server().await;
    let agents = Agents::start().await;
    let s = TestServer::start_with(|c| {
        super::invocation::local_agents(c);
        c.gateway.outbound.timeout_ms = 10_000;
    })
    .await;
    directory(&s, &agents, port).await;
    (s, agents, sdk, port)
}

/// The answer to POST /discover without its per-answer members.
fn stable(mut v: Value) -> Value {
    if let Value::Object(m) = &mut v {
        m.remove("request_id");
        m.remove("generated_at");
    }
    v
}

#[tokio::test]
async fn mcp_server_tools_through_the_python_sdk() {
    let (s, agents, _sdk, port) = start().await;
    let url = format!("{}/mcp", s.http);
    let out = python_client(
        &url,
        Some(ALICE),
        json!([
            {"list": true},
            {"call": "discover_agents", "arguments": {"task": "repeat my text back", "limit": 5}},
            {"call": "get_agent", "arguments": {"id": "echo-agent"}},
            {"call": "invoke_agent", "arguments": {"agent_id": "echo-agent", "input": {"text": "hello"}}},
            {"call": "invoke_agent", "arguments": {"agent_id": "echo-agent", "input": {"words": 3}}},
            {"call": "discover_agents", "arguments": {"task": 42}},
            {"call": "list_agent_tools", "arguments": {"agent_id": "sdk-mcp-server"}},
            {"call": "invoke_agent", "arguments": {"agent_id": "sdk-mcp-server", "operation": "translate",
                "input": {"text": "hello", "target_language": "fr"}}},
            {"call": "no_such_tool", "arguments": {}}
        ]),
    )
    .await;
    assert_eq!(out.len(), 9, "{out:?}");

    // The four tools, with precise input schemas and output schemas.
    let tools = out[0]["tools"].as_array().expect("tools/list answers");
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "discover_agents",
            "get_agent",
            "invoke_agent",
            "list_agent_tools"
        ]
    );
    for t in tools {
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
        assert_eq!(t["inputSchema"]["additionalProperties"], false, "{t}");
        assert!(t["outputSchema"].is_object(), "{t}");
    }
    assert_eq!(tools[0]["inputSchema"]["required"], json!(["task"]));

    // discover_agents: the ADP answer of POST /discover, as structured
    // content and as its JSON text; Alice sees her private agent.
    let found = &out[1];
    assert_eq!(found["isError"], false, "{found}");
    let sc = found["structuredContent"].clone();
    let text: Value = serde_json::from_str(found["text"][0].as_str().unwrap()).unwrap();
    assert_eq!(text, sc);
    let ids: Vec<&str> = sc["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"echo-agent") && ids.contains(&"private-echo"),
        "{ids:?}"
    );
    assert!(
        sc["candidates"][0]["score_components"].is_object(),
        "evidence: {sc}"
    );
    let (_, direct) = Http::new(&s.http)
        .call(
            reqwest::Method::POST,
            "/discover",
            Some(ALICE),
            Some(json!({"query": "repeat my text back", "limit": 5, "include_evidence": true})),
        )
        .await
        .unwrap();
    assert_eq!(stable(sc), stable(direct), "MCP and POST /discover agree");

    // get_agent: the signed record, as GET /agents/{id} gives it.
    let rec = &out[2]["structuredContent"];
    assert_eq!(out[2]["isError"], false, "{}", out[2]);
    let (_, direct) = Http::new(&s.http)
        .call(
            reqwest::Method::GET,
            "/agents/echo-agent",
            Some(ALICE),
            None,
        )
        .await
        .unwrap();
    assert_eq!(rec, &direct);
    assert!(rec.to_string().contains("signature"), "{rec}");

    // invoke_agent: through the gateway, output checked.
    let called = &out[3];
    assert_eq!(called["isError"], false, "{called}");
    assert_eq!(called["structuredContent"]["status"], 200);
    assert_eq!(
        called["structuredContent"]["output"],
        json!({"echo": {"text": "hello"}})
    );
    assert_eq!(
        called["structuredContent"]["output_check"]["state"],
        "valid"
    );

    // Input that breaks the agent's schema is a tool error, and the agent
    // is not called.
    let bad = &out[4];
    assert_eq!(bad["isError"], true, "{bad}");
    assert_eq!(bad["structuredContent"]["code"], "invalid_request", "{bad}");
    assert!(
        bad["structuredContent"]["field"]
            .as_str()
            .unwrap()
            .starts_with("/input"),
        "{bad}"
    );
    assert_eq!(agents.calls(), 1, "only the valid call reached the agent");

    // Arguments that break the tool's own schema: a tool error too.
    let bad = &out[5];
    assert_eq!(bad["isError"], true, "{bad}");
    assert_eq!(bad["structuredContent"]["code"], "invalid_request", "{bad}");
    assert_eq!(bad["structuredContent"]["field"], "/task", "{bad}");

    // list_agent_tools: the SDK server's tools, fetched live.
    let listed = &out[6];
    assert_eq!(listed["isError"], false, "{listed}");
    let sc = &listed["structuredContent"];
    assert_eq!(sc["endpoint"], format!("http://127.0.0.1:{port}/mcp"));
    let names: Vec<&str> = sc["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, SDK_TOOLS, "{sc}");
    assert!(sc["tools"][0]["inputSchema"]["properties"]["target_language"].is_object());

    // ... and one of them called through invoke_agent.
    let translated = &out[7];
    assert_eq!(translated["isError"], false, "{translated}");
    assert_eq!(
        translated["structuredContent"]["output"],
        json!({"translated_text": "[fr] olleh"})
    );

    // A tool that does not exist is a JSON-RPC error.
    assert!(out[8]["exception"].as_str().is_some(), "{}", out[8]);

    // Bob is not entitled to Alice's private agent: discovery leaves it out
    // and get_agent does not find it.
    let out = python_client(
        &url,
        Some(BOB),
        json!([
            {"call": "discover_agents", "arguments": {"task": "repeat my text back", "limit": 5}},
            {"call": "get_agent", "arguments": {"id": "private-echo"}}
        ]),
    )
    .await;
    let ids: Vec<&str> = out[0]["structuredContent"]["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"echo-agent") && !ids.contains(&"private-echo"),
        "{ids:?}"
    );
    assert_eq!(out[1]["isError"], true, "{}", out[1]);
    assert_eq!(out[1]["structuredContent"]["code"], "not_found");

    // Without credentials: reads are open (anonymous_reads), invocation is
    // not; with a wrong key, nothing is (HTTP 401 before any MCP).
    let out = python_client(
        &url,
        None,
        json!([
            {"call": "invoke_agent", "arguments": {"agent_id": "echo-agent", "input": {"text": "hi"}}},
            {"call": "list_agent_tools", "arguments": {"agent_id": "sdk-mcp-server"}}
        ]),
    )
    .await;
    for o in &out {
        assert_eq!(o["isError"], true, "{o}");
        assert_eq!(o["structuredContent"]["code"], "unauthorized", "{o}");
    }
    let out = python_client(&url, Some("not-a-key-at-all"), json!([{"list": true}])).await;
    assert!(out[0]["exception"].as_str().is_some(), "{out:?}");
    assert_eq!(agents.calls(), 1, "refused calls never reached the agent");
    s.stop().await;
}

#[tokio::test]
async fn mcp_server_refusals_and_rate_limits_are_the_gates() {
    let s = TestServer::start_with(|c| {
        c.rate_limits.enabled = true;
        c.rate_limits.authenticated.discover = agentry::api::gate::Rate {
            per_second: 1,
            burst: 2,
        };
    })
    .await;
    // A wrong key: 401 with the problem body, before any MCP.
    let (status, body) = raw_rpc(&s, Some("wrong-key-000000000"), "tools/list", json!({})).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["code"], "unauthorized", "{body}");
    // A stateless server: tools/list needs no session.
    let (status, body) = raw_rpc(&s, Some(ALICE), "tools/list", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["result"]["tools"].as_array().unwrap().len(),
        4,
        "{body}"
    );
    // Transport refusals are JSON-RPC errors too, not plain text: an
    // Accept without both media types, another content type, params that
    // are no object, an id that is neither a string nor an integer.
    let post = |accept: &'static str, ctype: &'static str, body: &'static str| {
        reqwest::Client::new()
            .post(format!("{}/mcp", s.http))
            .bearer_auth(ALICE)
            .header("accept", accept)
            .header("content-type", ctype)
            .body(body)
            .send()
    };
    let ping = r#"{"jsonrpc": "2.0", "id": 9, "method": "ping"}"#;
    for (accept, ctype, body, status, code, id) in [
        (
            "application/json",
            "application/json",
            ping,
            406,
            -32000,
            json!(null),
        ),
        (
            "application/json, text/event-stream",
            "text/plain",
            ping,
            415,
            -32000,
            json!(null),
        ),
        (
            "application/json, text/event-stream",
            "application/json",
            r#"{"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": "all"}"#,
            400,
            -32602,
            json!(9),
        ),
        (
            "application/json, text/event-stream",
            "application/json",
            r#"{"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"}"#,
            400,
            -32600,
            json!(null),
        ),
        (
            "application/json, text/event-stream",
            "application/json",
            r#"{"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": {"_meta": 5}}"#,
            400,
            -32600,
            json!(9),
        ),
    ] {
        let r = post(accept, ctype, body).await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{body}");
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json"));
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["jsonrpc"], "2.0", "{v}");
        assert_eq!((&v["error"]["code"], &v["id"]), (&json!(code), &id), "{v}");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }

    // Discovery through MCP draws on the caller's discover bucket.
    let mut codes = Vec::new();
    for _ in 0..4 {
        let (status, body) = raw_rpc(
            &s,
            Some(ALICE),
            "tools/call",
            json!({"name": "discover_agents", "arguments": {"task": "anything"}}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let r = &body["result"];
        codes.push(if r["isError"] == true {
            r["structuredContent"]["code"].as_str().unwrap().to_string()
        } else {
            "ok".to_string()
        });
    }
    assert_eq!(codes[..2], ["ok", "ok"], "{codes:?}");
    assert!(codes.contains(&"rate_limited".to_string()), "{codes:?}");
    s.stop().await;
}

#[tokio::test]
async fn mcp_server_refuses_foreign_hosts_and_origins() {
    let agents = Agents::start().await;
    let s = TestServer::start_with(|c| {
        super::invocation::local_agents(c);
        c.gateway.public_url = Some("https://registry.example.com".into());
        c.mcp.allowed_hosts = vec!["agentry.internal".into()];
        c.mcp.allowed_origins = vec!["https://app.example.org".into()];
    })
    .await;
    register(
        &s,
        ALICE,
        "",
        json!({"id": "echo-agent", "name": "Echo agent", "description": "Repeats back the text it is sent.",
            "bindings": [{"protocol": "http", "endpoint": format!("{}/echo", agents.base)}]}),
    )
    .await;
    let port = s.http.rsplit(':').next().unwrap().to_string();
    let local = format!("127.0.0.1:{port}");
    let invoke = json!({"name": "invoke_agent", "arguments": {"agent_id": "echo-agent", "input": {"text": "hi"}}});

    // A rebound name, a cross-site page, both together (what the
    // conformance suite sends), a page with no origin: 403 with the
    // facade's problem body, and the agent is never called.
    let refused: [&[(&str, &str)]; 4] = [
        &[("host", "evil.example.com")],
        &[("origin", "http://evil.example.com")],
        &[
            ("host", "evil.example.com"),
            ("origin", "http://evil.example.com"),
        ],
        &[("origin", "null")],
    ];
    for headers in refused {
        let (status, body) =
            raw_rpc_with(&s, Some(ALICE), "tools/call", invoke.clone(), headers).await;
        assert_eq!(status, 403, "{headers:?}: {body}");
        assert_eq!(body["code"], "forbidden", "{body}");
        assert_eq!(body["instance"], "/mcp", "{body}");
        assert!(body.get("jsonrpc").is_none(), "no MCP answer: {body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("evil.example.com")
                || body["message"].as_str().unwrap().contains("null"),
            "{body}"
        );
    }
    assert_eq!(agents.calls(), 0, "a refused request reaches nothing");

    // Loopback on any port, an address, the public URL's host, the
    // operator's names; the request's own origin, a loopback page, a listed
    // page.
    let admitted: [&[(&str, &str)]; 8] = [
        &[],
        &[("host", "localhost:1")],
        &[("host", "10.0.0.7:8470")],
        &[("host", "registry.example.com")],
        &[("host", "agentry.internal:8470")],
        &[
            ("host", "registry.example.com"),
            ("origin", "https://registry.example.com"),
        ],
        &[("host", &local), ("origin", "http://localhost:6274")],
        &[("host", &local), ("origin", "https://app.example.org")],
    ];
    for headers in admitted {
        let (status, body) = raw_rpc_with(&s, Some(ALICE), "tools/list", json!({}), headers).await;
        assert_eq!(status, 200, "{headers:?}: {body}");
        assert_eq!(
            body["result"]["tools"].as_array().map(Vec::len),
            Some(4),
            "{body}"
        );
    }
    let (status, body) = raw_rpc_with(
        &s,
        Some(ALICE),
        "tools/call",
        invoke,
        &[("origin", "https://app.example.org")],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["result"]["structuredContent"]["output"],
        json!({"echo": {"text": "hi"}}),
        "{body}"
    );
    assert_eq!(agents.calls(), 1);
    s.stop().await;
}

/// A server published through the MCP Registry API (`POST /v0.1/publish`):
/// its record declares no operations and its remote is an `mcp` binding
/// that names no tool, so a call names the tool as its operation. The
/// server wants a key, which the gateway's configured credential gives to
/// listing its tools and calling them alike.
#[tokio::test]
async fn mcp_server_calls_the_tools_of_a_published_mcp_server() {
    let (_sdk, mcp_port) = start_mcp_server_with_key("text-tools-key").await;
    let refused = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{mcp_port}/mcp"))
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401, "the fixture wants its key");
    let agents = Agents::start().await;
    let s = TestServer::start_with(|c| {
        super::invocation::local_agents(c);
        c.gateway.outbound.timeout_ms = 10_000;
        c.gateway.credentials = vec![agentry::config::CredentialConfig {
            agent: "mcp:io.agentry.test/text-tools".into(),
            value: Some("Bearer text-tools-key".into()),
            ..Default::default()
        }];
    })
    .await;
    let http = Http::new(&s.http);
    let name = "io.agentry.test/text-tools";
    let (status, _, body) = http
        .send(
            reqwest::Method::POST,
            "/v0.1/publish",
            Some(ALICE),
            Some(json!({
                "$schema": "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json",
                "name": name,
                "description": "Text tools: translate text and count words.",
                "version": "1.0.0",
                "remotes": [{"type": "streamable-http", "url": format!("http://127.0.0.1:{mcp_port}/mcp")}]
            })),
            &[],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let id = format!("mcp:{name}");
    let record = http.record(&id, ALICE).await;
    assert!(
        record.get("operations").is_none_or(|o| o == &json!([])),
        "a published server declares no operations: {record}"
    );

    let url = format!("{}/mcp", s.http);
    let out = python_client(
        &url,
        Some(ALICE),
        json!([
            {"call": "list_agent_tools", "arguments": {"agent_id": id}},
            {"call": "invoke_agent", "arguments": {"agent_id": id, "operation": "translate",
                "input": {"text": "hello", "target_language": "fr"}}},
            {"call": "invoke_agent", "arguments": {"agent_id": id, "operation": "word_count",
                "input": {"text": "one two three"}}},
            {"call": "invoke_agent", "arguments": {"agent_id": id, "input": {"text": "hello"}}},
            {"call": "invoke_agent", "arguments": {"agent_id": id, "operation": "explode",
                "input": {"text": "boom"}}}
        ]),
    )
    .await;
    assert_eq!(out.len(), 5, "{out:?}");
    let names: Vec<&str> = out[0]["structuredContent"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{}", out[0]))
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, SDK_TOOLS);

    // The tool the operation names, its result as the output.
    let translated = &out[1];
    assert_eq!(translated["isError"], false, "{translated}");
    let sc = &translated["structuredContent"];
    assert_eq!(sc["status"], 200, "{sc}");
    assert_eq!(sc["protocol"], "mcp", "{sc}");
    assert_eq!(
        sc["output"],
        json!({"translated_text": "[fr] olleh"}),
        "{sc}"
    );
    assert_eq!(
        sc["output_check"]["state"], "unchecked",
        "no local schema: {sc}"
    );
    let counted = &out[2]["structuredContent"];
    assert_eq!(out[2]["isError"], false, "{}", out[2]);
    assert!(
        counted["output"].to_string().contains("3 words"),
        "{counted}"
    );

    // No tool named: a 400 that says to name one; the server's own tool
    // error: 502.
    assert_eq!(out[3]["isError"], true, "{}", out[3]);
    assert_eq!(
        out[3]["structuredContent"]["code"], "invalid_request",
        "{}",
        out[3]
    );
    assert_eq!(
        out[3]["structuredContent"]["field"], "/operation",
        "{}",
        out[3]
    );
    assert_eq!(out[4]["isError"], true, "{}", out[4]);
    assert_eq!(
        out[4]["structuredContent"]["code"], "bad_gateway",
        "{}",
        out[4]
    );

    // The same call over the facade's invoke route.
    let (status, _, body) = http
        .send(
            reqwest::Method::POST,
            &format!("/agents/{}/invoke?operation=translate", Http::url_id(&id)),
            Some(ALICE),
            Some(json!({"text": "abc", "target_language": "de"})),
            &[],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"translated_text": "[de] cba"}));

    // A REST agent that declares no operations still refuses a named one.
    register(
        &s,
        ALICE,
        "",
        json!({"id": "plain-echo", "name": "Echo", "description": "Repeats back the text it is sent.",
            "bindings": [{"protocol": "http", "endpoint": format!("{}/echo", agents.base)}]}),
    )
    .await;
    let (status, _, body) = http
        .send(
            reqwest::Method::POST,
            "/agents/plain-echo/invoke?operation=translate",
            Some(ALICE),
            Some(json!({"text": "abc"})),
            &[],
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("declares none"),
        "{body}"
    );
    assert_eq!(agents.calls(), 0);
    s.stop().await;
}

/// Runs the Inspector's CLI against `url` as Alice; its JSON answer.
async fn inspector(url: &str, args: &[&str]) -> Value {
    let mut cmd = node_tool("mcp-inspector");
    cmd.arg("--cli")
        .arg(url)
        .args(["--transport", "http", "--header"])
        .arg(format!("Authorization: Bearer {ALICE}"))
        .args(args);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("the inspector finishes")
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "inspector {args:?} failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str::<Value>(text.trim())
        .unwrap_or_else(|e| panic!("inspector printed no JSON ({e}): {text}"))
}

#[tokio::test]
async fn mcp_server_through_the_inspector_cli() {
    let (s, agents, _sdk, _port) = start().await;
    let url = format!("{}/mcp", s.http);
    let listed = inspector(&url, &["--method", "tools/list"]).await;
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "discover_agents",
            "get_agent",
            "invoke_agent",
            "list_agent_tools"
        ]
    );
    let found = inspector(
        &url,
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "discover_agents",
            "--tool-arg",
            "task=repeat my text back",
            "limit=3",
        ],
    )
    .await;
    assert_ne!(found["isError"], true, "{found}");
    assert!(
        found["structuredContent"]["candidates"]
            .to_string()
            .contains("echo-agent"),
        "{found}"
    );
    let called = inspector(
        &url,
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "invoke_agent",
            "--tool-arg",
            "agent_id=echo-agent",
            r#"input={"text":"from the inspector"}"#,
        ],
    )
    .await;
    assert_ne!(called["isError"], true, "{called}");
    assert_eq!(
        called["structuredContent"]["output"]["echo"]["text"], "from the inspector",
        "{called}"
    );
    assert_eq!(agents.calls(), 1);
    s.stop().await;
}

/// The conformance suite's server scenarios that apply to a server with
/// tools only (no resources, prompts, logging, completion, sampling or
/// elicitation) and that must pass; `docs/conformance.md` lists them all.
const MUST_PASS: &[&str] = &[
    "server-initialize",
    "ping",
    "tools-list",
    "dns-rebinding-protection",
];

#[tokio::test]
async fn mcp_server_conformance_suite() {
    let s = TestServer::start().await;
    let url = format!("{}/mcp", s.http);
    let results = tempfile::tempdir().unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        node_tool("conformance")
            .args(["server", "--url", &url, "-o"])
            .arg(results.path())
            .output(),
    )
    .await
    .expect("the conformance suite finishes")
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    // Each scenario leaves its checks in <output>/server-<scenario>-*/checks.json.
    let mut verdicts = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(results.path()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().to_string();
        let Ok(checks) = std::fs::read_to_string(entry.path().join("checks.json")) else {
            continue;
        };
        let checks: Vec<Value> = serde_json::from_str(&checks).unwrap_or_default();
        let failed: Vec<String> = checks
            .iter()
            .filter(|c| c["status"] == "FAILURE")
            .map(|c| format!("{}: {}", c["id"], c["errorMessage"]))
            .collect();
        let passed = checks.iter().filter(|c| c["status"] == "SUCCESS").count();
        verdicts.insert(name, (passed, failed));
    }
    println!("conformance output:\n{text}\nverdicts: {verdicts:#?}");
    for scenario in MUST_PASS {
        let prefix = format!("server-{scenario}-");
        let (_, (passed, failed)) = verdicts
            .iter()
            .find(|(name, _)| name.starts_with(&prefix) || name.as_str() == *scenario)
            .unwrap_or_else(|| panic!("scenario {scenario} did not run: {text}"));
        assert!(failed.is_empty(), "{scenario} failed: {failed:?}\n{text}");
        assert!(*passed > 0, "{scenario} ran no check: {text}");
    }
    s.stop().await;
}

/// `GET path` without credentials.
async fn anonymous_get(h: &Http, path: &str) -> (u16, reqwest::header::HeaderMap, Value) {
    h.send(reqwest::Method::GET, path, None, None, &[]).await
}

/// An MCP client signs in with OAuth as MCP clients do, against the
/// organisation's identity provider that `[jwt]` trusts
/// (`tests/fixtures/oauth_server.py`): the registry's 401 names its
/// resource metadata (RFC 9728), the metadata names the issuer, and the
/// SDK's own OAuth client registers, authorizes with PKCE for the `/mcp`
/// resource (RFC 8707) and calls the tools with the token.
#[tokio::test]
async fn an_mcp_client_signs_in_through_the_issuer_the_registry_names() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    let jwks_arg = jwks.to_string_lossy().to_string();
    let (_idp, idp_port) =
        super::mcp::python_fixture("oauth_server.py", &[&jwks_arg, "agentry-registry"]).await;
    let issuer = format!("http://127.0.0.1:{idp_port}");
    let jwt_issuer = issuer.clone();
    let s = TestServer::start_with(move |c| {
        c.anonymous_reads = false;
        c.jwt = Some(agentry::api::jwt::JwtConfig {
            issuer: jwt_issuer,
            audiences: vec!["agentry-registry".into()],
            jwks_file: Some(jwks),
            jwks_url: None,
            principal_claim: "sub".into(),
            role_claim: Some("roles".into()),
            default_role: agentry::domain::Role::Reader,
            tenant_claim: None,
            leeway_secs: 5,
            jwks_min_refresh_secs: 1,
        });
    })
    .await;
    let h = Http::new(&s.http);
    h.register(Some(ALICE), super::harness::minimal("signed-in-read"))
        .await
        .unwrap();

    // The challenge and the documents it leads to.
    let (status, body) = raw_rpc(&s, None, "tools/list", json!({})).await;
    assert_eq!(
        status, 401,
        "anonymous /mcp where reads need credentials: {body}"
    );
    let challenge = reqwest::Client::new()
        .post(format!("{}/mcp", s.http))
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap()
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let mcp_metadata = format!("{}/.well-known/oauth-protected-resource/mcp", s.http);
    assert!(
        challenge.starts_with("Bearer ")
            && challenge.contains(&format!("resource_metadata=\"{mcp_metadata}\"")),
        "{challenge}"
    );
    let (status, headers, _) = anonymous_get(&h, "/agents/signed-in-read").await;
    assert_eq!(status, 401);
    let api_challenge = headers["www-authenticate"].to_str().unwrap();
    assert!(
        api_challenge.contains(&format!(
            "resource_metadata=\"{}/.well-known/oauth-protected-resource\"",
            s.http
        )),
        "{api_challenge}"
    );
    let (status, _, doc) = anonymous_get(&h, "/.well-known/oauth-protected-resource/mcp").await;
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["resource"], format!("{}/mcp", s.http));
    assert_eq!(doc["authorization_servers"], json!([issuer]));
    let (_, _, doc) = anonymous_get(&h, "/.well-known/oauth-protected-resource").await;
    assert_eq!(doc["resource"], s.http);

    // The SDK signs in by itself and reads with its token.
    let out = python_client(
        &format!("{}/mcp", s.http),
        Some("oauth"),
        json!([
            {"list": true},
            {"call": "get_agent", "arguments": {"id": "signed-in-read"}},
        ]),
    )
    .await;
    let names: Vec<&str> = out[0]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("the client listed no tools: {out:?}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"get_agent"), "{names:?}");
    assert_eq!(out[1]["isError"], false, "{out:?}");
    assert_eq!(
        out[1]["structuredContent"]["id"], "signed-in-read",
        "{out:?}"
    );
    // It asked the issuer for a token for the registry's /mcp resource.
    let log: Value = reqwest::get(format!("{issuer}/log"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let steps: Vec<&str> = log
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["step"].as_str())
        .collect();
    assert_eq!(steps, ["authorize", "token"], "{log}");
    for e in log.as_array().unwrap() {
        assert_eq!(e["resource"], format!("{}/mcp", s.http), "{log}");
    }
    s.stop().await;

    // Without [jwt] there is no issuer to name: no document, plain challenge.
    let plain = TestServer::start_with(|c| c.anonymous_reads = false).await;
    let h = Http::new(&plain.http);
    let (status, _, problem) = anonymous_get(&h, "/.well-known/oauth-protected-resource/mcp").await;
    assert_eq!(status, 404, "{problem}");
    assert!(
        problem["message"]
            .as_str()
            .unwrap_or_default()
            .contains("[jwt]"),
        "{problem}"
    );
    let (_, headers, _) = anonymous_get(&h, "/agents/x").await;
    assert_eq!(headers["www-authenticate"], "Bearer realm=\"agentry\"");
    plain.stop().await;
}

/// An agent's refusal of the credential `invoke_agent` passed it reaches
/// the MCP client as a tool error with what the agent asked for.
#[tokio::test]
async fn invoke_agent_passes_on_what_a_refusing_agent_asks_for() {
    let agents = Agents::start().await;
    let s = TestServer::start_with(super::invocation::local_agents).await;
    register(
        &s,
        ALICE,
        "",
        json!({
            "id": "keyed-agent",
            "name": "Keyed agent",
            "description": "Answers only callers with its own key.",
            "bindings": [{"protocol": "http", "endpoint": format!("{}/keyed", agents.base)}],
            "authentication": {"type": "api_key"}
        }),
    )
    .await;
    let call = json!({"name": "invoke_agent", "arguments": {
        "agent_id": "keyed-agent", "input": {}, "agent_authorization": "a-wrong-secret"}});
    let (status, body) = raw_rpc(&s, Some(ALICE), "tools/call", call).await;
    assert_eq!(status, 200, "{body}");
    let result = &body["result"];
    assert_eq!(result["isError"], true, "{body}");
    let out = &result["structuredContent"];
    assert_eq!(out["status"], 401, "{body}");
    assert_eq!(
        out["agent_challenge"],
        super::agents::KEYED_CHALLENGE,
        "{body}"
    );
    assert_eq!(agents.calls(), 1);
    s.stop().await;
}
