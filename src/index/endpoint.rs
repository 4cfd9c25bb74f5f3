//! An OpenAI-compatible embeddings endpoint (`POST …/embeddings` with
//! `{"model", "input": [...]}`, answering `{"data": [{"index", "embedding"}]}`),
//! for operators who already run an embedding service or want a larger
//! model than the registry should host.
//!
//! Every answer is checked (one finite vector of the configured length per
//! input) and normalised, because some servers return raw vectors and the
//! index assumes unit length.

use std::time::Duration;

use futures::{stream, StreamExt, TryStreamExt};
use serde::Deserialize;
use serde_json::json;

use super::config::EndpointConfig;
use super::embed::EmbedError;
use super::search::normalise;

/// Requests in flight at once while a batch larger than `batch` is sent.
const IN_FLIGHT: usize = 4;
/// Longest piece of an error body quoted back.
const QUOTE: usize = 300;

#[derive(Debug)]
pub struct Endpoint {
    client: reqwest::Client,
    url: String,
    model: String,
    dimensions: usize,
    send_dimensions: bool,
    batch: usize,
    api_key: Option<String>,
}

#[derive(Deserialize)]
struct Answer {
    data: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    index: usize,
    embedding: Vec<f32>,
}

impl Endpoint {
    pub fn new(config: &EndpointConfig) -> Result<Self, EmbedError> {
        let api_key = match &config.api_key_env {
            Some(var) => Some(std::env::var(var).map_err(|_| EmbedError::Endpoint {
                url: config.url.clone(),
                message: format!("the API key variable {var} is not set"),
            })?),
            None => None,
        };
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(config.timeout_ms))
            .build()
            .map_err(|e| EmbedError::Endpoint {
                url: config.url.clone(),
                message: e.to_string(),
            })?;
        Ok(Self {
            client,
            url: config.url.clone(),
            model: config.model.clone(),
            dimensions: config.dimensions,
            send_dimensions: config.send_dimensions,
            batch: config.batch.max(1),
            api_key,
        })
    }

    pub fn dim(&self) -> usize {
        self.dimensions
    }

    fn error(&self, message: String) -> EmbedError {
        EmbedError::Endpoint {
            url: self.url.clone(),
            message,
        }
    }

    /// One unit vector per text, in order; requests of at most `batch`
    /// texts, a few in flight.
    pub async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let chunks: Vec<Vec<String>> = texts.chunks(self.batch).map(<[String]>::to_vec).collect();
        let parts: Vec<Vec<Vec<f32>>> = stream::iter(chunks)
            .map(|chunk| self.call(chunk))
            .buffered(IN_FLIGHT)
            .try_collect()
            .await?;
        Ok(parts.into_iter().flatten().collect())
    }

    async fn call(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut body = json!({
            "model": self.model,
            "input": texts,
            "encoding_format": "float",
        });
        if self.send_dimensions {
            body["dimensions"] = self.dimensions.into();
        }
        let mut request = self.client.post(&self.url).json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request
            .send()
            .await
            .map_err(|e| self.error(without_url(&e)))?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| self.error(without_url(&e)))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes);
            let quoted: String = text.chars().take(QUOTE).collect();
            return Err(self.error(format!("answered {status}: {quoted}")));
        }
        let answer: Answer = serde_json::from_slice(&bytes)
            .map_err(|e| self.error(format!("not an embeddings answer: {e}")))?;
        if answer.data.len() != texts.len() {
            return Err(self.error(format!(
                "answered {} vectors for {} texts",
                answer.data.len(),
                texts.len()
            )));
        }
        let mut out: Vec<Option<Vec<f32>>> = vec![None; texts.len()];
        for item in answer.data {
            if item.embedding.len() != self.dimensions {
                return Err(self.error(format!(
                    "answered a vector of length {}; discovery.endpoint.dimensions is {}",
                    item.embedding.len(),
                    self.dimensions
                )));
            }
            if item.embedding.iter().any(|x| !x.is_finite()) {
                return Err(self.error("answered a vector with a non-finite value".into()));
            }
            let Some(slot) = out.get_mut(item.index) else {
                return Err(self.error(format!("answered index {} out of range", item.index)));
            };
            let mut v = item.embedding;
            normalise(&mut v);
            *slot = Some(v);
        }
        out.into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| self.error("answered the same index twice".into()))
    }
}

/// reqwest's messages repeat the URL, which the error already names.
fn without_url(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    };
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(e);
    let mut detail = String::new();
    while let Some(s) = source {
        detail = s.to_string();
        source = s.source();
    }
    if detail.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}: {detail}")
    }
}
