//! Generates the berth.v1 gRPC code. protoc is `$PROTOC` when set, else the vendored
//! binary of `protoc-bin-vendored`, so a fresh machine needs no protobuf install.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let protos = [
        "berth/v1/types.proto",
        "berth/v1/workspace.proto",
        "berth/v1/node.proto",
        "berth/v1/admin.proto",
        "berth/v1/contract.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    println!("cargo:rerun-if-env-changed=PROTOC");
    let mut config = prost_build::Config::new();
    // File data as `Bytes`: a chunk decoded from the wire shares the receive buffer, and a
    // node agent cuts a block read from disk into chunks without copying.
    config.bytes([".berth.v1.FileChunk.data", ".berth.v1.WriteFileRequest.chunk"]);
    let mut includes = vec![std::path::PathBuf::from(".")];
    if std::env::var_os("PROTOC").is_none() {
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
        includes.push(protoc_bin_vendored::include_path()?);
    }
    tonic_prost_build::configure().file_descriptor_set_path(out_dir.join("berth_descriptor.bin")).compile_with_config(
        config,
        &protos.map(std::path::PathBuf::from),
        &includes,
    )?;
    Ok(())
}
