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
    ];
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("agentry_descriptor.bin"))
        .compile_protos(&protos, &["proto"])?;
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    Ok(())
}
