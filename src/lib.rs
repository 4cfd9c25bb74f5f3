//! Agentry: a federated registry cluster for AI agents.
//!
//! Layers depend in one direction: `api` -> `service` -> `consensus` ->
//! `storage`, with `domain` (pure types) shared by all. See
//! `docs/architecture.md`.

// Deeply nested async state machines (the gateway over rmcp and tonic)
// need more than the default 128 levels of layout queries.
#![recursion_limit = "256"]

pub mod api;
pub mod bench;
pub mod cli;
pub mod config;
pub mod consensus;
pub mod convert;
pub mod crypto;
pub mod demo;
pub mod domain;
pub mod federation;
pub mod gateway;
pub mod index;
pub mod listener;
pub mod metrics;
pub mod server;
pub mod service;
pub mod storage;

/// An error with every cause under it, "outer: inner: root", a cause that
/// only repeats the text before it left out. Client libraries (hyper,
/// reqwest, tonic) put the useful part ("Connection refused", "invalid
/// peer certificate") in a source several levels down, so their top
/// message alone ("transport error") tells a user nothing.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.ends_with(&part) {
            text = format!("{text}: {part}");
        }
        source = s.source();
    }
    text
}

/// Generated protobuf and gRPC code of `proto/agentry/v1`.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("agentry.v1");

    /// Descriptor set served by gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("agentry_descriptor");
}

/// gRPC's rich error model (`google.rpc.Status`), which carries Agentry's
/// `ErrorDetail` in error statuses.
pub mod rpc_pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("google.rpc");
}

/// A2A 1.0's gRPC messages (`proto/a2a/v1/a2a.proto`), for calling
/// agents over gRPC.
pub mod a2a_pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("lf.a2a.v1");
}

/// etcd's KV Put (client only), for the write benchmark.
pub mod etcd_pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("etcdserverpb");
}
