//! Bad input gets a clear error and loses nothing: each case asserts the HTTP
//! status, the ADP code, the offending field where there is one, and that
//! the stored records are exactly as before.

use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::*;

struct Case {
    name: &'static str,
    method: Method,
    path: String,
    key: Option<&'static str>,
    content_type: Option<&'static str>,
    body: Option<String>,
    status: u16,
    code: &'static str,
    field: Option<&'static str>,
}

fn case(
    name: &'static str,
    method: Method,
    path: &str,
    body: Option<Value>,
    status: u16,
    code: &'static str,
    field: Option<&'static str>,
) -> Case {
    Case {
        name,
        method,
        path: path.to_string(),
        key: Some(ALICE),
        content_type: body.as_ref().map(|_| "application/json"),
        body: body.map(|b| b.to_string()),
        status,
        code,
        field,
    }
}

fn with(mut m: Value, f: impl FnOnce(&mut Value)) -> Value {
    f(&mut m);
    m
}

/// Everything stored, tombstones and all statuses included.
async fn snapshot(h: &Http) -> Value {
    let url = format!(
        "{}/agents?status=active,deprecated,inactive,deleted&include_expired=true&page_size=1000",
        h.base
    );
    let mut v: Value = h
        .client
        .get(url)
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v.as_object_mut().unwrap().remove("applied_revision");
    v
}

/// Who is a member of the cluster, with what role and address. Refused
/// writes still take log entries (rules are decided in apply), so indexes
/// are left out.
async fn membership(h: &Http) -> Vec<(Value, Value, Value)> {
    let v: Value = h
        .client
        .get(format!("{}/cluster", h.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].clone(), m["role"].clone(), m["raft_addr"].clone()))
        .collect()
}

#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let s = TestServer::start_with(|c| c.max_record_bytes = 64 * 1024).await;
    let h = Http::new(&s.http);
    // A stored record to attempt stale, foreign and conflicting writes on.
    h.register(Some(ALICE), translator("agent-12345"))
        .await
        .unwrap();
    h.register(Some(ALICE), minimal("to-be-deleted"))
        .await
        .unwrap();
    h.delete(Some(ALICE), "to-be-deleted").await.unwrap();

    let t = translator("fresh-agent");
    let post = Method::POST;
    let mut cases = vec![
        case(
            "malformed JSON",
            post.clone(),
            "/agents",
            None,
            400,
            "invalid_request",
            None,
        ),
        case(
            "array instead of object",
            post.clone(),
            "/agents",
            Some(json!([])),
            400,
            "invalid_request",
            Some(""),
        ),
        case(
            "name of wrong type",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| m["name"] = json!(5))),
            400,
            "invalid_request",
            Some("/name"),
        ),
        case(
            "integer beyond 2^53, which a double would round",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| {
                m["x-limits"] = json!({"max": 9_007_199_254_740_993_u64});
            })),
            400,
            "invalid_request",
            Some("/x-limits/max"),
        ),
        case(
            "missing name",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| {
                m.as_object_mut().unwrap().remove("name");
            })),
            400,
            "invalid_request",
            Some("/name"),
        ),
        case(
            "missing description",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| {
                m.as_object_mut().unwrap().remove("description");
            })),
            400,
            "invalid_request",
            Some("/description"),
        ),
        case(
            "no binding and no endpoint",
            post.clone(),
            "/agents",
            Some(json!({"id": "x1", "name": "n", "description": "d"})),
            400,
            "invalid_request",
            Some("/bindings"),
        ),
        case(
            "id with a space",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| m["id"] = json!("bad id"))),
            400,
            "invalid_request",
            Some("/id"),
        ),
        case(
            "id with a control character",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| m["id"] = json!("bad\u{1}id"))),
            400,
            "invalid_request",
            Some("/id"),
        ),
        case(
            "id too long",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| m["id"] = json!("a".repeat(600)))),
            400,
            "invalid_request",
            Some("/id"),
        ),
        case(
            "id of wrong type",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| m["id"] = json!(12))),
            400,
            "invalid_request",
            Some("/id"),
        ),
        case(
            "endpoint not a URL",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| m["endpoint"] = json!("not a url"))),
            400,
            "invalid_request",
            Some("/endpoint"),
        ),
        case(
            "endpoint with a forbidden scheme",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| {
                m["endpoint"] = json!("file:///etc/passwd")
            })),
            400,
            "invalid_request",
            Some("/endpoint"),
        ),
        case(
            "binding endpoint missing",
            post.clone(),
            "/agents",
            Some(
                json!({"id": "x2", "name": "n", "description": "d", "bindings": [{"protocol": "https"}]}),
            ),
            400,
            "invalid_request",
            Some("/bindings/0/endpoint"),
        ),
        case(
            "invalid JSON Schema",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| {
                m["operations"][0]["inputs"] = json!({"type": "nonsense"})
            })),
            400,
            "invalid_request",
            Some("/operations/0/inputs"),
        ),
        case(
            "schema that is not an object",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| {
                m["operations"][0]["outputs"] = json!("string")
            })),
            400,
            "invalid_request",
            Some("/operations/0/outputs"),
        ),
        case(
            "example not matching its schema",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| {
                m["operations"][0]["examples"][0]["input"]["source_language"] = json!("fr")
            })),
            400,
            "invalid_request",
            Some("/operations/0/examples/0/input/source_language"),
        ),
        case(
            "example missing a required input",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| {
                m["operations"][0]["examples"][0]["input"]
                    .as_object_mut()
                    .unwrap()
                    .remove("text");
            })),
            400,
            "invalid_request",
            Some("/operations/0/examples/0/input"),
        ),
        case(
            "duplicate operation names",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| {
                let op = m["operations"][0].clone();
                m["operations"].as_array_mut().unwrap().push(op);
            })),
            400,
            "invalid_request",
            Some("/operations/1/name"),
        ),
        case(
            "tags not an array",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| m["tags"] = json!("nlp"))),
            400,
            "invalid_request",
            Some("/tags"),
        ),
        case(
            "blank tag",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| m["tags"] = json!(["ok", "  "]))),
            400,
            "invalid_request",
            Some("/tags/1"),
        ),
        case(
            "too many tags",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| {
                m["tags"] = json!((0..65).map(|i| format!("t{i}")).collect::<Vec<_>>())
            })),
            400,
            "invalid_request",
            Some("/tags"),
        ),
        case(
            "updated_at not RFC 3339",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| m["updated_at"] = json!("last tuesday"))),
            400,
            "invalid_request",
            Some("/updated_at"),
        ),
        case(
            "unknown status",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| m["status"] = json!("sleeping"))),
            400,
            "invalid_request",
            Some("/status"),
        ),
        case(
            "oversize record",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| {
                m["x-blob"] = json!("a".repeat(200 * 1024))
            })),
            413,
            "invalid_request",
            None,
        ),
        case(
            "record over the record limit but under the body limit",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| {
                m["x-blob"] = json!("a".repeat(70 * 1024))
            })),
            400,
            "invalid_request",
            None,
        ),
        case(
            "bad visibility",
            post.clone(),
            "/agents?visibility=secret",
            Some(t.clone()),
            400,
            "invalid_request",
            Some("/visibility"),
        ),
        case(
            "stale update",
            Method::PUT,
            "/agents/agent-12345",
            Some(with(translator("agent-12345"), |m| {
                m["updated_at"] = json!("2020-01-01T00:00:00Z")
            })),
            409,
            "stale_metadata",
            None,
        ),
        case(
            "stale version",
            Method::PUT,
            "/agents/agent-12345",
            Some(with(translator("agent-12345"), |m| {
                m["version"] = json!("1.0.0")
            })),
            409,
            "stale_metadata",
            None,
        ),
        case(
            "path and body ids differ",
            Method::PUT,
            "/agents/agent-12345",
            Some(translator("agent-99999")),
            400,
            "invalid_request",
            Some("/id"),
        ),
        // The gateway sends callers' credentials in this header: one no
        // call can carry, or one the call needs for itself, is refused
        // when written rather than at every call.
        case(
            "credential header that is not an HTTP header name",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| {
                m["authentication"] = json!({"type": "api_key", "header": "X API Key"});
            })),
            400,
            "invalid_request",
            Some("/authentication/header"),
        ),
        case(
            "credential header the gateway sets itself",
            Method::PUT,
            "/agents/agent-12345",
            Some(with(translator("agent-12345"), |m| {
                let auth = json!({"type": "api_key", "header": "Content-Type"});
                m["auth"] = auth.clone();
                m["authentication"] = auth;
            })),
            400,
            "invalid_request",
            Some("/authentication/header"),
        ),
        // Stored, a date in the future would make the owner's honest
        // refreshes stale until then.
        case(
            "updated_at far in the future",
            Method::PUT,
            "/agents/agent-12345",
            Some(with(translator("agent-12345"), |m| {
                m["updated_at"] = json!("2999-01-01T00:00:00Z");
            })),
            400,
            "invalid_request",
            Some("/updated_at"),
        ),
        case(
            "update of an unknown agent",
            Method::PUT,
            "/agents/nobody",
            Some(translator("nobody")),
            404,
            "not_found",
            None,
        ),
        case(
            "update of a deleted agent",
            Method::PUT,
            "/agents/to-be-deleted",
            Some(minimal("to-be-deleted")),
            410,
            "not_found",
            None,
        ),
        case(
            "incompatible bindings on register",
            post.clone(),
            "/agents",
            Some(with(translator("agent-12345"), |m| {
                m["endpoint"] = json!("https://elsewhere.example/x");
                m["updated_at"] = json!("2026-06-01T00:00:00Z");
            })),
            409,
            "conflict",
            None,
        ),
        case(
            "bad status value",
            post.clone(),
            "/agents/agent-12345/status",
            Some(json!({"status": "asleep"})),
            400,
            "invalid_request",
            Some("/status"),
        ),
        case(
            "status missing",
            post.clone(),
            "/agents/agent-12345/status",
            Some(json!({"reason": "x"})),
            400,
            "invalid_request",
            Some("/status"),
        ),
        case(
            "unknown list parameter",
            Method::GET,
            "/agents?tag=nlp",
            None,
            400,
            "invalid_request",
            None,
        ),
        case(
            "page size too large",
            Method::GET,
            "/agents?page_size=5000",
            None,
            400,
            "invalid_request",
            Some("/page_size"),
        ),
        case(
            "page size not a number",
            Method::GET,
            "/agents?page_size=ten",
            None,
            400,
            "invalid_request",
            Some("/page_size"),
        ),
        case(
            "forged page token",
            Method::GET,
            "/agents?page_token=zz",
            None,
            400,
            "invalid_request",
            Some("/page_token"),
        ),
        case(
            "bad consistency",
            Method::GET,
            "/agents/agent-12345?consistency=eventual",
            None,
            400,
            "invalid_request",
            Some("/consistency"),
        ),
        case(
            "search with an unsupported filter",
            post.clone(),
            "/agents/search",
            Some(json!({"filters": {"price": 3}})),
            400,
            "invalid_request",
            Some("/filters/price"),
        ),
        case(
            "search top out of range",
            post.clone(),
            "/agents/search",
            Some(json!({"top": 0})),
            400,
            "invalid_request",
            Some("/top"),
        ),
        case(
            "search filters of wrong type",
            post.clone(),
            "/agents/search",
            Some(json!({"filters": {"tags": 7}})),
            400,
            "invalid_request",
            Some("/filters/tags"),
        ),
        case(
            "search with a query of wrong type",
            post.clone(),
            "/agents/search",
            Some(json!({"query": ["weather"]})),
            400,
            "invalid_request",
            Some("/query"),
        ),
        case(
            "discover without a query",
            post.clone(),
            "/discover",
            Some(json!({"required_tags": ["hr"]})),
            400,
            "invalid_request",
            Some("/query"),
        ),
        case(
            "discover with an unknown member",
            post.clone(),
            "/discover",
            Some(json!({"query": "x", "required_capabilities": ["y"]})),
            400,
            "invalid_request",
            Some("/required_capabilities"),
        ),
        case(
            "discover limit out of range",
            post.clone(),
            "/discover",
            Some(json!({"query": "x", "limit": 5000})),
            400,
            "invalid_request",
            Some("/limit"),
        ),
        case(
            "discover with an unknown detail level",
            post.clone(),
            "/discover",
            Some(json!({"query": "x", "detail": "everything"})),
            400,
            "invalid_request",
            Some("/detail"),
        ),
        case(
            "discover tags of wrong type",
            post.clone(),
            "/discover",
            Some(json!({"query": "x", "required_tags": "hr"})),
            400,
            "invalid_request",
            Some("/required_tags"),
        ),
        case(
            "discover with a blank tag",
            post.clone(),
            "/discover",
            Some(json!({"query": "x", "preferred_tags": ["ok", " "]})),
            400,
            "invalid_request",
            Some("/preferred_tags/1"),
        ),
        case(
            "discover with a tag both required and excluded",
            post.clone(),
            "/discover",
            Some(json!({"query": "x", "required_tags": ["hr"], "excluded_tags": ["HR"]})),
            400,
            "invalid_request",
            Some("/excluded_tags"),
        ),
        case(
            "discover with a malformed age constraint",
            post.clone(),
            "/discover",
            Some(json!({"query": "x", "constraints": {"max_results_age_seconds": -5}})),
            400,
            "invalid_request",
            Some("/constraints/max_results_age_seconds"),
        ),
        case(
            "discover with an unknown status constraint",
            post.clone(),
            "/discover",
            Some(json!({"query": "x", "constraints": {"status": ["retired"]}})),
            400,
            "invalid_request",
            Some("/constraints/status/0"),
        ),
        case(
            "discover with a request that is not an object",
            post.clone(),
            "/discover",
            Some(json!(["query"])),
            400,
            "invalid_request",
            Some(""),
        ),
        case(
            "resolve without an intent",
            post.clone(),
            "/resolve",
            Some(json!({"policy": {"max_candidates": 2}})),
            400,
            "invalid_request",
            Some("/intent"),
        ),
        case(
            "resolve asking for too many candidates",
            post.clone(),
            "/resolve",
            Some(json!({"intent": "x", "policy": {"max_candidates": 500}})),
            400,
            "invalid_request",
            Some("/policy/max_candidates"),
        ),
        case(
            "resolve with an unknown status",
            post.clone(),
            "/resolve",
            Some(json!({"intent": "x", "policy": {"statuses": ["retired"]}})),
            400,
            "invalid_request",
            Some("/policy/statuses/0"),
        ),
        case(
            "resolve with a context domain of wrong type",
            post.clone(),
            "/resolve",
            Some(json!({"intent": "x", "context": {"domain": 3}})),
            400,
            "invalid_request",
            Some("/context/domain"),
        ),
        case(
            "unknown route",
            Method::GET,
            "/nope",
            None,
            404,
            "not_found",
            None,
        ),
        case(
            "wrong method on an agent",
            Method::PATCH,
            "/agents/agent-12345",
            Some(json!({})),
            405,
            "invalid_request",
            None,
        ),
        case(
            "wrong method on the collection",
            Method::DELETE,
            "/agents",
            None,
            405,
            "invalid_request",
            None,
        ),
        case(
            "get unknown agent",
            Method::GET,
            "/agents/no-such-agent",
            None,
            404,
            "not_found",
            None,
        ),
        case(
            "get deleted agent",
            Method::GET,
            "/agents/to-be-deleted",
            None,
            410,
            "not_found",
            None,
        ),
    ];
    let mut special = vec![
        Case {
            content_type: Some("text/plain"),
            ..case(
                "text/plain body",
                post.clone(),
                "/agents",
                Some(t.clone()),
                415,
                "invalid_request",
                None,
            )
        },
        Case {
            content_type: None,
            ..case(
                "no content type",
                post.clone(),
                "/agents",
                Some(t.clone()),
                415,
                "invalid_request",
                None,
            )
        },
        Case {
            key: None,
            ..case(
                "no API key",
                post.clone(),
                "/agents",
                Some(t.clone()),
                401,
                "unauthorized",
                None,
            )
        },
        Case {
            key: Some("not-a-key-0000000000"),
            ..case(
                "unknown API key",
                post.clone(),
                "/agents",
                Some(t.clone()),
                401,
                "unauthorized",
                None,
            )
        },
        Case {
            key: Some(CAROL_READER),
            ..case(
                "reader may not register",
                post.clone(),
                "/agents",
                Some(t.clone()),
                403,
                "forbidden",
                None,
            )
        },
        Case {
            key: Some(BOB),
            ..case(
                "another owner's update",
                Method::PUT,
                "/agents/agent-12345",
                Some(with(translator("agent-12345"), |m| {
                    m["updated_at"] = json!("2026-06-01T00:00:00Z")
                })),
                403,
                "forbidden",
                None,
            )
        },
        Case {
            key: Some(BOB),
            ..case(
                "another owner's registration",
                post.clone(),
                "/agents",
                Some(with(translator("agent-12345"), |m| {
                    m["updated_at"] = json!("2026-06-01T00:00:00Z")
                })),
                409,
                "conflict",
                None,
            )
        },
        Case {
            key: Some(BOB),
            ..case(
                "another owner's delete",
                Method::DELETE,
                "/agents/agent-12345",
                None,
                403,
                "forbidden",
                None,
            )
        },
        Case {
            key: Some(BOB),
            ..case(
                "another owner's status change",
                post.clone(),
                "/agents/agent-12345/status",
                Some(json!({"status": "inactive"})),
                403,
                "forbidden",
                None,
            )
        },
    ];
    cases.append(&mut special);
    cases.extend([
        case(
            "id '..' (a dot segment no URL keeps)",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| m["id"] = json!(".."))),
            400,
            "invalid_request",
            Some("/id"),
        ),
        case(
            "register an MCP server's record directly",
            post.clone(),
            "/agents",
            Some(with(t.clone(), |m| {
                m["id"] = json!("mcp:io.example/weather")
            })),
            400,
            "invalid_request",
            Some("/id"),
        ),
        case(
            "delete an MCP server's record directly",
            Method::DELETE,
            "/agents/mcp%3Aio.example%2Fweather",
            None,
            400,
            "invalid_request",
            Some("/id"),
        ),
        case(
            "set an MCP server's status directly",
            post.clone(),
            "/agents/mcp%3Aio.example%2Fweather/status",
            Some(json!({"status": "deleted"})),
            400,
            "invalid_request",
            Some("/id"),
        ),
        case(
            "a path parameter that is not UTF-8",
            Method::GET,
            "/agents/%FF",
            None,
            400,
            "invalid_request",
            None,
        ),
        case(
            "discovery limit 0",
            post.clone(),
            "/discover",
            Some(json!({"query": "translate", "limit": 0})),
            400,
            "invalid_request",
            Some("/limit"),
        ),
    ]);
    // Cluster administration: validated, refused, and membership unchanged.
    let admin = |name, method: Method, path: &str, body, status, code, field| Case {
        key: Some(ADMIN),
        ..case(name, method, path, body, status, code, field)
    };
    cases.extend([
        admin(
            "learner with a bad address",
            post.clone(),
            "/cluster/learners",
            Some(json!({"id": 2, "raft_addr": "nohost"})),
            400,
            "invalid_request",
            Some("/raft_addr"),
        ),
        admin(
            "learner with node id 0",
            post.clone(),
            "/cluster/learners",
            Some(json!({"id": 0, "raft_addr": "127.0.0.1:1"})),
            400,
            "invalid_request",
            Some("/id"),
        ),
        admin(
            "learner with an unknown member",
            post.clone(),
            "/cluster/learners",
            Some(json!({"id": 2, "raft_addr": "127.0.0.1:1", "voter": true})),
            400,
            "invalid_request",
            None,
        ),
        case(
            "learner added by a publisher",
            post.clone(),
            "/cluster/learners",
            Some(json!({"id": 2, "raft_addr": "127.0.0.1:1"})),
            403,
            "forbidden",
            None,
        ),
        admin(
            "leadership to a node that is no voter",
            post.clone(),
            "/cluster/transfer-leader",
            Some(json!({"id": 9})),
            409,
            "conflict",
            None,
        ),
        admin(
            "leadership to node id 0",
            post.clone(),
            "/cluster/transfer-leader",
            Some(json!({"id": 0})),
            400,
            "invalid_request",
            Some("/id"),
        ),
        admin(
            "leadership with an unknown member",
            post.clone(),
            "/cluster/transfer-leader",
            Some(json!({"node": 2})),
            400,
            "invalid_request",
            None,
        ),
        admin(
            "leadership moved from the only voter",
            post.clone(),
            "/cluster/transfer-leader",
            None,
            409,
            "conflict",
            None,
        ),
        case(
            "leadership moved by a publisher",
            post.clone(),
            "/cluster/transfer-leader",
            None,
            403,
            "forbidden",
            None,
        ),
        admin(
            "promote a node that is no learner",
            post.clone(),
            "/cluster/members/9/promote",
            None,
            409,
            "conflict",
            None,
        ),
        admin(
            "remove a node that is no member",
            Method::DELETE,
            "/cluster/members/9",
            None,
            409,
            "conflict",
            None,
        ),
        admin(
            "remove the last voter",
            Method::DELETE,
            "/cluster/members/1",
            None,
            409,
            "conflict",
            None,
        ),
        admin(
            "remove a node id that is no number",
            Method::DELETE,
            "/cluster/members/abc",
            None,
            400,
            "invalid_request",
            Some("/id"),
        ),
        admin(
            "initialise an initialised cluster",
            post.clone(),
            "/cluster/init",
            None,
            409,
            "conflict",
            None,
        ),
        admin(
            "initialise with a node listed twice",
            post.clone(),
            "/cluster/init",
            Some(json!({"members": [{"id": 1, "raft_addr": "127.0.0.1:1"}, {"id": 1, "raft_addr": "127.0.0.1:2"}]})),
            400,
            "invalid_request",
            Some("/members/1/id"),
        ),
    ]);
    cases[0].body = Some("{\"id\": \"x\", \"name\": ".into());
    cases[0].content_type = Some("application/json");
    cases.push(case(
        "a single-valued filter given twice",
        Method::GET,
        "/agents?publisher=alice&publisher=bob",
        None,
        400,
        "invalid_request",
        Some("/publisher"),
    ));
    // A member named twice means one thing to a parser that keeps the
    // first and another to one that keeps the last: refused, never guessed.
    // Each body is a record that would be stored with either reading.
    let named_twice = |record: Value, member: &str| {
        let text = record.to_string();
        format!("{}, \"{member}\": \"another\"}}", &text[..text.len() - 1])
    };
    for (name, method, path, body) in [
        (
            "an id named twice",
            post.clone(),
            "/agents",
            named_twice(translator("fresh-agent"), "id"),
        ),
        (
            "a description named twice",
            Method::PUT,
            "/agents/agent-12345",
            named_twice(translator("agent-12345"), "description"),
        ),
    ] {
        let mut c = case(name, method, path, None, 400, "invalid_request", None);
        c.body = Some(body);
        c.content_type = Some("application/json");
        cases.push(c);
    }
    assert!(cases.len() >= 30, "the issue asks for at least 30 cases");

    let before = snapshot(&h).await;
    let cluster_before = membership(&h).await;
    for c in &cases {
        let mut req = h
            .client
            .request(c.method.clone(), format!("{}{}", s.http, c.path));
        if let Some(k) = c.key {
            req = req.bearer_auth(k);
        }
        if let Some(ct) = c.content_type {
            req = req.header("content-type", ct);
        }
        if let Some(b) = &c.body {
            req = req.body(b.clone());
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let ctype = content_type(&resp);
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        assert_eq!(status, c.status, "{}: {body}", c.name);
        assert_eq!(ctype, "application/problem+json", "{}", c.name);
        assert_eq!(body["code"], c.code, "{}: {body}", c.name);
        assert_eq!(body["error"]["code"], c.code, "{}", c.name);
        assert_eq!(body["status"], c.status, "{}", c.name);
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{}: a message",
            c.name
        );
        assert!(
            body["correlation_id"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{}: a correlation id",
            c.name
        );
        assert_eq!(
            body["instance"],
            c.path.split('?').next().unwrap(),
            "{}",
            c.name
        );
        if let Some(f) = c.field {
            assert_eq!(body["field"], f, "{}: {body}", c.name);
        }
        assert_eq!(snapshot(&h).await, before, "{} changed stored data", c.name);
    }
    let cluster_after = membership(&h).await;
    assert_eq!(cluster_after, cluster_before, "membership unchanged");
    // A repeated init says so in the operator's terms, not openraft's.
    let (_, _, again) = h
        .send(post.clone(), "/cluster/init", Some(ADMIN), None, &[])
        .await;
    let said = again["message"].as_str().unwrap_or_default();
    assert!(
        said.starts_with("this node is already part of a cluster (term ")
            && !said.contains("LogId"),
        "{said}"
    );
    s.stop().await;
}

/// HTTP's own edges: HEAD, a body that cannot be read, the scheme's case,
/// a private record's existence, conditional GETs after a deletion, and a
/// JSON-RPC body that is not JSON.
#[tokio::test]
async fn http_edges_answer_as_the_standards_say() {
    let s = TestServer::start().await;
    let h = Http::new(&s.http);
    h.register(Some(ALICE), translator("agent-12345"))
        .await
        .unwrap();

    // HEAD is GET without the body, through the same gate.
    for path in [
        "/healthz",
        "/agents",
        "/agents/agent-12345",
        "/v0.1/servers",
    ] {
        let r = h
            .client
            .head(format!("{}{path}", s.http))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "HEAD {path}");
    }

    // A chunked body cut short by a bad chunk size cannot be read: 400,
    // not "too large".
    let addr = s.http.trim_start_matches("http://").to_string();
    let raw = format!(
        "POST /agents HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ALICE}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nZZ\r\n{{}}\r\n0\r\n\r\n"
    );
    let answer = raw_http(&addr, raw.as_bytes()).await;
    assert!(
        answer.starts_with("HTTP/1.1 400"),
        "malformed chunked body: {answer}"
    );
    assert!(answer.contains("application/problem+json"), "{answer}");

    // A JSON body that starts with a byte order mark (a file an editor on
    // Windows saved) is read without it, and stored without it.
    let bom = [
        &b"\xEF\xBB\xBF"[..],
        minimal("bom-agent").to_string().as_bytes(),
    ]
    .concat();
    let r = h
        .client
        .post(format!("{}/agents", s.http))
        .bearer_auth(ALICE)
        .header("content-type", "application/json")
        .body(bom)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().await.unwrap());
    let stored = h.record("bom-agent", ALICE).await;
    assert_eq!(stored["name"], "Minimal Agent", "{stored}");

    // The authorization scheme is case-insensitive.
    let (status, _, _) = h
        .send(
            Method::GET,
            "/agents/agent-12345",
            None,
            None,
            &[("authorization", &format!("BEARER {ALICE}"))],
        )
        .await;
    assert_eq!(status, 200);
    // Two authorization headers, the good one first, are refused: a proxy
    // that checked the other would otherwise let one caller act as another.
    let (status, _, body) = h
        .send(
            Method::GET,
            "/agents/agent-12345",
            Some(ALICE),
            None,
            &[("authorization", "Bearer not-a-key-0123456789")],
        )
        .await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "unauthorized", "{body}");

    // A private record is not found for a principal who may not read it,
    // on the write paths as on the reads; stored data stays as it was.
    let (status, _, _) = h
        .send(
            Method::POST,
            "/agents?visibility=private",
            Some(ALICE),
            Some(translator("secret-agent")),
            &[],
        )
        .await;
    assert_eq!(status, 201);
    let before = snapshot(&h).await;
    for (method, path, body) in [
        (Method::GET, "/agents/secret-agent", None),
        (
            Method::PUT,
            "/agents/secret-agent",
            Some(translator("secret-agent")),
        ),
        (Method::DELETE, "/agents/secret-agent", None),
        (
            Method::POST,
            "/agents/secret-agent/status",
            Some(json!({"status": "inactive"})),
        ),
        (Method::POST, "/agents/secret-agent/refresh", None),
    ] {
        let (status, _, body) = h.send(method.clone(), path, Some(BOB), body, &[]).await;
        assert_eq!(status, 404, "{method} {path}: {body}");
        assert_eq!(body["code"], "not_found", "{method} {path}");
    }
    assert_eq!(snapshot(&h).await, before, "refused writes changed nothing");

    // A conditional GET after a deletion sees the change, although the
    // remaining records are all older than the catalog's last date.
    h.register(Some(ALICE), translator("agent-2"))
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let catalog = "/.well-known/ai-catalog.json";
    let (status, headers, _) = h.send(Method::GET, catalog, None, None, &[]).await;
    assert_eq!(status, 200);
    let last_modified = headers["last-modified"].to_str().unwrap().to_string();
    h.delete(Some(ALICE), "agent-2").await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (status, headers, body) = h
        .send(
            Method::GET,
            catalog,
            None,
            None,
            &[("if-modified-since", &last_modified)],
        )
        .await;
    assert_eq!(status, 200, "the catalog changed since {last_modified}");
    assert!(!body.to_string().contains("agent-2"));
    let now_modified = headers["last-modified"].to_str().unwrap().to_string();
    let (status, _, _) = h
        .send(
            Method::GET,
            catalog,
            None,
            None,
            &[("if-modified-since", &now_modified)],
        )
        .await;
    assert_eq!(status, 304, "unchanged since {now_modified}");

    // A body that is not JSON gets JSON-RPC's parse error.
    let r = h
        .client
        .post(format!("{}/mcp", s.http))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body("{bad")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], -32700, "{v}");
    s.stop().await;
}

/// A member named twice in any JSON the registry reads is refused with the
/// name, in each route family's own error shape, and stores nothing: a
/// proxy that keeps the first of two and the registry that kept the last
/// would otherwise read one body as two different requests.
#[tokio::test]
async fn a_member_named_twice_is_refused_in_each_routes_shape() {
    let s = TestServer::start().await;
    let h = Http::new(&s.http);
    let post = |path: &str, key: Option<&str>, body: &'static str| {
        let mut req = h
            .client
            .post(format!("{}{path}", s.http))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let ctype = content_type(&r);
            (
                status,
                ctype,
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };

    // The registry's own routes: the problem body, naming the member.
    let (status, ctype, body) = post(
        "/agents",
        Some(ALICE),
        r#"{"id": "dup-first", "name": "n", "description": "d", "id": "dup-last"}"#,
    )
    .await;
    assert_eq!(
        (status, ctype.as_str()),
        (400, "application/problem+json"),
        "{body}"
    );
    assert_eq!(body["code"], "invalid_request", "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains(r#"duplicate member name "id""#),
        "{message}"
    );
    for id in ["dup-first", "dup-last"] {
        let (status, _, _) = h
            .send(
                Method::GET,
                &format!("/agents/{id}"),
                Some(ADMIN),
                None,
                &[],
            )
            .await;
        assert_eq!(status, 404, "{id} was not stored");
    }
    let (status, _, body) = post(
        "/discover",
        None,
        r#"{"query": "translate", "limit": 1, "limit": 50}"#,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("\"limit\""),
        "{body}"
    );

    // An invocation's input, read once for both encodings.
    h.register(Some(ALICE), translator("dup-invoked"))
        .await
        .unwrap();
    let (status, _, body) = post(
        "/agents/dup-invoked/invoke",
        Some(ALICE),
        r#"{"text": "hello", "text": "bye"}"#,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains(r#"duplicate member name "text""#),
        "{body}"
    );

    // The MCP Registry API's shape.
    let (status, _, body) = post(
        "/v0.1/publish",
        Some(ALICE),
        r#"{"name": "io.example/one", "version": "1.0.0", "name": "io.example/two"}"#,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("duplicate member name"),
        "{body}"
    );
    let (_, _, list) = h.send(Method::GET, "/v0.1/servers", None, None, &[]).await;
    assert_eq!(list["servers"], json!([]), "nothing published: {list}");

    // ARD's shape.
    let (status, _, body) = post(
        "/ard/search",
        None,
        r#"{"query": {"text": "a"}, "query": {"text": "b"}}"#,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["errorCode"], "INVALID_ARGUMENT", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("duplicate member name"),
        "{body}"
    );

    // MCP's JSON-RPC: a parse error, since the message cannot be read as
    // one request.
    let (status, _, body) = post(
        "/mcp",
        Some(ALICE),
        r#"{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "method": "tools/call"}"#,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], -32700, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("duplicate member name"),
        "{body}"
    );
    s.stop().await;
}

/// A request head that could be read two ways (two `Host`s, none, two
/// `Content-Type`s, a query parameter given twice) is refused with the
/// error body, and what it would have written is not stored.
#[tokio::test]
async fn a_request_head_read_two_ways_is_refused() {
    let s = TestServer::start().await;
    let addr = s.http.trim_start_matches("http://").to_string();
    let body = minimal("head-probe").to_string();
    let register = |head: String| {
        format!(
            "POST /agents HTTP/1.1\r\n{head}Authorization: Bearer {ALICE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let json = "Content-Type: application/json\r\n";
    for (head, says) in [
        (
            format!("Host: {addr}\r\nHost: evil.example.com\r\n{json}"),
            "send one Host header, not 2",
        ),
        (json.to_string(), "must name its host"),
        (format!("Host: a b\r\n{json}"), "is not a host name"),
        (
            format!("Host: {addr}\r\n{json}Content-Type: text/plain\r\n"),
            "send one Content-Type header, not 2",
        ),
    ] {
        let answer = raw_http(&addr, register(head.clone()).as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{head:?}: {answer}");
        assert!(
            answer.contains("application/problem+json"),
            "{head:?}: {answer}"
        );
        assert!(answer.contains(says), "{head:?}: {answer}");
    }
    // The same request with one of each is stored, so it was the head
    // that was refused.
    let h = Http::new(&s.http);
    let (status, _, _) = h
        .send(Method::GET, "/agents/head-probe", Some(ADMIN), None, &[])
        .await;
    assert_eq!(status, 404, "nothing stored from a refused head");
    let answer = raw_http(
        &addr,
        register(format!("Host: {addr}\r\n{json}")).as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");

    // A single-valued query parameter given twice, in the MCP Registry
    // API's own error shape.
    let (status, _, v) = h
        .send(
            Method::GET,
            "/v0.1/servers?limit=1&limit=100",
            None,
            None,
            &[],
        )
        .await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("'limit' may be given once"),
        "{v}"
    );
    // A repeatable one still adds its values.
    let (status, _, v) = h
        .send(
            Method::GET,
            "/agents?tags=a&tags=b&status=active&status=deprecated",
            None,
            None,
            &[],
        )
        .await;
    assert_eq!(status, 200, "{v}");

    // A body said to be gzip-coded twice is refused as that, not as an
    // unknown coding.
    let (status, _, v) = h
        .send(
            Method::POST,
            "/discover",
            None,
            None,
            &[
                ("content-type", "application/json"),
                ("content-encoding", "gzip, gzip"),
            ],
        )
        .await;
    assert_eq!(status, 415, "{v}");
    assert!(v["message"].as_str().unwrap().contains("not twice"), "{v}");
    s.stop().await;
}

/// Requests answered before they reach a route (a malformed head, a path
/// no route takes, a method its path does not take, an unknown gRPC
/// method) are counted in `agentry_requests_total`, under one route value
/// whatever was asked: an operator sees a client probing the listeners,
/// and the client cannot mint label values. The counters are the
/// process's (other tests' servers count too), so each is read as an
/// increase.
#[tokio::test]
async fn requests_answered_before_a_route_are_counted() {
    let s = TestServer::start().await;
    let addr = s.http.trim_start_matches("http://").to_string();
    let h = Http::new(&s.http);
    let counted = |page: &str, transport: &str, code: &str| -> f64 {
        let labels = format!("transport=\"{transport}\",route=\"(unrouted)\",code=\"{code}\"");
        page.lines()
            .find(|l| l.starts_with("agentry_requests_total{") && l.contains(&labels))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    };
    let page = || async {
        let r = h.client.get(format!("{}/metrics", h.base)).send().await;
        r.unwrap().text().await.unwrap()
    };
    let cases = [
        ("http", "400"),
        ("http", "404"),
        ("http", "405"),
        ("grpc", "Unimplemented"),
    ];
    let before = page().await;
    let answer = raw_http(
        &addr,
        format!(
            "GET /agents HTTP/1.1\r\nHost: {addr}\r\nHost: x.example\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let (status, _, _) = h
        .send(Method::GET, "/probe/wp-login.php", None, None, &[])
        .await;
    assert_eq!(status, 404);
    let (status, _, _) = h.send(Method::DELETE, "/healthz", None, None, &[]).await;
    assert_eq!(status, 405);
    let unknown = raw_call(&s.grpc, "/agentry.v1.Registry/Probe", b"a".to_vec()).await;
    assert_eq!(unknown.code(), tonic::Code::Unimplemented);
    let after = page().await;
    for (transport, code) in cases {
        assert!(
            counted(&after, transport, code) >= counted(&before, transport, code) + 1.0,
            "{transport} {code} counted:\n{after}"
        );
    }
    assert!(
        !after.contains("wp-login") && !after.contains("Registry/Probe"),
        "a path asked for never becomes a label"
    );
    s.stop().await;
}

/// Sends `request` as it is and reads the answer until the server closes.
async fn raw_http(addr: &str, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut answer),
    )
    .await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// A client that stops sending its body is answered 408 with the error body
/// once the request deadline passes, not told the server timed out (504).
#[tokio::test]
async fn a_stalled_body_gets_408() {
    let s = TestServer::start_with(|c| c.request_timeout_secs = 1).await;
    let addr = s.http.trim_start_matches("http://").to_string();
    let raw = format!(
        "POST /agents HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ALICE}\r\nContent-Type: application/json\r\nContent-Length: 500\r\nConnection: close\r\n\r\n{{\"id\": \"half"
    );
    let answer = raw_http(&addr, raw.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "stalled body: {answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert!(answer.contains("did not arrive"), "{answer}");
    let h = Http::new(&s.http);
    let (status, _, _) = h
        .send(Method::GET, "/agents/half", Some(ALICE), None, &[])
        .await;
    assert_eq!(status, 404, "nothing stored from the half body");
    // The refused write is in the audit trail with the answer's reason,
    // under the correlation id the caller was given.
    let (status, _, page) = h
        .send(
            Method::GET,
            "/audit?outcome=invalid_request",
            Some(ADMIN),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 200, "{page}");
    let entries = page["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{page}");
    assert_eq!(entries[0]["operation"], "POST /agents", "{page}");
    assert!(entries[0]["principal"].is_string(), "{page}");
    let message = entries[0]["message"].as_str().unwrap_or_default();
    assert!(message.contains("did not arrive within 1 s"), "{page}");
    let correlation = entries[0]["correlation_id"].as_str().unwrap_or_default();
    assert!(
        !correlation.is_empty() && answer.contains(correlation),
        "{page} / {answer}"
    );
}

/// A body declared longer than the limit is refused with 413 before any of
/// it arrives, not held until the body deadline and answered 408.
#[tokio::test]
async fn a_declared_oversized_body_gets_413_at_once() {
    let s = TestServer::start_with(|c| c.request_timeout_secs = 30).await;
    let addr = s.http.trim_start_matches("http://").to_string();
    let raw = format!(
        "POST /discover HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 99999999999\r\nConnection: close\r\n\r\n{{\"query\""
    );
    let answer = raw_http(&addr, raw.as_bytes()).await;
    assert!(
        answer.starts_with("HTTP/1.1 413"),
        "declared too large: {answer}"
    );
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert!(answer.contains("larger than the limit"), "{answer}");
    s.stop().await;
}

/// A gRPC request whose message never arrives is answered at the request
/// deadline with `DEADLINE_EXCEEDED` and the error detail, and the
/// connection goes on serving.
#[tokio::test]
async fn a_stalled_grpc_request_gets_deadline_exceeded() {
    use agentry::pb;
    let s = TestServer::start_with(|c| c.request_timeout_secs = 1).await;
    let channel = tonic::transport::Channel::from_shared(s.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut raw = tonic::client::Grpc::new(channel.clone());
    raw.ready().await.unwrap();
    let mut stalled = tonic::Request::new(futures::stream::pending::<pb::GetRequest>());
    stalled
        .metadata_mut()
        .insert("authorization", format!("Bearer {ALICE}").parse().unwrap());
    let started = std::time::Instant::now();
    let e = raw
        .client_streaming::<_, pb::GetRequest, pb::GetResponse, _>(
            stalled,
            http::uri::PathAndQuery::from_static("/agentry.v1.Registry/Get"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .expect_err("no message, no answer");
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e:?}");
    assert_eq!(agentry::api::error::detail_of(&e).code, "timeout", "{e:?}");
    assert!(e.message().contains("within 1 s"), "{e:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // The same connection still answers.
    let mut client = agentry::pb::registry_client::RegistryClient::new(channel);
    let missing = client
        .get(Grpc::req(
            Some(ALICE),
            pb::GetRequest {
                id: "nobody".into(),
                ..Default::default()
            },
        ))
        .await
        .expect_err("not there");
    assert_eq!(missing.code(), tonic::Code::NotFound);
}

/// gRPC can carry an unknown member (`extensions`) named like a member the
/// record defines, which JSON cannot. Written, the record's JSON held that
/// member twice and no node could decode the log entry again: the node
/// stopped and did not restart. It is refused by field, at any depth, and
/// the node goes on serving.
#[tokio::test]
async fn grpc_extensions_named_like_defined_members_are_refused() {
    use agentry::pb;
    use prost_types::value::Kind;
    let s = TestServer::start().await;
    let g = Grpc::connect(&s.grpc).await;
    let text = |t: &str| prost_types::Value {
        kind: Some(Kind::StringValue(t.into())),
    };
    let base = || grpc_translator("clash");
    let mut top = base();
    top.extensions
        .get_or_insert_with(Default::default)
        .fields
        .insert("description".into(), text("twice"));
    let mut nested = base();
    nested.bindings[0]
        .extensions
        .get_or_insert_with(Default::default)
        .fields
        .insert("endpoint".into(), text("https://other.example/"));
    for (meta, field) in [
        (top, "/extensions/description"),
        (nested, "/bindings/0/extensions/endpoint"),
    ] {
        let e = register_grpc(&g, meta).await.expect_err(field);
        let d = agentry::api::error::detail_of(&e);
        assert_eq!(d.code, "invalid_request", "{e:?}");
        assert_eq!(d.field.as_deref(), Some(field), "{e:?}");
    }
    // The node still serves, and an ordinary unknown member is kept.
    let mut fine = base();
    fine.extensions
        .get_or_insert_with(Default::default)
        .fields
        .insert("x-vendor".into(), text("kept"));
    register_grpc(&g, fine).await.expect("registers");
    let h = Http::new(&s.http);
    let (status, _, body) = h
        .send(Method::GET, "/agents/clash", Some(ALICE), None, &[])
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["x-vendor"], "kept", "{body}");
    // A ranked List names its own field, not the JSON search's `/top`.
    let e = g
        .client
        .clone()
        .list(Grpc::req(
            Some(ALICE),
            pb::ListRequest {
                query: "translate".into(),
                page_size: 5000,
                ..Default::default()
            },
        ))
        .await
        .expect_err("too large a page");
    let d = agentry::api::error::detail_of(&e);
    assert_eq!(d.field.as_deref(), Some("/page_size"), "{e:?}");
}

/// The translator fixture as gRPC metadata, with its endpoint as a binding.
fn grpc_translator(id: &str) -> agentry::pb::AgentMetadata {
    agentry::convert::metadata_from_json(with(translator(id), |m| {
        m["bindings"] =
            json!([{"protocol": "https", "endpoint": "https://api.example.com/agents/translate"}]);
    }))
    .unwrap()
}

/// Registers `meta` over gRPC as Alice.
async fn register_grpc(
    g: &Grpc,
    meta: agentry::pb::AgentMetadata,
) -> Result<tonic::Response<agentry::pb::RegisterResponse>, tonic::Status> {
    let request = agentry::pb::RegisterRequest {
        metadata: Some(meta),
        visibility: 0,
        readers: Vec::new(),
    };
    g.client
        .clone()
        .register(Grpc::req(Some(ALICE), request))
        .await
}

/// A protobuf message whose field 1 is raw bytes: sent as a `GetRequest`,
/// its id is whatever bytes the test chooses, UTF-8 or not.
#[derive(Clone, PartialEq, prost::Message)]
struct RawId {
    #[prost(bytes = "vec", tag = "1")]
    id: Vec<u8>,
}

/// The error answering `path` called with a message whose field 1 is `id`.
async fn raw_call(addr: &str, path: &'static str, id: Vec<u8>) -> tonic::Status {
    let channel = tonic::transport::Channel::from_shared(addr.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut raw = tonic::client::Grpc::new(channel);
    raw.ready().await.unwrap();
    raw.unary(
        Grpc::req(Some(ALICE), RawId { id }),
        tonic::codegen::http::uri::PathAndQuery::from_static(path),
        tonic_prost::ProstCodec::<RawId, agentry::pb::GetResponse>::default(),
    )
    .await
    .expect_err(path)
}

/// The status of a gRPC `Get` whose body is `body` as it is, framing
/// included, sent over a raw HTTP/2 stream.
async fn raw_grpc_body(addr: &str, body: &[u8]) -> tonic::Status {
    raw_grpc_body_encoded(addr, body, None).await
}

/// `raw_grpc_body` with a `grpc-encoding`.
async fn raw_grpc_body_encoded(addr: &str, body: &[u8], encoding: Option<&str>) -> tonic::Status {
    let tcp = tokio::net::TcpStream::connect(addr.trim_start_matches("http://"))
        .await
        .unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut request = http::Request::post(format!("{addr}/agentry.v1.Registry/Get"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(e) = encoding {
        request = request.header("grpc-encoding", e);
    }
    let request = request.body(()).unwrap();
    let (response, mut send) = client.send_request(request, false).unwrap();
    send.send_data(hyper::body::Bytes::copy_from_slice(body), true)
        .unwrap();
    let response = response.await.unwrap();
    let mut headers = response.headers().clone();
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let _ = chunk.unwrap();
    }
    if let Ok(Some(trailers)) = body.trailers().await {
        headers.extend(trailers);
    }
    tonic::Status::from_header_map(&headers).expect("a gRPC status")
}

/// A request framed wrongly (a message flagged compressed with no
/// `grpc-encoding`, a body that ends inside a message) blames the client
/// with `InvalidArgument` and the error detail; tonic said `Internal`, a
/// server fault to every dashboard.
#[tokio::test]
async fn grpc_requests_framed_wrongly_are_the_clients_fault() {
    use agentry::api::error::detail_of;
    let s = TestServer::start().await;
    // Field 1 (the id) = "abc", as a GetRequest.
    let message = b"\x0a\x03abc";
    let compressed = [&[1u8, 0, 0, 0, 5][..], message].concat();
    let truncated = [&[0u8, 0, 0, 0, 100][..], message].concat();
    for (what, body) in [("compressed", compressed), ("truncated", truncated)] {
        let e = raw_grpc_body(&s.grpc, &body).await;
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{what}: {e:?}");
        let d = detail_of(&e);
        assert_eq!(
            (d.code.as_str(), d.http_status),
            ("invalid_request", 400),
            "{what}"
        );
    }
    // Framed rightly, the same message reaches the handler.
    let e = raw_grpc_body(&s.grpc, &[&[0u8, 0, 0, 0, 5][..], message].concat()).await;
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    s.stop().await;
}

/// A gzip-compressed request (a client's channel compression) is read; one
/// whose bytes do not inflate blames the client, and one that inflates past
/// the message limit is refused while inflating, never held whole.
#[tokio::test]
async fn gzip_requests_are_read_and_bad_ones_refused_with_the_error_detail() {
    use agentry::api::error::detail_of;
    use std::io::Write;
    let gzip = |data: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    };
    let framed = |payload: &[u8]| {
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        [&[1u8][..], &len, payload].concat()
    };
    let s = TestServer::start().await;
    // Field 1 (the id) = "abc", as a GetRequest: it reaches the handler.
    let e = raw_grpc_body_encoded(&s.grpc, &framed(&gzip(b"\x0a\x03abc")), Some("gzip")).await;
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

    let e = raw_grpc_body_encoded(&s.grpc, &framed(b"not gzip at all"), Some("gzip")).await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let d = detail_of(&e);
    assert_eq!((d.code.as_str(), d.http_status), ("invalid_request", 400));
    assert!(d.message.contains("decompress"), "{}", d.message);

    // 64 MiB of one id, 64 KiB compressed: past the limit once inflated.
    let mut bomb = vec![0x0a, 0x80, 0x80, 0x80, 0x20];
    bomb.resize(bomb.len() + (64 << 20), b'a');
    let bomb = gzip(&bomb);
    assert!(bomb.len() < 1 << 20, "{} bytes compressed", bomb.len());
    let e = raw_grpc_body_encoded(&s.grpc, &framed(&bomb), Some("gzip")).await;
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    let d = detail_of(&e);
    assert_eq!(d.http_status, 413, "{e:?}");
    assert!(d.message.contains("decompressing"), "{}", d.message);

    // An encoding the server does not read is refused as unsupported.
    let e = raw_grpc_body_encoded(&s.grpc, &framed(&gzip(b"\x0a\x03abc")), Some("zstd")).await;
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
    assert_eq!(detail_of(&e).code, "unsupported", "{e:?}");
    s.stop().await;
}

/// What tonic refuses before any handler runs answers like everything
/// else, with the `ErrorDetail` and a code that blames the client: a
/// request that does not decode (a string that is not UTF-8, a value nested
/// past the decoder's limit) is `InvalidArgument` (tonic said `Internal`,
/// a server fault to every dashboard), an oversized one `ResourceExhausted`
/// (tonic said `OutOfRange`), an unknown method `Unimplemented`; each
/// carried no detail. A double that JSON cannot hold (NaN, infinities) is
/// refused by field; it was stored as null. Nothing is stored.
#[tokio::test]
async fn grpc_requests_tonic_refuses_and_non_finite_numbers_carry_the_error_detail() {
    use agentry::api::error::detail_of;
    use agentry::pb;
    use prost_types::value::Kind;
    use tonic::Code;
    let s = TestServer::start().await;
    let h = Http::new(&s.http);
    let g = Grpc::connect(&s.grpc).await;
    let before = snapshot(&h).await;

    let e = raw_call(&s.grpc, "/agentry.v1.Registry/Get", vec![b'a', 0xff, 0xfe]).await;
    let d = detail_of(&e);
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(
        (d.code.as_str(), d.http_status),
        ("invalid_request", 400),
        "{e:?}"
    );
    assert!(e.message().contains("UTF-8"), "{e:?}");

    let unknown = raw_call(&s.grpc, "/agentry.v1.Registry/Nope", b"a".to_vec()).await;
    let d = detail_of(&unknown);
    assert_eq!(unknown.code(), Code::Unimplemented, "{unknown:?}");
    assert_eq!(
        (d.code.as_str(), d.http_status),
        ("unsupported", 501),
        "{unknown:?}"
    );

    let base = || grpc_translator("numbers");
    let number = |n: f64| prost_types::Value {
        kind: Some(Kind::NumberValue(n)),
    };

    let mut deep = prost_types::Value {
        kind: Some(Kind::StringValue("leaf".into())),
    };
    for _ in 0..60 {
        deep = prost_types::Value {
            kind: Some(Kind::ListValue(prost_types::ListValue {
                values: vec![deep],
            })),
        };
    }
    let mut nested = base();
    nested.inputs = Some(deep);
    let e = register_grpc(&g, nested)
        .await
        .expect_err("nested past the limit");
    let d = detail_of(&e);
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(d.code, "invalid_request", "{e:?}");
    // The path of every level is elided to its start and its cause.
    assert!(e.message().len() < 400, "{e:?}");

    let mut large = base();
    large.description = "a".repeat(1 << 20);
    let e = register_grpc(&g, large)
        .await
        .expect_err("over the message limit");
    let d = detail_of(&e);
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert_eq!(
        (d.code.as_str(), d.http_status),
        ("invalid_request", 413),
        "{e:?}"
    );

    let mut nan = base();
    nan.constraints
        .get_or_insert_with(Default::default)
        .fields
        .insert("max_cost".into(), number(f64::NAN));
    let mut infinite = base();
    let added = format!("/operations/{}/inputs/maximum", infinite.operations.len());
    infinite.operations.push(pb::Operation {
        name: "translate".into(),
        inputs: Some(prost_types::Value {
            kind: Some(Kind::StructValue(prost_types::Struct {
                fields: [("maximum".to_string(), number(f64::NEG_INFINITY))].into(),
            })),
        }),
        ..Default::default()
    });
    let mut extension = base();
    extension
        .extensions
        .get_or_insert_with(Default::default)
        .fields
        .insert("x/rate".into(), number(f64::INFINITY));
    for (meta, field) in [
        (nan, "/constraints/max_cost"),
        (infinite, added.as_str()),
        (extension, "/extensions/x~1rate"),
    ] {
        let e = register_grpc(&g, meta).await.expect_err(field);
        let d = detail_of(&e);
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert_eq!(d.field.as_deref(), Some(field), "{e:?}");
    }
    let discover = agentry::pb::discovery_client::DiscoveryClient::connect(s.grpc.clone())
        .await
        .unwrap()
        .discover(Grpc::req(
            Some(ALICE),
            pb::DiscoverRequest {
                query: "translate".into(),
                constraints: Some(prost_types::Struct {
                    fields: [("max_latency_ms".to_string(), number(f64::NAN))].into(),
                }),
                ..Default::default()
            },
        ))
        .await
        .expect_err("NaN filter");
    let d = detail_of(&discover);
    assert_eq!(
        d.field.as_deref(),
        Some("/constraints/max_latency_ms"),
        "{discover:?}"
    );

    assert_eq!(snapshot(&h).await, before);
}
