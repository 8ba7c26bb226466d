//! Compiles kvd's peer protocol (`proto/kvd/peer.proto`) with protox (a pure-Rust protobuf
//! compiler: no `protoc` needed) and tonic-prost-build.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read when the script runs, not baked in when it is compiled: two checkouts sharing a
    // target directory share the compiled script.
    let root =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR unset")?)
            .join("../../proto");
    let file = "kvd/peer.proto";
    println!("cargo:rerun-if-changed={}", root.join(file).display());
    let descriptors = protox::compile([file], [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
