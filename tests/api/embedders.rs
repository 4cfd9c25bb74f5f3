//! The embedders besides the built-in model: an OpenAI-compatible endpoint
//! (a real HTTP service on loopback that answers like one, and fails when
//! told to) and, with the `minilm` feature, all-MiniLM-L6-v2 from local
//! files.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::*;

const DIM: usize = 48;
const KEY_VAR: &str = "AGENTRY_TEST_EMBEDDINGS_KEY";
const KEY: &str = "sk-test-embeddings-key";

#[derive(Default)]
struct Service {
    failing: AtomicBool,
    /// (authorization header, model, number of inputs) of every request.
    seen: Mutex<Vec<(String, String, usize)>>,
}

/// A bag of hashed words, not normalised (the registry must normalise):
/// texts that share words get similar vectors.
fn bag_of_words(text: &str) -> Vec<f32> {
    let mut v = vec![0.0f32; DIM];
    for word in text
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 2)
    {
        let h = word.bytes().fold(2166136261u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(16777619)
        });
        v[h as usize % DIM] += 1.0;
    }
    v
}

async fn embeddings(
    State(s): State<Arc<Service>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let inputs: Vec<String> = body["input"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    s.seen.lock().unwrap().push((
        headers
            .get("authorization")
            .and_then(|h| h.to_str().ok())
            .unwrap_or("")
            .to_string(),
        body["model"].as_str().unwrap_or("").to_string(),
        inputs.len(),
    ));
    if s.failing.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": {"message": "model is reloading"}})),
        );
    }
    // Answered in reverse order: the registry must place vectors by index.
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .rev()
        .map(|(i, t)| json!({"object": "embedding", "index": i, "embedding": bag_of_words(t)}))
        .collect();
    (
        StatusCode::OK,
        Json(json!({"object": "list", "data": data, "model": body["model"]})),
    )
}

async fn start_service() -> (String, Arc<Service>) {
    let state = Arc::new(Service::default());
    let app = Router::new()
        .route("/v1/embeddings", post(embeddings))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1/embeddings"), state)
}

fn endpoint(url: &str, dimensions: usize) -> agentry::config::EndpointConfig {
    agentry::config::EndpointConfig {
        url: url.into(),
        model: "test-embed-1".into(),
        dimensions,
        api_key_env: Some(KEY_VAR.into()),
        send_dimensions: false,
        batch: 4,
        timeout_ms: 2000,
    }
}

async fn discover(h: &Http, query: &str) -> Value {
    h.call(
        Method::POST,
        "/discover",
        None,
        Some(json!({"query": query, "include_evidence": true})),
    )
    .await
    .expect("discovery succeeds")
    .1
}

fn ids(resp: &Value) -> Vec<&str> {
    resp["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect()
}

async fn metric(server: &TestServer, name: &str) -> f64 {
    let text = reqwest::get(format!("{}/metrics", server.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

fn summarizer() -> Value {
    json!({
        "id": "summarizer",
        "name": "Meeting summarizer",
        "description": "Summarize meeting transcripts into action items",
        "tags": ["summarization"],
        "examples": [{"id": "ex-1", "text": "summarize this meeting transcript"}],
        "bindings": [{"protocol": "https", "endpoint": "https://agents.example.net/summarizer"}],
        "updated_at": agentry::domain::time::now(),
    })
}

#[tokio::test]
async fn an_openai_compatible_endpoint_embeds_records_and_queries_and_its_failures_lose_nothing() {
    std::env::set_var(KEY_VAR, KEY);
    let (url, service) = start_service().await;
    let server = TestServer::start_with(|c| {
        c.discovery.embedder = "openai".into();
        c.discovery.endpoint = Some(endpoint(&url, DIM));
    })
    .await;
    let h = Http::new(&server.http);
    for meta in [translator("translator"), minimal("minimal")] {
        h.call(Method::POST, "/agents", Some(ALICE), Some(meta))
            .await
            .expect("registers");
    }

    let r = discover(&h, "translate text into chinese").await;
    assert_eq!(ids(&r)[0], "translator", "{r}");
    assert!(
        r["candidates"][0]["score_components"]["context"]
            .as_f64()
            .is_some_and(|c| c > 0.0),
        "vectors from the endpoint take part: {r}"
    );
    assert_eq!(r["warnings"], json!([]), "{r}");
    {
        let seen = service.seen.lock().unwrap();
        assert!(seen.len() >= 3, "records and the query were embedded");
        for (auth, model, n) in seen.iter() {
            assert_eq!(auth, &format!("Bearer {KEY}"));
            assert_eq!(model, "test-embed-1");
            assert!((1..=4).contains(n), "at most `batch` texts a request");
        }
    }
    assert_eq!(
        metric(&server, "agentry_discovery_embedder_loaded").await,
        1.0
    );

    // The endpoint goes down: queries are answered by words and tags, and
    // say so; a record registered meanwhile is indexed without vectors and
    // still found.
    service.failing.store(true, Ordering::SeqCst);
    let r = discover(&h, "translate text into chinese").await;
    assert_eq!(ids(&r)[0], "translator", "{r}");
    let warnings = r["warnings"].to_string();
    assert!(
        warnings.contains("could not be embedded") && warnings.contains("503"),
        "{r}"
    );
    h.call(Method::POST, "/agents", Some(ALICE), Some(summarizer()))
        .await
        .expect("registers while the endpoint is down");
    let r = discover(&h, "summarize meeting").await;
    assert_eq!(ids(&r)[0], "summarizer", "{r}");
    assert!(
        r["warnings"]
            .to_string()
            .contains("1 agent(s) are indexed without vectors"),
        "{r}"
    );
    assert_eq!(
        metric(&server, "agentry_discovery_agents_without_vectors").await,
        1.0
    );
    assert_eq!(
        metric(&server, "agentry_discovery_embed_failures_total").await,
        1.0
    );

    // Back up: the next change of that record gives it its vectors.
    service.failing.store(false, Ordering::SeqCst);
    let mut updated = summarizer();
    updated["description"] = json!("Summarize meeting transcripts and calls into action items");
    h.call(
        Method::PUT,
        "/agents/summarizer",
        Some(ALICE),
        Some(updated),
    )
    .await
    .expect("updates");
    let r = discover(&h, "summarize meeting").await;
    assert_eq!(ids(&r)[0], "summarizer", "{r}");
    assert_eq!(r["warnings"], json!([]), "{r}");
    assert_eq!(
        metric(&server, "agentry_discovery_agents_without_vectors").await,
        0.0
    );
    server.stop().await;
}

#[tokio::test]
async fn an_endpoint_answering_the_wrong_length_is_refused_with_a_reason() {
    std::env::set_var(KEY_VAR, KEY);
    let (url, _service) = start_service().await;
    let server = TestServer::start_with(|c| {
        c.discovery.embedder = "openai".into();
        c.discovery.endpoint = Some(endpoint(&url, 16));
    })
    .await;
    let h = Http::new(&server.http);
    h.call(
        Method::POST,
        "/agents",
        Some(ALICE),
        Some(translator("translator")),
    )
    .await
    .expect("registers");
    let r = discover(&h, "translate text").await;
    assert_eq!(ids(&r), vec!["translator"], "{r}");
    assert!(
        r["warnings"]
            .to_string()
            .contains("answered a vector of length 48; discovery.endpoint.dimensions is 16"),
        "{r}"
    );
    server.stop().await;
}

#[tokio::test]
async fn an_embedder_configuration_that_cannot_work_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.discovery.embedder = "openai".into();
    let err = agentry::server::start(config.clone()).await.err().unwrap();
    assert!(err.to_string().contains("[discovery.endpoint]"), "{err}");

    let mut e = endpoint("ftp://127.0.0.1/embeddings", 16);
    config.discovery.endpoint = Some(e.clone());
    let err = agentry::server::start(config.clone()).await.err().unwrap();
    assert!(err.to_string().contains("http(s) URL"), "{err}");

    e.url = "http://127.0.0.1:9/v1/embeddings".into();
    e.api_key_env = Some("AGENTRY_TEST_NO_SUCH_VARIABLE".into());
    config.discovery.endpoint = Some(e);
    let err = agentry::server::start(config.clone()).await.err().unwrap();
    assert!(
        err.to_string().contains("AGENTRY_TEST_NO_SUCH_VARIABLE"),
        "{err}"
    );

    config.discovery.embedder = "word2vec".into();
    let err = agentry::server::start(config).await.err().unwrap();
    assert!(
        err.to_string().contains("discovery.embedder must be"),
        "{err}"
    );
}

#[cfg(feature = "minilm")]
#[tokio::test]
async fn minilm_from_local_files_ranks_by_meaning() {
    // scripts/test.sh fetches the model (scripts/fetch-minilm.sh).
    let server = TestServer::start_with(|c| c.discovery.embedder = "minilm".into()).await;
    let h = Http::new(&server.http);
    for meta in [translator("translator"), minimal("minimal"), summarizer()] {
        h.call(Method::POST, "/agents", Some(ALICE), Some(meta))
            .await
            .expect("registers");
    }
    let r = discover(&h, "I need the minutes of our call condensed").await;
    assert_eq!(r["warnings"], json!([]), "the model is loaded: {r}");
    assert_eq!(
        ids(&r)[0],
        "summarizer",
        "no shared word, same meaning: {r}"
    );
    assert!(
        r["candidates"][0]["score_components"]["context"]
            .as_f64()
            .is_some_and(|c| c > 0.2),
        "{r}"
    );
    assert_eq!(
        metric(&server, "agentry_discovery_embedder_loaded").await,
        1.0
    );
    server.stop().await;
}
