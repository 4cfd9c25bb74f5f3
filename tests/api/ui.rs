//! The directory page (`/ui`): served without credentials, locked down by
//! its headers, and driven in headless Chromium against a real node with
//! the demo directory — search, agent page, registry identity, the admin's
//! cluster view, and a hostile record that must render as text.
//!
//! The browser test drives headless Chromium (`browser`). Screenshots go to
//! `$CARGO_TARGET_TMPDIR/ui-*.png`.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use crate::browser::Browser;
use crate::harness::{translator, Http, TestServer, ADMIN, ALICE};

/// A description and a name a hostile publisher might write.
const HOSTILE_DESCRIPTION: &str =
    "Reverses the letters of words. <script>window.__xss = 1</script><img src=x onerror=\"window.__xss = 2\">";
const HOSTILE_NAME: &str = "<img src=y onerror=\"window.__xss = 3\">Word Reverser";

#[tokio::test]
async fn the_page_loads_without_credentials_small_and_locked_down() {
    // Reads need a key on this node; the page must load all the same.
    let server = TestServer::start_with(|c| c.anonymous_reads = false).await;
    let client = reqwest::Client::new();
    let get = |path: &str, etag: Option<&str>| {
        let mut req = client.get(format!("{}{path}", server.http));
        if let Some(e) = etag {
            req = req.header("if-none-match", e);
        }
        req.send()
    };

    let mut total = 0usize;
    for (path, ctype) in [
        ("/ui", "text/html"),
        ("/ui/assets/app.js", "text/javascript"),
        ("/ui/assets/style.css", "text/css"),
    ] {
        let resp = get(path, None).await.expect("GET");
        assert_eq!(resp.status(), 200, "{path}");
        let h = resp.headers().clone();
        let header = |n: &str| {
            h.get(n)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        assert!(header("content-type").starts_with(ctype), "{path}");
        let csp = header("content-security-policy");
        assert!(csp.contains("script-src 'self'"), "{csp}");
        assert!(csp.contains("default-src 'none'"), "{csp}");
        assert!(
            !csp.contains("unsafe-inline") && !csp.contains("http"),
            "{csp}"
        );
        assert_eq!(header("x-content-type-options"), "nosniff");
        let etag = header("etag");
        assert!(etag.starts_with('"'), "{path} has a strong ETag: {etag}");
        total += resp.bytes().await.expect("body").len();
        let again = get(path, Some(&etag)).await.expect("GET");
        assert_eq!(again.status(), 304, "{path} revalidates");
    }
    println!("ui first load: {total} bytes (HTML + script + stylesheet)");
    assert!(total < 200 * 1024, "first load is {total} bytes");

    let page = get("/ui", None).await.unwrap().text().await.unwrap();
    assert!(!page.contains("<script>"), "no inline script");

    let missing = get("/ui/assets/other.js", None).await.unwrap();
    assert_eq!(missing.status(), 404);
    // The API behind it still needs the key.
    let h = Http::new(&server.http);
    let (status, _, _) = h.send(Method::GET, "/agents/x", None, None, &[]).await;
    assert_eq!(status, 401);
    server.stop().await;
}

/// Waits until the demo directory's 199 agents are registered.
async fn wait_for_demo(h: &Http) {
    for _ in 0..300 {
        let (_, _, v) = h
            .send(Method::GET, "/agents?page_size=1", None, None, &[])
            .await;
        if v["total_count"] == 199 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the demo directory did not load");
}

#[tokio::test]
async fn a_browser_searches_opens_agents_and_sees_the_cluster_only_as_admin() {
    let server = TestServer::start_with(|c| c.demo = true).await;
    let h = Http::new(&server.http);
    wait_for_demo(&h).await;
    // An agent with an operation and its schemas (the demo agents have none).
    let op_agent = translator("ui-translator");
    let hostile = json!({
        "id": "ui-hostile",
        "name": HOSTILE_NAME,
        "description": HOSTILE_DESCRIPTION,
        "examples": [{"text": "Reverse the letters of the word <b>hello</b>"}],
        "bindings": [{"protocol": "https", "endpoint": "https://example.net/reverse"}]
    });
    for agent in [op_agent, hostile] {
        let (status, _, body) = h
            .send(Method::POST, "/agents", Some(ALICE), Some(agent), &[])
            .await;
        assert!(status == 200 || status == 201, "{status} {body}");
    }
    let (_, _, identity) = h
        .send(Method::GET, "/.well-known/agentry.json", None, None, &[])
        .await;
    let signing_key = identity["signing_key"].as_str().expect("signing key");

    let b = Browser::start().await;
    let ui = format!("{}/ui", server.http);
    b.goto(&ui).await;
    b.wait_for("document.body.dataset.ready === 'true'").await;
    assert_eq!(
        b.js("return document.getElementById('nav-cluster').hidden;")
            .await,
        json!(true),
        "anonymous callers see no cluster view"
    );

    // A plain-language search, with its evidence.
    b.type_into("#q", "Will it rain in Paris this weekend?")
        .await;
    b.click("#go").await;
    b.wait_for("document.querySelectorAll('#results li.result').length > 0")
        .await;
    let first = b
        .js("return document.querySelector('#results li.result').dataset.id;")
        .await;
    assert_eq!(first, json!("WeatherTool"));
    let components = b
        .js("return Array.from(document.querySelectorAll('#results li.result:first-child .components tr'))
                .map(function (r) { return r.dataset.component + '=' + r.querySelector('td').textContent; });")
        .await;
    let components: Vec<String> = serde_json::from_value(components).expect("rows");
    for name in ["context", "example", "lexical", "protocol"] {
        assert!(
            components
                .iter()
                .any(|c| c.starts_with(&format!("{name}=0."))
                    || c.starts_with(&format!("{name}=1."))),
            "{name} in {components:?}"
        );
    }
    let examples = b
        .js("return Array.from(document.querySelectorAll('#results li.result:first-child .examples li q'))
                .map(function (q) { return q.textContent; });")
        .await;
    let examples: Vec<String> = serde_json::from_value(examples).expect("examples");
    assert!(
        !examples.is_empty() && examples.iter().any(|e| e.contains("weather")),
        "matched examples as evidence: {examples:?}"
    );
    let search_png = b.screenshot("ui-search.png").await;

    // The filters reach the request: the demo's publishers are
    // self-asserted, and none of its agents speaks MCP.
    b.click("#verified").await;
    b.click("#go").await;
    b.wait_for("document.getElementById('search-status').textContent === '0 results'")
        .await;
    b.click("#verified").await;
    b.type_into("#protocols", "mcp").await;
    b.click("#go").await;
    b.wait_for("document.getElementById('search-status').textContent === '0 results'")
        .await;
    b.type_into("#protocols", "https").await;
    b.click("#go").await;
    b.wait_for("document.querySelector('#results li.result[data-id=\"WeatherTool\"]')")
        .await;

    // Its agent page.
    b.click("#results li.result:first-child a.name").await;
    b.wait_for("document.getElementById('agent-name') && document.getElementById('agent-name').textContent === 'WeatherTool'")
        .await;
    assert!(b
        .text("#agent-bindings")
        .await
        .contains("https://WeatherTool.eval.invalid/invoke"));
    let signature = b.text("#agent-signature").await;
    assert!(signature.contains(signing_key), "{signature}");
    assert!(
        signature.contains("this registry's key, valid"),
        "{signature}"
    );
    assert_eq!(
        b.text("#agent-signature .publisher-state").await,
        "self asserted"
    );
    assert_eq!(b.text("#agent-lifecycle .status").await, "active");
    assert!(b
        .text("#agent-provenance")
        .await
        .contains("not copied from a peer"));

    // Operations with their schemas, readably.
    b.goto(&format!("{ui}#/agent/ui-translator")).await;
    b.wait_for("document.querySelector('#agent-operations .operation')")
        .await;
    let ops = b.text("#agent-operations").await;
    for needle in [
        "translateText",
        "source_language",
        "required",
        "\"zh\"",
        "translated_text",
    ] {
        assert!(ops.contains(needle), "{needle} in {ops}");
    }
    assert_eq!(
        b.js("return document.querySelectorAll('#agent-operations .inputs .props > li').length;")
            .await,
        json!(3)
    );
    let agent_png = b.screenshot("ui-agent.png").await;

    // A hostile record is text, in the results and on its page.
    b.goto(&format!("{ui}#/")).await;
    b.wait_for("document.body.dataset.view === 'search'").await;
    b.type_into("#q", "reverse the letters of a word").await;
    b.click("#go").await;
    b.wait_for("document.querySelector('#results li.result[data-id=\"ui-hostile\"]')")
        .await;
    b.goto(&format!("{ui}#/agent/ui-hostile")).await;
    b.wait_for("document.getElementById('agent-description')")
        .await;
    assert_eq!(b.text("#agent-description").await, HOSTILE_DESCRIPTION);
    assert_eq!(b.text("#agent-name").await, HOSTILE_NAME);
    assert_eq!(
        b.js("return [document.querySelectorAll('main img, main script, main b').length, typeof window.__xss];")
            .await,
        json!([0, "undefined"]),
        "no publisher markup became elements, no publisher script ran"
    );

    // The registry's identity and keys.
    b.click("#nav-registry").await;
    b.wait_for("document.querySelector('#registry-keys tr.key')")
        .await;
    assert!(b.text("#registry-keys").await.contains(signing_key));

    // Cluster status: refused to an anonymous caller, shown to an admin.
    b.goto(&format!("{ui}#/cluster")).await;
    b.wait_for("document.getElementById('cluster-denied')")
        .await;
    assert_eq!(
        b.js("return document.getElementById('cluster-members') === null;")
            .await,
        json!(true)
    );
    // A publisher's key is not enough.
    b.type_into("#token", ALICE).await;
    b.click("#token-save").await;
    b.wait_for("document.getElementById('whoami').textContent === 'token set'")
        .await;
    assert_eq!(
        b.js("return document.getElementById('nav-cluster').hidden;")
            .await,
        json!(true)
    );
    b.type_into("#token", ADMIN).await;
    b.click("#token-save").await;
    b.wait_for("!document.getElementById('nav-cluster').hidden")
        .await;
    b.wait_for("document.querySelector('#cluster-members tr.member')")
        .await;
    assert_eq!(b.text("#view-cluster .node-role").await, "leader");
    let url = b.js("return window.location.href;").await;
    let url = url.as_str().unwrap_or_default();
    assert!(
        !url.contains(ADMIN) && !url.contains(ALICE),
        "the token stays out of the URL: {url}"
    );
    assert_eq!(
        b.js("return document.getElementById('token').value;").await,
        json!(""),
        "the token is not left in the form"
    );
    let cluster_png = b.screenshot("ui-cluster.png").await;

    // Forgetting the token hides the admin view again.
    b.click("#token-forget").await;
    b.wait_for("document.getElementById('nav-cluster').hidden")
        .await;
    b.wait_for("document.getElementById('cluster-denied')")
        .await;

    b.quit().await;
    for png in [search_png, agent_png, cluster_png] {
        let bytes = std::fs::read(&png).expect("screenshot");
        assert!(bytes.starts_with(b"\x89PNG"), "{}", png.display());
    }
    server.stop().await;
}
