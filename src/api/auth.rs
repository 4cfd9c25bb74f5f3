//! Credentials to a typed identity; nothing else. Bearer API keys map to a
//! principal with a role; bearer JWTs are checked against their issuer's
//! keys (`jwt`); client certificates (mutual TLS on the public listeners)
//! map to principals by the DNS names they are valid for. Keys are kept as
//! SHA-256 digests, so neither the config file nor memory dumps need to
//! hold the secrets themselves.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::jwt::JwtVerifier;
use crate::domain::{Principal, Role};
use crate::listener::Peer;
use crate::service::ServiceError;

/// Who made a request, as found in request extensions. `None` is anonymous.
#[derive(Debug, Clone, Default)]
pub struct Identity(pub Option<Principal>);

/// Hex SHA-256 of an API key.
pub fn key_digest(key: &str) -> String {
    crate::crypto::hex(&Sha256::digest(key.as_bytes()))
}

/// `[[client_certificates]]`: a client certificate valid for `dns_name`
/// (a DNS subject alternative name) is this principal.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CertPrincipal {
    pub dns_name: String,
    pub name: String,
    pub role: Role,
    #[serde(default)]
    pub tenant: Option<String>,
}

/// Maps credentials to principals.
#[derive(Clone, Default)]
pub struct Authenticator {
    by_digest: HashMap<String, Principal>,
    jwt: Option<Arc<JwtVerifier>>,
    certs: Vec<CertPrincipal>,
}

impl Authenticator {
    /// Adds a key by the hex SHA-256 digest of its secret.
    pub fn add_digest(&mut self, digest: &str, principal: Principal) {
        self.by_digest
            .insert(digest.to_ascii_lowercase(), principal);
    }

    /// Accepts bearer JWTs checked by `verifier`.
    pub fn with_jwt(mut self, verifier: Arc<JwtVerifier>) -> Self {
        self.jwt = Some(verifier);
        self
    }

    /// Maps client certificates to principals.
    pub fn with_client_certificates(mut self, certs: Vec<CertPrincipal>) -> Self {
        self.certs = certs;
        self
    }

    /// Identifies the caller from `authorization: Bearer <key or JWT>`,
    /// else from its client certificate. No credential is anonymous; a
    /// wrong or malformed one is refused rather than downgraded. So are
    /// several: a proxy in front that checked another of them than the
    /// first, which this node would read, would let one caller act as
    /// another.
    pub async fn identify(
        &self,
        headers: &http::HeaderMap,
        peer: Option<&Peer>,
    ) -> Result<Identity, ServiceError> {
        let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
        let Some(value) = values.next() else {
            return Ok(Identity(peer.and_then(|p| self.by_certificate(p))));
        };
        if values.next().is_some() {
            return Err(ServiceError::Unauthorized(
                "send one authorization header, not several".into(),
            ));
        }
        let value = value.to_str().map_err(|_| {
            ServiceError::Unauthorized("the authorization header is not valid text".into())
        })?;
        // The scheme is case-insensitive (RFC 9110 11.1).
        let credential = value
            .split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, rest)| rest.trim())
            .filter(|k| !k.is_empty())
            .ok_or_else(|| {
                ServiceError::Unauthorized("use 'Authorization: Bearer <api key or token>'".into())
            })?;
        if let Some(jwt) = &self.jwt {
            if JwtVerifier::looks_like_jwt(credential) {
                return jwt
                    .verify(credential)
                    .await
                    .map(|p| Identity(Some(p)))
                    .map_err(|e| ServiceError::Unauthorized(e.to_string()));
            }
        }
        self.by_digest
            .get(&key_digest(credential))
            .cloned()
            .map(|p| Identity(Some(p)))
            .ok_or_else(|| ServiceError::Unauthorized("unknown API key".into()))
    }

    /// The principal a verified client certificate maps to, if any.
    fn by_certificate(&self, peer: &Peer) -> Option<Principal> {
        let cert = peer.client_cert.as_ref()?;
        let parsed = rustls::server::ParsedCertificate::try_from(cert).ok()?;
        self.certs.iter().find_map(|m| {
            let name = rustls::pki_types::ServerName::try_from(m.dns_name.clone()).ok()?;
            rustls::client::verify_server_name(&parsed, &name)
                .ok()
                .map(|_| Principal::new(m.name.clone(), m.role).in_tenant(m.tenant.clone()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Role;

    fn md(auth: Option<&str>) -> http::HeaderMap {
        let mut m = http::HeaderMap::new();
        if let Some(a) = auth {
            m.insert("authorization", a.parse().unwrap());
        }
        m
    }

    #[tokio::test]
    async fn bearer_keys_map_to_principals() {
        let mut a = Authenticator::default();
        a.add_digest(&key_digest("s3cret"), Principal::new("ci", Role::Publisher));
        assert_eq!(
            a.identify(&md(Some("Bearer s3cret")), None)
                .await
                .unwrap()
                .0
                .unwrap()
                .name,
            "ci"
        );
        assert!(a.identify(&md(None), None).await.unwrap().0.is_none());
        assert!(a.identify(&md(Some("Bearer nope")), None).await.is_err());
        assert!(a.identify(&md(Some("Basic abc")), None).await.is_err());
        // The scheme's case does not matter; a scheme alone is no credential.
        for scheme in ["bearer", "BEARER", "BeaRer"] {
            let who = a
                .identify(&md(Some(&format!("{scheme} s3cret"))), None)
                .await;
            assert_eq!(who.unwrap().0.unwrap().name, "ci", "{scheme}");
        }
        assert!(a.identify(&md(Some("Bearer")), None).await.is_err());
        assert!(a.identify(&md(Some("Bearer  ")), None).await.is_err());
        // Two credentials, even a good one first, are refused.
        let mut two = md(Some("Bearer s3cret"));
        two.append("authorization", "Bearer nope".parse().unwrap());
        let e = a.identify(&two, None).await.unwrap_err();
        assert!(e.to_string().contains("one authorization header"), "{e}");
    }
}
