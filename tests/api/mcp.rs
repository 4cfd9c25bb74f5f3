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
    let s = TestServer::start_with(|c| {
        super::invocation::local_agents(c);
        // A Python server's first answer can take a moment.
        c.gateway.outbound.timeout_ms = 10_000;
    })
    .await;
    let http = Http::new(&s.http);
    let (_, report) = http
        .call(
            reqwest::Method::POST,
            "/import/woa",
            Some(ALICE),
            Some(json!({"url": agents.base})),
        )
        .await
        .expect("the WoA document imports");
    assert_eq!(report["agents"].as_array().unwrap().len(), 3, "{report}");
    let id = |name: &str| format!("{}/.well-known/woa.json#{name}", agents.base);
    let rec = http.record(&id("translate"), ALICE).await;
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

/// A node whose directory holds `tools` of the SDK server at `port`,
/// imported from a WoA host.
async fn mcp_gateway(port: u16, tools: &[&str]) -> (Agents, TestServer) {
    let agents = Agents::start().await;
    mcp_host(&agents, port, tools);
    let s = TestServer::start_with(|c| {
        super::invocation::local_agents(c);
        c.gateway.outbound.timeout_ms = 10_000;
    })
    .await;
    Http::new(&s.http)
        .call(
            reqwest::Method::POST,
            "/import/woa",
            Some(ALICE),
            Some(json!({"url": agents.base})),
        )
        .await
        .expect("the WoA document imports");
    (agents, s)
}

#[tokio::test]
async fn mcp_sessions_are_kept_across_calls_and_started_again_when_the_server_forgets_them() {
    let (server, port) = start_mcp_server().await;
    let (agents, s) = mcp_gateway(port, &["session", "translate"]).await;
    let session = || {
        let url = format!(
            "{}/agents/{}/invoke",
            s.http,
            Http::url_id(&format!("{}/.well-known/woa.json#session", agents.base))
        );
        async move {
            let resp = reqwest::Client::new()
                .post(url)
                .bearer_auth(ALICE)
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap();
            assert_eq!(status, 200, "{body}");
            body["session"].as_str().expect("a session id").to_string()
        }
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
    let url = format!(
        "{}/agents/{}/invoke",
        s.http,
        Http::url_id(&format!("{}/.well-known/woa.json#translate", agents.base))
    );
    let call = |credential: Option<&'static str>| {
        let mut req = reqwest::Client::new()
            .post(&url)
            .bearer_auth(ALICE)
            .json(&json!({"text": "hello", "target_language": "fr"}));
        if let Some(c) = credential {
            req = req.header("agent-authorization", c);
        }
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // Refused when the session starts, and refused in a kept one: the
    // server's own 401 at once, not a 502 or a wait for the timeout.
    for credential in [
        None,
        Some("Bearer a-wrong-key"),
        Some("Bearer the-servers-key"),
        None,
    ] {
        let started = std::time::Instant::now();
        let (status, body) = call(credential).await;
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
    s.stop().await;
}
