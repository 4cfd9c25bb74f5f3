//! Benchmarks that print their figures: committed writes against etcd,
//! discovery latency against PostgreSQL and LanceDB, signature throughput,
//! federated discovery, invocation gateway overheads, the cost of TLS
//! and token checks, and the discovery standards' surfaces (ARD, the AI
//! Catalog, the MCP registry) and the MCP server's discovery against
//! `POST /discover`.

pub mod discover;
pub mod federation;
pub mod gateway;
pub mod mcp;
pub mod peers;
pub mod signatures;
pub mod standards;
pub mod trust;
mod write_stages;
mod writes;

pub use writes::{report, RefreshLoad, Row, WriteBench};
