//! Benchmarks that print their figures: committed writes against etcd,
//! discovery latency against PostgreSQL and LanceDB, signature throughput,
//! federated discovery, invocation gateway overheads, and the cost of TLS
//! and token checks.

pub mod discover;
pub mod federation;
pub mod gateway;
pub mod signatures;
pub mod trust;
mod writes;

pub use writes::{report, Row, WriteBench};
