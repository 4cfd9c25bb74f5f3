//! Benchmarks that print their figures: committed writes against etcd, and
//! discovery latency against PostgreSQL and LanceDB.

pub mod discover;
mod writes;

pub use writes::{report, Row, WriteBench};
