//! Server configuration: defaults, then a TOML file, then environment
//! variables and flags (flags and env are merged by clap in `cli`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::domain::{Limits, Role};

pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8470";
pub const DEFAULT_GRPC_ADDR: &str = "127.0.0.1:8471";
pub const DEFAULT_RAFT_ADDR: &str = "127.0.0.1:8472";
pub const DEFAULT_DATA_DIR: &str = "agentry-data";

/// An API key from the config file. Give the SHA-256 digest
/// (`key_sha256`, preferred: the file then holds no secret) or the key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    pub name: String,
    pub role: String,
    #[serde(default)]
    pub key_sha256: Option<String>,
    #[serde(default)]
    pub key: Option<String>,
}

/// Everything `agentry serve` needs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Raft node id of this node.
    pub node_id: u64,
    /// Where RocksDB, snapshots and the bootstrap admin key digest live.
    pub data_dir: PathBuf,
    /// Public gRPC listener.
    pub grpc_addr: SocketAddr,
    /// JSON/HTTP facade listener.
    pub http_addr: SocketAddr,
    /// Address this node advertises for Raft traffic.
    pub raft_addr: String,
    /// Whether reads without an API key are allowed.
    pub anonymous_reads: bool,
    /// Largest accepted record (canonical JSON bytes).
    pub max_record_bytes: usize,
    /// URL schemes accepted for endpoints.
    pub allowed_schemes: Vec<String>,
    /// Revisions of change history kept for Watch.
    pub watch_history: u64,
    /// Log entries between snapshots.
    pub snapshot_logs: u64,
    /// Seconds a unary request may take before it fails with a timeout.
    pub request_timeout_secs: u64,
    /// API keys besides the bootstrap admin key.
    pub api_keys: Vec<ApiKeyConfig>,
    /// Bootstrap admin key (normally from `AGENTRY_ADMIN_KEY`).
    #[serde(skip)]
    pub admin_key: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        let limits = Limits::default();
        Self {
            node_id: 1,
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            grpc_addr: DEFAULT_GRPC_ADDR.parse().expect("constant address parses"),
            http_addr: DEFAULT_HTTP_ADDR.parse().expect("constant address parses"),
            raft_addr: DEFAULT_RAFT_ADDR.to_string(),
            anonymous_reads: true,
            max_record_bytes: limits.max_record_bytes,
            allowed_schemes: limits.allowed_schemes,
            watch_history: 100_000,
            snapshot_logs: 10_000,
            request_timeout_secs: 30,
            api_keys: Vec::new(),
            admin_key: None,
        }
    }
}

/// Configuration problems, reported before anything starts.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("api key '{name}': {message}")]
    ApiKey { name: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    /// Loads a TOML config file over the defaults.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.into(),
            source: Box::new(source),
        })
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_record_bytes: self.max_record_bytes,
            allowed_schemes: self.allowed_schemes.clone(),
        }
    }

    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_record_bytes < 1024 {
            return Err(ConfigError::Invalid(
                "max_record_bytes must be at least 1024".into(),
            ));
        }
        if self.node_id == 0 {
            return Err(ConfigError::Invalid("node_id must be at least 1".into()));
        }
        for k in &self.api_keys {
            let err = |m: &str| ConfigError::ApiKey {
                name: k.name.clone(),
                message: m.into(),
            };
            if Role::parse(&k.role).is_none() {
                return Err(err("role must be admin, publisher or reader"));
            }
            match (&k.key_sha256, &k.key) {
                (Some(d), None) if d.len() == 64 && d.chars().all(|c| c.is_ascii_hexdigit()) => {}
                (Some(_), None) => return Err(err("key_sha256 must be 64 hex digits")),
                (None, Some(key)) if key.len() >= 16 => {}
                (None, Some(_)) => return Err(err("key must be at least 16 characters")),
                _ => return Err(err("give exactly one of key_sha256 and key")),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_overrides_defaults_and_rejects_unknown_keys() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.toml");
        std::fs::write(&p, "anonymous_reads = false\n[[api_keys]]\nname = \"ci\"\nrole = \"publisher\"\nkey = \"0123456789abcdef\"\n").unwrap();
        let c = Config::from_file(&p).unwrap();
        assert!(!c.anonymous_reads);
        assert_eq!(c.grpc_addr.to_string(), DEFAULT_GRPC_ADDR);
        c.validate().unwrap();
        std::fs::write(&p, "anonymous_read = false\n").unwrap();
        assert!(Config::from_file(&p).is_err());
    }
}
