//! `gkm-local`: gkm's main job on a local control plane, no cluster needed.
//!
//! Starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
//! kwok and an OCI registry on loopback (the real components
//! `hack/ci/components.sh` builds), three simulated nodes (NVIDIA T4, AMD
//! MI210, no GPU) and one real node (kubelet, containerd, runc). It builds
//! gkm's images with `hack/images/build.sh`, imports them into the real node's
//! containerd and installs gkm's Helm chart: the operator, and on the real
//! node the agent (reading a simulated T4), the CSI driver and the device
//! plugin, run as pods. The simulated nodes run no containers, so their
//! agents and CSI drivers run as processes. It builds the Triton CUDA fixture
//! cache into an image, signs it with cosign, applies a `GKMCache`, shows it
//! converge with kubectl, and runs a pod on the real node whose container
//! reads the cache through gkm's CSI driver. Then it runs until interrupted,
//! printing how to reach it.
//!
//! `--dra`: on the real node the chart runs gkm's DRA kubelet plugin
//! instead of the device plugin (reading a simulated T4's sysfs, `/dev` and
//! `/proc`), with the chart's DeviceClasses and the operator's one per
//! cache; a pod gets a GPU through a claim template of the cache's class,
//! and the claim's allocated device is printed.
//!
//! `--no-real-node` needs no root: no kubelet, so no chart; gkm's operator,
//! agents and CSI drivers run as processes for the simulated nodes.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use clap::Parser;
use gkm_k8s_api::crd::{CacheState, GKMCache};
use gkm_local::dra::{self, GpuPath};
use gkm_local::{SimulatedNode, Stack, cache_pod, cosign, default_nodes, fixture};
use gkm_testenv::{Component, find_binary, pod_log, tools_bin_dir, wait_for_pod};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// Run gkm on a local control plane.
#[derive(Parser)]
#[command(name = "gkm-local", version, about)]
struct Cli {
    /// Directory for all state (wiped at start).
    #[arg(long, default_value = ".gkm/local")]
    dir: PathBuf,
    /// Exit once the cache has converged instead of running until Ctrl-C.
    #[arg(long)]
    exit_when_ready: bool,
    /// How long to wait for convergence.
    #[arg(long, default_value_t = 180)]
    timeout_secs: u64,
    /// Run only simulated nodes (no kubelet, containerd or runc, so no
    /// chart: gkm runs as processes; no root needed).
    #[arg(long, conflicts_with = "dra")]
    no_real_node: bool,
    /// On the real node, offer its GPU through Dynamic Resource Allocation
    /// (gkm's DRA kubelet plugin, the chart's and the cache's DeviceClasses)
    /// instead of the device plugin, and run a pod that claims it through
    /// the cache's class.
    #[arg(long)]
    dra: bool,
}

/// The real node: a kubelet with containerd and runc, where the chart runs
/// gkm; its agent reads a simulated T4.
const REAL_NODE: &str = "real-sm75";

fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(find_binary(Component::Kubectl)?)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()?;
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let began = Instant::now();
    let gpu_path = if cli.dra {
        GpuPath::Dra
    } else {
        GpuPath::DevicePlugin
    };
    if cli.dir.exists() {
        std::fs::remove_dir_all(&cli.dir)?;
    }
    std::fs::create_dir_all(&cli.dir)?;
    let dir = std::fs::canonicalize(&cli.dir)?;

    let mut stack = if cli.no_real_node {
        eprintln!(
            "==> starting etcd, kube-apiserver, kube-controller-manager, kwok and a registry"
        );
        Stack::start(&dir, default_nodes()).await?
    } else {
        eprintln!(
            "==> starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and a registry"
        );
        Stack::start_for_chart_with(&dir, default_nodes(), gpu_path).await?
    };
    eprintln!(
        "    control plane ready in {:.1?} at {}",
        stack.plane.started_in(),
        stack.plane.url()
    );
    let kubeconfig = dir.join("kubeconfig");
    std::fs::copy(stack.plane.kubeconfig(), &kubeconfig)?;
    if !cli.no_real_node {
        eprintln!("==> starting a real node: kubelet, containerd and runc ({REAL_NODE})");
        stack
            .add_real_node(SimulatedNode::new(REAL_NODE, "gpus:\n- profile: T4\n"))
            .await?;
        if let Some(node) = stack.real_node(REAL_NODE) {
            eprintln!("    {REAL_NODE} Ready in {:.1?}", node.started_in());
        }
    }
    let nodes = stack.nodes().len() as i32;

    eprintln!(
        "==> building the Triton CUDA sm75 fixture cache into an image and signing it with cosign"
    );
    let key = cosign::generate_key_pair(&dir.join("keys"))?;
    let (image, digest) = stack
        .push_signed_cache(
            &fixture("triton-vector-add-cuda-sm75"),
            "gkm/vector-add",
            "cuda",
            &key,
        )
        .await?;
    eprintln!("    {image} = {digest}, signed");

    stack.set_args(
        vec![
            "--resolve-interval=30s".into(),
            // The demo cache names its own signer in the default namespace.
            "--tenant-signer-namespaces=default".into(),
        ],
        vec!["--resync=10s".into()],
    );
    if cli.no_real_node {
        eprintln!("==> starting gkm-operator, and gkm-agent + gkm-csi on each node");
    } else {
        let step = Instant::now();
        eprintln!(
            "==> building gkm's images (hack/images/build.sh) and importing them into {REAL_NODE}'s containerd"
        );
        stack.import_images()?;
        eprintln!("    built and imported in {:.1?}", step.elapsed());
        let step = Instant::now();
        eprintln!("==> helm install gkm deploy/helm/gkm --namespace gkm-system");
        stack.install_chart().await?;
        eprintln!("    gkm's pods Ready in {:.1?}", step.elapsed());
        println!(
            "\n$ kubectl get pods -n gkm-system -o wide\n{}",
            kubectl(
                &kubeconfig,
                &["get", "pods", "-n", "gkm-system", "-o", "wide"]
            )?
        );
        eprintln!(
            "==> starting gkm-agent + gkm-csi as processes for the simulated nodes (kwok runs no containers)"
        );
    }
    stack.start_gkm()?;

    let client = stack.plane.client().await?;
    let cache = json!({
        "apiVersion": "gkm.io/v1alpha1",
        "kind": "GKMCache",
        "metadata": {"name": "vector-add", "namespace": "default"},
        "spec": {"image": image, "signature": {"signers": [{"key": {"publicKey": key.public_pem}}]}}
    });
    let caches: Api<GKMCache> = Api::namespaced(client.clone(), "default");
    caches
        .patch(
            "vector-add",
            &PatchParams::apply("gkm-local").force(),
            &Patch::Apply(&cache),
        )
        .await?;
    eprintln!("==> applied GKMCache default/vector-add; waiting for it to converge");

    let deadline = Instant::now() + Duration::from_secs(cli.timeout_secs);
    loop {
        stack.check_running()?;
        let status = caches.get("vector-add").await?.status.unwrap_or_default();
        // Converged: every node reported and settled.
        let c = &status.counts;
        if status.state == Some(CacheState::Extracted) && c.node_cnt == nodes && c.all_settled() {
            break;
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "not converged after {}s: {:?} {:?}",
                cli.timeout_secs,
                status.state,
                status.counts
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "\n$ kubectl get gkmcache,gkmcachenode -A\n{}",
        kubectl(&kubeconfig, &["get", "gkmcache,gkmcachenode", "-A"])?
    );
    println!(
        "$ kubectl get gkmcachenode node-gfx90a -o jsonpath='{{.status.caches}}'\n{}\n",
        kubectl(
            &kubeconfig,
            &[
                "get",
                "gkmcachenode",
                "node-gfx90a",
                "-o",
                "jsonpath={.status.caches}"
            ]
        )?
    );
    if !cli.no_real_node {
        eprintln!("==> a pod on {REAL_NODE} reads the cache through gkm's CSI driver");
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let pod = cache_pod(
            "default",
            "triton-reader",
            REAL_NODE,
            "/root/.triton/cache",
            json!({"csi.gkm.io/GKMCache": "vector-add"}),
            "ls \"$TRITON_CACHE_DIR\"; sha256sum \"$TRITON_CACHE_DIR\"/*/*.cubin; exec sleep 100000",
        )?;
        pods.create(&PostParams::default(), &pod).await?;
        let running =
            |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        wait_for_pod(
            &pods,
            "triton-reader",
            Duration::from_secs(cli.timeout_secs),
            running,
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        println!(
            "$ kubectl logs triton-reader\n{}",
            pod_log(&pods, "triton-reader", "triton").await?
        );
    }
    if cli.dra {
        eprintln!("==> a pod claims a GPU through the DeviceClass of GKMCache default/vector-add");
        let claimed = dra::claim_cache_gpu(
            &client,
            "default",
            "vector-add",
            Duration::from_secs(cli.timeout_secs),
        )
        .await?;
        println!(
            "$ kubectl get resourceslices,resourceclaims -A\n{}",
            kubectl(&kubeconfig, &["get", "resourceslices,resourceclaims", "-A"])?
        );
        for device in &claimed.devices {
            println!(
                "claim default/{} (class {}) allocated driver={} pool={} device={}",
                claimed.claim, claimed.class, device.driver, device.pool, device.device
            );
        }
        println!();
    }
    let logs = if cli.no_real_node {
        format!("{}/gkm-operator.log, ", dir.display())
    } else {
        "kubectl logs -n gkm-system deploy/gkm-operator (ds/gkm-agent, ds/gkm-csi), ".into()
    };
    println!(
        "gkm converged in {:.1?}. To look around:\n\n  export PATH={}:$PATH KUBECONFIG={}\n  kubectl get gkmcache,gkmcachenode -A\n  kubectl describe gkmcache vector-add\n  kubectl get nodes --show-labels\n\nlogs: {logs}{}/nodes/*/gkm-*.log; registry: {}\n",
        began.elapsed(),
        tools_bin_dir().display(),
        kubeconfig.display(),
        dir.display(),
        stack.registry.addr(),
    );
    if cli.exit_when_ready {
        return Ok(());
    }
    eprintln!("Ctrl-C stops everything.");
    tokio::signal::ctrl_c().await?;
    eprintln!("stopping");
    Ok(())
}
