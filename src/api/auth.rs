//! Credentials to a typed identity; nothing else. Bearer API keys map to a
//! principal with a role. Keys are kept as SHA-256 digests, so neither the
//! config file nor memory dumps need to hold the secrets themselves.

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use tonic::metadata::MetadataMap;

use crate::domain::Principal;
use crate::service::ServiceError;

/// Who made a request, as found in request extensions. `None` is anonymous.
#[derive(Debug, Clone, Default)]
pub struct Identity(pub Option<Principal>);

/// Hex SHA-256 of an API key.
pub fn key_digest(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Maps API keys to principals.
#[derive(Debug, Clone, Default)]
pub struct Authenticator {
    by_digest: HashMap<String, Principal>,
}

impl Authenticator {
    /// Adds a key by the hex SHA-256 digest of its secret.
    pub fn add_digest(&mut self, digest: &str, principal: Principal) {
        self.by_digest
            .insert(digest.to_ascii_lowercase(), principal);
    }

    /// Identifies the caller from `authorization: Bearer <key>`. No header is
    /// anonymous; a wrong or malformed one is refused rather than downgraded.
    pub fn identify(&self, metadata: &MetadataMap) -> Result<Identity, ServiceError> {
        let Some(value) = metadata.get("authorization") else {
            return Ok(Identity(None));
        };
        let value = value.to_str().map_err(|_| {
            ServiceError::Unauthorized("the authorization header is not valid text".into())
        })?;
        let key = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .ok_or_else(|| {
                ServiceError::Unauthorized("use 'Authorization: Bearer <api key>'".into())
            })?;
        self.by_digest
            .get(&key_digest(key))
            .cloned()
            .map(|p| Identity(Some(p)))
            .ok_or_else(|| ServiceError::Unauthorized("unknown API key".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Role;

    fn md(auth: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Some(a) = auth {
            m.insert("authorization", a.parse().unwrap());
        }
        m
    }

    #[test]
    fn bearer_keys_map_to_principals() {
        let mut a = Authenticator::default();
        a.add_digest(
            &key_digest("s3cret"),
            Principal {
                name: "ci".into(),
                role: Role::Publisher,
            },
        );
        assert_eq!(
            a.identify(&md(Some("Bearer s3cret")))
                .unwrap()
                .0
                .unwrap()
                .name,
            "ci"
        );
        assert!(a.identify(&md(None)).unwrap().0.is_none());
        assert!(a.identify(&md(Some("Bearer nope"))).is_err());
        assert!(a.identify(&md(Some("Basic abc"))).is_err());
    }
}
