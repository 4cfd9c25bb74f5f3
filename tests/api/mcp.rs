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
    use tokio::io::AsyncBufReadExt;
    let path = super::harness::fixture(script);
    // Port 0: the fixture binds a free port itself and prints it. A port
    // picked here and released could be taken by a parallel test's server
    // before the fixture binds it, and the test would talk to that one.
    let mut child = tokio::process::Command::new(mcp_python())
        .arg(path)
        .arg("0")
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
