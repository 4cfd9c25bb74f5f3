//! Benchmarks that print their figures: committed writes against etcd,
//! discovery latency against PostgreSQL and LanceDB, signature throughput.

pub mod discover;
pub mod federation;
pub mod signatures;
mod writes;

pub use writes::{report, Row, WriteBench};
