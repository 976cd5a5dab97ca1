//! Running the plugin: looking at the node every poll interval (reading its
//! devices again only when [`gkm_k8s_devices::rescan`] says so), serving one
//! socket per resource, registering with the kubelet and registering again
//! when the kubelet restarts.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gkm_core::assignment::GpuDevice;
use gkm_gpu::pci_ids::PciIds;
use gkm_k8s_devices::rescan::Rescan;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

use super::allocate::AllocateOptions;
use super::assignments::AssignmentSource;
use super::naming;
use super::node_gpus::NodeGpusSink;
use super::resources::{NodePaths, Resource, ScanInputs, Snapshot, scan};
use super::service::ResourceService;
use crate::error::{Error, Result};
use crate::proto::device_plugin_server::DevicePluginServer;
use crate::proto::registration_client::RegistrationClient;
use crate::proto::{DevicePluginOptions, RegisterRequest};

/// The API version the plugin registers with.
pub const API_VERSION: &str = "v1beta1";
/// The kubelet's registration socket in the device-plugins directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// Everything the plugin needs.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// Where to look at the node.
    pub paths: NodePaths,
    /// The kubelet's device-plugins directory (`/var/lib/kubelet/device-plugins`).
    pub device_plugins_dir: PathBuf,
    /// The PCI ID database that names passthrough models.
    pub pci_ids: gkm_gpu::PciIdsSource,
    /// How often to look at the node again.
    pub poll: Duration,
    /// Watch NVML for critical XIDs and read GPU UUIDs from it (when the
    /// library is there; a node without it is fine).
    pub nvml: bool,
    /// Also name `nvidia.com/gpu` devices as CDI devices.
    pub nvidia_cdi: bool,
    /// Offer container GPUs as `gkm.io/gpu-cores` and `gkm.io/gpu-memory`
    /// units instead of whole.
    pub gpu_shares: bool,
    /// Where to write the latest snapshot (resources, excluded GPUs with
    /// reasons) as JSON, when set.
    pub status_file: Option<PathBuf>,
}

/// One served resource.
struct Served {
    resource: watch::Sender<Arc<Resource>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    socket: PathBuf,
    registered: bool,
}

/// What the plugin shares with its NVML watcher.
#[derive(Debug, Default)]
struct Health {
    inputs: Mutex<ScanInputs>,
    stop: AtomicBool,
}

/// Runs the plugin until `shutdown` completes.
///
/// With `gpu_shares`, the GPUs offered in units are published to
/// `node_gpus` (the node's `gkm.io/gpu-devices` annotation) whenever they
/// change, and again on the next look when publishing failed.
///
/// Every `poll` it looks at the node (a full read when the node's
/// fingerprint moved, an XID was recorded, or a minute passed; see
/// [`rescan`]), serves a socket for each new resource and
/// registers it, streams device changes to `ListAndWatch` (a resource whose
/// devices are all gone stays served with none), and registers every
/// resource again on a fresh socket when the kubelet's `kubelet.sock` is
/// recreated or a resource's socket disappears (a kubelet restart removes
/// them).
pub async fn run(
    config: PluginConfig,
    assignments: Option<Arc<dyn AssignmentSource>>,
    node_gpus: Option<Arc<dyn NodeGpusSink>>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let ids = PciIds::open(&config.pci_ids).map_err(|e| Error::Gpu(e.to_string()))?;
    let health = Arc::new(Health::default());
    lock(&health.inputs).gpu_shares = config.gpu_shares;
    if config.nvml {
        start_nvml(&health);
    }
    let options = Arc::new(AllocateOptions {
        dev_root: config.paths.dev_root.clone(),
        nvidia_cdi: config.nvidia_cdi,
    });
    let mut served: BTreeMap<String, Served> = BTreeMap::new();
    // The last kubelet socket seen; it stays while the kubelet is down.
    let mut kubelet = None;
    let mut last: Option<Snapshot> = None;
    let mut rescan: Rescan<Snapshot> = Rescan::default();
    let mut published: Option<Vec<GpuDevice>> = None;
    tokio::pin!(shutdown);
    loop {
        let snapshot = {
            let paths = config.paths.clone();
            let ids = ids.clone();
            let inputs = lock(&health.inputs).clone();
            // Moved into the blocking task (reading is file I/O) and back.
            let mut polling = std::mem::take(&mut rescan);
            let (snapshot, polled) = tokio::task::spawn_blocking(move || {
                let snapshot = polling.poll(&paths, &inputs, || scan(&paths, &ids, &inputs));
                (snapshot, polling)
            })
            .await
            .map_err(|e| Error::Gpu(e.to_string()))?;
            rescan = polled;
            snapshot
        };
        match snapshot {
            Ok(snapshot) => {
                // Written again when it changed or was removed (a kubelet
                // restart clears the device-plugins directory).
                let missing = config.status_file.as_deref().is_some_and(|p| !p.exists());
                if missing || last.as_ref() != Some(&snapshot) {
                    if last.as_ref().map(|l| &l.excluded) != Some(&snapshot.excluded) {
                        for ex in &snapshot.excluded {
                            tracing::warn!(device = %ex.device, reason = %ex.reason, "not offered");
                        }
                    }
                    write_status(config.status_file.as_deref(), &snapshot);
                    last = Some(snapshot.clone());
                }
                if let (true, Some(sink)) = (config.gpu_shares, &node_gpus) {
                    let gpus = super::node_gpus::node_gpus(&snapshot);
                    if published.as_ref() != Some(&gpus) {
                        match sink.publish(&gpus).await {
                            Ok(()) => {
                                tracing::info!(
                                    gpus = gpus.len(),
                                    "published the node's shared GPUs"
                                );
                                published = Some(gpus);
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "cannot publish the node's shared GPUs; retrying")
                            }
                        }
                    }
                }
                update(&config, &options, &assignments, &mut served, snapshot).await;
            }
            Err(e) => tracing::error!(error = %e, "cannot read the node's devices"),
        }
        let now = kubelet_identity(&config.device_plugins_dir);
        let restarted = now.is_some() && kubelet.is_some() && now != kubelet;
        if restarted {
            tracing::info!("the kubelet's socket was recreated; registering again");
        }
        for (name, s) in served.iter_mut() {
            let socket_gone = !s.socket.exists();
            if socket_gone || restarted {
                if socket_gone {
                    tracing::info!(resource = %name, "socket removed; serving it again");
                }
                restart(&options, &assignments, s, name).await;
            }
            if !s.registered && now.is_some() {
                s.registered = register(&config.device_plugins_dir, name, &s.socket)
                    .await
                    .map_err(|e| tracing::warn!(resource = %name, error = %e, "registration failed; retrying"))
                    .is_ok();
            }
        }
        if now.is_some() {
            kubelet = now;
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(config.poll) => {}
        }
    }
    health.stop.store(true, Ordering::Relaxed);
    for (_, s) in served {
        stop(s).await;
    }
    Ok(())
}

/// Brings the served resources in line with `snapshot`.
async fn update(
    config: &PluginConfig,
    options: &Arc<AllocateOptions>,
    assignments: &Option<Arc<dyn AssignmentSource>>,
    served: &mut BTreeMap<String, Served>,
    snapshot: Snapshot,
) {
    for (name, s) in served.iter() {
        if !snapshot.resources.contains_key(name) {
            s.resource.send_if_modified(|r| {
                let had_devices = !r.devices.is_empty();
                if had_devices {
                    tracing::info!(resource = %name, "no devices left");
                    *r = Arc::new(Resource {
                        devices: Vec::new(),
                        ..(**r).clone()
                    });
                }
                had_devices
            });
        }
    }
    for (name, resource) in snapshot.resources {
        if let Some(s) = served.get(&name) {
            s.resource.send_if_modified(|r| {
                let changed = **r != resource;
                if changed {
                    tracing::info!(resource = %name, devices = resource.devices.len(), healthy = resource.healthy(), "devices changed");
                    *r = Arc::new(resource);
                }
                changed
            });
            continue;
        }
        tracing::info!(resource = %name, devices = resource.devices.len(), healthy = resource.healthy(), "new resource");
        let socket = config.device_plugins_dir.join(naming::socket_name(&name));
        let (tx, _) = watch::channel(Arc::new(resource));
        let (stop_tx, _) = watch::channel(false);
        let mut s = Served {
            resource: tx,
            stop: stop_tx,
            task: tokio::spawn(async {}),
            socket,
            registered: false,
        };
        restart(options, assignments, &mut s, &name).await;
        served.insert(name, s);
    }
}

/// Stops a resource's server (if running) and serves it on a fresh socket;
/// it must register again.
async fn restart(
    options: &Arc<AllocateOptions>,
    assignments: &Option<Arc<dyn AssignmentSource>>,
    s: &mut Served,
    name: &str,
) {
    let _ = s.stop.send(true);
    finish(&mut s.task).await;
    s.registered = false;
    let (stop_tx, stop_rx) = watch::channel(false);
    s.stop = stop_tx;
    let listener = match gkm_k8s_kubelet::socket::bind(&s.socket) {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!(resource = %name, error = %e, "cannot serve");
            s.task = tokio::spawn(async {});
            return;
        }
    };
    let service = ResourceService::new(
        s.resource.subscribe(),
        stop_rx.clone(),
        options.clone(),
        assignments.clone(),
    );
    let mut stopped = stop_rx;
    let name = name.to_string();
    s.task = tokio::spawn(async move {
        let served = Server::builder()
            .add_service(DevicePluginServer::new(service))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            })
            .await;
        if let Err(e) = served {
            tracing::error!(resource = %name, error = %e, "device plugin server failed");
        }
    });
}

/// Waits a little for a stopping server, then drops it.
async fn finish(task: &mut JoinHandle<()>) {
    if tokio::time::timeout(Duration::from_secs(2), &mut *task)
        .await
        .is_err()
    {
        task.abort();
    }
}

async fn stop(mut s: Served) {
    let _ = s.stop.send(true);
    finish(&mut s.task).await;
    let _ = std::fs::remove_file(&s.socket);
}

/// Registers `resource`, served on `socket`, with the kubelet.
pub async fn register(device_plugins_dir: &Path, resource: &str, socket: &Path) -> Result<()> {
    let kubelet = device_plugins_dir.join(KUBELET_SOCKET);
    let io_err = |e: String| Error::Io {
        path: kubelet.clone(),
        source: io::Error::other(e),
    };
    let channel = gkm_k8s_kubelet::socket::connect(&kubelet, Duration::from_secs(2))
        .await
        .map_err(|e| io_err(e.to_string()))?;
    let endpoint = socket
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: API_VERSION.to_string(),
            endpoint,
            resource_name: resource.to_string(),
            options: Some(DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        })
        .await
        .map_err(|e| io_err(e.message().to_string()))?;
    tracing::info!(resource, "registered with the kubelet");
    Ok(())
}

/// The kubelet socket's identity (device, inode, change time): a new one
/// means the kubelet restarted.
fn kubelet_identity(dir: &Path) -> Option<(u64, u64, i64)> {
    let meta = std::fs::metadata(dir.join(KUBELET_SOCKET)).ok()?;
    Some((
        meta.dev(),
        meta.ino(),
        meta.ctime_nsec() + meta.ctime() * 1_000_000_000,
    ))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write_status(path: Option<&Path>, snapshot: &Snapshot) {
    let Some(path) = path else { return };
    let written = serde_json::to_vec_pretty(snapshot)
        .map_err(io::Error::other)
        .and_then(|json| {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, json)?;
            std::fs::rename(&tmp, path)
        });
    if let Err(e) = written {
        tracing::warn!(path = %path.display(), error = %e, "cannot write the status file");
    }
}

/// Logs an XID NVML reported, and whether it made its GPU unhealthy.
pub(crate) fn log_xid(event: &gkm_gpu::nvidia::XidEvent, critical: bool) {
    let xid = event
        .xid
        .map_or_else(|| "unknown".to_string(), |x| x.to_string());
    if critical {
        tracing::warn!(gpu = ?event.pci_address, xid, "critical XID: marking the GPU unhealthy");
    } else {
        tracing::info!(gpu = ?event.pci_address, xid, "XID ignored (an application's fault)");
    }
}

/// Reads GPU UUIDs from NVML once and watches its critical XIDs on a thread
/// of its own; without NVML, logs why and does nothing.
fn start_nvml(health: &Arc<Health>) {
    let report = gkm_gpu::nvidia::query();
    {
        let mut inputs = lock(&health.inputs);
        for gpu in report.gpus {
            let Some(address) = gpu.pci_address else {
                continue;
            };
            if let Some(uuid) = gpu.uuid {
                inputs.nvml_uuids.insert(address.clone(), uuid);
            }
            if let Some(bytes) = gpu.memory_bytes {
                inputs.nvml_memory.insert(address, bytes);
            }
        }
    }
    let health = health.clone();
    std::thread::spawn(move || {
        let ended = gkm_gpu::nvidia::watch_xids(&health.stop, |event| {
            let mut inputs = lock(&health.inputs);
            let all: Vec<String> = inputs.nvml_uuids.keys().cloned().collect();
            log_xid(&event, inputs.record_xid(&event, all));
        });
        tracing::info!(reason = %ended, "no NVML XID health checks");
    });
}
