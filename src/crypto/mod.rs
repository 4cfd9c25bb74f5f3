//! Canonical JSON (RFC 8785), the registry's ed25519 identity and record
//! signatures. Pure functions over domain types: storage signs with them
//! during apply, the API publishes the public keys, federation and
//! `agentry verify` check what peers and registries sent.

pub mod canonical;
pub mod keys;
pub mod publisher;
pub mod signature;
pub mod signature_book;

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

/// Lower-case hex of bytes (digests, MACs, page tokens): the one hex
/// encoder of the crate.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Bytes of a hex string (either case); `None` when it is not hex.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod hex_tests {
    #[test]
    fn hex_round_trips() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(super::hex(&bytes), "0001abff");
        assert_eq!(super::unhex("0001ABff").as_deref(), Some(&bytes[..]));
        assert_eq!(super::unhex("abc"), None);
        assert_eq!(super::unhex("zz"), None);
    }
}
