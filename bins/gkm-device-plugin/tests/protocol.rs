//! The `gkm-device-plugin` binary over the kubelet's device-plugin protocol:
//! the test serves the `v1beta1.Registration` service on a `kubelet.sock` of
//! its own and talks to the plugin's sockets with a gRPC client, against a
//! sysfs, /dev and /proc tree it made.
//!
//! It checks that each resource registers on its own socket, that
//! `ListAndWatch` reports a group node disappearing and coming back and
//! vGPUs being created and removed, that `Allocate` and
//! `GetPreferredAllocation` answer, that a recreated `kubelet.sock` brings
//! every resource back registered on fresh sockets, and that SIGTERM stops
//! the plugin and removes its sockets.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gkm_k8s_device_plugin::node_tree::{EXAMPLE_VGPU_PARENT, NodeTree};
use gkm_k8s_kubelet::proto::deviceplugin::device_plugin_client::DevicePluginClient;
use gkm_k8s_kubelet::proto::deviceplugin::registration_server::{Registration, RegistrationServer};
use gkm_k8s_kubelet::proto::deviceplugin::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    ListAndWatchResponse, PreferredAllocationRequest, RegisterRequest,
};
use gkm_testenv::Process;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

const H100: &str = "nvidia.com/GH100_H100_SXM5_80GB";
const A100: &str = "nvidia.com/GA100_A100_PCIE_80GB";
const T4_2Q: &str = "nvidia.com/GRID_T4-2Q";
const WAIT: Duration = Duration::from_secs(20);

/// The kubelet's registration service, as the test serves it: it passes
/// every request on.
struct Kubelet(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let _ = self.0.send(request.into_inner());
        Ok(Response::new(Empty {}))
    }
}

/// Serves `kubelet.sock` in `dir` until the returned sender is used or dropped.
fn serve_kubelet(
    dir: &Path,
    requests: mpsc::UnboundedSender<RegisterRequest>,
) -> oneshot::Sender<()> {
    let socket = dir.join("kubelet.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind kubelet.sock");
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Kubelet(requests)))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                async {
                    let _ = stop_rx.await;
                },
            )
            .await
            .expect("kubelet registration server");
    });
    stop_tx
}

/// Waits for `n` registrations, by resource name.
async fn registrations(
    rx: &mut mpsc::UnboundedReceiver<RegisterRequest>,
    n: usize,
) -> BTreeMap<String, RegisterRequest> {
    let mut seen = BTreeMap::new();
    while seen.len() < n {
        let request = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("only {} of {n} registrations: {seen:?}", seen.len()))
            .expect("registration channel");
        seen.insert(request.resource_name.clone(), request);
    }
    seen
}

async fn connect(socket: &Path) -> Channel {
    gkm_k8s_kubelet::socket::connect(socket, WAIT)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e:?}", socket.display()))
}

/// The next `ListAndWatch` update as (ID, health) pairs.
async fn next(stream: &mut Streaming<ListAndWatchResponse>) -> Vec<(String, String)> {
    let update = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("a ListAndWatch update in time")
        .expect("ListAndWatch stream")
        .expect("ListAndWatch still open");
    update
        .devices
        .into_iter()
        .map(|d| (d.id, d.health))
        .collect()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

fn start_plugin(work: &Path, tree: &NodeTree, plugins: &Path) -> Process {
    let pci_ids = work.join("pci.ids");
    std::fs::write(
        &pci_ids,
        "10de  NVIDIA Corporation\n\t20b5  GA100 [A100 PCIe 80GB]\n\t2330  GH100 [H100 SXM5 80GB]\n",
    )
    .expect("pci.ids");
    let paths = tree.paths();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gkm-device-plugin"));
    cmd.arg(format!("--device-plugins-dir={}", plugins.display()))
        .arg(format!("--sysfs-root={}", paths.sysfs_root.display()))
        .arg(format!("--dev-root={}", paths.dev_root.display()))
        .arg(format!("--proc-root={}", paths.proc_root.display()))
        .arg(format!("--pci-ids={}", pci_ids.display()))
        .arg(format!(
            "--status-file={}",
            work.join("status.json").display()
        ))
        .arg("--poll=200ms")
        .arg("--no-nvml")
        .env_remove("NODE_NAME");
    Process::spawn("gkm-device-plugin", cmd, &work.join("plugin.log")).expect("start the plugin")
}

#[tokio::test(flavor = "multi_thread")]
async fn registers_streams_changes_allocates_and_comes_back_after_a_kubelet_restart() {
    let work = tempfile::tempdir().expect("tempdir");
    let tree = NodeTree::new(&work.path().join("node")).expect("tree");
    tree.example().expect("example node");
    let plugins: PathBuf = work.path().join("device-plugins");
    std::fs::create_dir_all(&plugins).expect("plugins dir");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let kubelet = serve_kubelet(&plugins, tx.clone());
    let mut plugin = start_plugin(work.path(), &tree, &plugins);

    // One registration per resource, each naming its own socket.
    let registered = registrations(&mut rx, 3).await;
    assert_eq!(
        registered.keys().collect::<Vec<_>>(),
        [A100, H100, T4_2Q],
        "{}",
        plugin.log_tail(30)
    );
    let h100 = &registered[H100];
    assert_eq!(h100.version, "v1beta1");
    assert_eq!(h100.endpoint, "gkm-nvidia.com_GH100_H100_SXM5_80GB.sock");
    assert!(
        h100.options
            .as_ref()
            .is_some_and(|o| o.get_preferred_allocation_available)
    );

    // The group that is not viable is reported with its reason.
    let status: serde_json::Value =
        serde_json::from_slice(&std::fs::read(work.path().join("status.json")).expect("status"))
            .expect("status JSON");
    let excluded = status["excluded"].as_array().expect("excluded");
    assert!(
        excluded.iter().any(|e| e["device"] == "0000:4c:00.0"
            && e["reason"]
                .as_str()
                .is_some_and(|r| r.contains("snd_hda_intel"))),
        "{excluded:?}"
    );

    let mut client = DevicePluginClient::new(connect(&plugins.join(&h100.endpoint)).await);
    let options = client
        .get_device_plugin_options(Empty {})
        .await
        .expect("options")
        .into_inner();
    assert!(options.get_preferred_allocation_available);
    let mut stream = client
        .list_and_watch(Empty {})
        .await
        .expect("ListAndWatch")
        .into_inner();
    let healthy = pairs(&[("0000:18:00.0", "Healthy"), ("0000:2a:00.0", "Healthy")]);
    assert_eq!(next(&mut stream).await, healthy);

    // A group node disappears, then comes back.
    tree.remove_group_node(11).expect("remove group node");
    assert_eq!(
        next(&mut stream).await,
        pairs(&[("0000:18:00.0", "Healthy"), ("0000:2a:00.0", "Unhealthy")])
    );
    tree.group_node(11).expect("restore group node");
    assert_eq!(next(&mut stream).await, healthy);

    let answer = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["0000:2a:00.0".into()],
            }],
        })
        .await
        .expect("Allocate")
        .into_inner();
    let container = &answer.container_responses[0];
    assert_eq!(
        container.envs["PCI_RESOURCE_NVIDIA_COM_GH100_H100_SXM5_80GB"],
        "0000:2a:00.0"
    );
    let paths: Vec<&str> = container
        .devices
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    assert_eq!(paths, ["/dev/vfio/vfio", "/dev/vfio/11"]);
    let refused = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["0000:4c:00.0".into()],
            }],
        })
        .await
        .expect_err("a device not offered");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);

    let preferred = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: vec!["0000:2a:00.0".into(), "0000:18:00.0".into()],
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .expect("GetPreferredAllocation")
        .into_inner();
    assert_eq!(preferred.container_responses[0].device_i_ds.len(), 1);

    // vGPUs created and removed while the plugin runs.
    let vgpu_socket = plugins.join(&registered[T4_2Q].endpoint);
    let mut vgpus = DevicePluginClient::new(connect(&vgpu_socket).await)
        .list_and_watch(Empty {})
        .await
        .expect("ListAndWatch vGPUs")
        .into_inner();
    assert_eq!(next(&mut vgpus).await.len(), 2);
    let third = "0b1c5e8a-1111-4d2e-9c3a-000000000003";
    tree.mdev(third, EXAMPLE_VGPU_PARENT, "nvidia-222", "GRID T4-2Q", 32)
        .expect("create vGPU");
    let ids: Vec<String> = next(&mut vgpus).await.into_iter().map(|d| d.0).collect();
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().any(|id| id == third));
    tree.remove_mdev(third).expect("remove vGPU");
    assert_eq!(next(&mut vgpus).await.len(), 2);

    // The kubelet restarts: it removes the plugins' sockets and serves a new
    // kubelet.sock. Every resource is served and registered again.
    let _ = kubelet.send(());
    for entry in std::fs::read_dir(&plugins).expect("plugins dir") {
        std::fs::remove_file(entry.expect("entry").path()).expect("remove socket");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _kubelet = serve_kubelet(&plugins, tx);
    let again = registrations(&mut rx, 3).await;
    assert_eq!(again.keys().collect::<Vec<_>>(), [A100, H100, T4_2Q]);
    let mut client = DevicePluginClient::new(connect(&plugins.join(&again[H100].endpoint)).await);
    let mut stream = client
        .list_and_watch(Empty {})
        .await
        .expect("ListAndWatch after the restart")
        .into_inner();
    assert_eq!(next(&mut stream).await, healthy);

    plugin.check_running().expect("the plugin is still running");
    let status = plugin
        .terminate(Duration::from_secs(10))
        .expect("stops on SIGTERM");
    assert!(status.success(), "{status}\n{}", plugin.log_tail(30));
    let left: Vec<_> = std::fs::read_dir(&plugins)
        .expect("plugins dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("gkm-"))
        .collect();
    assert!(left.is_empty(), "sockets left behind: {left:?}");
}
