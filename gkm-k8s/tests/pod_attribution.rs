//! Pod attribution of GPU metrics on a real node: the kubelet allocates a
//! GPU to a container through a device plugin, the agent reads the
//! allocation from the kubelet's pod-resources API, and the GPU's series
//! carry the pod's `namespace`, `pod` and `container` until the pod goes.
//!
//! The device plugin here is the smallest the kubelet accepts (it offers the
//! simulated GPUs by UUID and allocates nothing else); the kubelet's side,
//! the allocation and the pod-resources answer, is the real kubelet's.

use std::path::Path;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use gkm_k8s::agent::{AgentConfig, GpuMetrics, TelemetryConfig};
use gkm_testenv::{
    BUSYBOX_IMAGE, ControlPlane, ControlPlaneOptions, RealNode, RealNodeOptions, Sample, samples,
    wait_for_pod,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use prometheus_client::registry::Registry;
use serde_json::json;
use tonic::{Request, Response, Status};

#[allow(clippy::all, clippy::pedantic)]
mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

use v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use v1beta1::registration_client::RegistrationClient;

const TIMEOUT: Duration = Duration::from_secs(120);
const RESOURCE: &str = "gkm.test/gpu";
const UUIDS: [&str; 2] = [
    "GPU-0a7c0000-0000-4000-8000-000000000000",
    "GPU-0a7c0000-0000-4000-8000-000000000001",
];

/// Offers `UUIDS` as `RESOURCE`, healthy, and allocates them as they are.
struct Plugin;

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    type ListAndWatchStream =
        Pin<Box<dyn Stream<Item = Result<v1beta1::ListAndWatchResponse, Status>> + Send>>;

    async fn get_device_plugin_options(
        &self,
        _: Request<v1beta1::Empty>,
    ) -> Result<Response<v1beta1::DevicePluginOptions>, Status> {
        Ok(Response::new(v1beta1::DevicePluginOptions::default()))
    }

    async fn list_and_watch(
        &self,
        _: Request<v1beta1::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let devices = UUIDS
            .iter()
            .map(|id| v1beta1::Device {
                id: id.to_string(),
                health: "Healthy".into(),
                topology: None,
            })
            .collect();
        let first =
            futures::stream::once(async move { Ok(v1beta1::ListAndWatchResponse { devices }) });
        // The kubelet reads the stream for as long as the plugin lives.
        Ok(Response::new(Box::pin(
            first.chain(futures::stream::pending()),
        )))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<v1beta1::PreferredAllocationRequest>,
    ) -> Result<Response<v1beta1::PreferredAllocationResponse>, Status> {
        Ok(Response::new(
            v1beta1::PreferredAllocationResponse::default(),
        ))
    }

    async fn allocate(
        &self,
        request: Request<v1beta1::AllocateRequest>,
    ) -> Result<Response<v1beta1::AllocateResponse>, Status> {
        let containers = request.into_inner().container_requests.len();
        Ok(Response::new(v1beta1::AllocateResponse {
            container_responses: vec![v1beta1::ContainerAllocateResponse::default(); containers],
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<v1beta1::PreStartContainerRequest>,
    ) -> Result<Response<v1beta1::PreStartContainerResponse>, Status> {
        Ok(Response::new(v1beta1::PreStartContainerResponse::default()))
    }
}

/// The plugin's server; its socket is removed when it is dropped.
struct Served {
    task: tokio::task::JoinHandle<()>,
    socket: std::path::PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Serves the plugin in the kubelet's device-plugin directory and registers
/// it with the kubelet.
async fn start_plugin(dir: &Path) -> anyhow::Result<Served> {
    let endpoint = format!("gkm-test-gpu-{}.sock", std::process::id());
    let socket = dir.join(&endpoint);
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket)?;
    let task = tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(Plugin))
            .serve_with_incoming(incoming)
            .await;
    });
    let channel = gkm_k8s::csi::client::connect(&dir.join("kubelet.sock"), TIMEOUT).await?;
    RegistrationClient::new(channel)
        .register(v1beta1::RegisterRequest {
            version: "v1beta1".into(),
            endpoint,
            resource_name: RESOURCE.into(),
            options: None,
        })
        .await?;
    Ok(Served { task, socket })
}

/// The GPU metrics the agent serves now.
fn scrape(metrics: &GpuMetrics) -> anyhow::Result<Vec<Sample>> {
    let mut registry = Registry::with_prefix("gkm");
    registry.register_collector(Box::new(metrics.clone()));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    samples(&text)
}

/// The temperature series once `done` holds for them.
async fn temperatures_when(
    metrics: &GpuMetrics,
    done: impl Fn(&[Sample]) -> bool,
) -> anyhow::Result<Vec<Sample>> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let series: Vec<Sample> = scrape(metrics)?
            .into_iter()
            .filter(|s| s.name == "gkm_gpu_temperature_celsius")
            .collect();
        if done(&series) {
            return Ok(series);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "GPU series never got there: {series:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gpu_held_by_a_pod_carries_its_namespace_pod_and_container() -> anyhow::Result<()> {
    let plane = ControlPlane::start_with(ControlPlaneOptions {
        controller_manager: true,
        ..ControlPlaneOptions::default()
    })
    .await?;
    plane.install_crds(&gkm_k8s::crd::crds()).await?;
    let node_name = "gpu-attribution";
    let node = RealNode::start(
        &plane,
        RealNodeOptions {
            name: node_name.into(),
            ..RealNodeOptions::default()
        },
    )
    .await?;
    let client = plane.client().await?;
    let _plugin = start_plugin(&node.device_plugins_dir()).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let capacity = nodes
            .get(node_name)
            .await?
            .status
            .and_then(|s| s.allocatable)
            .and_then(|a| a.get(RESOURCE).map(|q| q.0.clone()));
        if capacity.as_deref() == Some("2") {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the kubelet never offered {RESOURCE}: {capacity:?}\n{}",
            node.kubelet_log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The agent of this node, with two simulated GPUs named as the plugin
    // names them.
    let dir = gkm_testenv::temp_dir()?;
    let gpus = dir.path().join("gpus.yaml");
    std::fs::write(
        &gpus,
        format!(
            "gpus:\n  - {{profile: H100, uuid: {}}}\n  - {{profile: H100, uuid: {}}}\n",
            UUIDS[0], UUIDS[1]
        ),
    )?;
    let metrics = GpuMetrics::default();
    let mut config = AgentConfig::new(node_name, dir.path().join("store"));
    config.discovery.simulate = Some(gpus);
    config.telemetry = Some(TelemetryConfig {
        pod_resources_socket: Some(node.pod_resources_socket()),
        pod_resources_every: Duration::from_millis(500),
        ..TelemetryConfig::new(metrics.clone())
    });
    let agent = tokio::spawn(gkm_k8s::agent::run(client.clone(), config));
    let before = temperatures_when(&metrics, |s| s.len() == 2).await?;
    assert!(
        before.iter().all(|s| s.label("pod").is_none()),
        "{before:?}"
    );

    plane.ensure_namespace("ml").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ml");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "train-0", "namespace": "ml"},
        "spec": {
            "nodeName": node_name,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sleep", "100000"],
                "resources": {"limits": {RESOURCE: "1"}},
            }],
        }
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let running = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    wait_for_pod(&pods, "train-0", TIMEOUT, running).await?;

    let held = temperatures_when(&metrics, |s| s.iter().any(|s| s.label("pod").is_some())).await?;
    assert_eq!(held.len(), 2, "{held:?}");
    let labelled: Vec<&Sample> = held.iter().filter(|s| s.label("pod").is_some()).collect();
    assert_eq!(labelled.len(), 1, "one GPU is held: {held:?}");
    let uuid = labelled[0].label("UUID").unwrap_or_default();
    assert!(UUIDS.contains(&uuid), "{uuid}");
    let holder = ["namespace", "pod", "container"].map(|k| labelled[0].label(k));
    assert_eq!(holder, [Some("ml"), Some("train-0"), Some("main")]);

    pods.delete("train-0", &DeleteParams::default().grace_period(0))
        .await?;
    temperatures_when(&metrics, |s| {
        s.len() == 2 && s.iter().all(|s| s.label("pod").is_none())
    })
    .await?;

    agent.abort();
    Ok(())
}
