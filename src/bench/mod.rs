//! Benchmarks that print their figures: committed writes against etcd,
//! discovery latency against PostgreSQL and LanceDB, signature throughput,
//! federated discovery and invocation gateway overheads.

pub mod discover;
pub mod federation;
pub mod gateway;
pub mod signatures;
mod writes;

pub use writes::{report, Row, WriteBench};
