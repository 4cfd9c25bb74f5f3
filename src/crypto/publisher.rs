//! Publisher signatures (ADP `signature`): a publisher signs its own
//! metadata with a key it registered here, bound to its principal and to
//! the agent id prefixes it vouches for; the registry checks the signature
//! when it accepts the metadata and records the verdict in the envelope
//! (which its own signature then covers).
//!
//! The signed bytes are the RFC 8785 canonical form of the metadata as the
//! registry reads it — the submitted members, with empty arrays, empty
//! objects and nulls of the record's known members left out — without the
//! `signature` member itself. The `signature` member is
//! `{"alg": "Ed25519", "key_id": …, "value": <base64url>}`; `agentry keys
//! sign-metadata` produces it.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier};
use serde_json::{Map, Value};

use super::canonical::canonical;
use super::keys::decode_public;
use super::signature::ALG;
use crate::domain::{
    AgentMetadata, FieldError, PublisherKey, PublisherVerification, VerificationState,
};

/// The bytes a publisher signs.
pub fn signed_bytes(metadata: &AgentMetadata) -> String {
    let mut value = serde_json::to_value(metadata).unwrap_or(Value::Null);
    if let Some(obj) = value.as_object_mut() {
        obj.remove("signature");
    }
    canonical(&value)
}

/// Signs `metadata` in place with `secret` (base64url seed).
pub fn sign_metadata(
    metadata: &mut AgentMetadata,
    secret: &str,
) -> Result<String, super::CryptoError> {
    let seed = URL_SAFE_NO_PAD
        .decode(secret.trim().trim_end_matches('='))
        .map_err(|e| super::CryptoError::BadKey(format!("the seed is not base64url: {e}")))?;
    let seed: [u8; 32] = seed
        .try_into()
        .map_err(|_| super::CryptoError::BadKey("the seed must be 32 bytes".into()))?;
    let key = SigningKey::from_bytes(&seed);
    let key_id = super::keys::key_id(&key.verifying_key());
    metadata.signature = None;
    let value = URL_SAFE_NO_PAD.encode(key.sign(signed_bytes(metadata).as_bytes()).to_bytes());
    let mut sig = Map::new();
    sig.insert("alg".into(), ALG.into());
    sig.insert("key_id".into(), key_id.clone().into());
    sig.insert("value".into(), value.into());
    metadata.signature = Some(sig);
    Ok(key_id)
}

/// The verdict on `metadata`'s signature for a record owned by `owner`,
/// given the registered publisher keys. A signature that names a registered
/// key but is wrong is an error naming the member (the write fails: it is
/// not a weaker claim).
pub fn verify_publisher(
    metadata: &AgentMetadata,
    owner: &str,
    owner_tenant: Option<&str>,
    keys: &[PublisherKey],
) -> Result<PublisherVerification, FieldError> {
    let Some(sig) = &metadata.signature else {
        return Ok(PublisherVerification::self_asserted(
            "the metadata is not signed",
        ));
    };
    let text = |name: &str| sig.get(name).and_then(Value::as_str);
    let (Some(key_id), Some(value)) = (text("key_id"), text("value")) else {
        // Some other kind of ADP signature (a credential reference, a
        // detached JWS, …): kept as it came, not checked.
        return Ok(PublisherVerification::self_asserted(
            "the signature is not an Ed25519 signature with key_id and value",
        ));
    };
    if text("alg").is_some_and(|a| !a.eq_ignore_ascii_case(ALG)) {
        return Ok(PublisherVerification::self_asserted(format!(
            "signature algorithm {} is not checked here",
            text("alg").unwrap_or_default()
        )));
    }
    let Some(key) = keys.iter().find(|k| k.key_id == key_id) else {
        return Ok(PublisherVerification::self_asserted(format!(
            "key {key_id} is not registered here"
        )));
    };
    if !key.belongs_to(owner, owner_tenant) {
        return Ok(PublisherVerification::self_asserted(format!(
            "key {key_id} belongs to another publisher"
        )));
    }
    if !key.covers(&metadata.id) {
        return Ok(PublisherVerification::self_asserted(format!(
            "the id is outside the namespaces of key {key_id}"
        )));
    }
    let raw = URL_SAFE_NO_PAD
        .decode(value.trim_end_matches('='))
        .ok()
        .and_then(|b| <[u8; 64]>::try_from(b).ok())
        .ok_or_else(|| FieldError::new("/signature/value", "not a base64url Ed25519 signature"))?;
    let public = decode_public(&key.public_key)
        .map_err(|e| FieldError::new("/signature/key_id", format!("key {key_id}: {e}")))?;
    public
        .verify(signed_bytes(metadata).as_bytes(), &Signature::from_bytes(&raw))
        .map_err(|_| {
            FieldError::new(
                "/signature",
                format!("does not verify with key {key_id} (the metadata was changed after signing, or signed by another key)"),
            )
        })?;
    Ok(PublisherVerification {
        state: VerificationState::Verified,
        key_id: Some(key_id.to_string()),
        reason: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: [u8; 32] = [5; 32];

    fn key(principal: &str, namespaces: &[&str]) -> PublisherKey {
        let signing = SigningKey::from_bytes(&SEED);
        PublisherKey {
            key_id: super::super::keys::key_id(&signing.verifying_key()),
            public_key: URL_SAFE_NO_PAD.encode(signing.verifying_key().as_bytes()),
            principal: principal.into(),
            namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
            added_at: "2026-01-01T00:00:00Z".into(),
            tenant: None,
        }
    }

    fn metadata() -> AgentMetadata {
        serde_json::from_value(serde_json::json!({
            "id": "urn:acme:agents:translate",
            "name": "Translator",
            "description": "Translates.",
            "bindings": [{"protocol": "https", "endpoint": "https://acme.example/t"}],
            "x-acme": {"tier": 2}
        }))
        .unwrap()
    }

    #[test]
    fn a_registered_key_in_its_namespace_verifies_and_anything_else_is_self_asserted() {
        let mut m = metadata();
        sign_metadata(&mut m, &URL_SAFE_NO_PAD.encode(SEED)).unwrap();
        let keys = [key("acme", &["urn:acme:"])];
        let v = verify_publisher(&m, "acme", None, &keys).unwrap();
        assert_eq!(v.state, VerificationState::Verified);
        assert_eq!(v.key_id.as_deref(), Some(keys[0].key_id.as_str()));

        for (owner, keys, why) in [
            ("acme", vec![], "not registered"),
            (
                "mallory",
                vec![key("acme", &["urn:acme:"])],
                "another publisher",
            ),
            (
                "acme",
                vec![key("acme", &["urn:other:"])],
                "outside the namespaces",
            ),
        ] {
            let v = verify_publisher(&m, owner, None, &keys).unwrap();
            assert_eq!(v.state, VerificationState::SelfAsserted);
            assert!(v.reason.as_deref().unwrap().contains(why), "{v:?}");
        }
        let unsigned = verify_publisher(&metadata(), "acme", None, &keys).unwrap();
        assert_eq!(unsigned.state, VerificationState::SelfAsserted);
    }

    #[test]
    fn altered_metadata_or_a_broken_value_fails_the_write() {
        let keys = [key("acme", &["urn:acme:"])];
        let mut m = metadata();
        sign_metadata(&mut m, &URL_SAFE_NO_PAD.encode(SEED)).unwrap();
        let mut altered = m.clone();
        altered.description = "Translates, and keeps a copy.".into();
        assert!(verify_publisher(&altered, "acme", None, &keys).is_err());
        let mut broken = m.clone();
        if let Some(sig) = broken.signature.as_mut() {
            sig.insert("value".into(), "AAAA".into());
        }
        assert!(verify_publisher(&broken, "acme", None, &keys).is_err());
        // Another kind of signature object is kept, not judged.
        let mut other = metadata();
        other.signature =
            Some(serde_json::from_value(serde_json::json!({"jws": "eyJ..."})).unwrap());
        assert_eq!(
            verify_publisher(&other, "acme", None, &keys).unwrap().state,
            VerificationState::SelfAsserted
        );
    }
}
