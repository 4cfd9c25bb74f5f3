//! Every route the facade documents, given hostile input: the cases in
//! `bad_input.rs` are chosen one by one; this sweep walks the served
//! OpenAPI document (which a unit test holds equal to the router), so a
//! route added later is swept without anyone listing it here.

use reqwest::Method;
use serde_json::{json, Map, Value};

use crate::harness::*;

/// Path parameter values no route should take for a real one: a NUL, a
/// dot-dot walk, a sign, an emoji, a number too large for any integer
/// field.
const PATH_VALUES: &[&str] = &[
    "%00",
    "..%2F..%2Fetc%2Fpasswd",
    "-1",
    "%F0%9F%98%80",
    "99999999999999999999999999",
];

/// Query parameter values of the wrong kind for every documented type.
const QUERY_VALUES: &[&str] = &["-1", "%00", "99999999999999999999999999", "%5B%5D"];

/// Bodies no operation accepts, sent to every route that takes one.
fn bodies() -> Vec<(&'static str, String)> {
    vec![
        ("truncated JSON", "{\"id\": \"x\", \"name\": ".into()),
        ("a lone surrogate", "{\"id\": \"\\ud800\"}".into()),
        (
            "nesting beyond any parser's depth",
            format!("{}{}", "[".repeat(4096), "]".repeat(4096)),
        ),
        ("a number for the document", "42".into()),
        (
            "every common member mistyped",
            json!({
                "id": 7, "name": [], "query": {"text": 1}, "intent": [],
                "limit": -1, "top": "ten", "filters": "tags", "ttl_seconds": "soon",
                "status": 3, "members": "all", "jsonrpc": 2, "method": [],
                "input": null, "text": {}, "version": 1.5, "remotes": "x",
            })
            .to_string(),
        ),
    ]
}

/// An answer to hostile input: an error of the route's own JSON shape (or
/// a success that leaves stored data alone, checked afterwards), never a
/// server failure, a dropped connection or a silent hang.
async fn check(h: &Http, method: &Method, url: &str, body: Option<&str>, what: &str) {
    let mut req = h
        .client
        .request(method.clone(), url)
        .bearer_auth(ADMIN)
        .header("accept", "application/json, text/event-stream")
        .timeout(std::time::Duration::from_secs(10));
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => panic!("{what}: no answer ({e})"),
    };
    let status = resp.status().as_u16();
    let ctype = content_type(&resp);
    // A request hostile in ways the operation ignores may be a valid one;
    // on a streaming route it opens its stream, which is an answer.
    if status < 400 && ctype.starts_with("text/event-stream") {
        return;
    }
    let text = resp
        .text()
        .await
        .unwrap_or_else(|e| panic!("{what}: the answer's body broke off ({e})"));
    // 501 is MCP's own answer to an operation this registry declines.
    assert!(status < 500 || status == 501, "{what}: {status} {text}");
    if status >= 400 {
        assert!(
            ctype.contains("json"),
            "{what}: {status} as {ctype:?}: {text}"
        );
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{what}: error body is not JSON ({e}): {text}"));
        let said = ["message", "detail", "error"]
            .iter()
            .any(|k| v.get(k).is_some_and(|m| m != "" && !m.is_null()));
        assert!(said, "{what}: the error says nothing: {text}");
    }
}

/// Everything an operator would notice changed: the stored records (all
/// statuses, tombstones and expired ones), the members and the signing
/// keys.
async fn state(h: &Http) -> Value {
    let mut out = Map::new();
    for (name, path) in [
        (
            "agents",
            "/agents?status=active,deprecated,inactive,deleted&include_expired=true&page_size=1000",
        ),
        ("cluster", "/cluster"),
        ("keys", "/.well-known/agentry.json"),
    ] {
        let (_, _, mut v) = h.send(Method::GET, path, Some(ADMIN), None, &[]).await;
        if let Some(o) = v.as_object_mut() {
            // Indexes and replication figures move with every refused
            // write (rules are decided in apply); what is stored must not.
            o.remove("applied_revision");
            if name == "cluster" {
                let members: Vec<Value> = o["members"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|m| json!([m["id"], m["role"], m["raft_addr"]]))
                    .collect();
                v = Value::Array(members);
            }
        }
        out.insert(name.into(), v);
    }
    Value::Object(out)
}

#[tokio::test]
async fn every_documented_route_answers_hostile_input_and_keeps_stored_data() {
    let s = TestServer::start().await;
    let h = Http::new(&s.http);
    let real = "agent-12345";
    // Its endpoint is refused by the gateway's address guard, so nothing
    // the sweep sends leaves this machine.
    let mut agent = translator(real);
    agent["endpoint"] = json!("https://127.0.0.1:9/agents/translate");
    h.register(Some(ALICE), agent).await.unwrap();
    let (_, _, doc) = h.send(Method::GET, "/openapi.json", None, None, &[]).await;
    let before = state(&h).await;

    let mut sent = 0;
    let mut operations = 0;
    for (template, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let Ok(method) = Method::from_bytes(method.to_uppercase().as_bytes()) else {
                continue;
            };
            operations += 1;
            let has_path_params = template.contains('{');
            let queries: Vec<&str> = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .chain(item["parameters"].as_array().into_iter().flatten())
                .filter(|p| p["in"] == "query")
                .filter_map(|p| p["name"].as_str())
                .collect();
            let takes_body = !op["requestBody"].is_null()
                || [Method::POST, Method::PUT, Method::PATCH].contains(&method);
            // The real id where one is wanted, so that body and query
            // checks reach the operation itself, not only the lookup.
            let real_path = fill(template, |_| real);
            // Garbage in each path parameter (never the real id here: a
            // DELETE with it and nothing else wrong would be valid).
            if has_path_params {
                for value in PATH_VALUES {
                    let path = fill(template, |_| value);
                    let body = takes_body.then_some("{}");
                    let what = format!("{method} {path}");
                    check(&h, &method, &format!("{}{path}", s.http), body, &what).await;
                    sent += 1;
                }
            }
            // Each query parameter of the wrong kind, on the real path
            // (a well-formed body where one is needed, so the query is
            // what is wrong).
            for name in &queries {
                for value in QUERY_VALUES {
                    let path = format!("{real_path}?{name}={value}");
                    let what = format!("{method} {path}");
                    let body = takes_body.then_some("{\"not a member\": true}");
                    check(&h, &method, &format!("{}{path}", s.http), body, &what).await;
                    sent += 1;
                }
            }
            if takes_body {
                for (kind, body) in bodies() {
                    let what = format!("{method} {real_path} with {kind}");
                    check(
                        &h,
                        &method,
                        &format!("{}{real_path}", s.http),
                        Some(&body),
                        &what,
                    )
                    .await;
                    sent += 1;
                }
            }
        }
    }
    assert!(
        operations >= 50,
        "the document lists {operations} operations"
    );
    assert!(sent >= 400, "only {sent} requests were sent");
    assert_eq!(state(&h).await, before, "hostile input changed stored data");
    // The node still serves: a read and a write go through.
    assert_eq!(h.record(real, ALICE).await["id"], real);
    h.register(Some(ALICE), minimal("after-the-sweep"))
        .await
        .unwrap();
    s.stop().await;
}

/// The template with each `{param}` replaced by `value(param)`.
fn fill<'a>(template: &str, value: impl Fn(&str) -> &'a str) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').map_or(rest.len(), |c| open + c);
        out.push_str(value(&rest[open + 1..close]));
        rest = rest.get(close + 1..).unwrap_or("");
    }
    out.push_str(rest);
    out
}
