//! Integration tests: real servers (RocksDB, Raft, gRPC and HTTP listeners)
//! on loopback ports they pick themselves.

mod a2a;
mod agent_protocol;
mod agents;
mod alerts;
mod ap_agent;
mod ard;
mod audit;
mod bad_input;
mod browser;
mod certs;
mod compression;
mod cors;
mod discovery;
mod embedders;
mod harness;
mod helm;
mod invocation;
mod leases;
mod mcp;
mod mcp_mirror;
mod mcp_registry;
mod mcp_server;
mod peer_tls;
mod restart;
mod scenario;
mod signatures;
mod sweep;
mod tenants;
mod tokens;
mod trust;
mod ui;
mod watch;
