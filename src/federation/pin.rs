//! Pinning a peer's keys from its `/.well-known/agentry.json`: fetched on
//! first start, written to `peers/<authority>.json` in the data directory,
//! and read from there ever after. A later key of the peer is trusted only
//! when the operator pins it (adds it to `keys`, or deletes the file to
//! fetch again) — a compromised web server cannot swap keys silently.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ed25519_dalek::VerifyingKey;
use serde_json::Value;
use tracing::{info, warn};

use super::{Peer, Peers};
use crate::crypto::keys::decode_public;

/// How often a failed fetch is retried.
const RETRY: Duration = Duration::from_secs(10);

fn pin_file(data_dir: &Path, authority: &str) -> PathBuf {
    peer_file(data_dir, authority, "json")
}

/// Where a node notes the peer's trust fingerprint its copies were last
/// listed under (`Peer::trust_fingerprint`).
pub(super) fn listed_file(data_dir: &Path, authority: &str) -> PathBuf {
    peer_file(data_dir, authority, "listed")
}

fn peer_file(data_dir: &Path, authority: &str, extension: &str) -> PathBuf {
    // Authorities are DNS names; anything else is escaped out of the path.
    let safe: String = authority
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    data_dir.join("peers").join(format!("{safe}.{extension}"))
}

/// The valid keys of a registry-info document, if it names `authority`.
fn keys_of(doc: &Value, authority: &str) -> Result<Vec<VerifyingKey>, String> {
    let named = doc.get("authority").and_then(Value::as_str).unwrap_or("");
    if named != authority {
        return Err(format!(
            "the document is for authority '{named}', not '{authority}'"
        ));
    }
    let keys: Vec<VerifyingKey> = doc
        .get("keys")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|k| k.get("state").and_then(Value::as_str) == Some("valid"))
        .filter_map(|k| k.get("public_key").and_then(Value::as_str))
        .map(|k| decode_public(k).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    if keys.is_empty() {
        return Err("the document lists no valid key".into());
    }
    Ok(keys)
}

/// Replaces `path` whole: a crash leaves the old file or the new one.
pub(super) fn write_file(path: &Path, contents: &str) -> Result<(), String> {
    let failed = |e: std::io::Error| format!("{}: {e}", path.display());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(failed)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, contents).map_err(failed)?;
    std::fs::rename(&tmp, path).map_err(failed)
}

async fn fetch(url: &str) -> Result<Value, String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    let resp = client.get(url).send().await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status()));
    }
    resp.json().await.map_err(|e| e.to_string())
}

async fn pin_one(peer: &Peer, url: &str, data_dir: &Path) -> Result<(), String> {
    let path = pin_file(data_dir, &peer.authority);
    let doc = match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| format!("pinned file {}: {e}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let doc = fetch(url).await?;
            keys_of(&doc, &peer.authority)?;
            write_file(&path, &doc.to_string())?;
            info!(peer = %peer.authority, %url, file = %path.display(), "pinned the peer's keys");
            doc
        }
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    peer.pin(keys_of(&doc, &peer.authority)?);
    Ok(())
}

/// Pins the keys of every peer configured with a well-known URL, retrying
/// the ones whose document cannot be fetched yet.
pub async fn pin_keys(peers: Peers, data_dir: PathBuf) {
    let mut pending: Vec<_> = peers
        .all()
        .iter()
        .filter_map(|p| p.config.well_known.clone().map(|u| (p.clone(), u)))
        .collect();
    while !pending.is_empty() {
        let mut still = Vec::new();
        for (peer, url) in pending {
            if let Err(e) = pin_one(&peer, &url, &data_dir).await {
                warn!(peer = %peer.authority, %url, error = %e, "cannot pin the peer's keys yet; its records are refused until then");
                still.push((peer, url));
            }
        }
        pending = still;
        if !pending.is_empty() {
            tokio::time::sleep(RETRY).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_valid_keys_of_the_named_authority_are_pinned() {
        let k = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
        let doc = serde_json::json!({"authority": "b.example", "keys": [
            {"public_key": k, "state": "valid"},
            {"public_key": k, "state": "revoked"}
        ]});
        assert_eq!(keys_of(&doc, "b.example").unwrap().len(), 1);
        assert!(keys_of(&doc, "c.example").is_err());
        let none = serde_json::json!({"authority": "b.example", "keys": []});
        assert!(keys_of(&none, "b.example").is_err());
        assert_eq!(
            pin_file(Path::new("/d"), "../x/y"),
            PathBuf::from("/d/peers/.._x_y.json")
        );
    }
}
