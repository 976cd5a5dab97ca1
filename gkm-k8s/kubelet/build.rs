//! Generates the gRPC code for the CSI driver (`proto/csi.proto`, package
//! `csi.v1`), the kubelet plugin registration (`proto/pluginregistration.proto`),
//! the kubelet device-plugin API (`proto/deviceplugin.proto`, package
//! `v1beta1`) and the kubelet pod-resources API (`proto/podresources.proto`,
//! package `v1`).
//!
//! `protox` compiles the protos in Rust (no system `protoc`), and
//! `tonic-prost-build` turns the descriptors into prost messages and tonic
//! services.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/csi.proto",
        "proto/pluginregistration.proto",
        "proto/deviceplugin.proto",
        "proto/podresources.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
