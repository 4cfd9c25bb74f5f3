//! Compiles the protos with a vendored protoc and writes the descriptor set that
//! server reflection serves.
use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    env::set_var("PROTOC", protoc);
    let out = PathBuf::from(env::var("OUT_DIR")?);
    let protos = [
        "proto/agentry/v1/record.proto",
        "proto/agentry/v1/registry.proto",
        "proto/agentry/v1/cluster.proto",
        "proto/agentry/v1/raft.proto",
        "proto/agentry/v1/discovery.proto",
        "proto/agentry/v1/ard.proto",
        "proto/agentry/v1/federation.proto",
        "proto/agentry/v1/invocation.proto",
        "proto/google/rpc/status.proto",
    ];
    tonic_prost_build::configure()
        // A log entry's command is handed from the log to every follower's
        // message by reference, never copied per follower.
        .bytes(".agentry.v1.RaftLogEntry")
        .file_descriptor_set_path(out.join("agentry_descriptor.bin"))
        .compile_protos(&protos, &["proto"])?;
    // etcd's Put, for the side-by-side write benchmark (`agentry bench`);
    // client only, and kept out of the reflection descriptor set.
    let etcd = "proto/bench/etcd_kv.proto";
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&[etcd], &["proto"])?;
    // A2A 1.0's gRPC binding, for calling agents (messages only: the
    // gateway sends under the interface URL's path with tonic's client).
    let a2a = "proto/a2a/v1/a2a.proto";
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .compile_protos(&[a2a], &["proto"])?;
    for p in protos.iter().chain([&etcd, &a2a]) {
        println!("cargo:rerun-if-changed={p}");
    }
    Ok(())
}
