//! The Agent Protocol surface: a real AP agent (served by the test)
//! imported from its `describe` URL and proxied route by route, and plain
//! REST agents run as AP agents by the gateway (RunStarted … TextOutput …
//! RunCompleted, WaitForInput → ResumeWithInput, CancelRequest).

use std::time::Duration;

use agentry::pb::{self, agent_protocol_client::AgentProtocolClient};
use futures::StreamExt;
use serde_json::{json, Value};

use super::agents::Agents;
use super::ap_agent::ApAgent;
use super::harness::{Http, TestServer, ALICE, BOB};

/// Loopback agents, with time for the slow one to be cancelled.
fn local_agents(c: &mut agentry::config::Config) {
    super::invocation::local_agents(c);
    c.gateway.outbound.timeout_ms = 3_000;
}

/// A client of the registry's AP routes for one agent.
pub(super) struct Ap<'a> {
    s: &'a TestServer,
    path: String,
    key: &'a str,
}

impl<'a> Ap<'a> {
    pub(super) fn new(s: &'a TestServer, id: &str, key: &'a str) -> Self {
        Self {
            s,
            path: format!("/agents/{}", Http::url_id(id)),
            key,
        }
    }

    pub(super) async fn get(&self, route: &str) -> (u16, Value) {
        let resp = reqwest::Client::new()
            .get(format!("{}{}/{route}", self.s.http, self.path))
            .bearer_auth(self.key)
            .send()
            .await
            .unwrap();
        (
            resp.status().as_u16(),
            resp.json().await.unwrap_or(Value::Null),
        )
    }

    pub(super) async fn run(&self, request: Value) -> (u16, Value) {
        let resp = reqwest::Client::new()
            .post(format!("{}{}/run?wait=true", self.s.http, self.path))
            .bearer_auth(self.key)
            .json(&request)
            .send()
            .await
            .unwrap();
        (
            resp.status().as_u16(),
            resp.json().await.unwrap_or(Value::Null),
        )
    }

    /// Polls get_events until RunCompleted; returns all the run's events.
    pub(super) async fn until_completed(&self, run_id: &str) -> Vec<Value> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (status, events) = self.get(&format!("get_events/{run_id}")).await;
            assert_eq!(status, 200, "{events}");
            let events = events.as_array().unwrap().clone();
            if events.last().is_some_and(|e| e["type"] == "RunCompleted") {
                return events;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "run {run_id} never completed: {events:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Opens an SSE stream (GET when `body` is None) and reads events until
    /// one of type `stop`.
    pub(super) async fn stream(&self, route: &str, body: Option<Value>, stop: &str) -> Vec<Value> {
        let client = reqwest::Client::new();
        let url = format!("{}{}/{route}", self.s.http, self.path);
        let req = match body {
            Some(b) => client.post(url).json(&b),
            None => client.get(url),
        };
        let mut resp = req.bearer_auth(self.key).send().await.unwrap();
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        let (mut buf, mut out) = (String::new(), Vec::new());
        while let Some(chunk) = resp.chunk().await.unwrap() {
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let frame: String = buf.drain(..end + 2).collect();
                let data: Vec<&str> = frame
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect();
                if data.is_empty() {
                    continue;
                }
                let event: Value = serde_json::from_str(&data.join("\n")).unwrap();
                let done = event["type"] == stop;
                out.push(event);
                if done {
                    return out;
                }
            }
        }
        out
    }
}

fn types(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?"))
        .collect()
}

#[tokio::test]
async fn ap_agents_are_imported_from_describe_and_proxied() {
    let agent = ApAgent::start().await;
    let s = TestServer::start_with(local_agents).await;
    let (_, report) = Http::new(&s.http)
        .call(
            reqwest::Method::POST,
            "/import/agent-protocol",
            Some(ALICE),
            Some(json!({"url": format!("{}/describe", agent.base)})),
        )
        .await
        .expect("the AP agent imports");
    let id = report["agents"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(id, agent.base);
    let ap = Ap::new(&s, &id, ALICE);

    let (status, desc) = ap.get("describe").await;
    assert_eq!(
        (status, desc["name"].as_str()),
        (200, Some("researcher")),
        "{desc}"
    );
    assert_eq!(desc["operations"][0]["name"], "chat");

    // run (wait) → RunStarted; get_events polled to RunCompleted.
    let (status, started) = ap
        .run(json!({"type": "ChatRequest", "input": "rust"}))
        .await;
    assert_eq!(
        (status, started["type"].as_str()),
        (200, Some("RunStarted")),
        "{started}"
    );
    let run_id = started["run_id"].as_str().unwrap().to_string();
    let events = ap.until_completed(&run_id).await;
    assert_eq!(
        types(&events),
        [
            "RunStarted",
            "TextOutput",
            "ToolCall",
            "ToolResult",
            "TextOutput",
            "RunCompleted"
        ]
    );
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["id"], i);
        assert_eq!(e["run_id"], run_id.as_str());
        assert_eq!(e["thread_id"], started["thread_id"]);
    }
    assert_eq!(events[5]["finish_reason"], "success");
    let (_, later) = ap.get(&format!("get_events/{run_id}?since=3")).await;
    assert_eq!(
        types(later.as_array().unwrap()),
        ["TextOutput", "RunCompleted"]
    );
    let (_, run) = ap.get(&format!("runs/{run_id}")).await;
    assert_eq!(run["status"], "completed", "{run}");
    let (_, threads) = ap.get("threads").await;
    assert!(threads.to_string().contains(&run_id), "{threads}");

    // stream_request over SSE.
    let events = ap
        .stream(
            "stream_request",
            Some(json!({"type": "ChatRequest", "input": "sse"})),
            "RunCompleted",
        )
        .await;
    assert_eq!(types(&events).first(), Some(&"RunStarted"));
    assert_eq!(types(&events).last(), Some(&"RunCompleted"));

    // Human in the loop: WaitForInput, then ResumeWithInput.
    let (_, started) = ap
        .run(json!({"type": "ChatRequest", "input": "ask me"}))
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_string();
    let events = ap
        .stream(
            &format!("get_events/{run_id}?stream=true"),
            None,
            "WaitForInput",
        )
        .await;
    assert_eq!(
        events.last().unwrap()["request_keys"]["topic"],
        "Which topic should I research?"
    );
    let (status, _) = ap
        .run(json!({"type": "ResumeWithInput", "run_id": run_id, "request_keys": {"topic": "ferris"}}))
        .await;
    assert_eq!(status, 200);
    let events = ap.until_completed(&run_id).await;
    assert!(
        events
            .iter()
            .any(|e| e["content"].as_str().is_some_and(|c| c.contains("ferris"))),
        "{events:?}"
    );

    // Cancel.
    let (_, started) = ap
        .run(json!({"type": "ChatRequest", "input": "forever"}))
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_string();
    let (status, done) = ap
        .run(json!({"type": "CancelRequest", "run_id": run_id}))
        .await;
    assert_eq!(
        (status, done["type"].as_str()),
        (200, Some("RunCompleted")),
        "{done}"
    );
    assert_eq!(done["finish_reason"], "canceled");
    assert!(agent.state.was_cancelled(&run_id));

    // The same agent through the AIDIP gateway: one answer.
    let resp = reqwest::Client::new()
        .post(format!("{}/agents/{}/invoke", s.http, Http::url_id(&id)))
        .bearer_auth(ALICE)
        .json(&json!({"input": "gateways"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let out: Value = resp.json().await.unwrap();
    assert_eq!(out["output"], "Found 3 sources about gateways.", "{out}");
    assert_eq!(out["finish_reason"], "success");
    s.stop().await;
}

#[tokio::test]
async fn every_agent_runs_through_the_ap_surface() {
    let agents = Agents::start().await;
    let s = TestServer::start_with(local_agents).await;
    let http = Http::new(&s.http);
    let translate = json!({
        "id": "echo", "name": "Echo translator", "description": "Echoes what it should translate.",
        "bindings": [{"protocol": "http", "endpoint": format!("{}/echo", agents.base)}],
        "operations": [{"name": "translate", "description": "Translate a text.",
            "inputs": {"type": "object", "properties": {
                "text": {"type": "string"},
                "target_language": {"type": "string", "description": "Which language?"}},
                "required": ["text", "target_language"]}}]
    });
    http.call(
        reqwest::Method::POST,
        "/agents",
        Some(ALICE),
        Some(translate),
    )
    .await
    .unwrap();
    let slow = json!({"id": "slow", "name": "Slow", "description": "Takes its time.",
        "bindings": [{"protocol": "http", "endpoint": format!("{}/slow", agents.base)}]});
    http.call(reqwest::Method::POST, "/agents", Some(ALICE), Some(slow))
        .await
        .unwrap();

    let (_, list) = http
        .call(reqwest::Method::GET, "/ap", Some(ALICE), None)
        .await
        .unwrap();
    assert!(
        list.as_array()
            .unwrap()
            .contains(&json!(["Echo translator", "/agents/echo"])),
        "{list}"
    );

    let ap = Ap::new(&s, "echo", ALICE);
    let (_, desc) = ap.get("describe").await;
    assert_eq!(desc["purpose"], "Echoes what it should translate.");
    assert_eq!(
        desc["operations"][0]["input_schema"]["required"][1],
        "target_language"
    );

    let (status, started) = ap
        .run(json!({"input": r#"{"text": "hi", "target_language": "fr"}"#}))
        .await;
    assert_eq!(
        (status, started["type"].as_str()),
        (200, Some("RunStarted")),
        "{started}"
    );
    let run_id = started["run_id"].as_str().unwrap().to_string();
    let events = ap.until_completed(&run_id).await;
    assert_eq!(types(&events), ["RunStarted", "TextOutput", "RunCompleted"]);
    let output: Value = serde_json::from_str(events[1]["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        output,
        json!({"echo": {"text": "hi", "target_language": "fr"}})
    );
    assert_eq!(events[2]["finish_reason"], "success");
    assert_eq!(events[0]["agent"], "Echo translator");

    // Missing required input: asked for, then supplied.
    let (_, started) = ap.run(json!({"input": {"text": "hi"}})).await;
    let run_id = started["run_id"].as_str().unwrap().to_string();
    let events = ap
        .stream(
            &format!("get_events/{run_id}?stream=true"),
            None,
            "WaitForInput",
        )
        .await;
    assert_eq!(
        events.last().unwrap()["request_keys"],
        json!({"target_language": "Which language?"})
    );
    let (_, run) = ap.get(&format!("runs/{run_id}")).await;
    assert_eq!(run["status"], "waiting");
    let (status, _) = ap
        .run(json!({"type": "ResumeWithInput", "run_id": run_id, "request_keys": {"target_language": "de"}}))
        .await;
    assert_eq!(status, 200);
    let events = ap.until_completed(&run_id).await;
    assert_eq!(
        types(&events),
        ["RunStarted", "WaitForInput", "TextOutput", "RunCompleted"]
    );
    assert!(
        events[2]["content"].as_str().unwrap().contains("\"de\""),
        "{events:?}"
    );
    // Continue the thread.
    let (_, next) = ap
        .run(json!({"input": {"text": "again", "target_language": "it"}, "thread_id": started["thread_id"]}))
        .await;
    assert_eq!(next["thread_id"], started["thread_id"]);

    // stream_request.
    let events = ap
        .stream(
            "stream_request",
            Some(json!({"input": {"text": "s", "target_language": "es"}})),
            "RunCompleted",
        )
        .await;
    assert_eq!(types(&events), ["RunStarted", "TextOutput", "RunCompleted"]);

    // Cancel a slow call.
    let slow = Ap::new(&s, "slow", ALICE);
    let (_, started) = slow.run(json!({"input": "anything"})).await;
    let run_id = started["run_id"].as_str().unwrap().to_string();
    let (status, done) = slow
        .run(json!({"type": "CancelRequest", "run_id": run_id}))
        .await;
    assert_eq!(
        (status, done["finish_reason"].as_str()),
        (200, Some("canceled")),
        "{done}"
    );
    let (_, run) = slow.get(&format!("runs/{run_id}")).await;
    assert_eq!(
        (run["status"].as_str(), run["finish_reason"].as_str()),
        (Some("completed"), Some("canceled"))
    );
    let (status, _) = slow
        .run(json!({"type": "CancelRequest", "run_id": run_id}))
        .await;
    assert_eq!(status, 409, "a completed run cannot be cancelled again");

    // Runs belong to whoever started them.
    let (status, _) = Ap::new(&s, "slow", BOB)
        .get(&format!("runs/{run_id}"))
        .await;
    assert_eq!(status, 404);
    let (status, body) = ap.run(json!({"type": "Dance"})).await;
    assert_eq!((status, body["field"].as_str()), (400, Some("/type")));

    // gRPC streams the same run.
    let mut grpc = AgentProtocolClient::connect(s.grpc.clone()).await.unwrap();
    let mut req = tonic::Request::new(pb::ApRunRequest {
        agent_id: "echo".into(),
        request: json!({"input": {"text": "g", "target_language": "nl"}}).to_string(),
        ..Default::default()
    });
    req.metadata_mut()
        .insert("authorization", format!("Bearer {ALICE}").parse().unwrap());
    let kinds: Vec<String> = grpc
        .stream_request(req)
        .await
        .unwrap()
        .into_inner()
        .map(|e| e.unwrap().r#type)
        .collect()
        .await;
    assert_eq!(kinds, ["RunStarted", "TextOutput", "RunCompleted"]);
    s.stop().await;
}

/// Registers Alice's `echo` agent, whose one operation requires `text`:
/// a ChatRequest without it waits for input.
async fn register_echo(s: &TestServer, agents: &Agents) {
    let echo = json!({
        "id": "echo", "name": "Echo", "description": "Echoes its input.",
        "bindings": [{"protocol": "http", "endpoint": format!("{}/echo", agents.base)}],
        "operations": [{"name": "echo", "description": "Echo a text.",
            "inputs": {"type": "object", "properties": {"text": {"type": "string"}},
                "required": ["text"]}}]
    });
    Http::new(&s.http)
        .call(reqwest::Method::POST, "/agents", Some(ALICE), Some(echo))
        .await
        .unwrap();
}

/// A run that asks for input nobody sends ends by itself: its stream
/// closes with an error instead of holding the connection and the run's
/// memory for ever.
#[tokio::test]
async fn a_run_nobody_answers_ends_with_an_error() {
    let agents = Agents::start().await;
    let s = TestServer::start_with(|c| {
        local_agents(c);
        c.gateway.run_input_wait_secs = 1;
    })
    .await;
    register_echo(&s, &agents).await;
    let ap = Ap::new(&s, "echo", ALICE);
    let asked = std::time::Instant::now();
    let events = ap
        .stream("stream_request", Some(json!({"input": {}})), "RunCompleted")
        .await;
    assert_eq!(
        types(&events),
        ["RunStarted", "WaitForInput", "RunCompleted"],
        "{events:?}"
    );
    assert!(asked.elapsed() >= Duration::from_secs(1));
    let done = &events[2];
    assert_eq!(done["finish_reason"], "error");
    assert_eq!(
        done["error"]["message"],
        "no input arrived within 1 s; the run has ended"
    );
    let run_id = done["run_id"].as_str().unwrap();
    let (status, _) = ap
        .run(json!({"type": "ResumeWithInput", "run_id": run_id, "request_keys": {"text": "late"}}))
        .await;
    assert_eq!(status, 409, "an ended run takes no more input");
    let (_, run) = ap.get(&format!("runs/{run_id}")).await;
    assert_eq!(
        (run["status"].as_str(), run["finish_reason"].as_str()),
        (Some("completed"), Some("error"))
    );
    s.stop().await;
}

/// Anonymous callers are held to their allowance of open runs (1,000 on a
/// node) by address, as rate limits count them: one client that starts
/// runs and leaves them waiting is refused its next, over HTTP and gRPC
/// alike, while a client at another address still starts its own.
#[tokio::test]
async fn anonymous_callers_hold_open_runs_by_address() {
    let agents = Agents::start().await;
    let s = TestServer::start_with(|c| {
        local_agents(c);
        c.gateway.anonymous_invoke = true;
        c.rate_limits.enabled = false;
    })
    .await;
    register_echo(&s, &agents).await;
    let from = |ip: &str| {
        reqwest::Client::builder()
            .local_address(ip.parse::<std::net::IpAddr>().unwrap())
            .build()
            .unwrap()
    };
    let (one, other) = (from("127.0.0.1"), from("127.0.0.2"));
    let url = format!("{}/agents/echo/run?wait=true", s.http);
    // Each run asks for `text` and waits for it.
    let start = |client: &reqwest::Client| {
        let req = client.post(&url).json(&json!({"input": {}}));
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let started: Vec<(u16, Value)> = futures::stream::iter(0..1000)
        .map(|_| start(&one))
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(
        started.iter().all(|(status, _)| *status == 200),
        "{:?}",
        started.iter().find(|(status, _)| *status != 200)
    );
    let (status, refused) = start(&one).await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (429, Some("rate_limited")),
        "{refused}"
    );
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("runs are still open"),
        "{refused}"
    );
    let mut grpc = AgentProtocolClient::connect(s.grpc.clone()).await.unwrap();
    let refused = grpc
        .run(pb::ApRunRequest {
            agent_id: "echo".into(),
            request: json!({"input": {}}).to_string(),
            wait: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    let (status, started) = start(&other).await;
    assert_eq!(
        (status, started["type"].as_str()),
        (200, Some("RunStarted")),
        "{started}"
    );
    s.stop().await;
}

/// Every Agent Protocol route refuses a query parameter it does not take,
/// as the registry's other routes do, instead of ignoring it: a client
/// sending `stream_request?wait=true` is told, not left to think it waited.
#[tokio::test]
async fn ap_routes_refuse_query_parameters_they_do_not_take() {
    use super::harness::*;
    use reqwest::Method;
    let s = TestServer::start().await;
    let h = Http::new(&s.http);
    h.register(Some(ALICE), minimal("ap-params")).await.unwrap();
    let get = Method::GET;
    for (method, path, body) in [
        (get.clone(), "/ap?page=2", None),
        (get.clone(), "/agents/ap-params/describe?x=1", None),
        (get.clone(), "/agents/ap-params/threads?x=1", None),
        (get.clone(), "/agents/ap-params/runs/r-1?x=1", None),
        (
            Method::POST,
            "/agents/ap-params/stream_request?wait=true",
            Some(json!({"input": "hi"})),
        ),
    ] {
        let (status, _, v) = h.send(method, path, Some(ALICE), body, &[]).await;
        assert_eq!(status, 400, "{path}: {v}");
        assert!(
            v["message"]
                .as_str()
                .unwrap_or_default()
                .contains("unknown query parameter"),
            "{path}: {v}"
        );
    }
    s.stop().await;
}
