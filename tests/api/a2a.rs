//! The gateway's `a2a` transport against real A2A agents: the official
//! `a2a-sdk` (PyPI, `scripts/fetch-mcp.sh` installs it) serving
//! `tests/fixtures/a2a_agent.py` in each of its modes — a 1.0 agent, a
//! 0.3 agent, one that streams, one that asks for input, one that fails,
//! and one that requires a key. Each is imported from its card and invoked
//! through `POST /agents/{id}/invoke`.

use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use super::agent_protocol::Ap;
use super::harness::{eventually, Http, TestServer, ALICE};
use super::mcp::python_fixture;

/// A running fixture agent; it stops when dropped.
struct A2aAgent {
    _child: tokio::process::Child,
    base: String,
}

impl A2aAgent {
    async fn start(mode: &str, key: Option<&str>) -> Self {
        let mut args = vec![mode];
        if let Some(k) = key {
            args.extend(["--key", k]);
        }
        Self::start_args(&args).await
    }

    /// The fixture with `args` (its mode and options), its card served
    /// over HTTP.
    async fn start_args(args: &[&str]) -> Self {
        let (child, port) = python_fixture("a2a_agent.py", args).await;
        Self {
            _child: child,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    /// An agent that takes only tokens of the identity provider whose keys
    /// are in `jwks`, issued for `audience`; its card names `token_url`.
    async fn start_oauth(jwks: &str, audience: &str, token_url: &str) -> Self {
        Self::start_args(&["v1", "--oauth", jwks, audience, token_url]).await
    }

    /// An agent behind mutual TLS with the certificates in `dir`
    /// (`agent.pem`, and `clients-ca.pem` for the clients it accepts).
    async fn start_tls(mode: &str, dir: &Path, more: &[&str]) -> Self {
        let dir = dir.to_str().expect("a UTF-8 temporary path");
        let args = [&[mode, "--tls", dir][..], more].concat();
        let (child, port) = python_fixture("a2a_agent.py", &args).await;
        Self {
            _child: child,
            base: format!("https://localhost:{port}"),
        }
    }

    /// The requests the agent saw, oldest first.
    async fn requests(&self) -> Vec<Value> {
        self.seen().await["requests"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The first request the agent saw that `matches`.
    async fn request(&self, matches: impl Fn(&Value) -> bool) -> Option<Value> {
        self.requests().await.into_iter().find(|r| matches(r))
    }

    /// What the agent saw: `{requests: [...], cancelled: [...]}`.
    async fn seen(&self) -> Value {
        reqwest::get(format!("{}/_seen", self.base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

/// Imports an agent's card; returns the record id.
async fn import(http: &Http, agent: &A2aAgent) -> String {
    let (_, report) = http
        .call(
            reqwest::Method::POST,
            "/import/a2a",
            Some(ALICE),
            Some(json!({"url": agent.base})),
        )
        .await
        .expect("the card imports");
    report["agents"][0]["id"].as_str().unwrap().to_string()
}

async fn invoke(s: &TestServer, id: &str, body: Value, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/agents/{}/invoke", s.http, Http::url_id(id)))
        .bearer_auth(ALICE)
        .json(&body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn artifact_text(task: &Value) -> Vec<String> {
    task["artifacts"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|a| a["parts"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["text"].as_str().map(String::from))
        .collect()
}

async fn server() -> TestServer {
    TestServer::start_with(|c| {
        super::invocation::local_agents(c);
        // A Python agent's first answer can take a moment.
        c.gateway.outbound.timeout_ms = 10_000;
    })
    .await
}

#[tokio::test]
async fn a2a_1_0_and_0_3_agents_are_imported_and_called_over_both_wires() {
    let (v1, legacy, failing) = tokio::join!(
        A2aAgent::start("v1", None),
        A2aAgent::start("compat", None),
        A2aAgent::start("fail", None),
    );
    let s = server().await;
    let http = Http::new(&s.http);

    // A 1.0 card: no top-level url; each supported interface a binding.
    let id = import(&http, &v1).await;
    let rec = http.record(&id, ALICE).await;
    let bindings = rec["bindings"].as_array().unwrap();
    assert_eq!(bindings.len(), 2, "{rec}");
    assert_eq!(bindings[0]["protocol"], "a2a");
    assert_eq!(bindings[0]["transport"], "JSONRPC");
    assert_eq!(bindings[0]["protocolVersion"], "1.0");
    assert_eq!(bindings[1]["transport"], "HTTP+JSON");
    assert_eq!(bindings[1]["endpoint"], format!("{}/rest", v1.base));
    assert_eq!(rec["name"], "Echo Agent");

    // Text in, the completed task out, over JSON-RPC with the 1.0 header.
    let (status, body) = invoke(&s, &id, json!({"text": "hi"}), &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["task"]["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(artifact_text(&body["task"]), vec!["echo: hi"]);
    let call = v1
        .request(|r| r["path"] == "/jsonrpc")
        .await
        .expect("the agent was called over JSON-RPC");
    assert_eq!(call["rpc_method"], "SendMessage");
    assert_eq!(call["a2a_version"], "1.0");

    // The HTTP+JSON interface, with a JSON object sent as a data part.
    let mut rest = json!({
        "id": "a2a-echo-rest", "name": "Echo over HTTP+JSON",
        "description": "The echo agent reached through its HTTP+JSON interface.",
        "bindings": [{"protocol": "a2a", "endpoint": format!("{}/rest", v1.base),
            "transport": "HTTP+JSON", "protocolVersion": "1.0"}],
    });
    http.call(
        reqwest::Method::POST,
        "/agents",
        Some(ALICE),
        Some(rest.take()),
    )
    .await
    .expect("registers");
    let (status, body) = invoke(
        &s,
        "a2a-echo-rest",
        json!({"city": "Paris", "nights": "two"}),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let part = &body["task"]["artifacts"][0]["parts"][0]["data"]["echo"];
    assert_eq!(
        (part["city"].as_str(), part["nights"].as_str()),
        (Some("Paris"), Some("two")),
        "{body}"
    );
    assert!(
        v1.request(|r| r["path"] == "/rest/message:send" && r["a2a_version"] == "1.0")
            .await
            .is_some(),
        "{:?}",
        v1.requests().await
    );

    // A 0.3 agent: its card's version decides the method names and shape;
    // the answer comes back in the same `{task}` wrapping.
    let id = import(&http, &legacy).await;
    let (status, body) = invoke(&s, &id, json!({"text": "old"}), &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["task"]["status"]["state"], "completed");
    assert_eq!(artifact_text(&body["task"]), vec!["echo: old"]);
    let call = legacy
        .request(|r| r["path"] == "/jsonrpc")
        .await
        .expect("the agent was called over JSON-RPC");
    assert_eq!(call["rpc_method"], "message/send");
    assert!(call["a2a_version"].is_null(), "{call}");

    // A failed task is the agent's failure: 502 with its reason.
    let id = import(&http, &failing).await;
    let (status, body) = invoke(&s, &id, json!({"text": "anything"}), &[]).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (502, Some("bad_gateway")),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("the backend is down"),
        "{body}"
    );
    s.stop().await;
}

#[tokio::test]
async fn a2a_streams_are_relayed_and_a_dropped_stream_cancels_the_task() {
    let counting = A2aAgent::start("stream", None).await;
    let s = server().await;
    let http = Http::new(&s.http);
    let id = import(&http, &counting).await;
    stream_then_leave_one(&s, &id, &counting).await;
    s.stop().await;
}

/// Imports the booking agent `asking` and asks it to book: the answer is
/// its task waiting for input, with its question. Returns the record id.
async fn import_and_ask(s: &TestServer, http: &Http, asking: &A2aAgent) -> String {
    let id = import(http, asking).await;
    let (status, body) = invoke(s, &id, json!({"text": "book a table"}), &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["task"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{body}"
    );
    assert_eq!(
        body["task"]["status"]["message"]["parts"][0]["text"],
        "Which date?"
    );
    id
}

/// Streams the countdown agent `id` (`counting`) to its end, checking the
/// events relayed; then leaves a slow stream mid-way and waits for the
/// gateway to cancel its task.
async fn stream_then_leave_one(s: &TestServer, id: &str, counting: &A2aAgent) {
    let url = format!("{}/agents/{}/invoke?stream=true", s.http, Http::url_id(id));
    let resp = reqwest::Client::new()
        .post(&url)
        .bearer_auth(ALICE)
        .json(&json!({"text": "go"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let text = resp.text().await.unwrap();
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(names.first(), Some(&"task"), "{text}");
    assert_eq!(
        names.iter().filter(|n| **n == "artifactUpdate").count(),
        3,
        "{text}"
    );
    assert_eq!(names.last(), Some(&"end"), "{text}");
    assert!(
        text.contains("tick 3") && text.contains("TASK_STATE_COMPLETED"),
        "{text}"
    );

    // A caller that leaves mid-stream: the gateway cancels the task.
    let resp = reqwest::Client::new()
        .post(&url)
        .bearer_auth(ALICE)
        .json(&json!({"text": "slow"}))
        .send()
        .await
        .unwrap();
    let mut body = resp.bytes_stream();
    let mut got = String::new();
    while !got.contains("artifactUpdate") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
            .await
            .expect("events arrive")
            .expect("the stream is open")
            .unwrap();
        got.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(body);
    eventually(
        Duration::from_secs(10),
        "the gateway cancels the upstream task",
        || async {
            counting.seen().await["cancelled"]
                .as_array()
                .is_some_and(|c| c.len() == 1)
        },
    )
    .await;
}

#[tokio::test]
async fn a2a_declared_auth_is_applied_and_input_required_is_asked_and_resumed() {
    let (locked, asking) = tokio::join!(
        A2aAgent::start("v1", Some("s3cret")),
        A2aAgent::start("ask", None),
    );
    let s = server().await;
    let http = Http::new(&s.http);

    // The 1.0 card's bearer scheme becomes the record's authentication.
    let id = import(&http, &locked).await;
    let rec = http.record(&id, ALICE).await;
    assert_eq!(rec["authentication"]["type"], "oauth2_bearer", "{rec}");
    // Without a credential nothing is sent.
    let before = locked.requests().await.len();
    let (status, body) = invoke(&s, &id, json!({"text": "hi"}), &[]).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(locked.requests().await.len(), before);
    // The caller's Agent-Authorization reaches the agent.
    let (status, body) = invoke(
        &s,
        &id,
        json!({"text": "hi"}),
        &[("agent-authorization", "Bearer s3cret")],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(artifact_text(&body["task"]), vec!["echo: hi"]);
    assert!(
        locked
            .request(|r| r["rpc_method"] == "SendMessage" && r["authorization"] == "Bearer s3cret")
            .await
            .is_some(),
        "{:?}",
        locked.requests().await
    );

    // A task waiting for input is a valid answer: the caller sees the
    // state and the agent's question.
    let id = import_and_ask(&s, &http, &asking).await;

    // Through the Agent Protocol surface the question is WaitForInput, and
    // ResumeWithInput answers it on the same A2A task.
    let ap = Ap::new(&s, &id, ALICE);
    let events = ap
        .stream(
            "stream_request",
            Some(json!({"type": "ChatRequest", "input": "book a table"})),
            "WaitForInput",
        )
        .await;
    let asked = events.last().unwrap();
    assert_eq!(asked["type"], "WaitForInput", "{events:?}");
    assert_eq!(asked["request_keys"]["input"], "Which date?");
    let run_id = asked["run_id"].as_str().unwrap().to_string();
    let (status, run) = ap.get(&format!("runs/{run_id}")).await;
    assert_eq!((status, run["status"].as_str()), (200, Some("waiting")));
    let (status, resumed) = ap
        .run(json!({"type": "ResumeWithInput", "run_id": run_id, "request_keys": {"input": "Friday"}}))
        .await;
    assert_eq!(status, 200, "{resumed}");
    let events = ap.until_completed(&run_id).await;
    let done = events.last().unwrap();
    assert_eq!(done["finish_reason"], "success", "{events:?}");
    let result: Value = serde_json::from_str(done["result"].as_str().unwrap()).unwrap();
    assert_eq!(result["task"]["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(artifact_text(&result["task"]), vec!["booked for Friday"]);
    // The follow-up went to the task that asked.
    let first_task = &asked_task_id(&events);
    assert_eq!(result["task"]["id"].as_str(), Some(first_task.as_str()));
    s.stop().await;
}

/// Agents that speak A2A over gRPC only (the SDK's `GrpcHandler`): called,
/// streamed and cancelled through `lf.a2a.v1.A2AService`, their answers
/// in the same JSON a JSON-RPC agent's take, their refusal of a key the
/// caller's to see.
#[tokio::test]
async fn a2a_agents_over_grpc_are_called_streamed_and_cancelled() {
    let (locked, counting, asking) = tokio::join!(
        A2aAgent::start_args(&["v1", "--grpc", "--key", "s3cret"]),
        A2aAgent::start_args(&["stream", "--grpc"]),
        A2aAgent::start_args(&["ask", "--grpc"]),
    );
    let s = server().await;
    let http = Http::new(&s.http);

    // The card's only interface is gRPC, and it is callable.
    let id = import(&http, &locked).await;
    let rec = http.record(&id, ALICE).await;
    assert_eq!(rec["bindings"][0]["transport"], "GRPC", "{rec}");
    assert_eq!(rec["authentication"]["type"], "oauth2_bearer", "{rec}");

    // The key as metadata; text and JSON in, the task out as JSON (whole
    // numbers stay whole).
    let key = [("agent-authorization", "Bearer s3cret")];
    let (status, body) = invoke(&s, &id, json!({"text": "hi"}), &key).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{body}"
    );
    assert_eq!(artifact_text(&body["task"]), vec!["echo: hi"]);
    let (status, body) = invoke(&s, &id, json!({"city": "Paris", "nights": 2}), &key).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["task"]["artifacts"][0]["parts"][0]["data"]["echo"],
        json!({"city": "Paris", "nights": 2}),
        "{body}"
    );
    let call = locked
        .request(|r| r["method"] == "GRPC" && r["authorization"] == "Bearer s3cret")
        .await
        .expect("the agent was called over gRPC with the key");
    assert_eq!(call["path"], "/lf.a2a.v1.A2AService/SendMessage");
    assert_eq!(call["a2a_version"], "1.0");

    // A wrong key: the agent's UNAUTHENTICATED is the caller's 401, with
    // what the agent asked for.
    let resp = reqwest::Client::new()
        .post(format!("{}/agents/{}/invoke", s.http, Http::url_id(&id)))
        .bearer_auth(ALICE)
        .header("agent-authorization", "Bearer wrong")
        .json(&json!({"text": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.headers()["agent-authenticate"], "Bearer");
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("bearer key"),
        "{body}"
    );

    // A task that asks: its question, as over JSON-RPC.
    let id = import_and_ask(&s, &http, &asking).await;

    // The outbound guard stands before gRPC connections as before HTTP
    // ones: a name that resolves to an internal address is refused (403),
    // and nothing reaches the agent.
    let grpc_endpoint = http.record(&id, ALICE).await["bindings"][0]["endpoint"]
        .as_str()
        .unwrap()
        .replace("127.0.0.1", "localhost");
    let guarded = TestServer::start_with(|c| c.gateway.outbound.allow_http = true).await;
    Http::new(&guarded.http)
        .call(
            reqwest::Method::POST,
            "/agents",
            Some(ALICE),
            Some(json!({"id": "grpc-inside", "name": "Booking over gRPC",
                "description": "The booking agent, at an internal address.",
                "bindings": [{"protocol": "a2a", "endpoint": grpc_endpoint,
                    "transport": "GRPC", "protocolVersion": "1.0"}]})),
        )
        .await
        .expect("registers");
    let before = asking.requests().await.len();
    let (status, body) = invoke(&guarded, "grpc-inside", json!({"text": "hi"}), &[]).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("internal addresses"),
        "{body}"
    );
    assert_eq!(asking.requests().await.len(), before);
    guarded.stop().await;

    // A stream relayed event by event, and cancelled when its caller goes.
    let id = import(&http, &counting).await;
    stream_then_leave_one(&s, &id, &counting).await;
    assert!(
        counting
            .request(|r| r["path"] == "/lf.a2a.v1.A2AService/CancelTask")
            .await
            .is_some(),
        "{:?}",
        counting.requests().await
    );
    s.stop().await;
}

/// A gRPC agent behind mutual TLS: the channel trusts the gateway's CA
/// file and presents its client certificate; rotated to one the agent
/// does not accept, the kept channel is dropped and no call gets through.
#[tokio::test]
async fn grpc_agents_behind_mutual_tls_get_the_gateways_certificate_which_rotates() {
    let dir = tempfile::tempdir().unwrap();
    let certs = mtls_certificates(dir.path()).await;
    let agent = A2aAgent::start_tls("v1", dir.path(), &["--grpc"]).await;
    let (s, presented) = presenting_gateway(dir.path(), &certs).await;
    let http = Http::new(&s.http);
    let id = import(&http, &agent).await;
    let rec = http.record(&id, ALICE).await;
    let endpoint = rec["bindings"][0]["endpoint"].as_str().unwrap().to_string();
    assert!(endpoint.starts_with("https://localhost:"), "{rec}");
    assert_eq!(rec["bindings"][0]["transport"], "GRPC", "{rec}");
    let (status, body) = invoke(&s, &id, json!({"text": "hi"}), &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(artifact_text(&body["task"]), vec!["echo: hi"]);

    // A certificate of a CA the agent does not trust, put in place of the
    // gateway's: the kept channel (its connection was made with the old
    // certificate) is dropped, and the next handshake fails.
    present(&certs.rogue, &presented);
    let refused = invoke_until(&s, &id, "rogue", 502).await;
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("cannot reach")),
        "{refused}"
    );
    // Rotated back, calls go through again without a restart.
    present(&certs.gateway, &presented);
    let body = invoke_until(&s, &id, "rotated", 200).await;
    assert_eq!(artifact_text(&body["task"]), vec!["echo: rotated"]);
    s.stop().await;
}

/// The id of the A2A task whose question a run's first TextOutput carries.
fn asked_task_id(events: &[Value]) -> String {
    let first = events
        .iter()
        .find(|e| e["type"] == "TextOutput")
        .expect("the question was output");
    let task: Value = serde_json::from_str(first["content"].as_str().unwrap()).unwrap();
    task["task"]["id"].as_str().unwrap().to_string()
}

/// The certificates of the mutual-TLS test: the agent's (from its own CA),
/// the gateway's (from the CA the agent accepts clients of) and a rogue
/// client's (from a CA it does not).
async fn mtls_certificates(dir: &Path) -> Certificates {
    use crate::certs::{ca, leaf};
    ca(dir, "agents-ca").await;
    leaf(dir, "agents-ca", "agent", "DNS:localhost,IP:127.0.0.1").await;
    ca(dir, "clients-ca").await;
    ca(dir, "rogue-ca").await;
    Certificates {
        agents_ca: dir.join("agents-ca.pem"),
        gateway: leaf(dir, "clients-ca", "gateway", "DNS:gateway.example").await,
        rogue: leaf(dir, "rogue-ca", "rogue", "DNS:gateway.example").await,
    }
}

struct Certificates {
    agents_ca: std::path::PathBuf,
    gateway: (std::path::PathBuf, std::path::PathBuf),
    rogue: (std::path::PathBuf, std::path::PathBuf),
}

/// Puts a certificate and its key where the gateway reads its own, as a
/// rotation by cert-manager would.
fn present(
    files: &(std::path::PathBuf, std::path::PathBuf),
    at: &(std::path::PathBuf, std::path::PathBuf),
) {
    std::fs::copy(&files.0, &at.0).expect("certificate copied");
    std::fs::copy(&files.1, &at.1).expect("key copied");
}

/// A gateway that trusts the agents' CA and presents the gateway's
/// certificate from files in `dir`, which a test rotates (`present`).
async fn presenting_gateway(
    dir: &Path,
    certs: &Certificates,
) -> (TestServer, (std::path::PathBuf, std::path::PathBuf)) {
    let presented = (dir.join("presented.pem"), dir.join("presented.key"));
    present(&certs.gateway, &presented);
    let (ca_file, cert, key) = (
        certs.agents_ca.clone(),
        presented.0.clone(),
        presented.1.clone(),
    );
    let s = TestServer::start_with(move |c| {
        super::invocation::local_agents(c);
        c.gateway.outbound.timeout_ms = 10_000;
        c.gateway.outbound.ca_file = Some(ca_file);
        c.gateway.outbound.client_cert_file = Some(cert);
        c.gateway.outbound.client_key_file = Some(key);
    })
    .await;
    (s, presented)
}

#[tokio::test]
async fn agents_behind_mutual_tls_are_called_with_the_gateways_certificate_which_rotates() {
    let dir = tempfile::tempdir().unwrap();
    let certs = mtls_certificates(dir.path()).await;
    let agent = A2aAgent::start_tls("v1", dir.path(), &[]).await;
    let (s, presented) = presenting_gateway(dir.path(), &certs).await;
    let http = Http::new(&s.http);

    // The card is read over mutual TLS; its mtls scheme becomes the
    // record's authentication, and the call needs no caller credential.
    let id = import(&http, &agent).await;
    let rec = http.record(&id, ALICE).await;
    assert_eq!(rec["authentication"]["type"], "mtls", "{rec}");
    assert!(
        rec["bindings"][0]["endpoint"]
            .as_str()
            .is_some_and(|e| e.starts_with("https://localhost:")),
        "{rec}"
    );
    let (status, body) = invoke(&s, &id, json!({"text": "over mtls"}), &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(artifact_text(&body["task"]), vec!["echo: over mtls"]);

    // A certificate the agent does not accept, put in place of the
    // gateway's, is presented from then on: the agent refuses the
    // handshake, and the caller gets a 502 naming the agent.
    present(&certs.rogue, &presented);
    let refused = invoke_until(&s, &id, "rogue", 502).await;
    assert_eq!(refused["code"], "bad_gateway", "{refused}");
    // Rotated back, calls go through again without a restart.
    present(&certs.gateway, &presented);
    let body = invoke_until(&s, &id, "rotated", 200).await;
    assert_eq!(artifact_text(&body["task"]), vec!["echo: rotated"]);

    // A half-written rotation (a key that is not PEM) keeps the working
    // certificate.
    std::fs::write(&presented.1, "not a key").unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (status, body) = invoke(&s, &id, json!({"text": "kept"}), &[]).await;
    assert_eq!(status, 200, "{body}");

    // A node whose gateway has no certificate of its own: an agent that
    // requires mutual TLS is refused before anything is sent, naming the
    // settings; a credential for that agent presents its own certificate.
    let metadata = json!({
        "id": id, "name": rec["name"], "description": rec["description"],
        "bindings": rec["bindings"], "authentication": rec["authentication"],
    });
    let (ca_file, gateway) = (certs.agents_ca.clone(), certs.gateway.clone());
    let own = id.clone();
    let other = TestServer::start_with(move |c| {
        super::invocation::local_agents(c);
        c.gateway.outbound.timeout_ms = 10_000;
        c.gateway.outbound.ca_file = Some(ca_file);
        c.gateway.credentials = vec![agentry::config::CredentialConfig {
            agent: own,
            client_cert_file: Some(gateway.0),
            client_key_file: Some(gateway.1),
            ..Default::default()
        }];
    })
    .await;
    let other_http = Http::new(&other.http);
    let mut copy = metadata.clone();
    copy["id"] = json!("mtls-without-a-certificate");
    for m in [&metadata, &copy] {
        let (status, body) = other_http
            .call(
                reqwest::Method::POST,
                "/agents",
                Some(ALICE),
                Some(m.clone()),
            )
            .await
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(status, 201, "{body}");
    }
    let (status, body) = invoke(&other, &id, json!({"text": "own"}), &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(artifact_text(&body["task"]), vec!["echo: own"]);
    let (status, body) = invoke(
        &other,
        "mtls-without-a-certificate",
        json!({"text": "x"}),
        &[],
    )
    .await;
    assert_eq!(status, 501, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("gateway.outbound.client_cert_file")),
        "{body}"
    );
}

/// Invokes `id` with `text` until the answer has `status` (a rotation is
/// seen within about a second); its body.
async fn invoke_until(s: &TestServer, id: &str, text: &str, status: u16) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (got, body) = invoke(s, id, json!({ "text": text }), &[]).await;
        if got == status {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {status} within 10 s; the last answer was {got} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The client-credentials grants an identity provider fixture logged.
async fn grants(idp: &str) -> Vec<Value> {
    let log: Vec<Value> = reqwest::get(format!("{idp}/log"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    log.into_iter()
        .filter(|e| e["step"] == "client_credentials")
        .collect()
}

#[tokio::test]
async fn agents_that_want_oauth_tokens_get_the_gateways_own_from_client_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    let jwks_arg = jwks.to_str().unwrap().to_string();
    // The secret holds characters Basic authentication must form-encode.
    let (_idp, idp_port) = python_fixture(
        "oauth_server.py",
        &[
            &jwks_arg,
            "a2a-agents",
            "--client",
            "agentry-gateway:s3cret&=+x",
            "--ttl",
            "4",
        ],
    )
    .await;
    let idp = format!("http://127.0.0.1:{idp_port}");
    let token_url = format!("{idp}/token");
    let agent = A2aAgent::start_oauth(&jwks_arg, "a2a-agents", &token_url).await;

    std::env::set_var("AGENTRY_TEST_GATEWAY_CLIENT_SECRET", "s3cret&=+x");
    let client = |secret_env: Option<&str>, secret: Option<&str>, auth: Option<&str>| {
        agentry::config::ClientCredentialsConfig {
            token_url: token_url.clone(),
            client_id: "agentry-gateway".into(),
            client_secret: secret.map(String::from),
            client_secret_env: secret_env.map(String::from),
            scopes: vec!["agents.invoke".into()],
            audience: None,
            resource: None,
            client_auth: auth.map(String::from),
            ..Default::default()
        }
    };
    let credentials = vec![
        oauth_credential(
            "oauth-wrong-secret".into(),
            client(None, Some("not-the-secret"), Some("post")),
        ),
        oauth_credential(
            format!("{}/*", agent.base),
            client(Some("AGENTRY_TEST_GATEWAY_CLIENT_SECRET"), None, None),
        ),
    ];
    let s = gateway_with(credentials).await;
    let http = Http::new(&s.http);

    // The card's OAuth scheme: the record wants a bearer token, and the
    // caller brings none; the gateway gets its own.
    let id = import(&http, &agent).await;
    let rec = http.record(&id, ALICE).await;
    assert_eq!(rec["authentication"]["type"], "oauth2_bearer", "{rec}");
    let (status, body) = invoke(&s, &id, json!({"text": "first"}), &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(artifact_text(&body["task"]), vec!["echo: first"]);
    let got = grants(&idp).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (&got[0]["auth"], &got[0]["scope"], &got[0]["refused"]),
        (&json!("basic"), &json!("agents.invoke"), &json!(false)),
        "{got:?}"
    );
    // The token is reused while it is valid...
    let (status, body) = invoke(&s, &id, json!({"text": "second"}), &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(grants(&idp).await.len(), 1);
    // ...and renewed before it expires (4 s, renewed at 3).
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    let (status, body) = invoke(&s, &id, json!({"text": "renewed"}), &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(grants(&idp).await.len(), 2);

    // An agent that stops accepting the token (its issuer's keys changed)
    // answers 401, which the caller sees; the token is dropped, and the
    // next call fetches a new one.
    let keys = std::fs::read(&jwks).unwrap();
    std::fs::write(&jwks, r#"{"keys": []}"#).unwrap();
    let (status, body) = invoke(&s, &id, json!({"text": "refused"}), &[]).await;
    assert_eq!(status, 401, "{body}");
    std::fs::write(&jwks, keys).unwrap();
    let (status, body) = invoke(&s, &id, json!({"text": "again"}), &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(grants(&idp).await.len(), 3);

    // A client the token endpoint refuses: 502 naming the endpoint and the
    // provider's error, and the agent is not called.
    register_copy(&http, &rec, "oauth-wrong-secret").await;
    let before = agent.requests().await.len();
    let (status, body) = invoke(&s, "oauth-wrong-secret", json!({"text": "x"}), &[]).await;
    assert_eq!(status, 502, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&token_url) && message.contains("invalid_client"),
        "{body}"
    );
    assert_eq!(agent.requests().await.len(), before);
    let last = grants(&idp).await.pop().unwrap();
    assert_eq!(
        (&last["auth"], &last["refused"]),
        (&json!("post"), &json!(true))
    );
}

/// The gateway proves itself to the token endpoint with an assertion
/// signed by its own key (`private_key_jwt`) instead of a secret, with a
/// key of each kind. Each token request carries a new assertion (the
/// provider refuses one it has seen), and a key the provider does not hold
/// for the client is refused as a wrong secret is.
#[tokio::test]
async fn the_gateway_proves_itself_to_the_token_endpoint_with_a_signed_assertion() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let jwks = file("jwks.json");
    let kinds = ["ed25519", "ec", "rsa"];
    let mut args = vec![
        jwks.clone(),
        "a2a-agents".into(),
        "--ttl".into(),
        "2".into(),
    ];
    for kind in kinds {
        args.push("--jwt-client".into());
        args.push(format!("gw-{kind}:{}:{kind}", file(&format!("{kind}.pem"))));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_idp, idp_port) = python_fixture("oauth_server.py", &args).await;
    let idp = format!("http://127.0.0.1:{idp_port}");
    let token_url = format!("{idp}/token");
    let agent = A2aAgent::start_oauth(&jwks, "a2a-agents", &token_url).await;

    let signed = |agent: &str, client: &str, key: &str| {
        oauth_credential(
            agent.into(),
            agentry::config::ClientCredentialsConfig {
                token_url: token_url.clone(),
                client_id: client.into(),
                client_auth: Some("private_key_jwt".into()),
                private_key_file: Some(file(key).into()),
                key_id: Some(format!("{client}-key")),
                scopes: vec!["agents.invoke".into()],
                ..Default::default()
            },
        )
    };
    let mut credentials: Vec<_> = kinds
        .iter()
        .map(|k| {
            signed(
                &format!("signed-{k}"),
                &format!("gw-{k}"),
                &format!("{k}.pem"),
            )
        })
        .collect();
    credentials.push(signed("signed-wrong-key", "gw-ed25519", "ec.pem"));
    let s = gateway_with(credentials).await;
    let http = Http::new(&s.http);
    let id = import(&http, &agent).await;
    let rec = http.record(&id, ALICE).await;
    for kind in kinds {
        register_copy(&http, &rec, &format!("signed-{kind}")).await;
    }
    register_copy(&http, &rec, "signed-wrong-key").await;

    // The A2A agent takes only the provider's tokens: each call got one.
    for kind in kinds {
        let (status, body) =
            invoke(&s, &format!("signed-{kind}"), json!({"text": kind}), &[]).await;
        assert_eq!(status, 200, "{kind}: {body}");
        assert_eq!(artifact_text(&body["task"]), vec![format!("echo: {kind}")]);
    }
    let got = grants(&idp).await;
    let proven: Vec<(&str, &str, bool)> = got
        .iter()
        .map(|g| {
            let text = |k: &str| g[k].as_str().unwrap_or_default();
            (
                text("client_id"),
                text("auth"),
                g["refused"] == json!(false),
            )
        })
        .collect();
    assert_eq!(
        proven,
        [
            ("gw-ed25519", "private_key_jwt", true),
            ("gw-ec", "private_key_jwt", true),
            ("gw-rsa", "private_key_jwt", true),
        ],
        "{got:?}"
    );
    // Renewed after the token's 2 s (at 1.5 s), with a new assertion.
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let (status, body) = invoke(&s, "signed-ed25519", json!({"text": "renewed"}), &[]).await;
    assert_eq!(status, 200, "{body}");
    let last = grants(&idp).await.pop().unwrap();
    assert_eq!(
        (&last["client_id"], &last["refused"]),
        (&json!("gw-ed25519"), &json!(false)),
        "{last}"
    );

    // Another key than the client's: refused, and the agent is not called.
    let before = agent.requests().await.len();
    let (status, body) = invoke(&s, "signed-wrong-key", json!({"text": "x"}), &[]).await;
    assert_eq!(status, 502, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("invalid_client"), "{body}");
    assert_eq!(agent.requests().await.len(), before);
    let last = grants(&idp).await.pop().unwrap();
    assert_eq!(
        (&last["auth"], &last["refused"]),
        (&json!("private_key_jwt"), &json!(true))
    );
}

/// A gateway credential whose token the gateway gets with `oauth2`.
fn oauth_credential(
    agent: String,
    oauth2: agentry::config::ClientCredentialsConfig,
) -> agentry::config::CredentialConfig {
    agentry::config::CredentialConfig {
        agent,
        oauth2: Some(oauth2),
        ..Default::default()
    }
}

/// Registers `rec`'s agent again under `id`, for a credential of its own.
async fn register_copy(http: &Http, rec: &Value, id: &str) {
    let copy = json!({
        "id": id, "name": rec["name"], "description": rec["description"],
        "bindings": rec["bindings"], "authentication": rec["authentication"],
    });
    let (status, _) = http
        .call(reqwest::Method::POST, "/agents", Some(ALICE), Some(copy))
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(status, 201);
}

/// A registry whose gateway calls agents on loopback with `credentials`.
async fn gateway_with(credentials: Vec<agentry::config::CredentialConfig>) -> TestServer {
    TestServer::start_with(move |c| {
        super::invocation::local_agents(c);
        c.gateway.outbound.timeout_ms = 10_000;
        c.gateway.credentials = credentials;
    })
    .await
}
