//! Browser pages of other origins (CORS): a page of a listed origin reads,
//! writes with its bearer key and reads the refusals, in headless Chromium;
//! a page of any other origin can do none of it and changes nothing; `/mcp`
//! answers the pages its own origin check admits.

use reqwest::Method;
use serde_json::{json, Value};

use crate::browser::Browser;
use crate::harness::{minimal, Http, TestServer, ADMIN};

/// A web server of one blank page, standing for another site's console.
async fn page_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the page server");
    let port = listener.local_addr().expect("address").port();
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(|| async {
            axum::response::Html("<!doctype html><title>console</title><p>console</p>")
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    port
}

/// `fetch(url, init)` from the page, as the page sees the outcome: the
/// status, body and the headers a page may read, or the error a blocked
/// request raises.
async fn page_fetch(b: &Browser, url: &str, init: Value) -> Value {
    let script = format!(
        "fetch({url}, {init}).then(async r => done({{ok: true, status: r.status, \
           body: await r.text(), etag: r.headers.get('etag'), \
           www: r.headers.get('www-authenticate')}}), \
         e => done({{ok: false, failure: String(e)}}));",
        url = serde_json::to_string(url).unwrap(),
    );
    b.js_async(&script).await
}

/// `POST /agents` of a minimal record from the page, with the admin's key.
async fn page_register(b: &Browser, registry: &str, id: &str) -> Value {
    let init = json!({"method": "POST",
        "headers": {"authorization": format!("Bearer {ADMIN}"),
                    "content-type": "application/json"},
        "body": minimal(id).to_string()});
    page_fetch(b, &format!("{registry}/agents"), init).await
}

fn body(v: &Value) -> Value {
    serde_json::from_str(v["body"].as_str().unwrap_or_default()).unwrap_or(Value::Null)
}

#[tokio::test]
async fn a_listed_page_reads_and_writes_and_other_pages_get_nothing() {
    let console_port = page_server().await;
    let other_port = page_server().await;
    let console = format!("http://console.example:{console_port}");
    let listed = console.clone();
    let server = TestServer::start_with(|c| c.cors.allowed_origins = vec![listed]).await;
    let registry = server.http.clone();
    let h = Http::new(&registry);

    // Both sites resolve to loopback, each under a name of its own.
    let b = Browser::start_with_args(&[
        "--host-resolver-rules=MAP console.example 127.0.0.1, MAP other.example 127.0.0.1",
    ])
    .await;

    b.goto(&format!("{console}/")).await;
    let read = page_fetch(&b, &format!("{registry}/v0.1/servers"), json!({})).await;
    assert_eq!(read["ok"], true, "{read}");
    assert_eq!(read["status"], 200, "{read}");
    assert!(body(&read)["servers"].is_array(), "{read}");

    // A write with a bearer key and a JSON body: preflighted, then sent.
    let write = page_register(&b, &registry, "from-console").await;
    assert_eq!(write["ok"], true, "{write}");
    assert_eq!(write["status"], 201, "{write}");
    let record = body(&write);
    assert_eq!(record["id"], "from-console", "{write}");
    assert!(
        record["registry"]["signature"]["value"].is_string(),
        "{write}"
    );

    // The page reads a refusal's body and challenge, and an ETag.
    let refused = page_fetch(
        &b,
        &format!("{registry}/agents"),
        json!({"method": "POST", "headers": {"content-type": "application/json"},
               "body": minimal("no-key").to_string()}),
    )
    .await;
    assert_eq!(refused["status"], 401, "{refused}");
    assert_eq!(body(&refused)["code"], "unauthorized", "{refused}");
    assert!(
        refused["www"]
            .as_str()
            .unwrap_or_default()
            .starts_with("Bearer"),
        "{refused}"
    );
    let got = page_fetch(&b, &format!("{registry}/agents/from-console"), json!({})).await;
    assert_eq!(got["status"], 200, "{got}");
    assert!(got["etag"].as_str().is_some_and(|e| !e.is_empty()), "{got}");

    // Another site's page reads nothing and writes nothing.
    b.goto(&format!("http://other.example:{other_port}/")).await;
    let read = page_fetch(&b, &format!("{registry}/v0.1/servers"), json!({})).await;
    assert_eq!(read["ok"], false, "{read}");
    let write = page_register(&b, &registry, "from-other").await;
    assert_eq!(write["ok"], false, "{write}");
    let (status, _, _) = h
        .send(Method::GET, "/agents/from-other", Some(ADMIN), None, &[])
        .await;
    assert_eq!(status, 404, "the refused page's write never happened");

    // `/mcp` follows its own check: a loopback page may call it (an MCP
    // client served on this machine), the listed console may not.
    let initialize = json!({"method": "POST",
        "headers": {"content-type": "application/json",
                    "accept": "application/json, text/event-stream"},
        "body": json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "page", "version": "1"}}}).to_string()});
    b.goto(&format!("http://localhost:{other_port}/")).await;
    let mcp = page_fetch(&b, &format!("{registry}/mcp"), initialize.clone()).await;
    assert_eq!(mcp["status"], 200, "{mcp}");
    assert!(
        mcp["body"]
            .as_str()
            .unwrap_or_default()
            .contains("serverInfo"),
        "{mcp}"
    );
    b.goto(&format!("{console}/")).await;
    let mcp = page_fetch(&b, &format!("{registry}/mcp"), initialize).await;
    assert_eq!(mcp["ok"], false, "{mcp}");

    b.quit().await;
    server.stop().await;
}

/// A preflight as a browser sends it.
async fn preflight(h: &Http, path: &str, origin: &str) -> (u16, reqwest::header::HeaderMap, Value) {
    h.send(
        Method::OPTIONS,
        path,
        None,
        None,
        &[
            ("origin", origin),
            ("access-control-request-method", "PUT"),
            (
                "access-control-request-headers",
                "authorization, content-type, x-sdk-trace",
            ),
            ("access-control-request-private-network", "true"),
        ],
    )
    .await
}

fn header<'a>(h: &'a reqwest::header::HeaderMap, name: &str) -> &'a str {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

#[tokio::test]
async fn preflights_say_what_a_listed_page_may_send_and_refuse_the_rest() {
    let console = "https://console.example.com";
    let server =
        TestServer::start_with(|c| c.cors.allowed_origins = vec![format!("{console}/")]).await;
    let h = Http::new(&server.http);

    let (status, headers, _) = preflight(&h, "/agents/x", console).await;
    assert_eq!(status, 204);
    assert_eq!(header(&headers, "access-control-allow-origin"), console);
    assert!(header(&headers, "access-control-allow-methods").contains("PUT"));
    assert_eq!(
        header(&headers, "access-control-allow-headers"),
        "authorization, content-type, x-sdk-trace"
    );
    assert_eq!(header(&headers, "access-control-max-age"), "600");
    assert_eq!(
        header(&headers, "access-control-allow-private-network"),
        "true"
    );
    assert!(headers.get("access-control-allow-credentials").is_none());

    let (status, headers, problem) = preflight(&h, "/agents/x", "https://elsewhere.example").await;
    assert_eq!(status, 403);
    assert_eq!(problem["code"], "forbidden", "{problem}");
    assert!(
        problem["message"]
            .as_str()
            .unwrap_or_default()
            .contains("cors.allowed_origins"),
        "{problem}"
    );
    assert!(headers.get("access-control-allow-origin").is_none());

    // Answers name the listed page, vary by origin, and expose the
    // headers a page reads; other pages' answers name nobody.
    let (status, headers, _) = h
        .send(Method::GET, "/healthz", None, None, &[("origin", console)])
        .await;
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "access-control-allow-origin"), console);
    let exposed = header(&headers, "access-control-expose-headers");
    // The invocation gateway's findings among them (docs/invocation.md).
    for name in [
        "etag",
        "retry-after",
        "www-authenticate",
        "agent-authenticate",
        "idempotent-replayed",
        "x-agentry-binding",
        "x-agentry-output-check",
        "x-agentry-output-error",
    ] {
        assert!(exposed.split(", ").any(|h| h == name), "{name}: {exposed}");
    }
    assert!(header(&headers, "vary").contains("origin"));
    let (_, headers, _) = h.send(Method::GET, "/healthz", None, None, &[]).await;
    assert!(header(&headers, "vary").contains("origin"));
    assert!(headers.get("access-control-allow-origin").is_none());
    // An OPTIONS that is no preflight is still a method no route has.
    let (status, _, _) = h.send(Method::OPTIONS, "/agents", None, None, &[]).await;
    assert_eq!(status, 405);
    // `/mcp` refuses a page its own check refuses, naming its setting.
    let (status, _, problem) = preflight(&h, "/mcp", console).await;
    assert_eq!(status, 403);
    assert!(
        problem["message"]
            .as_str()
            .unwrap_or_default()
            .contains("mcp.allowed_origins"),
        "{problem}"
    );
    server.stop().await;

    // With no list no page may call; with `*` every page may, answers
    // name no one page and do not vary.
    let closed = TestServer::start().await;
    let h = Http::new(&closed.http);
    let (status, _, _) = preflight(&h, "/agents/x", console).await;
    assert_eq!(status, 403);
    let (_, headers, _) = h
        .send(Method::GET, "/healthz", None, None, &[("origin", console)])
        .await;
    assert!(headers.get("access-control-allow-origin").is_none());
    assert!(headers.get("vary").is_none());
    let (status, headers, _) = preflight(&h, "/mcp", "http://localhost:6274").await;
    assert_eq!(status, 204, "a loopback MCP client's page");
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        "http://localhost:6274"
    );
    closed.stop().await;

    let open = TestServer::start_with(|c| c.cors.allowed_origins = vec!["*".into()]).await;
    let h = Http::new(&open.http);
    let (status, headers, _) = preflight(&h, "/agents/x", "https://any.example").await;
    assert_eq!(status, 204);
    assert_eq!(header(&headers, "access-control-allow-origin"), "*");
    let (_, headers, _) = h.send(Method::GET, "/healthz", None, None, &[]).await;
    assert_eq!(header(&headers, "access-control-allow-origin"), "*");
    assert!(headers.get("vary").is_none());
    open.stop().await;
}
