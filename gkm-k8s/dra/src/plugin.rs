//! Running the plugin: looking at the node every poll interval (reading its
//! devices again only when [`crate::rescan`] says so), serving the DRA
//! socket and the registration socket, and keeping the node's
//! ResourceSlices published until shutdown, when they are deleted.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gkm_gpu::pci_ids::PciIds;
use gkm_gpu::{DiscoveryOptions, PciIdsSource};
use gkm_k8s_devices::NodePaths;
use gkm_k8s_devices::resources::{Access, ScanInputs, from_inventory};
use gkm_k8s_kubelet::authority::AuthorityFix;
use gkm_k8s_kubelet::registration::{RegistrationService, serve_registration};
use gkm_k8s_kubelet::socket::{bind, finish};
use tokio::sync::{Notify, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

use crate::checkpoint::ClaimStore;
use crate::devices::{NodeDevices, node_devices};
use crate::error::{Error, Result};
use crate::health::HealthService;
use crate::proto::health::dra_resource_health_server::DraResourceHealthServer;
use crate::proto::v1::dra_plugin_server::DraPluginServer;
use crate::proto::v1beta1::dra_plugin_server::DraPluginServer as DraPluginServerV1beta1;
use crate::publish::{Publisher, watch_slices};
use crate::rescan::Rescan;
use crate::service::{ApiClaims, DraService};
use crate::{DRIVER, PLUGIN};

/// Everything the plugin needs.
#[derive(Debug, Clone)]
pub struct DraConfig {
    /// Where to look at the node.
    pub paths: NodePaths,
    /// The kubelet's root directory (`/var/lib/kubelet`): the registration
    /// socket goes in its `plugins_registry/`, the DRA socket in
    /// `plugins/gpu.gkm.io/`.
    pub kubelet_dir: PathBuf,
    /// Where CDI specs go (a directory the runtime reads, `/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// Where the prepared-claims checkpoint goes.
    pub state_dir: PathBuf,
    /// The PCI ID database that names devices.
    pub pci_ids: PciIdsSource,
    /// How often to look at the node again.
    pub poll: Duration,
    /// Ask NVML about NVIDIA GPUs (driver version, memory, UUIDs).
    pub nvml: bool,
    /// This node's name (its pool's name).
    pub node_name: String,
}

impl DraConfig {
    /// The DRA socket the kubelet calls.
    pub fn dra_socket(&self) -> PathBuf {
        self.kubelet_dir
            .join("plugins")
            .join(DRIVER)
            .join("dra.sock")
    }

    /// The registration socket the kubelet's plugin watcher finds.
    pub fn registration_socket(&self) -> PathBuf {
        self.kubelet_dir
            .join("plugins_registry")
            .join(PLUGIN.socket_name())
    }
}

/// Reads the node's devices: discovery, what each needs in a container
/// ([`gkm_k8s_devices::resources`]), and each PCI function's root complex.
pub fn look(config: &DraConfig, ids: &PciIds) -> Result<NodeDevices> {
    look_with(config, ids, &ScanInputs::default())
}

/// [`look`], with what NVML reported: GPUs with a critical XID are
/// unhealthy.
pub fn look_with(config: &DraConfig, ids: &PciIds, inputs: &ScanInputs) -> Result<NodeDevices> {
    let inventory = gkm_gpu::discover(&DiscoveryOptions {
        sysfs_root: config.paths.sysfs_root.clone(),
        nvml: config.nvml,
        simulate: None,
        pci_ids: config.pci_ids.clone(),
    })?;
    let snapshot = from_inventory(&config.paths, ids, inputs, inventory.clone());
    let roots = pcie_roots(&config.paths.sysfs_root);
    Ok(node_devices(&inventory, &snapshot, &roots))
}

/// PCI address → root complex (`pci0000:00`), from where
/// `bus/pci/devices/<address>` links in `devices/`.
fn pcie_roots(sysfs_root: &Path) -> BTreeMap<String, String> {
    let dir = sysfs_root.join("bus/pci/devices");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let target = std::fs::read_link(entry.path()).ok()?;
            let root = target.components().find_map(|c| {
                let name = c.as_os_str().to_str()?;
                name.starts_with("pci").then(|| name.to_string())
            })?;
            Some((entry.file_name().to_string_lossy().into_owned(), root))
        })
        .collect()
}

/// Watches NVML's XIDs on a thread of its own until `stop`: a GPU with a
/// critical one is unhealthy from the next look on (left out of the slice,
/// reported unhealthy to the kubelet). Without NVML, logs why and ends.
fn watch_xids(
    inputs: Arc<Mutex<ScanInputs>>,
    devices: watch::Receiver<NodeDevices>,
    stop: Arc<AtomicBool>,
) {
    std::thread::spawn(move || {
        let ended = gkm_gpu::nvidia::watch_xids(&stop, |event| {
            // NVML could not say which GPU: every NVIDIA GPU.
            let nvidia: Vec<String> = devices
                .borrow()
                .devices
                .iter()
                .filter(|d| matches!(d.access, Access::Nvidia { .. }))
                .filter_map(|d| d.attributes.get(crate::devices::PCI_BUS_ID))
                .filter_map(|a| a.string.clone())
                .collect();
            let critical = inputs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .record_xid(&event, nvidia);
            if critical {
                tracing::warn!(gpu = ?event.pci_address, xid = ?event.xid, "critical XID: the GPU is unhealthy");
            } else {
                tracing::info!(gpu = ?event.pci_address, xid = ?event.xid, "XID ignored (an application's fault)");
            }
        });
        tracing::info!(reason = %ended, "no NVML XID health checks");
    });
}

/// Logs devices left out that were not left out before, with the reason.
fn log_excluded(before: &NodeDevices, now: &NodeDevices) {
    for excluded in &now.excluded {
        if !before.excluded.contains(excluded) {
            tracing::warn!(device = %excluded.device, reason = %excluded.reason, "not published");
        }
    }
}

/// Runs the plugin until `shutdown` completes: looks at the node, serves
/// the kubelet, publishes the node's pool; then deletes the node's slices
/// and the sockets.
pub async fn run(
    config: DraConfig,
    client: kube::Client,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let ids = PciIds::open(&config.pci_ids)?;
    let store = ClaimStore::open(&config.state_dir, &config.cdi_dir)?;
    let inputs = Arc::new(Mutex::new(ScanInputs::default()));
    let mut rescan = Rescan::default();
    let first = rescan.poll(&config.paths, &ScanInputs::default(), || {
        look(&config, &ids)
    })?;
    log_excluded(&NodeDevices::default(), &first);
    let (devices_tx, devices_rx) = watch::channel(first);
    let xids_stop = Arc::new(AtomicBool::new(false));
    if config.nvml {
        watch_xids(inputs.clone(), devices_rx.clone(), xids_stop.clone());
    }
    let mut publisher = Publisher::new(client.clone(), DRIVER, &config.node_name).await?;

    let service = DraService::new(
        DRIVER,
        &config.node_name,
        config.paths.dev_root.clone(),
        devices_rx.clone(),
        Arc::new(ApiClaims(client.clone())),
        store,
    );
    let health = HealthService::new(&config.node_name, devices_rx.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    let dra_socket = config.dra_socket();
    let listener = bind(&dra_socket)?;
    let dra = {
        let stop = stopped();
        let dra_socket = dra_socket.clone();
        tokio::spawn(async move {
            let served = Server::builder()
                .add_service(DraPluginServer::new(service.clone()))
                .add_service(DraPluginServerV1beta1::new(service))
                .add_service(DraResourceHealthServer::new(health))
                .serve_with_incoming_shutdown(
                    UnixListenerStream::new(listener).map(|c| c.map(AuthorityFix::new)),
                    stop,
                )
                .await;
            finish(&dra_socket, served)
        })
    };
    tracing::info!(socket = %dra_socket.display(), driver = DRIVER, "serving the kubelet's DRA API");
    let registration = {
        let stop = stopped();
        let socket = config.registration_socket();
        let service = RegistrationService::new(PLUGIN, dra_socket.clone());
        tokio::spawn(async move { serve_registration(&socket, service, stop).await })
    };
    let slices_changed = Arc::new(Notify::new());
    let watch = {
        let (client, node, changed) = (
            client.clone(),
            config.node_name.clone(),
            slices_changed.clone(),
        );
        tokio::spawn(async move { watch_slices(client, DRIVER, &node, &changed).await })
    };

    let mut shutdown = std::pin::pin!(shutdown);
    let mut poll = tokio::time::interval(config.poll);
    // The apiserver is asked only when the devices changed, the slices
    // changed (the watch) or the last write failed.
    let mut publish = true;
    loop {
        if publish {
            let devices = devices_rx.borrow().clone();
            publish = match publisher.publish(&devices.devices).await {
                Ok(()) => false,
                Err(e) => {
                    tracing::warn!(error = %e, "publishing the node's ResourceSlices; trying again");
                    true
                }
            };
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = slices_changed.notified() => publish = true,
            _ = poll.tick() => {
                let inputs = inputs.lock().unwrap_or_else(|e| e.into_inner()).clone();
                match rescan.poll(&config.paths, &inputs, || look_with(&config, &ids, &inputs)) {
                    Ok(found) => {
                        if found != *devices_rx.borrow() {
                            log_excluded(&devices_rx.borrow(), &found);
                            devices_tx.send_replace(found);
                            publish = true;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "looking at the node's devices; looking again at the next poll"),
                }
            }
        }
    }
    watch.abort();
    xids_stop.store(true, Ordering::Relaxed);
    stop_tx.send_replace(true);
    if let Err(e) = publisher.withdraw().await {
        tracing::warn!(error = %e, "deleting the node's ResourceSlices");
    }
    let joined = |r: std::result::Result<std::result::Result<(), _>, tokio::task::JoinError>| {
        r.map_err(|e| Error::Io {
            path: dra_socket.clone(),
            source: std::io::Error::other(e),
        })?
        .map_err(Error::Socket)
    };
    joined(dra.await)?;
    joined(registration.await)?;
    Ok(())
}
