//! The registry's identity: its authority name and its ed25519 keys.
//!
//! The identity is part of the replicated state (see `storage`), not a file
//! per node: every node of a cluster must sign with the same keys, and a
//! record signed during apply must come out byte-identical everywhere. So
//! keys are generated or imported *before* a command is proposed, and the
//! commands that change the identity ([`IdentityChange`]) are applied here,
//! deterministically, from their contents and the leader's clock alone.
//!
//! Lifecycle of a key: `valid` (verifies; the one named by `signing_key`
//! also signs) → `retired` (a planned end: no longer accepted) or
//! `revoked` (compromised: never accepted, and peers are told so). Records
//! signed with a key that leaves `valid` are re-signed with the signing key
//! in the same apply, so every served record always verifies.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::CryptoError;

/// Where a key stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyState {
    Valid,
    Retired,
    Revoked,
}

/// One authority key. `secret` is the 32-byte ed25519 seed; it never
/// leaves the cluster (the public views omit it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthorityKey {
    pub key_id: String,
    /// base64url (no padding) of the 32-byte public key.
    pub public_key: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret: String,
    pub state: KeyState,
    /// RFC 3339: signatures made before this are not accepted.
    pub not_before: String,
    /// RFC 3339: signatures made after this are not accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<String>,
    /// When the key was retired or revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
}

impl AuthorityKey {
    /// The key as peers see it (no secret).
    pub fn public(&self) -> Self {
        Self {
            secret: String::new(),
            ..self.clone()
        }
    }

    pub fn verifying_key(&self) -> Result<VerifyingKey, CryptoError> {
        decode_public(&self.public_key)
    }

    /// Whether a signature made at `at` (RFC 3339) by this key counts.
    pub fn accepts_at(&self, at: &str) -> bool {
        let Some(at) = crate::domain::time::parse(at) else {
            return false;
        };
        let after_start =
            crate::domain::time::parse(&self.not_before).is_some_and(|start| start <= at);
        let before_end = self
            .not_after
            .as_deref()
            .is_none_or(|end| crate::domain::time::parse(end).is_some_and(|end| at <= end));
        self.state == KeyState::Valid && after_start && before_end
    }
}

/// The registry's identity as replicated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The operator's DNS name; signatures name it.
    pub authority: String,
    pub keys: Vec<AuthorityKey>,
    /// The key that signs new records.
    pub signing_key: String,
}

/// A key made outside apply, to be proposed: its seed and optional end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewKey {
    /// base64url of the 32-byte seed.
    pub secret: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<String>,
}

impl NewKey {
    /// A fresh key from the operating system's random source.
    pub fn generate() -> Result<Self, CryptoError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| CryptoError::Random(e.to_string()))?;
        Ok(Self {
            secret: URL_SAFE_NO_PAD.encode(seed),
            not_after: None,
        })
    }
}

/// A replicated change to the identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdentityChange {
    /// Sets up the identity when there is none. With `imported` keys (from
    /// the operator's key file) it also adds any of them the identity lacks
    /// and signs with the last; generated keys only ever found an identity,
    /// so nodes racing to create one agree on the first.
    Establish {
        authority: String,
        keys: Vec<NewKey>,
        imported: bool,
    },
    /// Adds a key and signs with it from now on.
    Rotate {
        key: NewKey,
    },
    Retire {
        key_id: String,
    },
    Revoke {
        key_id: String,
    },
}

/// Why an identity change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum IdentityRefusal {
    #[error("the registry has no identity yet")]
    NoIdentity,
    #[error("no key {0}")]
    UnknownKey(String),
    #[error("key {0} signs new records; rotate to another key first")]
    SigningKey(String),
    #[error("key {0} is already {1}")]
    AlreadyEnded(String, String),
    #[error("bad key: {0}")]
    BadKey(String),
    #[error("no keys given")]
    NoKeys,
}

/// What an applied change did: whether the identity changed at all, and
/// whether records signed by keys no longer valid must be re-signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdentityOutcome {
    pub changed: bool,
}

fn seed(secret: &str) -> Result<SigningKey, IdentityRefusal> {
    let bytes = URL_SAFE_NO_PAD
        .decode(secret.trim().trim_end_matches('='))
        .map_err(|e| IdentityRefusal::BadKey(format!("the seed is not base64url: {e}")))?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|_| IdentityRefusal::BadKey("the seed must be 32 bytes".into()))?;
    Ok(SigningKey::from_bytes(&bytes))
}

/// The key id of a public key: `ed25519-` and the first 8 bytes of its
/// SHA-256, in hex. Stable, short, and the same wherever it is computed.
pub fn key_id(public: &VerifyingKey) -> String {
    let digest = Sha256::digest(public.as_bytes());
    format!("ed25519-{}", super::hex(&digest[..8]))
}

/// The public key (base64url) a seed makes.
pub fn public_key_of(secret: &str) -> Result<String, CryptoError> {
    let key = seed(secret).map_err(|e| CryptoError::BadKey(e.to_string()))?;
    Ok(URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes()))
}

/// The key id of the key a seed makes (None for a bad seed).
pub fn public_key_id(secret: &str) -> Option<String> {
    seed(secret).ok().map(|k| key_id(&k.verifying_key()))
}

pub fn decode_public(text: &str) -> Result<VerifyingKey, CryptoError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(text.trim().trim_end_matches('='))
        .map_err(|e| CryptoError::BadKey(format!("public key is not base64url: {e}")))?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|_| CryptoError::BadKey("a public key is 32 bytes".into()))?;
    VerifyingKey::from_bytes(&bytes).map_err(|e| CryptoError::BadKey(e.to_string()))
}

fn authority_key(new: &NewKey, now: &str) -> Result<AuthorityKey, IdentityRefusal> {
    let signing = seed(&new.secret)?;
    let public = signing.verifying_key();
    Ok(AuthorityKey {
        key_id: key_id(&public),
        public_key: URL_SAFE_NO_PAD.encode(public.as_bytes()),
        secret: URL_SAFE_NO_PAD.encode(signing.to_bytes()),
        state: KeyState::Valid,
        not_before: now.to_string(),
        not_after: new.not_after.clone(),
        ended_at: None,
    })
}

impl Identity {
    /// Applies `change` at `now` (the leader's clock, from the command).
    pub fn apply(
        current: Option<&Identity>,
        change: &IdentityChange,
        now: &str,
    ) -> Result<(Option<Identity>, IdentityOutcome), IdentityRefusal> {
        let unchanged = |c: Option<&Identity>| (c.cloned(), IdentityOutcome { changed: false });
        match change {
            IdentityChange::Establish {
                authority,
                keys,
                imported,
            } => {
                let last = keys.last().ok_or(IdentityRefusal::NoKeys)?;
                let new: Vec<AuthorityKey> = keys
                    .iter()
                    .map(|k| authority_key(k, now))
                    .collect::<Result<_, _>>()?;
                let Some(current) = current else {
                    let signing_key = authority_key(last, now)?.key_id;
                    return Ok((
                        Some(Identity {
                            authority: authority.clone(),
                            keys: new,
                            signing_key,
                        }),
                        IdentityOutcome { changed: true },
                    ));
                };
                if !imported {
                    return Ok(unchanged(Some(current)));
                }
                let mut next = current.clone();
                let mut changed = false;
                for key in new {
                    if next.keys.iter().all(|k| k.key_id != key.key_id) {
                        next.signing_key = key.key_id.clone();
                        next.keys.push(key);
                        changed = true;
                    }
                }
                Ok((Some(next), IdentityOutcome { changed }))
            }
            IdentityChange::Rotate { key } => {
                let current = current.ok_or(IdentityRefusal::NoIdentity)?;
                let key = authority_key(key, now)?;
                let mut next = current.clone();
                if next.keys.iter().any(|k| k.key_id == key.key_id) {
                    return Err(IdentityRefusal::BadKey(format!(
                        "key {} is already known",
                        key.key_id
                    )));
                }
                next.signing_key = key.key_id.clone();
                next.keys.push(key);
                Ok((Some(next), IdentityOutcome { changed: true }))
            }
            IdentityChange::Retire { key_id } | IdentityChange::Revoke { key_id } => {
                let current = current.ok_or(IdentityRefusal::NoIdentity)?;
                if current.signing_key == *key_id {
                    return Err(IdentityRefusal::SigningKey(key_id.clone()));
                }
                let mut next = current.clone();
                let key = next
                    .keys
                    .iter_mut()
                    .find(|k| k.key_id == *key_id)
                    .ok_or_else(|| IdentityRefusal::UnknownKey(key_id.clone()))?;
                let state = if matches!(change, IdentityChange::Revoke { .. }) {
                    KeyState::Revoked
                } else {
                    KeyState::Retired
                };
                match (key.state, state) {
                    (KeyState::Valid, _) | (KeyState::Retired, KeyState::Revoked) => {}
                    (s, _) => {
                        return Err(IdentityRefusal::AlreadyEnded(
                            key_id.clone(),
                            format!("{s:?}").to_lowercase(),
                        ))
                    }
                }
                key.state = state;
                key.ended_at = Some(now.to_string());
                Ok((Some(next), IdentityOutcome { changed: true }))
            }
        }
    }

    /// The signing key, ready to sign. Making one derives the public key (a
    /// scalar multiplication), so callers keep it rather than make one per
    /// signature.
    pub fn signer(&self) -> Option<Signer> {
        let key = self.keys.iter().find(|k| k.key_id == self.signing_key)?;
        Some(Signer {
            authority: self.authority.clone(),
            key_id: key.key_id.clone(),
            key: seed(&key.secret).ok()?,
        })
    }

    /// The identity as published (no secrets).
    pub fn public(&self) -> Identity {
        Identity {
            authority: self.authority.clone(),
            keys: self.keys.iter().map(AuthorityKey::public).collect(),
            signing_key: self.signing_key.clone(),
        }
    }

    /// Whether a signature by `key_id` made at `at` is accepted.
    pub fn accepts(&self, key_id: &str, at: &str) -> bool {
        self.keys
            .iter()
            .any(|k| k.key_id == key_id && k.accepts_at(at))
    }
}

/// An identity's signing key, parsed once.
pub struct Signer {
    pub authority: String,
    pub key_id: String,
    key: SigningKey,
}

impl Signer {
    /// The signature of `message`, base64url.
    pub fn sign(&self, message: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(self.key.sign(message).to_bytes())
    }
}

/// The operator's key file (for example a mounted Kubernetes secret): the
/// authority and the seeds, the last of which signs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    pub keys: Vec<NewKey>,
}

impl KeyFile {
    pub fn read(path: &std::path::Path) -> Result<Self, CryptoError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CryptoError::KeyFile(format!("{}: {e}", path.display())))?;
        let file: KeyFile = serde_json::from_str(&text)
            .map_err(|e| CryptoError::KeyFile(format!("{}: {e}", path.display())))?;
        if file.keys.is_empty() {
            return Err(CryptoError::KeyFile(format!("{}: no keys", path.display())));
        }
        for k in &file.keys {
            seed(&k.secret)
                .map_err(|e| CryptoError::KeyFile(format!("{}: {e}", path.display())))?;
        }
        Ok(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: &str = "2026-01-01T00:00:00Z";
    const T1: &str = "2026-02-01T00:00:00Z";

    fn key(byte: u8) -> NewKey {
        NewKey {
            secret: URL_SAFE_NO_PAD.encode([byte; 32]),
            not_after: None,
        }
    }

    fn establish(keys: Vec<NewKey>, imported: bool) -> IdentityChange {
        IdentityChange::Establish {
            authority: "registry.example.org".into(),
            keys,
            imported,
        }
    }

    #[test]
    fn the_first_establish_wins_and_imports_add_keys() {
        let (id, out) = Identity::apply(None, &establish(vec![key(1)], false), T0).unwrap();
        let id = id.unwrap();
        assert!(out.changed);
        assert_eq!(id.keys.len(), 1);
        assert_eq!(id.signing_key, id.keys[0].key_id);
        // A second generated key (another node racing) changes nothing.
        let (same, out) = Identity::apply(Some(&id), &establish(vec![key(2)], false), T1).unwrap();
        assert_eq!(same.as_ref(), Some(&id));
        assert!(!out.changed);
        // An imported key is added and signs.
        let (next, out) = Identity::apply(Some(&id), &establish(vec![key(3)], true), T1).unwrap();
        let next = next.unwrap();
        assert!(out.changed);
        assert_eq!(next.keys.len(), 2);
        assert_eq!(next.signing_key, next.keys[1].key_id);
        // Importing the same file again is a no-op.
        let (again, out) =
            Identity::apply(Some(&next), &establish(vec![key(3)], true), T1).unwrap();
        assert_eq!(again.as_ref(), Some(&next));
        assert!(!out.changed);
    }

    #[test]
    fn rotation_retirement_and_revocation_follow_the_lifecycle() {
        let id = Identity::apply(None, &establish(vec![key(1)], false), T0)
            .unwrap()
            .0
            .unwrap();
        let first = id.signing_key.clone();
        assert_eq!(
            Identity::apply(
                Some(&id),
                &IdentityChange::Retire {
                    key_id: first.clone()
                },
                T1
            ),
            Err(IdentityRefusal::SigningKey(first.clone()))
        );
        let id = Identity::apply(Some(&id), &IdentityChange::Rotate { key: key(2) }, T1)
            .unwrap()
            .0
            .unwrap();
        assert_ne!(id.signing_key, first);
        assert!(id.accepts(&first, T1), "the old key still verifies");
        let retired = Identity::apply(
            Some(&id),
            &IdentityChange::Retire {
                key_id: first.clone(),
            },
            T1,
        )
        .unwrap()
        .0
        .unwrap();
        assert!(!retired.accepts(&first, T1));
        let revoked = Identity::apply(
            Some(&retired),
            &IdentityChange::Revoke {
                key_id: first.clone(),
            },
            T1,
        )
        .unwrap()
        .0
        .unwrap();
        assert_eq!(revoked.keys[0].state, KeyState::Revoked);
        assert!(matches!(
            Identity::apply(
                Some(&revoked),
                &IdentityChange::Retire {
                    key_id: first.clone()
                },
                T1
            ),
            Err(IdentityRefusal::AlreadyEnded(..))
        ));
        assert!(matches!(
            Identity::apply(
                Some(&revoked),
                &IdentityChange::Revoke {
                    key_id: "nope".into()
                },
                T1
            ),
            Err(IdentityRefusal::UnknownKey(_))
        ));
    }

    #[test]
    fn validity_windows_bound_what_a_key_accepts() {
        let mut k = key(1);
        k.not_after = Some(T1.into());
        let id = Identity::apply(None, &establish(vec![k], false), T0)
            .unwrap()
            .0
            .unwrap();
        let kid = id.signing_key.clone();
        assert!(id.accepts(&kid, T0));
        assert!(id.accepts(&kid, T1));
        assert!(
            !id.accepts(&kid, "2025-12-31T23:59:59Z"),
            "before not_before"
        );
        assert!(!id.accepts(&kid, "2026-02-01T00:00:01Z"), "after not_after");
        assert!(!id.accepts(&kid, "not a time"));
        assert!(id.public().keys.iter().all(|k| k.secret.is_empty()));
    }

    #[test]
    fn bad_seeds_are_refused() {
        let bad = NewKey {
            secret: "c2hvcnQ".into(),
            not_after: None,
        };
        assert!(matches!(
            Identity::apply(None, &establish(vec![bad], false), T0),
            Err(IdentityRefusal::BadKey(_))
        ));
        assert_eq!(
            Identity::apply(None, &establish(vec![], false), T0),
            Err(IdentityRefusal::NoKeys)
        );
    }
}
