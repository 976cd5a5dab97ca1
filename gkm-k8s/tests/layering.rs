//! The crates under `gkm-k8s/` keep their layers: no component crate
//! depends on another component, and the node-side crates, and the
//! `gkm-csi` binary that ships the CSI driver, build without what they
//! never use. Read from `cargo metadata` and `cargo tree`, as an embedder
//! would read them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::process::Command;

/// The crates that each are one process's logic.
const COMPONENTS: &[&str] = &[
    "gkm-k8s-agent",
    "gkm-k8s-csi",
    "gkm-k8s-device-plugin",
    "gkm-k8s-dra",
    "gkm-k8s-extender",
    "gkm-k8s-operator",
];

/// What a crate must build without, and why.
const FORBIDDEN: &[(&str, &[&str], &str)] = &[
    (
        "gkm-gpu",
        &["kube", "k8s-openapi", "oci-client", "tonic"],
        "GPU discovery, readings and their metrics are for every node process and the CLI",
    ),
    (
        "gkm",
        &["gkm-k8s-agent"],
        "the CLI prints GPU metrics with gkm-gpu's collector, without the agent's crate",
    ),
    (
        "gkm-k8s-csi",
        &["kube", "k8s-openapi", "oci-client", "nvml-wrapper", "rcgen"],
        "the CSI driver never reads the apiserver, a registry or a GPU: what it needs of \
         the cluster, the agent writes in the node files (gkm-k8s-node)",
    ),
    (
        "gkm-csi",
        &["kube", "k8s-openapi", "oci-client", "nvml-wrapper", "rcgen"],
        "the shipped CSI driver is the CSI crate and its flags: what it serves besides CSI \
         (health, readiness, metrics) comes from gkm-k8s-daemon, not gkm-k8s-runtime",
    ),
    (
        "gkm-k8s-daemon",
        &["kube", "k8s-openapi", "oci-client", "tonic", "nvml-wrapper"],
        "a daemon's endpoints, readiness, metrics and tasks need no Kubernetes API \
         (what of them does is gkm-k8s-runtime's)",
    ),
    (
        "gkm-k8s-node",
        &["kube", "k8s-openapi", "oci-client", "tonic"],
        "the node files are read without the Kubernetes API",
    ),
    (
        "gkm-k8s-kubelet",
        &["kube", "k8s-openapi", "oci-client", "nvml-wrapper"],
        "the kubelet's gRPC plumbing knows nothing of the apiserver",
    ),
    (
        "gkm-k8s-devices",
        &["kube", "k8s-openapi", "tonic", "oci-client"],
        "reading a node's devices needs neither the apiserver nor the kubelet",
    ),
    (
        "gkm-k8s-extender",
        &["tonic", "oci-client", "nvml-wrapper"],
        "the extender speaks HTTP to kube-scheduler and never reads a registry",
    ),
    (
        "gkm-k8s-api",
        &["tonic", "oci-client", "nvml-wrapper"],
        "the CRD types are for every embedder",
    ),
];

fn cargo() -> Command {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
    cmd
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("running cargo");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The crates `package` builds with (normal dependencies, its own features).
fn normal_tree(package: &str) -> BTreeSet<String> {
    let out = run(cargo().args([
        "tree",
        "--locked",
        "--offline",
        "-e",
        "normal",
        "--prefix",
        "none",
        "-p",
        package,
    ]));
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn no_component_crate_depends_on_another() {
    let out = run(cargo().args(["metadata", "--no-deps", "--format-version", "1"]));
    let metadata: serde_json::Value = serde_json::from_str(&out).expect("cargo metadata");
    let mut sideways = Vec::new();
    for package in metadata["packages"].as_array().expect("packages") {
        let name = package["name"].as_str().unwrap_or_default();
        if !COMPONENTS.contains(&name) {
            continue;
        }
        for dep in package["dependencies"].as_array().into_iter().flatten() {
            let dep_name = dep["name"].as_str().unwrap_or_default();
            let dev = dep["kind"].as_str() == Some("dev");
            if COMPONENTS.contains(&dep_name) && dep_name != name && !dev {
                sideways.push(format!("{name} -> {dep_name}"));
            }
        }
    }
    assert!(
        sideways.is_empty(),
        "component crates import each other (move what they share into gkm-k8s-api, \
         -node, -kubelet, -daemon or -runtime): {sideways:?}"
    );
}

#[test]
fn node_side_crates_build_without_what_they_never_use() {
    for (package, forbidden, why) in FORBIDDEN {
        let tree = normal_tree(package);
        println!("{package}: {} crates", tree.len());
        let found: Vec<_> = forbidden.iter().filter(|f| tree.contains(**f)).collect();
        assert!(
            found.is_empty(),
            "{package} builds with {found:?}, but {why}"
        );
    }
}
