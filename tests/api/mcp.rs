//! The gateway's `mcp` transport against a real MCP server: the official
//! Python SDK (`scripts/fetch-mcp.sh` installs it), imported from a WoA
//! host document and invoked through `POST /agents/{id}/invoke`.

use std::time::Duration;

use serde_json::{json, Value};

use super::agents::Agents;
use super::harness::{Http, TestServer, ALICE};

/// The Python of the test virtualenv (the MCP SDK, grpcio-reflection).
pub fn mcp_python() -> std::path::PathBuf {
    let path = std::env::var_os("AGENTRY_MCP_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            std::path::Path::new(&home).join(".cache/agentry/mcp-venv/bin/python")
        });
    assert!(
        path.exists(),
        "the MCP Python SDK is not installed at {}: run scripts/fetch-mcp.sh (scripts/test.sh does)",
        path.display()
    );
    path
}

/// Starts `tests/fixtures/<script> PORT <args>` with the test virtualenv's
/// Python on a free port and waits until it listens; it stops when the
/// child is dropped.
pub async fn python_fixture(script: &str, args: &[&str]) -> (tokio::process::Child, u16) {
    python_fixture_on(script, 0, args).await
}

/// `python_fixture` on a given port (a server restarted where it was).
pub async fn python_fixture_on(
    script: &str,
    port: u16,
    args: &[&str],
) -> (tokio::process::Child, u16) {
    use tokio::io::AsyncBufReadExt;
    let path = super::harness::fixture(script);
    // Port 0: the fixture binds a free port itself and prints it. A port
    // picked here and released could be taken by a parallel test's server
    // before the fixture binds it, and the test would talk to that one.
    let mut child = tokio::process::Command::new(mcp_python())
        .arg(path)
        .arg(port.to_string())
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{script} starts: {e}"));
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("{script} {args:?} printed no port within 30 s"));
    let port: u16 = first
        .ok()
        .flatten()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("{script} {args:?} did not print its port"));
    // Whatever else it prints is drained, so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{script} {args:?} did not listen"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (child, port)
}

/// The tools of `tests/fixtures/mcp_server.py`, in the order it lists them.
pub const SDK_TOOLS: [&str; 7] = [
    "translate",
    "word_count",
    "session",
    "explode",
    "wait",
    "pad",
    "chatter",
];

/// The SDK's Streamable HTTP server (`tests/fixtures/mcp_server.py`).
pub async fn start_mcp_server() -> (tokio::process::Child, u16) {
    python_fixture("mcp_server.py", &[]).await
}

/// The SDK server, answering only requests with `Authorization: Bearer key`.
pub async fn start_mcp_server_with_key(key: &str) -> (tokio::process::Child, u16) {
    python_fixture("mcp_server.py", &[key]).await
}

fn mcp_agent(id: &str, inputs: Value, outputs: Value) -> Value {
    json!({"id": id, "name": id, "description": format!("The {id} tool over MCP."),
        "inputs": inputs, "outputs": outputs, "transports": ["mcp"]})
}

#[tokio::test]
async fn woa_mcp_agents_are_called_over_streamable_http() {
    let (_server, port) = start_mcp_server().await;
    let agents = Agents::start().await;
    let text =
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]});
    *agents.seen.woa.lock().unwrap() = json!({
        "woa_version": "1",
        "agents": [
            mcp_agent(
                "translate",
                json!({"type": "object",
                    "properties": {"text": {"type": "string"}, "target_language": {"type": "string"}},
                    "required": ["text", "target_language"]}),
                json!({"type": "object", "properties": {"translated_text": {"type": "string"}}, "required": ["translated_text"]})
            ),
            mcp_agent("word_count", text.clone(), json!({"type": "object"})),
            mcp_agent("explode", text, json!({"type": "object"})),
        ],
        "transports": {"mcp": {
            "server": format!("http://127.0.0.1:{port}/mcp"),
            "tool_namespace": "agentry-gateway-test",
            "tool_field": "agent"
        }}
    });
    let (s, report) = gateway_importing(&agents).await;
    assert_eq!(report["agents"].as_array().unwrap().len(), 3, "{report}");
    let id = |name: &str| tool_id(&agents, name);
    let rec = Http::new(&s.http).record(&id("translate"), ALICE).await;
    assert_eq!(rec["bindings"][0]["protocol"], "mcp", "{rec}");

    let call = |name: &str, input: Value| {
        let url = format!("{}/agents/{}/invoke", s.http, Http::url_id(&id(name)));
        async move {
            let resp = reqwest::Client::new()
                .post(url)
                .bearer_auth(ALICE)
                .json(&input)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let check = resp
                .headers()
                .get("x-agentry-output-check")
                .map(|v| v.to_str().unwrap().to_string());
            (status, check, resp.json::<Value>().await.unwrap())
        }
    };
    let (status, check, body) = call(
        "translate",
        json!({"text": "hello", "target_language": "fr"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"translated_text": "[fr] olleh"}));
    assert_eq!(check.as_deref(), Some("valid"));

    let (status, _, body) = call("word_count", json!({"text": "two words"})).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.to_string().contains("2 words"), "{body}");

    // A tool error is a bad answer from upstream, reported as such.
    let (status, _, body) = call("explode", json!({"text": "boom"})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (502, Some("bad_gateway")),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("reported an error"),
        "{body}"
    );

    // The schema is checked before the MCP server is contacted.
    let (status, _, body) = call("translate", json!({"text": "no language"})).await;
    assert_eq!(status, 400, "{body}");
    s.stop().await;
}

/// A WoA host whose agents are the SDK server's tools at `port`.
fn mcp_host(agents: &Agents, port: u16, tools: &[&str]) {
    let any = json!({"type": "object"});
    *agents.seen.woa.lock().unwrap() = json!({
        "woa_version": "1",
        "agents": tools.iter().map(|t| mcp_agent(t, any.clone(), any.clone())).collect::<Vec<_>>(),
        "transports": {"mcp": {
            "server": format!("http://127.0.0.1:{port}/mcp"),
            "tool_namespace": "agentry-gateway-test",
            "tool_field": "agent"
        }}
    });
}

/// A node calling local agents (answers up to 64 KiB), whose directory
/// holds what the WoA host `agents` serves: the node and the import's
/// report.
async fn gateway_importing(agents: &Agents) -> (TestServer, Value) {
    let s = TestServer::start_with(|c| {
        super::invocation::local_agents(c);
        // A Python server's first answer can take a moment.
        c.gateway.outbound.timeout_ms = 10_000;
    })
    .await;
    let report = Http::new(&s.http)
        .import_woa(ALICE, &agents.base)
        .await
        .expect("the WoA document imports");
    (s, report)
}

/// A node whose directory holds `tools` of the SDK server at `port`,
/// imported from a WoA host.
async fn mcp_gateway(port: u16, tools: &[&str]) -> (Agents, TestServer) {
    let agents = Agents::start().await;
    mcp_host(&agents, port, tools);
    let (s, _) = gateway_importing(&agents).await;
    (agents, s)
}

/// The id of the imported agent for `tool` of the WoA host `agents`.
fn tool_id(agents: &Agents, tool: &str) -> String {
    format!("{}/.well-known/woa.json#{tool}", agents.base)
}

/// `POST /agents/{id}/invoke` on the agent for `tool`, with `credential`
/// as the agent's own `Authorization`: the status and the body.
async fn invoke(
    s: &TestServer,
    agents: &Agents,
    tool: &str,
    input: Value,
    credential: Option<&str>,
) -> (u16, Value) {
    let url = format!(
        "{}/agents/{}/invoke",
        s.http,
        Http::url_id(&tool_id(agents, tool))
    );
    let mut req = reqwest::Client::new()
        .post(url)
        .bearer_auth(ALICE)
        .json(&input);
    if let Some(c) = credential {
        req = req.header("agent-authorization", c);
    }
    let resp = req.send().await.expect("the invocation is sent");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn mcp_sessions_are_kept_across_calls_and_started_again_when_the_server_forgets_them() {
    let (server, port) = start_mcp_server().await;
    let (agents, s) = mcp_gateway(port, &["session", "translate"]).await;
    let session = || async {
        let (status, body) = invoke(&s, &agents, "session", json!({}), None).await;
        assert_eq!(status, 200, "{body}");
        body["session"].as_str().expect("a session id").to_string()
    };

    // One session for every call to the same server with the same
    // credential, concurrent calls included.
    let first = session().await;
    assert_eq!(session().await, first);
    let together = futures::future::join_all((0..8).map(|_| session())).await;
    assert!(together.iter().all(|s| *s == first), "{together:?}");

    // The server restarts and forgets every session: it answers the kept
    // one's id with 404, and the call is made again in a new session
    // rather than failing or waiting for its timeout.
    let mut server = server;
    server.kill().await.expect("the MCP server stops");
    let (restarted, _) = python_fixture_on("mcp_server.py", port, &[]).await;
    let started = std::time::Instant::now();
    let second = session().await;
    assert_ne!(second, first);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(session().await, second);
    drop(restarted);
    s.stop().await;
}

#[tokio::test]
async fn an_mcp_servers_refusal_of_the_credentials_reaches_the_caller_as_its_status() {
    let (_server, port) = start_mcp_server_with_key("the-servers-key").await;
    let (agents, s) = mcp_gateway(port, &["translate"]).await;
    let hello = json!({"text": "hello", "target_language": "fr"});
    // Refused when the session starts, and refused in a kept one: the
    // server's own 401 at once, not a 502 or a wait for the timeout.
    for credential in [
        None,
        Some("Bearer a-wrong-key"),
        Some("Bearer the-servers-key"),
        None,
    ] {
        let started = std::time::Instant::now();
        let (status, body) = invoke(&s, &agents, "translate", hello.clone(), credential).await;
        if credential == Some("Bearer the-servers-key") {
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["translated_text"], "[fr] olleh", "{body}");
        } else {
            // A session kept for the right key is never lent to a call
            // without it.
            assert_eq!(status, 401, "{credential:?}: {body}");
            assert!(
                body["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("refused the credentials")),
                "{body}"
            );
        }
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    // What the server asked for travels beside the status, and the
    // registry's challenge blames the agent's credential, not ALICE's key.
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/agents/{}/invoke",
            s.http,
            Http::url_id(&tool_id(&agents, "translate"))
        ))
        .bearer_auth(ALICE)
        .header("agent-authorization", "Bearer a-wrong-key")
        .json(&hello)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.headers()["agent-authenticate"], "Bearer");
    let challenge = resp.headers()["www-authenticate"].to_str().unwrap();
    assert!(challenge.starts_with("Agent realm="), "{challenge}");
    s.stop().await;
}

/// `POST /agents/{id}/invoke?operation=translate` with `headers`: the
/// status, the response headers and the body.
async fn translate(
    s: &TestServer,
    id: &str,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = reqwest::Client::new()
        .post(format!(
            "{}/agents/{}/invoke?operation=translate",
            s.http,
            Http::url_id(id)
        ))
        .bearer_auth(ALICE)
        .json(&json!({"text": "hello", "target_language": "fr"}));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = req.send().await.expect("the invocation is sent");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, headers, resp.json().await.unwrap_or(Value::Null))
}

/// MCP servers that take an API key in a header of their own (not a
/// bearer token), as many in the MCP registry declare in their remote's
/// `headers`: the key reaches the server in that header, whether the
/// caller passes it or the gateway holds it.
#[tokio::test]
async fn an_mcp_server_gets_its_api_key_in_the_header_it_declares() {
    const KEY: &str = "text-tools-key";
    let (_server, port) = python_fixture("mcp_server.py", &[KEY, "--header=X-API-Key"]).await;
    let remote = format!("http://127.0.0.1:{port}/mcp");
    let s = TestServer::start_with(|c| {
        super::invocation::local_agents(c);
        c.gateway.outbound.timeout_ms = 10_000;
        c.gateway.credentials = vec![agentry::config::CredentialConfig {
            agent: "mcp:io.agentry.test/held-key".into(),
            header: Some("X-API-Key".into()),
            value: Some(KEY.into()),
            ..Default::default()
        }];
    })
    .await;
    let http = Http::new(&s.http);
    let publish = |name: &str, headers: Value| {
        json!({
            "$schema": "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json",
            "name": name,
            "description": "Text tools: translate text and count words.",
            "version": "1.0.0",
            "remotes": [{"type": "streamable-http", "url": remote, "headers": headers}]
        })
    };
    let declared = json!([{"name": "X-API-Key", "description": "Your Text Tools API key.",
        "isRequired": true, "isSecret": true}]);
    // A header every client sends as the document gives it (here the
    // same header, as a server whose key is public would have it).
    let setting = json!([{"name": "X-API-Key", "value": "{key}", "isRequired": true,
        "variables": {"key": {"default": KEY}}}]);
    for server in [
        publish("io.agentry.test/callers-key", declared),
        publish("io.agentry.test/held-key", json!([])),
        publish("io.agentry.test/set-key", setting),
    ] {
        let (status, _, body) = http
            .send(
                reqwest::Method::POST,
                "/v0.1/publish",
                Some(ALICE),
                Some(server),
                &[],
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }

    // The declared header is the record's requirement, for every reader.
    let callers = "mcp:io.agentry.test/callers-key";
    let record = http.record(callers, ALICE).await;
    assert_eq!(
        record["authentication"],
        json!({"type": "api_key", "header": "X-API-Key", "instructions": "Your Text Tools API key."}),
        "{record}"
    );
    assert_eq!(record["auth"], record["authentication"], "{record}");

    // The caller's key, in X-API-Key; calls after the first share the
    // session started with it, an idempotency key or not.
    for extra in [None, Some(("idempotency-key", "retry-7"))] {
        let mut headers = vec![("agent-authorization", KEY)];
        headers.extend(extra);
        let (status, _, body) = translate(&s, callers, &headers).await;
        assert_eq!(status, 200, "{extra:?}: {body}");
        assert_eq!(body, json!({"translated_text": "[fr] olleh"}));
    }
    // Without one, the gateway refuses before anything is sent and says
    // whose credential is missing; a wrong one, the server refuses.
    let (status, headers, body) = translate(&s, callers, &[]).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        headers["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Agent realm="),
        "{headers:?}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("api_key"),
        "{body}"
    );
    let (status, _, body) = translate(&s, callers, &[("agent-authorization", "a-wrong-key")]).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("refused the credentials")),
        "{body}"
    );

    // The gateway's own key for a server, in the header it is configured
    // with; the record declares nothing, so callers need none.
    let held = "mcp:io.agentry.test/held-key";
    assert!(http
        .record(held, ALICE)
        .await
        .get("authentication")
        .is_none());
    let (status, _, body) = translate(&s, held, &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"translated_text": "[fr] olleh"}));

    // A header the document sets is the binding's, sent with every call:
    // no credential is required or needed.
    let set = "mcp:io.agentry.test/set-key";
    let record = http.record(set, ALICE).await;
    assert!(record.get("authentication").is_none(), "{record}");
    assert_eq!(
        record["bindings"][0]["headers"],
        json!({"X-API-Key": KEY}),
        "{record}"
    );
    let (status, _, body) = translate(&s, set, &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"translated_text": "[fr] olleh"}));
    s.stop().await;
}

#[tokio::test]
async fn a_slow_mcp_call_holds_none_of_the_others_in_its_kept_session() {
    // Both ways a server answers a call: an event stream (the SDK's
    // default), and a single JSON body sent once the tool is done.
    for mode in [&[][..], &["--json"][..]] {
        let (_server, port) = python_fixture("mcp_server.py", mode).await;
        let (agents, s) = mcp_gateway(port, &["session", "translate", "wait"]).await;
        let (status, first) = invoke(&s, &agents, "session", json!({}), None).await;
        assert_eq!(status, 200, "{mode:?}: {first}");
        let (_, again) = invoke(&s, &agents, "session", json!({}), None).await;
        assert_eq!(again, first, "{mode:?}: one kept session");

        // A call sent while a slow one runs in the same session is
        // answered while the slow tool still sleeps (4 s from its start).
        let slow_started = std::time::Instant::now();
        let slow = invoke(&s, &agents, "wait", json!({"seconds": 4.0}), None);
        let quick = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let hello = json!({"text": "hello", "target_language": "fr"});
            let answer = invoke(&s, &agents, "translate", hello, None).await;
            (answer, slow_started.elapsed())
        };
        let ((slow_status, slow_body), ((status, body), answered_after)) =
            tokio::join!(slow, quick);
        assert_eq!(slow_status, 200, "{mode:?}: {slow_body}");
        assert_eq!(slow_body["waited"], 4.0, "{mode:?}: {slow_body}");
        assert_eq!(status, 200, "{mode:?}: {body}");
        assert_eq!(body["translated_text"], "[fr] olleh", "{mode:?}: {body}");
        assert!(
            answered_after < Duration::from_secs(3),
            "{mode:?}: the quick call waited for the slow one ({answered_after:?})"
        );
        let (_, after) = invoke(&s, &agents, "session", json!({}), None).await;
        assert_eq!(after, first, "{mode:?}");
        s.stop().await;
    }
}

#[tokio::test]
async fn an_mcp_answer_past_the_size_limit_ends_the_call_at_once() {
    for mode in [&[][..], &["--json"][..]] {
        let (_server, port) = python_fixture("mcp_server.py", mode).await;
        let (agents, s) = mcp_gateway(port, &["pad", "session", "chatter"]).await;
        // Under the node's 64 KiB limit: answered.
        let (status, body) = invoke(&s, &agents, "pad", json!({"size": 1000}), None).await;
        assert_eq!(status, 200, "{mode:?}: {body}");
        assert!(
            body.to_string().contains(&"x".repeat(1000)),
            "{mode:?}: {body}"
        );
        let (_, session) = invoke(&s, &agents, "session", json!({}), None).await;

        // Past it, and from a server that never stops sending on a
        // call's stream (log messages; only event streams carry them):
        // refused as too large, at once rather than at the call's timeout
        // (10 s), and the session goes on serving.
        let mut calls = vec![("pad", json!({"size": 200_000}))];
        if mode.is_empty() {
            calls.push(("chatter", json!({})));
        }
        for (tool, input) in calls {
            let started = std::time::Instant::now();
            let (status, body) = invoke(&s, &agents, tool, input, None).await;
            let took = started.elapsed();
            assert_eq!(
                (status, body["code"].as_str()),
                (502, Some("bad_gateway")),
                "{mode:?} {tool}: {body}"
            );
            assert!(
                body["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("larger than the limit of 65536 bytes")),
                "{mode:?} {tool}: {body}"
            );
            assert!(took < Duration::from_secs(5), "{mode:?} {tool}: {took:?}");
            let (status, after) = invoke(&s, &agents, "session", json!({}), None).await;
            assert_eq!((status, &after), (200, &session), "{mode:?} {tool}");
        }
        s.stop().await;
    }
}
