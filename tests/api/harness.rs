//! Starts a real registry in-process on ephemeral loopback ports, and the two
//! client transports the scenarios run over.

use std::time::Duration;

use agentry::api::error::detail_of;
use agentry::config::{ApiKeyConfig, Config};
use agentry::convert::{metadata_from_json, record_pb_to_json};
use agentry::pb::{self, registry_client::RegistryClient};
use agentry::server::{start, RunningServer};
use serde_json::{json, Value};
use tonic::transport::Channel;

pub const ADMIN: &str = "admin-key-for-tests-0001";
pub const ALICE: &str = "alice-key-for-tests-0001";
pub const BOB: &str = "bob-key-for-tests-000001";
pub const CAROL_READER: &str = "carol-key-for-tests-0001";

/// `tests/fixtures/<name>` in the checkout the tests run from. Cargo sets
/// `CARGO_MANIFEST_DIR` when it runs a test as well as when it builds one;
/// the value built in names the checkout that compiled the binary, and a
/// target directory shared between clones (`.ci/run` reuses one) keeps a
/// binary built from another clone when the sources are the same.
pub fn fixture(name: &str) -> std::path::PathBuf {
    let root = std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(
        || env!("CARGO_MANIFEST_DIR").into(),
        std::path::PathBuf::from,
    );
    root.join("tests/fixtures").join(name)
}

pub struct TestServer {
    pub http: String,
    pub grpc: String,
    pub server: Option<RunningServer>,
    /// Kept so the data directory lives as long as the server.
    _dir: tempfile::TempDir,
}

pub fn test_config(dir: &std::path::Path) -> Config {
    let key = |name: &str, role: &str, key: &str| ApiKeyConfig {
        name: name.into(),
        role: agentry::domain::Role::parse(role).expect("role"),
        key: Some(key.into()),
        key_sha256: None,
        tenant: None,
    };
    Config {
        data_dir: dir.to_path_buf(),
        grpc_addr: "127.0.0.1:0".parse().unwrap(),
        http_addr: "127.0.0.1:0".parse().unwrap(),
        raft_addr: "127.0.0.1:0".parse().unwrap(),
        peer_addr: "127.0.0.1:0".parse().unwrap(),
        admin_key: Some(ADMIN.into()),
        // Scenarios send bursts no client should; the limits have tests of
        // their own (trust.rs).
        rate_limits: agentry::api::gate::RateLimitConfig {
            enabled: false,
            ..Default::default()
        },
        api_keys: vec![
            key("alice", "publisher", ALICE),
            key("bob", "publisher", BOB),
            key("carol", "reader", CAROL_READER),
        ],
        ..Config::default()
    }
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(tweak: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = test_config(dir.path());
        tweak(&mut config);
        let server = start(config).await.expect("server starts");
        Self {
            http: format!("http://{}", server.http_addr),
            grpc: format!("http://{}", server.grpc_addr),
            server: Some(server),
            _dir: dir,
        }
    }

    pub fn data_dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    /// Stops the server and starts it again on the same data directory,
    /// with the default test configuration.
    pub async fn restart(mut self) -> Self {
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
        let server = start(test_config(self._dir.path()))
            .await
            .expect("server restarts");
        Self {
            http: format!("http://{}", server.http_addr),
            grpc: format!("http://{}", server.grpc_addr),
            server: Some(server),
            _dir: self._dir,
        }
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
    }
}

/// A failed call as both transports report it.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub code: String,
    pub http: u16,
    pub field: Option<String>,
}

pub type Outcome<T> = Result<T, Failure>;

/// The registry operations, over one transport. Records come back as the
/// JSON form, so both transports can be compared directly.
pub trait Transport {
    fn name(&self) -> &'static str;
    async fn register(&self, key: Option<&str>, meta: Value) -> Outcome<(Value, bool)>;
    async fn get(&self, key: Option<&str>, id: &str) -> Outcome<Value>;
    async fn update(&self, key: Option<&str>, id: &str, meta: Value) -> Outcome<Value>;
    async fn delete(&self, key: Option<&str>, id: &str) -> Outcome<u64>;
    async fn set_status(
        &self,
        key: Option<&str>,
        id: &str,
        status: &str,
        reason: &str,
    ) -> Outcome<Value>;
    /// (ids of the page, next page token, total count)
    async fn list(
        &self,
        key: Option<&str>,
        tags: &[&str],
        capabilities: &[&str],
        language: Option<&str>,
        page_size: u32,
        token: &str,
    ) -> Outcome<(Vec<String>, String, u64)>;
}

/// A response's content type, empty when it has none.
pub fn content_type(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

pub struct Http {
    pub base: String,
    pub client: reqwest::Client,
}

impl Http {
    pub fn new(base: &str) -> Self {
        Self {
            base: base.to_string(),
            client: reqwest::Client::new(),
        }
    }

    pub fn url_id(id: &str) -> String {
        url::form_urlencoded::byte_serialize(id.as_bytes()).collect()
    }

    /// The record `GET /agents/{id}` serves to `key`'s holder (the id is
    /// escaped for the path); it must exist.
    pub async fn record(&self, id: &str, key: &str) -> Value {
        let path = format!("/agents/{}", Self::url_id(id));
        self.call(reqwest::Method::GET, &path, Some(key), None)
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e:?}"))
            .1
    }

    /// A request whose answer is taken as it comes (any status, any error
    /// shape): (status, headers, JSON body or null).
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.expect("HTTP request is sent");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        (status, headers, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> Outcome<(u16, Value)> {
        let mut req = self
            .client
            .request(method, format!("{}{}", self.base, path));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("HTTP request is sent");
        let status = resp.status().as_u16();
        let ctype = content_type(&resp);
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if status >= 400 {
            assert_eq!(
                ctype, "application/problem+json",
                "errors are problem+json: {body}"
            );
            assert_eq!(
                body["error"]["code"], body["code"],
                "AIDIP error object mirrors the ADP code"
            );
            assert_eq!(body["status"], status, "problem status matches HTTP status");
            return Err(Failure {
                code: body["code"].as_str().unwrap_or("").into(),
                http: status,
                field: body["field"].as_str().map(String::from),
            });
        }
        Ok((status, body))
    }

    /// `POST /import/woa` of the WoA document at (or under) `url`: the
    /// import report.
    pub async fn import_woa(&self, key: &str, url: &str) -> Outcome<Value> {
        self.call(
            reqwest::Method::POST,
            "/import/woa",
            Some(key),
            Some(json!({ "url": url })),
        )
        .await
        .map(|(_, report)| report)
    }
}

impl Transport for Http {
    fn name(&self) -> &'static str {
        "http"
    }
    async fn register(&self, key: Option<&str>, meta: Value) -> Outcome<(Value, bool)> {
        let (status, body) = self
            .call(reqwest::Method::POST, "/agents", key, Some(meta))
            .await?;
        Ok((body, status == 201))
    }
    async fn get(&self, key: Option<&str>, id: &str) -> Outcome<Value> {
        Ok(self
            .call(
                reqwest::Method::GET,
                &format!("/agents/{}", Self::url_id(id)),
                key,
                None,
            )
            .await?
            .1)
    }
    async fn update(&self, key: Option<&str>, id: &str, meta: Value) -> Outcome<Value> {
        Ok(self
            .call(
                reqwest::Method::PUT,
                &format!("/agents/{}", Self::url_id(id)),
                key,
                Some(meta),
            )
            .await?
            .1)
    }
    async fn delete(&self, key: Option<&str>, id: &str) -> Outcome<u64> {
        let body = self
            .call(
                reqwest::Method::DELETE,
                &format!("/agents/{}", Self::url_id(id)),
                key,
                None,
            )
            .await?
            .1;
        Ok(body["revision"].as_u64().expect("revision"))
    }
    async fn set_status(
        &self,
        key: Option<&str>,
        id: &str,
        status: &str,
        reason: &str,
    ) -> Outcome<Value> {
        let path = format!("/agents/{}/status", Self::url_id(id));
        Ok(self
            .call(
                reqwest::Method::POST,
                &path,
                key,
                Some(json!({"status": status, "reason": reason})),
            )
            .await?
            .1)
    }
    async fn list(
        &self,
        key: Option<&str>,
        tags: &[&str],
        capabilities: &[&str],
        language: Option<&str>,
        page_size: u32,
        token: &str,
    ) -> Outcome<(Vec<String>, String, u64)> {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        if !tags.is_empty() {
            q.append_pair("tags", &tags.join(","));
        }
        for c in capabilities {
            q.append_pair("capabilities", c);
        }
        if let Some(l) = language {
            q.append_pair("language", l);
        }
        q.append_pair("page_size", &page_size.to_string());
        if !token.is_empty() {
            q.append_pair("page_token", token);
        }
        let body = self
            .call(
                reqwest::Method::GET,
                &format!("/agents?{}", q.finish()),
                key,
                None,
            )
            .await?
            .1;
        let ids = body["agents"]
            .as_array()
            .expect("agents")
            .iter()
            .map(|a| a["id"].as_str().unwrap().to_string())
            .collect();
        Ok((
            ids,
            body["next_page_token"].as_str().unwrap_or("").into(),
            body["total_count"].as_u64().unwrap(),
        ))
    }
}

pub struct Grpc {
    pub client: RegistryClient<Channel>,
}

impl Grpc {
    pub async fn connect(addr: &str) -> Self {
        Self {
            client: RegistryClient::connect(addr.to_string())
                .await
                .expect("gRPC connects"),
        }
    }

    /// A request carrying `key` as its Bearer credential, if any.
    pub fn req<T>(key: Option<&str>, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(k) = key {
            r.metadata_mut()
                .insert("authorization", format!("Bearer {k}").parse().unwrap());
        }
        r
    }

    /// Parses metadata JSON as a gRPC client would, failing like the server.
    fn metadata(meta: Value) -> Outcome<pb::AgentMetadata> {
        metadata_from_json(meta).map_err(|e| Failure {
            code: "invalid_request".into(),
            http: 400,
            field: Some(e.pointer),
        })
    }

    fn fail(s: tonic::Status) -> Failure {
        let d = detail_of(&s);
        Failure {
            code: d.code,
            http: d.http_status as u16,
            field: d.field,
        }
    }

    fn json(r: Option<pb::AgentRecord>) -> Value {
        record_pb_to_json(&r.expect("record")).expect("record converts")
    }
}

fn status_of(s: &str) -> i32 {
    match s {
        "active" => pb::AgentStatus::Active as i32,
        "deprecated" => pb::AgentStatus::Deprecated as i32,
        "inactive" => pb::AgentStatus::Inactive as i32,
        "deleted" => pb::AgentStatus::Deleted as i32,
        _ => 99,
    }
}

impl Transport for Grpc {
    fn name(&self) -> &'static str {
        "grpc"
    }
    async fn register(&self, key: Option<&str>, meta: Value) -> Outcome<(Value, bool)> {
        let metadata = Self::metadata(meta)?;
        let r = self
            .client
            .clone()
            .register(Self::req(
                key,
                pb::RegisterRequest {
                    metadata: Some(metadata),
                    visibility: 0,
                    readers: Vec::new(),
                },
            ))
            .await
            .map_err(Self::fail)?
            .into_inner();
        Ok((Self::json(r.record), r.created))
    }
    async fn get(&self, key: Option<&str>, id: &str) -> Outcome<Value> {
        let r = self
            .client
            .clone()
            .get(Self::req(
                key,
                pb::GetRequest {
                    id: id.into(),
                    consistency: 0,
                },
            ))
            .await
            .map_err(Self::fail)?
            .into_inner();
        Ok(Self::json(r.record))
    }
    async fn update(&self, key: Option<&str>, id: &str, meta: Value) -> Outcome<Value> {
        let metadata = Self::metadata(meta)?;
        let r = self
            .client
            .clone()
            .update(Self::req(
                key,
                pb::UpdateRequest {
                    id: id.into(),
                    metadata: Some(metadata),
                    visibility: 0,
                    readers: Vec::new(),
                    expected_revision: None,
                },
            ))
            .await
            .map_err(Self::fail)?
            .into_inner();
        Ok(Self::json(r.record))
    }
    async fn delete(&self, key: Option<&str>, id: &str) -> Outcome<u64> {
        let r = self
            .client
            .clone()
            .delete(Self::req(
                key,
                pb::DeleteRequest {
                    id: id.into(),
                    expected_revision: None,
                },
            ))
            .await
            .map_err(Self::fail)?
            .into_inner();
        Ok(r.revision)
    }
    async fn set_status(
        &self,
        key: Option<&str>,
        id: &str,
        status: &str,
        reason: &str,
    ) -> Outcome<Value> {
        let req = pb::SetStatusRequest {
            id: id.into(),
            status: status_of(status),
            reason: Some(reason.into()),
            expected_revision: None,
        };
        let r = self
            .client
            .clone()
            .set_status(Self::req(key, req))
            .await
            .map_err(Self::fail)?
            .into_inner();
        Ok(Self::json(r.record))
    }
    async fn list(
        &self,
        key: Option<&str>,
        tags: &[&str],
        capabilities: &[&str],
        language: Option<&str>,
        page_size: u32,
        token: &str,
    ) -> Outcome<(Vec<String>, String, u64)> {
        let req = pb::ListRequest {
            tags: tags.iter().map(|s| s.to_string()).collect(),
            capabilities: capabilities.iter().map(|s| s.to_string()).collect(),
            languages: language.into_iter().map(String::from).collect(),
            page_size,
            page_token: token.into(),
            ..Default::default()
        };
        let r = self
            .client
            .clone()
            .list(Self::req(key, req))
            .await
            .map_err(Self::fail)?
            .into_inner();
        let ids = r
            .records
            .iter()
            .map(|r| r.metadata.as_ref().unwrap().id.clone())
            .collect();
        Ok((ids, r.next_page_token, r.total_count))
    }
}

/// The AIDIP translator example, with an id of the caller's choice.
pub fn translator(id: &str) -> Value {
    json!({
        "id": id,
        "name": "Chinese-English Translator",
        "description": "Translates text between Chinese and English with high accuracy using a fine-tuned model.",
        "version": "1.2.0",
        "publisher": "ExampleAI Inc.",
        "capabilities": ["translation"],
        "tags": ["NLP", "chinese", "english", "cloud", "nlp"],
        "endpoint": "https://api.example.com/agents/translate",
        "supported_languages": ["en", "zh"],
        "authentication": {"type": "api_key", "instructions": "Include 'X-API-Key' header with your API key."},
        "status": "active",
        "operations": [{
            "name": "translateText",
            "description": "Translates text from source language to target language.",
            "inputs": {"type": "object", "properties": {
                "text": {"type": "string"},
                "source_language": {"type": "string", "enum": ["en", "zh"]},
                "target_language": {"type": "string", "enum": ["en", "zh"]}},
                "required": ["text", "source_language", "target_language"]},
            "outputs": {"type": "object", "properties": {"translated_text": {"type": "string"}}},
            "examples": [{"input": {"text": "你好世界", "source_language": "zh", "target_language": "en"},
                          "output": {"translated_text": "Hello World"}}]
        }],
        "updated_at": "2026-05-08T00:00:00Z",
        "com.example/pricing": {"per_call_usd": 0.002, "free_tier": true}
    })
}

/// The ADP D0 minimal record.
pub fn minimal(id: &str) -> Value {
    json!({
        "id": id,
        "name": "Minimal Agent",
        "description": "Answers short factual questions.",
        "bindings": [{"protocol": "https", "endpoint": "https://example.net/agent/invoke"}]
    })
}

/// Waits until `ok` holds, polling every 100 ms, or fails naming `what`
/// once `timeout` has passed.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut ok: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !ok().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
