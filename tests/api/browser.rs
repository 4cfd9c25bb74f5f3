//! Headless Chromium for the tests that need a real browser (the
//! directory page, cross-origin pages). Needs Debian's `chromium` and
//! `chromium-driver` (`scripts/fetch-chromium.sh`, which `scripts/test.sh`
//! runs). It talks WebDriver (plain JSON over HTTP) to chromedriver with
//! reqwest, so the tests add no crate.

use std::time::Duration;

use base64::Engine;
use reqwest::Method;
use serde_json::{json, Value};

/// A WebDriver session on a chromedriver this test started.
pub struct Browser {
    driver: tokio::process::Child,
    client: reqwest::Client,
    session: String,
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    pub async fn start() -> Self {
        Self::start_with_args(&[]).await
    }

    /// A browser started with `extra` command-line switches, e.g.
    /// `--host-resolver-rules` to give loopback pages names of their own.
    pub async fn start_with_args(extra: &[&str]) -> Self {
        let chromedriver =
            std::env::var("AGENTRY_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
        let chromium = std::env::var("AGENTRY_CHROMIUM").unwrap_or_else(|_| {
            ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
                .into_iter()
                .find(|p| std::path::Path::new(p).exists())
                .unwrap_or("chromium")
                .to_string()
        });
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let driver = tokio::process::Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run {chromedriver} ({e}); run scripts/fetch-chromium.sh")
            });
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        let mut ready = false;
        for _ in 0..100 {
            if let Ok(r) = client.get(format!("{base}/status")).send().await {
                if r.status().is_success() {
                    ready = true;
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ready, "chromedriver did not start on port {port}");
        let mut args = vec![
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1280,1000",
            "--hide-scrollbars",
        ];
        args.extend_from_slice(extra);
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args}
        }}});
        let resp: Value = client
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .expect("new session")
            .json()
            .await
            .expect("session JSON");
        let id = resp["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {resp}"));
        Self {
            session: format!("{base}/session/{id}"),
            driver,
            client,
        }
    }

    async fn cmd(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.session));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp: Value = req
            .send()
            .await
            .expect("WebDriver call")
            .json()
            .await
            .expect("WebDriver JSON");
        if resp["value"]["error"].is_string() || resp.get("value").is_none() {
            panic!("WebDriver {path}: {resp}");
        }
        resp["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.cmd(Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    pub async fn find(&self, css: &str) -> String {
        let v = self
            .cmd(
                Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        v[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_string()
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css).await;
        self.cmd(
            Method::POST,
            &format!("/element/{e}/clear"),
            Some(json!({})),
        )
        .await;
        self.cmd(
            Method::POST,
            &format!("/element/{e}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    pub async fn click(&self, css: &str) {
        let e = self.find(css).await;
        self.cmd(
            Method::POST,
            &format!("/element/{e}/click"),
            Some(json!({})),
        )
        .await;
    }

    /// Runs `script` (a function body) in the page and returns its value.
    pub async fn js(&self, script: &str) -> Value {
        self.cmd(
            Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// Runs `script`, a function body that ends by calling `done(value)`
    /// (it may await first), in the page and returns that value.
    pub async fn js_async(&self, script: &str) -> Value {
        let script = format!("const done = arguments[arguments.length - 1]; {script}");
        self.cmd(
            Method::POST,
            "/execute/async",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// The text of the first element matching `css` ("" when none).
    pub async fn text(&self, css: &str) -> String {
        let css = serde_json::to_string(css).unwrap_or_default();
        self.js(&format!(
            "var e = document.querySelector({css}); return e ? e.textContent : '';"
        ))
        .await
        .as_str()
        .unwrap_or_default()
        .to_string()
    }

    /// Waits until `condition` (a JS expression) is true in the page.
    pub async fn wait_for(&self, condition: &str) {
        for _ in 0..300 {
            if self.js(&format!("return !!({condition});")).await == json!(true) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let body = self.text("body").await;
        panic!("timed out waiting for {condition}; the page shows: {body}");
    }

    pub async fn screenshot(&self, name: &str) -> std::path::PathBuf {
        let b64 = self.cmd(Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().expect("screenshot base64"))
            .expect("PNG");
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
        std::fs::write(&path, png).expect("screenshot written");
        println!("screenshot: {}", path.display());
        path
    }

    pub async fn quit(mut self) {
        let _ = self.client.delete(&self.session).send().await;
        let _ = self.driver.kill().await;
    }
}
