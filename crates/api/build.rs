//! Compiles `proto/` into Rust with protox (a pure-Rust protobuf compiler) and tonic-prost-build,
//! and derives the JSON mapping of every message with pbjson-build.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [
        "etcd/api/mvccpb/kv.proto",
        "etcd/api/authpb/auth.proto",
        "etcd/api/etcdserverpb/rpc.proto",
        "etcd/server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
        "etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto",
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }
    let descriptors = protox::compile(files, [&root])?;
    let encoded = prost::Message::encode_to_vec(&descriptors);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    // Serde impls following protobuf's JSON mapping with the options etcd's gateway uses:
    // proto field names out (`create_revision`, `ID`), either name in, unknown fields ignored.
    pbjson_build::Builder::new()
        .register_descriptors(&encoded)?
        .preserve_proto_field_names()
        .ignore_unknown_fields()
        .build(&[
            ".mvccpb",
            ".authpb",
            ".etcdserverpb",
            ".v3lockpb",
            ".v3electionpb",
        ])?;
    Ok(())
}
