//! Pure types of the registry and their invariants: the agent record, its
//! envelope, validation and normalisation. Nothing here knows about gRPC, HTTP,
//! Raft or RocksDB, so every layer can share these rules.

pub mod audit;
pub mod catalog;
pub mod discovery;
pub mod federation;
pub mod filter;
pub mod invoke;
pub mod json;
pub mod lease;
pub mod mcp;
pub mod protocol;
pub mod record;
pub mod resolve;
pub mod time;
pub mod urn;
pub mod validate;
pub mod write;

pub use protocol::Protocol;
pub use record::*;
pub use validate::{FieldError, Limits};
