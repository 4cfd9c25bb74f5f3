//! Canonical JSON (RFC 8785), the registry's ed25519 identity and record
//! signatures. Pure functions over domain types: storage signs with them
//! during apply, the API publishes the public keys, federation and
//! `agentry verify` check what peers and registries sent.

pub mod canonical;
pub mod keys;
pub mod publisher;
pub mod signature;

pub use keys::{
    AuthorityKey, Identity, IdentityChange, IdentityRefusal, KeyFile, KeyState, NewKey,
};

/// Why a key or signature could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    #[error("the record carries no registry signature")]
    Unsigned,
    #[error("malformed signature: {0}")]
    Malformed(String),
    #[error("the signature does not match the record (altered, or signed by another key)")]
    BadSignature,
    #[error("signed by key {0}, which is not among the trusted keys")]
    UnknownKey(String),
    #[error(
        "signed by key {key_id} ({state}), which did not accept signatures at the signing time"
    )]
    KeyNotValid { key_id: String, state: String },
    #[error("signed for authority {claimed}, expected {expected}")]
    WrongAuthority { claimed: String, expected: String },
    #[error("bad key: {0}")]
    BadKey(String),
    #[error("key file {0}")]
    KeyFile(String),
    #[error("no random source: {0}")]
    Random(String),
}
