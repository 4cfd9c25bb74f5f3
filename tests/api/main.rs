//! Integration tests: real servers (RocksDB, Raft, gRPC and HTTP listeners)
//! on loopback ports they pick themselves.

mod agents;
mod bad_input;
mod discovery;
mod embedders;
mod harness;
mod invocation;
mod mcp;
mod peer_tls;
mod restart;
mod scenario;
mod signatures;
mod watch;
