//! Record signatures: what a registry signs, and how anyone checks it.
//!
//! The signed bytes are the RFC 8785 canonical form of the record *as
//! served* (`GET /agents/{id}`: the metadata members plus the `registry`
//! envelope), with two members left out because they are not facts fixed at
//! signing time: `registry.expired` (computed when read) and
//! `registry.signature.value` (the signature itself). Everything else —
//! metadata, owner, revision, timestamps, status, visibility, and the
//! signature's own `alg`, `authority`, `key_id` and `signed_at` — is
//! covered. A client needs nothing of Agentry's to check it: drop those
//! two members, canonicalise, verify with the key named by `key_id`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ed25519_dalek::{Signature, Verifier, VerifyingKey};
use serde_json::{Map, Value};

use super::canonical::canonical;
use super::keys::{Identity, Signer};
use super::CryptoError;
use crate::domain::{AgentRecord, RegistrySignature, ENVELOPE_MEMBER};

pub const ALG: &str = "Ed25519";

/// The served JSON form of a stored record, as the HTTP facade writes it
/// (the facade's own conversion is checked against this by the API tests).
pub fn served_form(record: &AgentRecord) -> Value {
    let mut obj = match serde_json::to_value(&record.metadata) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let envelope = serde_json::to_value(&record.envelope).unwrap_or(Value::Null);
    obj.insert(ENVELOPE_MEMBER.to_string(), envelope);
    Value::Object(obj)
}

/// The bytes a signature covers, from a served record.
pub fn signed_bytes(served: &Value) -> Result<String, CryptoError> {
    signed_form(served.clone())
}

/// [`signed_bytes`] of a served record the caller no longer needs (the
/// signer's own, built just to be signed), without copying it.
fn signed_form(mut doc: Value) -> Result<String, CryptoError> {
    let registry = doc
        .get_mut(ENVELOPE_MEMBER)
        .and_then(Value::as_object_mut)
        .ok_or(CryptoError::Unsigned)?;
    registry.remove("expired");
    let signature = registry
        .get_mut("signature")
        .and_then(Value::as_object_mut)
        .ok_or(CryptoError::Unsigned)?;
    signature.remove("value");
    Ok(canonical(&doc))
}

/// The signature object of a served record.
pub fn signature_of(served: &Value) -> Result<RegistrySignature, CryptoError> {
    let sig = served
        .get(ENVELOPE_MEMBER)
        .and_then(|r| r.get("signature"))
        .ok_or(CryptoError::Unsigned)?;
    serde_json::from_value(sig.clone()).map_err(|e| CryptoError::Malformed(e.to_string()))
}

/// Signs `record` in place at `now`.
pub fn sign_record(signer: &Signer, record: &mut AgentRecord, now: &str) {
    sign_record_with(signer, record, now, |bytes| signer.sign(bytes));
}

/// [`sign_record`], with `sign` turning the signed bytes into the value
/// (a follower takes its leader's signature of the same bytes:
/// `signature_book`).
pub fn sign_record_with(
    signer: &Signer,
    record: &mut AgentRecord,
    now: &str,
    sign: impl FnOnce(&[u8]) -> String,
) {
    record.envelope.signature = Some(RegistrySignature {
        alg: ALG.into(),
        authority: signer.authority.clone(),
        key_id: signer.key_id.clone(),
        signed_at: now.to_string(),
        value: String::new(),
    });
    // The served form of a record always has its envelope and signature,
    // so the signed bytes always exist.
    let value = signed_form(served_form(record))
        .map(|bytes| sign(bytes.as_bytes()))
        .unwrap_or_default();
    if let Some(sig) = record.envelope.signature.as_mut() {
        sig.value = value;
    }
}

/// Checks a served record's signature with `key` (the caller has chosen
/// the key by the signature's `key_id` and decided it may be trusted).
pub fn verify_served(served: &Value, key: &VerifyingKey) -> Result<RegistrySignature, CryptoError> {
    verify_served_with(served, key, None)
}

/// Signatures already checked, so records a peer serves again and again
/// (federated discovery returns the same agents query after query) are not
/// verified again. An entry is the digest of the key, the signature and the
/// exact signed bytes, so a hit means precisely these bytes verified with
/// this key before; anything changed misses and is verified in full.
#[derive(Debug, Default)]
pub struct Verified {
    seen: std::sync::Mutex<std::collections::HashSet<[u8; 32]>>,
}

/// Entries kept before the memo starts over (32 bytes each).
const VERIFIED_ENTRIES: usize = 1 << 16;

impl Verified {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<[u8; 32]>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// [`verify_served`], skipping the Ed25519 check for bytes `verified`
/// has seen verify with this key.
pub fn verify_served_with(
    served: &Value,
    key: &VerifyingKey,
    verified: Option<&Verified>,
) -> Result<RegistrySignature, CryptoError> {
    let sig = signature_of(served)?;
    if sig.alg != ALG {
        return Err(CryptoError::Malformed(format!(
            "algorithm {} (only {ALG} is used)",
            sig.alg
        )));
    }
    let raw = URL_SAFE_NO_PAD
        .decode(sig.value.trim_end_matches('='))
        .map_err(|e| CryptoError::Malformed(format!("signature is not base64url: {e}")))?;
    let raw: [u8; 64] = raw
        .try_into()
        .map_err(|_| CryptoError::Malformed("an Ed25519 signature is 64 bytes".into()))?;
    let bytes = signed_bytes(served)?;
    let digest = verified.map(|_| {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(key.as_bytes());
        h.update(raw);
        h.update(bytes.as_bytes());
        <[u8; 32]>::from(h.finalize())
    });
    if let (Some(memo), Some(d)) = (verified, &digest) {
        if memo.lock().contains(d) {
            return Ok(sig);
        }
    }
    key.verify(bytes.as_bytes(), &Signature::from_bytes(&raw))
        .map_err(|_| CryptoError::BadSignature)?;
    if let (Some(memo), Some(d)) = (verified, digest) {
        let mut seen = memo.lock();
        if seen.len() >= VERIFIED_ENTRIES {
            seen.clear();
        }
        seen.insert(d);
    }
    Ok(sig)
}

/// Checks a served record against an identity's published keys: the key
/// must be known, valid and in its window at `signed_at`, and the authority
/// must match.
pub fn verify_with_identity(
    served: &Value,
    identity: &Identity,
) -> Result<RegistrySignature, CryptoError> {
    let sig = signature_of(served)?;
    if sig.authority != identity.authority {
        return Err(CryptoError::WrongAuthority {
            claimed: sig.authority,
            expected: identity.authority.clone(),
        });
    }
    let key = identity
        .keys
        .iter()
        .find(|k| k.key_id == sig.key_id)
        .ok_or_else(|| CryptoError::UnknownKey(sig.key_id.clone()))?;
    if !key.accepts_at(&sig.signed_at) {
        return Err(CryptoError::KeyNotValid {
            key_id: sig.key_id.clone(),
            state: format!("{:?}", key.state).to_lowercase(),
        });
    }
    verify_served(served, &key.verifying_key()?)
}

/// Whether a stored record's signature is one the identity still accepts
/// (records that fail are re-signed when the identity changes).
pub fn still_valid(record: &AgentRecord, identity: &Identity) -> bool {
    record.envelope.signature.as_ref().is_some_and(|s| {
        s.authority == identity.authority && identity.accepts(&s.key_id, &s.signed_at)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::keys::{IdentityChange, NewKey};
    use crate::domain::{AgentMetadata, Envelope};

    fn identity() -> Identity {
        let change = IdentityChange::Establish {
            authority: "registry.example.org".into(),
            keys: vec![NewKey {
                secret: URL_SAFE_NO_PAD.encode([7u8; 32]),
                not_after: None,
            }],
            imported: false,
        };
        Identity::apply(None, &change, "2026-01-01T00:00:00Z")
            .unwrap()
            .0
            .unwrap()
    }

    fn record() -> AgentRecord {
        let metadata: AgentMetadata = serde_json::from_value(serde_json::json!({
            "id": "urn:agent:translate",
            "name": "Translator",
            "description": "Translates text between languages — fast.",
            "tags": ["translation"],
            "bindings": [{"protocol": "https", "endpoint": "https://t.example/a", "priority": 1}],
            "x-rating": 4.50,
            "x-nested": {"b": [1, 2.0], "a": "\u{1f600}"}
        }))
        .unwrap();
        AgentRecord {
            metadata,
            envelope: Envelope {
                owner: "alice".into(),
                revision: 12,
                created_revision: 3,
                registered_at: "2026-03-01T10:00:00Z".into(),
                modified_at: "2026-03-02T10:00:00Z".into(),
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_signed_record_verifies_in_any_member_order_and_tampering_is_caught() {
        let id = identity();
        let mut r = record();
        sign_record(&id.signer().unwrap(), &mut r, "2026-03-02T10:00:00Z");
        let served = served_form(&r);
        verify_with_identity(&served, &id.public()).unwrap();

        // Reordered members and re-spaced text: still valid.
        let mut reordered: Map<String, Value> = Map::new();
        let obj = served.as_object().unwrap();
        for (k, v) in obj.iter().rev() {
            reordered.insert(k.clone(), v.clone());
        }
        let text = serde_json::to_string_pretty(&Value::Object(reordered)).unwrap();
        let back: Value = serde_json::from_str(&text).unwrap();
        verify_with_identity(&back, &id).unwrap();

        // A derived `expired` flag is not covered.
        let mut flagged = served.clone();
        flagged[ENVELOPE_MEMBER]["expired"] = Value::Bool(true);
        verify_with_identity(&flagged, &id).unwrap();

        // Any covered change breaks it.
        for (pointer, value) in [
            ("/description", Value::String("Translates text.".into())),
            ("/registry/owner", Value::String("mallory".into())),
            ("/registry/revision", Value::from(13)),
            (
                "/registry/signature/signed_at",
                Value::String("2026-03-03T00:00:00Z".into()),
            ),
            ("/x-nested/a", Value::String("x".into())),
        ] {
            let mut t = served.clone();
            *t.pointer_mut(pointer).unwrap() = value;
            assert_eq!(
                verify_with_identity(&t, &id).unwrap_err(),
                CryptoError::BadSignature,
                "{pointer}"
            );
        }
        let mut added = served.clone();
        added["endpoint"] = Value::String("https://evil.example".into());
        assert_eq!(
            verify_with_identity(&added, &id).unwrap_err(),
            CryptoError::BadSignature
        );
    }

    #[test]
    fn the_verified_memo_skips_only_bytes_that_verified_before() {
        let id = identity();
        let key = id.keys[0].verifying_key().unwrap();
        let mut r = record();
        sign_record(&id.signer().unwrap(), &mut r, "2026-03-02T10:00:00Z");
        let served = served_form(&r);
        let memo = Verified::default();
        verify_served_with(&served, &key, Some(&memo)).unwrap();
        verify_served_with(&served, &key, Some(&memo)).unwrap();
        assert_eq!(memo.lock().len(), 1);
        // The same signature over other content is still refused.
        let mut forged = served.clone();
        forged["description"] = Value::String("changed".into());
        assert_eq!(
            verify_served_with(&forged, &key, Some(&memo)).unwrap_err(),
            CryptoError::BadSignature
        );
        assert_eq!(memo.lock().len(), 1);
    }

    #[test]
    fn unknown_keys_other_authorities_and_ended_keys_are_refused() {
        let id = identity();
        let mut r = record();
        sign_record(&id.signer().unwrap(), &mut r, "2026-03-02T10:00:00Z");
        let served = served_form(&r);

        let mut other = id.clone();
        other.authority = "other.example".into();
        assert!(matches!(
            verify_with_identity(&served, &other),
            Err(CryptoError::WrongAuthority { .. })
        ));

        let rotated = Identity::apply(
            Some(&id),
            &IdentityChange::Rotate {
                key: NewKey {
                    secret: URL_SAFE_NO_PAD.encode([9u8; 32]),
                    not_after: None,
                },
            },
            "2026-04-01T00:00:00Z",
        )
        .unwrap()
        .0
        .unwrap();
        verify_with_identity(&served, &rotated).unwrap();
        assert!(still_valid(&r, &rotated));
        let revoked = Identity::apply(
            Some(&rotated),
            &IdentityChange::Revoke {
                key_id: id.signing_key.clone(),
            },
            "2026-04-02T00:00:00Z",
        )
        .unwrap()
        .0
        .unwrap();
        assert!(matches!(
            verify_with_identity(&served, &revoked),
            Err(CryptoError::KeyNotValid { .. })
        ));
        assert!(!still_valid(&r, &revoked));
        // Re-signed with the new key, it verifies again.
        sign_record(&revoked.signer().unwrap(), &mut r, "2026-04-02T00:00:00Z");
        verify_with_identity(&served_form(&r), &revoked).unwrap();

        let mut stranger = revoked.clone();
        stranger.keys.retain(|k| k.key_id != revoked.signing_key);
        assert!(matches!(
            verify_with_identity(&served_form(&r), &stranger),
            Err(CryptoError::UnknownKey(_))
        ));
    }

    #[test]
    fn unsigned_and_malformed_signatures_are_reported() {
        let served = served_form(&record());
        assert_eq!(
            verify_with_identity(&served, &identity()).unwrap_err(),
            CryptoError::Unsigned
        );
        let id = identity();
        let mut r = record();
        sign_record(&id.signer().unwrap(), &mut r, "2026-03-02T10:00:00Z");
        let mut bad = served_form(&r);
        bad[ENVELOPE_MEMBER]["signature"]["value"] = Value::String("!!".into());
        assert!(matches!(
            verify_with_identity(&bad, &id),
            Err(CryptoError::Malformed(_))
        ));
    }
}
