//! Generates the gRPC code of the kubelet's DRA plugin API, `proto/dra-v1.proto`
//! (package `k8s.io.kubelet.pkg.apis.dra.v1`) and `proto/dra-v1beta1.proto`
//! (its v1beta1, for kubelets before 1.34), copied from
//! `k8s.io/kubelet@v0.36.3/pkg/apis/dra/{v1,v1beta1}/api.proto`, and the
//! device health API `proto/dra-health-v1alpha1.proto` (package `v1alpha1`),
//! from `k8s.io/kubelet@v0.36.3/pkg/apis/dra-health/v1alpha1/api.proto`.
//!
//! `protox` compiles the protos in Rust (no system `protoc`), and
//! `tonic-prost-build` turns the descriptors into prost messages and tonic
//! services (servers only: the kubelet is the client).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/dra-v1.proto",
        "proto/dra-v1beta1.proto",
        "proto/dra-health-v1alpha1.proto",
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
