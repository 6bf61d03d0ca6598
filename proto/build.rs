//! Generates the berth.v1 gRPC code. protoc comes from `PROTOC` or PATH (Debian's
//! `protobuf-compiler`, installed by `.ci/run`).
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
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("berth_descriptor.bin"))
        .compile_protos(&protos, &["."])?;
    Ok(())
}
