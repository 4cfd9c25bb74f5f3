//! The invocation gateway against real agents on loopback: validation
//! before anything is sent, forwarding and output checks, upstream
//! failures, authentication, idempotency, batches, streaming with
//! cancellation, the outbound policy, the WoA host and imports.

use std::sync::atomic::Ordering;
use std::time::Duration;

use agentry::config::Config;
use agentry::pb::{self, gateway_client::GatewayClient};
use futures::StreamExt;
use reqwest::header::HeaderMap;
use serde_json::{json, Value};

use super::agents::{Agents, KEYED_CHALLENGE};
use super::harness::{Grpc, Http, TestServer, ADMIN, ALICE, CAROL_READER};

/// Gateway settings for agents on loopback over plain HTTP.
pub fn local_agents(c: &mut Config) {
    c.gateway.outbound.allow = vec!["127.0.0.1".into()];
    c.gateway.outbound.allow_http = true;
    c.gateway.outbound.timeout_ms = 1_000;
    c.gateway.outbound.max_response_bytes = 64 * 1024;
}

/// A raw gateway answer: status, headers, body text.
struct Answer {
    status: u16,
    headers: HeaderMap,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
    /// The ADP code of a problem answer.
    fn code(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            "application/problem+json",
            "{}",
            self.text
        );
        self.json()["code"].as_str().unwrap_or("").to_string()
    }
}

async fn invoke(
    s: &TestServer,
    key: Option<&str>,
    id: &str,
    body: Value,
    extra: &[(&str, &str)],
) -> Answer {
    let mut req = reqwest::Client::new()
        .post(format!("{}/agents/{}/invoke", s.http, Http::url_id(id)))
        .json(&body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("gateway answers");
    Answer {
        status: resp.status().as_u16(),
        headers: resp.headers().clone(),
        text: resp.text().await.unwrap_or_default(),
    }
}

async fn register(s: &TestServer, meta: Value) {
    Http::new(&s.http)
        .call(reqwest::Method::POST, "/agents", Some(ALICE), Some(meta))
        .await
        .expect("agent registers");
}

fn agent(id: &str, endpoint: String, extra: Value) -> Value {
    let mut m = json!({
        "id": id,
        "name": format!("Agent {id}"),
        "description": "A test agent on loopback.",
        "bindings": [{"protocol": "http", "endpoint": endpoint}]
    });
    if let (Value::Object(m), Value::Object(e)) = (&mut m, extra) {
        m.extend(e);
    }
    m
}

fn echo_operations() -> Value {
    json!({"operations": [{
        "name": "echo",
        "description": "Echoes its input.",
        "inputs": {"type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}}, "required": ["text"]},
        "outputs": {"type": "object", "properties": {"echo": {"type": "object"}}, "required": ["echo"]}
    }]})
}

#[tokio::test]
async fn invocation_validates_forwards_and_checks_the_output() {
    let agents = Agents::start().await;
    let s = TestServer::start_with(local_agents).await;
    register(
        &s,
        agent("echo", format!("{}/echo", agents.base), echo_operations()),
    )
    .await;
    register(
        &s,
        agent(
            "liar",
            format!("{}/bad-output", agents.base),
            echo_operations(),
        ),
    )
    .await;

    // Bad input: 400 naming the field, and nothing reaches the agent.
    let a = invoke(&s, Some(ALICE), "echo", json!({"text": 5}), &[]).await;
    assert_eq!(
        (a.status, a.code().as_str()),
        (400, "invalid_request"),
        "{}",
        a.text
    );
    assert_eq!(a.json()["field"], "/text");
    let a = invoke(
        &s,
        Some(ALICE),
        "echo",
        json!({"agent": "echo", "input": {"n": 1}}),
        &[],
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.text);
    assert!(
        a.json()["message"].as_str().unwrap().contains("text"),
        "{}",
        a.text
    );
    let a = invoke(
        &s,
        Some(ALICE),
        "echo",
        json!({"agent": "other", "input": {"text": "x"}}),
        &[],
    )
    .await;
    assert_eq!(
        (a.status, a.json()["field"].as_str()),
        (400, Some("/agent")),
        "{}",
        a.text
    );
    let a = invoke(
        &s,
        Some(ALICE),
        "echo",
        json!({"operation": "nope", "input": {"text": "x"}}),
        &[],
    )
    .await;
    assert_eq!(
        (a.status, a.json()["field"].as_str()),
        (400, Some("/operation")),
        "{}",
        a.text
    );
    assert_eq!(agents.calls(), 0, "no invalid call was forwarded");

    // Credentials: none is 401; a reader may invoke.
    let a = invoke(&s, None, "echo", json!({"text": "hi"}), &[]).await;
    assert_eq!((a.status, a.code().as_str()), (401, "unauthorized"));
    let a = invoke(&s, Some(CAROL_READER), "echo", json!({"text": "hi"}), &[]).await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json(), json!({"echo": {"text": "hi"}}));
    assert_eq!(a.header("x-agentry-output-check"), "valid");
    assert_eq!(a.header("x-agentry-binding"), "http");

    // The WoA envelope: the agent receives the input alone.
    let a = invoke(
        &s,
        Some(ALICE),
        "echo",
        json!({"agent": "echo", "operation": "echo", "input": {"text": "env"}}),
        &[],
    )
    .await;
    assert_eq!(a.json(), json!({"echo": {"text": "env"}}), "{}", a.text);

    // An answer that breaks the output schema is returned, and reported.
    let a = invoke(&s, Some(ALICE), "liar", json!({"text": "hi"}), &[]).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json(), json!({"unexpected": 1}));
    assert_eq!(a.header("x-agentry-output-check"), "invalid");
    assert!(
        a.header("x-agentry-output-error").contains("echo"),
        "{:?}",
        a.headers
    );

    // A batch: one result per element, each with its own status.
    let a = invoke(
        &s,
        Some(ALICE),
        "echo",
        json!([{"text": "one"}, {"text": 2}, {"agent": "echo", "input": {"text": "three"}}]),
        &[],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    let items = a.json();
    let statuses: Vec<u64> = items
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, vec![200, 400, 200], "{items}");
    assert_eq!(items[0]["output"], json!({"echo": {"text": "one"}}));
    assert_eq!(items[1]["error"]["code"], "invalid_request");
    assert_eq!(items[1]["error"]["field"], "/1/text");
    assert_eq!(
        items[1]["error"]["instance"], "/agents/echo/invoke",
        "{items}"
    );
    assert_eq!(items[2]["output_check"]["state"], "valid");

    // gRPC says the same.
    let mut grpc = GatewayClient::connect(s.grpc.clone()).await.unwrap();
    let req = Grpc::req(
        Some(ALICE),
        pb::InvokeRequest {
            agent_id: "echo".into(),
            body: br#"{"text":"grpc"}"#.to_vec(),
            ..Default::default()
        },
    );
    let r = grpc.invoke(req).await.unwrap().into_inner().result.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        serde_json::from_slice::<Value>(&r.body).unwrap(),
        json!({"echo": {"text": "grpc"}})
    );
    assert_eq!(r.output_check.unwrap().state, "valid");
    let req = Grpc::req(
        Some(ALICE),
        pb::InvokeRequest {
            agent_id: "echo".into(),
            body: br#"{"text":7}"#.to_vec(),
            ..Default::default()
        },
    );
    let e = grpc.invoke(req).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        agentry::api::error::detail_of(&e).field.as_deref(),
        Some("/text")
    );

    // Unknown agents are 404.
    let a = invoke(&s, Some(ALICE), "ghost", json!({}), &[]).await;
    assert_eq!(a.status, 404);
    s.stop().await;
}

#[tokio::test]
async fn upstream_failures_map_to_gateway_statuses() {
    let agents = Agents::start().await;
    let s = TestServer::start_with(local_agents).await;
    for (id, path) in [
        ("fail", "fail"),
        ("busy", "busy"),
        ("slow", "slow"),
        ("html", "html"),
        ("huge", "huge"),
        ("refuse", "refuse"),
    ] {
        register(&s, agent(id, format!("{}/{path}", agents.base), json!({}))).await;
    }
    let call = |id: &'static str| invoke(&s, Some(ALICE), id, json!({"text": "x"}), &[]);

    let a = call("fail").await;
    assert_eq!(
        (a.status, a.code().as_str()),
        (502, "bad_gateway"),
        "{}",
        a.text
    );
    assert!(
        !a.text.contains("secrets"),
        "the agent's body is not echoed: {}",
        a.text
    );
    let a = call("busy").await;
    assert_eq!((a.status, a.code().as_str()), (503, "unavailable"));
    assert_eq!(a.header("retry-after"), "7");
    let started = std::time::Instant::now();
    let a = call("slow").await;
    assert_eq!(
        (a.status, a.code().as_str()),
        (504, "timeout"),
        "{}",
        a.text
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the gateway's deadline applies"
    );
    let a = call("html").await;
    assert_eq!(a.status, 502);
    assert!(
        a.json()["message"].as_str().unwrap().contains("not JSON"),
        "{}",
        a.text
    );
    let a = call("huge").await;
    assert_eq!(a.status, 502);
    assert!(
        a.json()["message"]
            .as_str()
            .unwrap()
            .contains("larger than"),
        "{}",
        a.text
    );
    // The agent's own refusal passes through, body and all.
    let a = call("refuse").await;
    assert_eq!(a.status, 422);
    assert_eq!(a.header("content-type"), "application/problem+json");
    assert_eq!(a.json()["detail"], "the text is too long for this agent");
    s.stop().await;
}

/// A gRPC client's own deadline (`grpc-timeout`) holds on the server: a
/// call to an agent slower than it is answered DEADLINE_EXCEEDED once the
/// client's deadline has passed, long before the gateway's own timeout.
/// The call goes out over plain HTTP/2, since tonic's client would enforce
/// the same deadline itself and race the server's answer.
#[tokio::test]
async fn a_grpc_clients_deadline_is_kept_by_the_server() {
    use prost::Message;
    let agents = Agents::start().await;
    let s = TestServer::start_with(|c| {
        local_agents(c);
        c.gateway.outbound.timeout_ms = 10_000;
    })
    .await;
    register(
        &s,
        agent("slow", format!("{}/slow", agents.base), json!({})),
    )
    .await;

    let message = pb::InvokeRequest {
        agent_id: "slow".into(),
        body: br#"{"text":"x"}"#.to_vec(),
        ..Default::default()
    }
    .encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend((message.len() as u32).to_be_bytes());
    frame.extend(message);
    let addr = s.grpc.trim_start_matches("http://");
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let request = http::Request::post(format!("{}/agentry.v1.Gateway/Invoke", s.grpc))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "500m")
        .header("authorization", format!("Bearer {ALICE}"))
        .body(())
        .unwrap();
    let started = std::time::Instant::now();
    let (response, mut body) = client.send_request(request, false).unwrap();
    body.send_data(frame.into(), true).unwrap();
    let response = response.await.unwrap();
    // A status without a message comes in the headers alone
    // (trailers-only); otherwise in the trailers.
    let mut fields = response.headers().clone();
    if !fields.contains_key("grpc-status") {
        let mut answer = response.into_body();
        while let Some(data) = answer.data().await {
            data.unwrap();
        }
        fields = answer.trailers().await.unwrap().unwrap_or_default();
    }
    let field = |name: &str| {
        fields
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    // 4: DEADLINE_EXCEEDED.
    assert_eq!(field("grpc-status"), "4", "{fields:?}");
    assert!(field("grpc-message").contains("500%20ms"), "{fields:?}");
    // The slow agent answers after 5 s.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    s.stop().await;
}

#[tokio::test]
async fn declared_authentication_is_passed_through_or_injected() {
    let agents = Agents::start().await;
    std::env::set_var("AGENTRY_TEST_KEYED_SECRET", "agent-secret");
    let s = TestServer::start_with(|c| {
        local_agents(c);
        c.gateway.credentials = vec![agentry::config::CredentialConfig {
            agent: "keyed-injected".into(),
            header: Some("X-API-Key".into()),
            value_env: Some("AGENTRY_TEST_KEYED_SECRET".into()),
            ..Default::default()
        }];
    })
    .await;
    let auth = json!({"authentication": {"type": "api_key", "instructions": "Send X-API-Key."}});
    register(
        &s,
        agent("keyed", format!("{}/keyed", agents.base), auth.clone()),
    )
    .await;
    register(
        &s,
        agent("keyed-injected", format!("{}/keyed", agents.base), auth),
    )
    .await;

    // The 401s below are about the agent's credential, not ALICE's good
    // registry key: the challenge says so (an OAuth client would drop its
    // token on `error="invalid_token"`, and run its flow again on the
    // registry's `resource_metadata`).
    let about_the_agent = r#"Agent realm="keyed", header="Agent-Authorization""#;
    let a = invoke(&s, Some(ALICE), "keyed", json!({}), &[]).await;
    assert_eq!((a.status, a.code().as_str()), (401, "unauthorized"));
    assert!(a.json()["message"]
        .as_str()
        .unwrap()
        .contains("Agent-Authorization"));
    assert_eq!(a.header("www-authenticate"), about_the_agent);
    assert_eq!(agents.calls(), 0, "nothing is sent without the credential");

    // The agent's own refusal: its body and its challenge reach the caller.
    let wrong = [("agent-authorization", "a-wrong-secret")];
    let a = invoke(&s, Some(ALICE), "keyed", json!({}), &wrong).await;
    assert_eq!(a.status, 401, "{}", a.text);
    let sent = json!({"type": "about:blank", "title": "Refused", "status": 401,
        "detail": "missing or wrong X-API-Key"});
    assert_eq!(
        a.text,
        sent.to_string(),
        "the agent's body exactly as it sent it"
    );
    assert_eq!(a.header("content-type"), "application/problem+json");
    assert_eq!(a.header("www-authenticate"), about_the_agent);
    assert_eq!(a.header("agent-authenticate"), KEYED_CHALLENGE);
    // In a batch and a stream, where no header is the element's own.
    let a = invoke(&s, Some(ALICE), "keyed", json!([{}, {}]), &wrong).await;
    assert_eq!(a.status, 200, "{}", a.text);
    for item in a.json().as_array().unwrap() {
        assert_eq!(item["status"], 401, "{item}");
        assert_eq!(item["agent_challenge"], KEYED_CHALLENGE, "{item}");
    }
    let resp = reqwest::Client::new()
        .post(format!("{}/agents/keyed/invoke?stream=true", s.http))
        .bearer_auth(ALICE)
        .header("agent-authorization", "a-wrong-secret")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    let (events, _) = read_events(resp, 2).await;
    assert_eq!(events[0].0, "error", "{events:?}");
    let end: Value = serde_json::from_str(&events[1].1).unwrap();
    assert_eq!(
        end,
        json!({"status": 401, "agent_challenge": KEYED_CHALLENGE}),
        "{events:?}"
    );
    // And to a gRPC client.
    let mut grpc = GatewayClient::connect(s.grpc.clone()).await.unwrap();
    let req = Grpc::req(
        Some(ALICE),
        pb::InvokeRequest {
            agent_id: "keyed".into(),
            body: b"{}".to_vec(),
            agent_authorization: "a-wrong-secret".into(),
            ..Default::default()
        },
    );
    let r = grpc.invoke(req).await.unwrap().into_inner().result.unwrap();
    assert_eq!(
        (r.status, r.agent_challenge.as_str()),
        (401, KEYED_CHALLENGE)
    );
    let req = Grpc::req(
        Some(ALICE),
        pb::InvokeRequest {
            agent_id: "keyed".into(),
            body: b"{}".to_vec(),
            ..Default::default()
        },
    );
    let e = grpc.invoke(req).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    assert_eq!(
        e.metadata().get("www-authenticate").unwrap(),
        about_the_agent
    );
    // gRPC carries any string: a credential or idempotency key that
    // cannot travel in an HTTP header is the caller's error, named, and
    // nothing is sent (it used to fail at sending, as an unreachable agent).
    let before = agents.calls();
    for (credential, key, field) in [
        ("agent-secret\r\nX-Injected: 1", "", "/agent_authorization"),
        ("agent-secret", "retry-1\n", "/idempotency_key"),
    ] {
        let req = Grpc::req(
            Some(ALICE),
            pb::InvokeRequest {
                agent_id: "keyed".into(),
                body: b"{}".to_vec(),
                agent_authorization: credential.into(),
                idempotency_key: key.into(),
                ..Default::default()
            },
        );
        let e = grpc.invoke(req).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        let detail = agentry::api::error::detail_of(&e);
        assert_eq!(detail.field.as_deref(), Some(field), "{detail:?}");
    }
    assert_eq!(agents.calls(), before);

    let a = invoke(
        &s,
        Some(ALICE),
        "keyed",
        json!({}),
        &[("agent-authorization", "agent-secret")],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(agents.header("x-api-key").as_deref(), Some("agent-secret"));
    assert_eq!(
        agents.header("authorization"),
        None,
        "the registry key never reaches the agent"
    );
    let a = invoke(&s, Some(ALICE), "keyed-injected", json!({}), &[]).await;
    assert_eq!(a.status, 200, "{}", a.text);
    s.stop().await;
}

#[tokio::test]
async fn idempotency_keys_return_the_first_answer() {
    let agents = Agents::start().await;
    let s = TestServer::start_with(local_agents).await;
    register(
        &s,
        agent("counter", format!("{}/count", agents.base), json!({})),
    )
    .await;
    let key = [("idempotency-key", "order-42")];
    let first = invoke(&s, Some(ALICE), "counter", json!({"item": "a"}), &key).await;
    let again = invoke(&s, Some(ALICE), "counter", json!({"item": "a"}), &key).await;
    assert_eq!(first.json(), json!({"count": 1}));
    assert_eq!(again.json(), json!({"count": 1}));
    assert_eq!(again.header("idempotent-replayed"), "true");
    assert_eq!(first.header("idempotent-replayed"), "");
    assert_eq!(agents.calls(), 1);
    assert_eq!(
        agents.header("idempotency-key").as_deref(),
        Some("order-42")
    );
    let other = invoke(&s, Some(ALICE), "counter", json!({"item": "b"}), &key).await;
    assert_eq!((other.status, other.code().as_str()), (409, "conflict"));
    let fresh = invoke(
        &s,
        Some(ALICE),
        "counter",
        json!({"item": "a"}),
        &[("idempotency-key", "order-43")],
    )
    .await;
    assert_eq!(fresh.json(), json!({"count": 2}));
    s.stop().await;
}

/// The answers kept for repeated keys are bounded in bytes, not only in
/// number: an invoker whose agent answers in megabytes cannot make a node
/// hold ten thousand of them. Past the bound the oldest are forgotten (a
/// repeat of one calls again, as after the window); an answer over an
/// eighth of it is not kept, and its repeat is refused rather than sent to
/// the agent a second time. A key longer than keys are kept is refused
/// before anything is sent.
#[tokio::test]
async fn idempotent_answers_are_kept_within_a_byte_bound() {
    let agents = Agents::start().await;
    let s = TestServer::start_with(|c| {
        local_agents(c);
        c.gateway.outbound.max_response_bytes = 512 * 1024;
        c.gateway.idempotency_max_bytes = 1024 * 1024;
    })
    .await;
    register(
        &s,
        agent("echo-big", format!("{}/echo", agents.base), json!({})),
    )
    .await;
    let text = |kb: usize| json!({"text": "x".repeat(kb * 1024)});

    // 200 KiB is over an eighth of 1 MiB: answered, not kept.
    let key = [("idempotency-key", "large-1")];
    let first = invoke(&s, Some(ALICE), "echo-big", text(200), &key).await;
    assert_eq!(first.status, 200, "{}", first.text);
    let calls = agents.calls();
    let again = invoke(&s, Some(ALICE), "echo-big", text(200), &key).await;
    assert_eq!(
        (again.status, again.code().as_str()),
        (409, "conflict"),
        "{}",
        again.text
    );
    assert!(
        again.text.contains("was not called again"),
        "{}",
        again.text
    );
    assert_eq!(agents.calls(), calls, "the repeat never reached the agent");

    // Answers of 100 KiB are kept until they fill 1 MiB; then the oldest
    // goes, and its repeat calls again while the newest still replays.
    for i in 0..12 {
        let key = format!("small-{i}");
        let a = invoke(
            &s,
            Some(ALICE),
            "echo-big",
            text(100),
            &[("idempotency-key", &key)],
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.text);
    }
    let calls = agents.calls();
    let newest = invoke(
        &s,
        Some(ALICE),
        "echo-big",
        text(100),
        &[("idempotency-key", "small-11")],
    )
    .await;
    assert_eq!(newest.header("idempotent-replayed"), "true");
    assert_eq!(agents.calls(), calls);
    let oldest = invoke(
        &s,
        Some(ALICE),
        "echo-big",
        text(100),
        &[("idempotency-key", "small-0")],
    )
    .await;
    assert_eq!(oldest.status, 200, "{}", oldest.text);
    assert_eq!(oldest.header("idempotent-replayed"), "");
    assert_eq!(agents.calls(), calls + 1, "a forgotten key calls again");

    let long = "k".repeat(257);
    let a = invoke(
        &s,
        Some(ALICE),
        "echo-big",
        json!({}),
        &[("idempotency-key", &long)],
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.text);
    assert!(a.text.contains("/idempotency_key"), "{}", a.text);
    assert_eq!(agents.calls(), calls + 1, "nothing sent for a key too long");
    s.stop().await;
}

/// Reads SSE frames from a response until `until` events have arrived.
async fn read_events(
    resp: reqwest::Response,
    until: usize,
) -> (Vec<(String, String)>, reqwest::Response) {
    let mut resp = resp;
    let mut buf = String::new();
    let mut events = Vec::new();
    while events.len() < until {
        let Some(chunk) = resp.chunk().await.unwrap() else {
            break;
        };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            let mut name = "message".to_string();
            let mut data = Vec::new();
            for line in frame.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.trim_start().to_string());
                }
            }
            if !data.is_empty() {
                events.push((name, data.join("\n")));
            }
        }
    }
    (events, resp)
}

#[tokio::test]
async fn streams_relay_events_and_a_disconnect_cancels_the_agent() {
    let agents = Agents::start().await;
    let s = TestServer::start_with(local_agents).await;
    register(
        &s,
        agent("streamer", format!("{}/stream", agents.base), json!({})),
    )
    .await;
    register(
        &s,
        agent("ticker", format!("{}/endless", agents.base), json!({})),
    )
    .await;
    register(
        &s,
        agent("echo", format!("{}/echo", agents.base), json!({})),
    )
    .await;
    let client = reqwest::Client::new();
    let post = |id: &str, body: Value| {
        client
            .post(format!("{}/agents/{id}/invoke", s.http))
            .bearer_auth(ALICE)
            .json(&body)
    };

    let resp = post("streamer", json!({"q": 1}))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let (events, _) = read_events(resp, 4).await;
    assert_eq!(
        events,
        vec![
            ("token".into(), "a".into()),
            ("token".into(), "b".into()),
            ("token".into(), "c".into()),
            ("end".into(), r#"{"status":200}"#.into())
        ]
    );

    // An agent that answers with JSON streams as one result event.
    let resp = post(
        "echo",
        json!({"agent": "echo", "input": {"x": 1}, "stream": true}),
    )
    .send()
    .await
    .unwrap();
    let (events, _) = read_events(resp, 2).await;
    assert_eq!(events[0], ("result".into(), r#"{"echo":{"x":1}}"#.into()));
    assert_eq!(events[1].0, "end");

    // The caller goes away: the agent's stream is dropped too.
    let resp = post("ticker", json!({}))
        .query(&[("stream", "true")])
        .send()
        .await
        .unwrap();
    let (events, resp) = read_events(resp, 2).await;
    assert_eq!(events[0].0, "tick");
    assert!(!agents.seen.cancelled.load(Ordering::SeqCst));
    drop(resp);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !agents.seen.cancelled.load(Ordering::SeqCst) {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent's stream was not cancelled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // gRPC streams the same events.
    let mut grpc = GatewayClient::connect(s.grpc.clone()).await.unwrap();
    let req = Grpc::req(
        Some(ALICE),
        pb::InvokeRequest {
            agent_id: "streamer".into(),
            body: b"{}".to_vec(),
            ..Default::default()
        },
    );
    let events: Vec<(String, String)> = grpc
        .invoke_stream(req)
        .await
        .unwrap()
        .into_inner()
        .map(|e| {
            let e = e.unwrap();
            (e.event, e.data)
        })
        .collect()
        .await;
    assert_eq!(events.len(), 4);
    assert_eq!(events[2], ("token".into(), "c".into()));
    s.stop().await;
}

#[tokio::test]
async fn an_agents_event_that_never_ends_is_cut_off_at_the_size_limit() {
    let agents = Agents::start().await;
    // The limit (64 KiB) is reached long before the idle timeout (1 s).
    let s = TestServer::start_with(local_agents).await;
    register(
        &s,
        agent("flood", format!("{}/flood", agents.base), json!({})),
    )
    .await;
    let resp = reqwest::Client::new()
        .post(format!("{}/agents/flood/invoke", s.http))
        .bearer_auth(ALICE)
        .header("accept", "text/event-stream")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let (events, _) = read_events(resp, 1).await;
    let (name, data) = &events[0];
    assert_eq!(name, "error", "{data}");
    let problem: Value = serde_json::from_str(data).unwrap();
    assert_eq!(problem["code"], "bad_gateway", "{problem}");
    assert!(
        problem["message"]
            .as_str()
            .is_some_and(|m| m.contains("larger than the limit of 65536 bytes")),
        "{problem}"
    );
    s.stop().await;
}

#[tokio::test]
async fn the_outbound_policy_refuses_internal_targets_and_redirects() {
    let agents = Agents::start().await;
    // Plain http allowed, but no internal target.
    let s = TestServer::start_with(|c| c.gateway.outbound.allow_http = true).await;
    register(
        &s,
        agent("literal", format!("{}/echo", agents.base), json!({})),
    )
    .await;
    register(
        &s,
        agent(
            "named",
            format!("http://localhost:{}/echo", agents.port),
            json!({}),
        ),
    )
    .await;
    let a = invoke(&s, Some(ALICE), "literal", json!({}), &[]).await;
    assert_eq!(
        (a.status, a.code().as_str()),
        (403, "forbidden"),
        "{}",
        a.text
    );
    assert!(
        a.json()["message"].as_str().unwrap().contains("127.0.0.1"),
        "{}",
        a.text
    );
    // A DNS name that resolves to loopback is refused as well.
    let a = invoke(&s, Some(ALICE), "named", json!({}), &[]).await;
    assert_eq!(
        (a.status, a.code().as_str()),
        (403, "forbidden"),
        "{}",
        a.text
    );
    assert!(
        a.json()["message"].as_str().unwrap().contains("internal"),
        "{}",
        a.text
    );
    assert_eq!(agents.calls(), 0);
    // The WoA crawler obeys the same policy.
    let e = Http::new(&s.http)
        .import_woa(ALICE, &agents.base)
        .await
        .unwrap_err();
    assert_eq!((e.http, e.code.as_str()), (403, "forbidden"));
    s.stop().await;

    // `localhost` allowed by name: its redirect to 127.0.0.1 is not.
    let s = TestServer::start_with(|c| {
        c.gateway.outbound.allow_http = true;
        c.gateway.outbound.allow = vec!["localhost".into()];
    })
    .await;
    register(
        &s,
        agent(
            "named",
            format!("http://localhost:{}/echo", agents.port),
            json!({}),
        ),
    )
    .await;
    register(
        &s,
        agent(
            "redirector",
            format!("http://localhost:{}/redirect", agents.port),
            json!({}),
        ),
    )
    .await;
    let a = invoke(&s, Some(ALICE), "named", json!({"ok": 1}), &[]).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let before = agents.calls();
    let a = invoke(&s, Some(ALICE), "redirector", json!({}), &[]).await;
    assert_eq!(
        (a.status, a.code().as_str()),
        (403, "forbidden"),
        "{}",
        a.text
    );
    assert!(
        a.json()["message"].as_str().unwrap().contains("127.0.0.1"),
        "{}",
        a.text
    );
    assert_eq!(
        agents.calls(),
        before + 1,
        "only the redirecting agent was reached"
    );
    s.stop().await;

    // Plain http is refused by default.
    let s = TestServer::start_with(|c| c.gateway.outbound.allow = vec!["127.0.0.1".into()]).await;
    register(
        &s,
        agent("echo", format!("{}/echo", agents.base), json!({})),
    )
    .await;
    let a = invoke(&s, Some(ALICE), "echo", json!({}), &[]).await;
    assert_eq!(a.status, 403, "{}", a.text);
    assert!(
        a.json()["message"].as_str().unwrap().contains("plain http"),
        "{}",
        a.text
    );
    s.stop().await;
}

#[tokio::test]
async fn the_registry_serves_a_woa_document_of_its_agents() {
    let agents = Agents::start().await;
    let s = TestServer::start_with(local_agents).await;
    register(
        &s,
        agent("echo", format!("{}/echo", agents.base), echo_operations()),
    )
    .await;
    register(
        &s,
        agent(
            "https://agents.example/uri-echo",
            format!("{}/echo", agents.base),
            json!({}),
        ),
    )
    .await;
    let client = reqwest::Client::new();
    let url = format!("{}/.well-known/woa.json", s.http);
    let resp = client.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/woa+json");
    let etag = resp.headers()["etag"].to_str().unwrap().to_string();
    assert!(resp.headers().contains_key("last-modified"));
    assert!(resp.headers()["cache-control"]
        .to_str()
        .unwrap()
        .contains("max-age="));
    let doc: Value = resp.json().await.unwrap();
    assert_eq!(doc["woa_version"], "1");
    assert_eq!(doc["transports"]["rest"]["base"], s.http);
    assert_eq!(
        doc["transports"]["rest"]["invoke_path"],
        "/agents/{agent_id}/invoke"
    );
    let listed = doc["agents"].as_array().unwrap();
    let echo = listed
        .iter()
        .find(|a| a["id"] == "echo")
        .expect("echo is listed");
    assert_eq!(echo["operations"][0]["name"], "echo");
    assert_eq!(echo["inputs"]["required"][0], "text");
    let uri = listed
        .iter()
        .find(|a| a["registry_id"] == "https://agents.example/uri-echo")
        .expect("the URI-named agent is listed under a token");
    let token = uri["id"].as_str().unwrap().to_string();
    assert!(
        token
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "{token}"
    );

    // Conditional GET.
    let resp = client
        .get(&url)
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 304);

    // A WoA client invokes as WoA says: base + invoke_path, envelope body.
    let a = invoke(
        &s,
        Some(ALICE),
        &token,
        json!({"agent": token, "input": {"via": "token"}}),
        &[],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json(), json!({"echo": {"via": "token"}}));

    // A change shows up with a new validator.
    register(
        &s,
        agent("later", format!("{}/echo", agents.base), json!({})),
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let resp = client
            .get(&url)
            .header("if-none-match", &etag)
            .send()
            .await
            .unwrap();
        if resp.status() == 200 {
            let doc: Value = resp.json().await.unwrap();
            assert!(doc["agents"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["id"] == "later"));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "woa.json never changed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    s.stop().await;
}

#[tokio::test]
async fn woa_hosts_and_agent_cards_are_imported_and_invoked() {
    let agents = Agents::start().await;
    let s = TestServer::start_with(local_agents).await;
    let http = Http::new(&s.http);
    let report = http
        .import_woa(ALICE, &agents.base)
        .await
        .expect("import succeeds");
    let doc_url = format!("{}/.well-known/woa.json", agents.base);
    assert_eq!(report["url"], doc_url);
    let outcomes: Vec<(String, String)> = report["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["id"].as_str().unwrap().into(),
                a["outcome"].as_str().unwrap().into(),
            )
        })
        .collect();
    let summarizer = format!("{doc_url}#summarizer");
    assert!(
        outcomes.contains(&(summarizer.clone(), "created".into())),
        "{report}"
    );
    assert_eq!(report["skipped"][0]["agent_id"], "pigeon_only", "{report}");
    assert!(
        report["unsupported_transports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|u| u["transport"] == "com.example.carrier-pigeon"),
        "{report}"
    );

    // The imported agent is invoked through its WoA transport.
    let a = invoke(
        &s,
        Some(ALICE),
        &summarizer,
        json!({"text": "The IETF"}),
        &[],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json(), json!({"summary": "summary of The IETF"}));
    assert_eq!(a.header("x-agentry-output-check"), "valid");
    assert_eq!(
        *agents.seen.last_envelope.lock().unwrap(),
        json!({"agent": "summarizer", "operation": "default", "input": {"text": "The IETF"}})
    );
    // Its schema is enforced before the host is contacted.
    let before = agents.calls();
    let a = invoke(
        &s,
        Some(ALICE),
        &summarizer,
        json!({"text": "x", "max_words": 2}),
        &[],
    )
    .await;
    assert_eq!(
        (a.status, a.json()["field"].as_str()),
        (400, Some("/max_words")),
        "{}",
        a.text
    );
    assert_eq!(agents.calls(), before);
    // The host's problem+json passes through.
    let a = invoke(
        &s,
        Some(ALICE),
        &format!("{doc_url}#refuser"),
        json!({}),
        &[],
    )
    .await;
    assert_eq!(a.status, 409);
    assert_eq!(a.json()["detail"], "this agent refuses everything");

    // Imported again: unchanged. Then the host drops the refuser.
    let again = http.import_woa(ALICE, &doc_url).await.unwrap();
    assert!(
        again["agents"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["outcome"] == "unchanged"),
        "{again}"
    );
    agents.seen.woa.lock().unwrap()["agents"]
        .as_array_mut()
        .unwrap()
        .retain(|a| a["id"] != "refuser");
    let third = http.import_woa(ALICE, &doc_url).await.unwrap();
    assert!(
        third["agents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["outcome"] == "removed"),
        "{third}"
    );
    let gone = http
        .call(
            reqwest::Method::GET,
            &format!("/agents/{}", Http::url_id(&format!("{doc_url}#refuser"))),
            Some(ALICE),
            None,
        )
        .await;
    assert_eq!(gone.unwrap_err().http, 410);

    // An A2A Agent Card, mapped as ADP's table says.
    let (_, card) = http
        .call(
            reqwest::Method::POST,
            "/import/a2a",
            Some(ALICE),
            Some(json!({"url": agents.base})),
        )
        .await
        .expect("card imports");
    let id = card["agents"][0]["id"].as_str().unwrap().to_string();
    let rec = http.record(&id, ALICE).await;
    assert_eq!(rec["name"], "Currency Agent");
    assert_eq!(rec["publisher"], "Example Finance");
    let tags: Vec<&str> = rec["tags"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        tags.contains(&"currency") && tags.contains(&"convert_currency"),
        "{rec}"
    );
    assert!(rec["examples"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["text"] == "How much is 100 USD in EUR?"));
    assert_eq!(rec["bindings"][0]["protocol"], "a2a");
    assert_eq!(rec["authentication"]["type"], "oauth2_bearer");
    assert_eq!(rec["source"]["format"], "a2a");

    // Importing needs a publisher; unknown formats and bad URLs are 400.
    let e = http
        .import_woa(CAROL_READER, &agents.base)
        .await
        .unwrap_err();
    assert_eq!(e.http, 403);
    let e = http
        .call(
            reqwest::Method::POST,
            "/import/rss",
            Some(ADMIN),
            Some(json!({"url": agents.base})),
        )
        .await
        .unwrap_err();
    assert_eq!((e.http, e.field.as_deref()), (400, Some("/format")));
    let e = http.import_woa(ADMIN, "nope").await.unwrap_err();
    assert_eq!((e.http, e.field.as_deref()), (400, Some("/url")));
    s.stop().await;
}

#[tokio::test]
async fn configured_woa_hosts_are_crawled_with_conditional_gets() {
    let agents = Agents::start().await;
    let base = agents.base.clone();
    let s = TestServer::start_with(move |c| {
        local_agents(c);
        c.gateway.woa_sources = vec![agentry::config::WoaSourceConfig {
            url: base,
            interval_secs: 1,
            owner: "crawler".into(),
            format: Default::default(),
        }];
    })
    .await;
    let http = Http::new(&s.http);
    let doc_url = format!("{}/.well-known/woa.json", agents.base);
    let wait_for = |id: String| {
        let http = &http;
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(15);
            loop {
                let path = format!("/agents/{}", Http::url_id(&id));
                if let Ok((_, rec)) = http
                    .call(reqwest::Method::GET, &path, Some(ALICE), None)
                    .await
                {
                    return rec;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{id} was never crawled"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let rec = wait_for(format!("{doc_url}#summarizer")).await;
    assert_eq!(rec["registry"]["owner"], "crawler");
    assert_eq!(rec["source"]["url"], doc_url);
    // Unchanged documents are revalidated, not re-read.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while agents.seen.woa_not_modified.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no conditional GET was answered 304"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A change at the host reaches the registry on a later crawl.
    agents.seen.woa.lock().unwrap()["agents"][1]["id"] = json!("refuser2");
    wait_for(format!("{doc_url}#refuser2")).await;
    s.stop().await;
}
