//! The driver's lifecycle: its services ([`Driver`]), serving them on a
//! unix socket ([`serve_csi`]), and [`run`], which owns the rest — the
//! kubelet registration, the sweeps of stale mount records and capture
//! trees, and the metrics endpoint — until its shutdown completes.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gkm_core::store_layout::StoreLayout;
use gkm_k8s_daemon::metrics::register_build_info;
use gkm_k8s_daemon::readiness::Readiness;
use gkm_k8s_daemon::server::EndpointServer;
use gkm_k8s_kubelet::proto::csi::identity_server::IdentityServer;
use gkm_k8s_kubelet::proto::csi::node_server::NodeServer;
use gkm_k8s_kubelet::registration::{
    CSI_PLUGIN_TYPE, Plugin, RegistrationService, serve_registration,
};
use gkm_k8s_kubelet::socket::{SocketError, bind, finish};
use gkm_k8s_node::volume::DRIVER_NAME;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

use crate::capture::admission::CaptureConfig;
use crate::capture::release::{ReleaseOptions, release_captures, report_trees_at_start};
use crate::identity::IdentityService;
use crate::metrics::CsiCollector;
use crate::node::NodeService;
use crate::views::ViewsConfig;

/// What the driver tells the kubelet when it registers: a CSI plugin named
/// [`DRIVER_NAME`], serving CSI 1.0.0. Its registration socket is
/// `PLUGIN.socket_name()` in the kubelet's `plugins_registry`.
pub const PLUGIN: Plugin = Plugin {
    kind: CSI_PLUGIN_TYPE,
    name: DRIVER_NAME,
    versions: &["1.0.0"],
};

/// What the driver needs to know.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// This node's name: the CSI node id, and the node named in refusals.
    pub node_name: String,
    /// The node store's root (the agent's `--store`).
    pub store_root: PathBuf,
    /// What is allowed of capture volumes.
    pub capture: CaptureConfig,
    /// What is allowed of the views of a cache.
    pub views: ViewsConfig,
}

/// The driver's CSI services.
#[derive(Debug, Clone)]
pub struct Driver {
    /// The Identity service.
    pub identity: IdentityService,
    /// The Node service.
    pub node: NodeService,
}

impl Driver {
    /// The driver for `config`, creating the store's entries directory if
    /// the agent has not yet (the driver only reads the store), and sweeping
    /// the uppers no mounted writable view names
    /// ([`NodeService::sweep_uppers`]).
    pub fn new(config: &DriverConfig) -> std::io::Result<Driver> {
        let store = StoreLayout::new(&config.store_root);
        store.create()?;
        let driver = Driver {
            identity: IdentityService::new(config.store_root.clone()),
            node: NodeService::new(
                config.node_name.clone(),
                store,
                config.capture.clone(),
                config.views.clone(),
            ),
        };
        if let Err(e) = driver.node.sweep_uppers() {
            tracing::warn!(error = %e, "sweeping the uppers of writable views");
        }
        Ok(driver)
    }
}

/// Serve the CSI Identity and Node services on the unix socket `socket`
/// until `shutdown` completes; the socket file is replaced if stale and
/// removed at the end.
pub async fn serve_csi(
    socket: &Path,
    driver: Driver,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), SocketError> {
    let listener = bind(socket)?;
    tracing::info!(socket = %socket.display(), node = %driver.node.node_name(), "serving CSI");
    let served = Server::builder()
        .add_service(IdentityServer::new(driver.identity))
        .add_service(NodeServer::new(driver.node))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await;
    finish(socket, served)
}

/// Removes mount records no mount backs (a node crash, a driver killed
/// between an unmount and the record's removal) at once and then every
/// `every`, until `shutdown` completes; records younger than `grace` are
/// kept, as their publish may still be under way. See
/// [`gkm_k8s_node::mount_table`].
pub async fn forget_stale_mount_records(
    store_root: PathBuf,
    every: std::time::Duration,
    grace: std::time::Duration,
    shutdown: impl Future<Output = ()> + Send,
) {
    let records = gkm_k8s_node::mount_records::MountRecords::new(&store_root);
    let work = async {
        loop {
            let records = records.clone();
            match tokio::task::spawn_blocking(move || {
                gkm_k8s_node::mount_table::reconcile_with_kernel(&records, grace)
            })
            .await
            {
                Ok(Ok(removed)) => {
                    for record in removed {
                        tracing::info!(volume = %record.volume_id, target = %record.target_path.display(),
                            "forgot a mount record no mount backs");
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "checking mount records against the mount table")
                }
                Err(e) => tracing::warn!(error = %e, "mount record check"),
            }
            tokio::time::sleep(every).await;
        }
    };
    tokio::select! {
        () = work => {}
        () = shutdown => {}
    }
}

/// Removes the relocation layers no view stacks (see
/// [`NodeService::remove_unused_layers`]) at once and then every `every`,
/// until `shutdown` completes; layers younger than `grace` are kept, as
/// their publish may still be under way.
pub async fn remove_unused_layers(
    node: NodeService,
    every: Duration,
    grace: Duration,
    shutdown: impl Future<Output = ()> + Send,
) {
    let work = async {
        loop {
            let node = node.clone();
            match tokio::task::spawn_blocking(move || node.remove_unused_layers(grace)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "removing relocation layers no view stacks")
                }
                Err(e) => tracing::warn!(error = %e, "relocation layer check"),
            }
            tokio::time::sleep(every).await;
        }
    };
    tokio::select! {
        () = work => {}
        () = shutdown => {}
    }
}

/// The socket path of a CSI endpoint: `unix:///path`, `unix:/path` or an
/// absolute path; [`BadEndpoint`] naming it otherwise.
pub fn endpoint_socket(endpoint: &str) -> Result<PathBuf, BadEndpoint> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    if !path.starts_with('/') {
        return Err(BadEndpoint(endpoint.to_string()));
    }
    Ok(PathBuf::from(path))
}

/// A CSI endpoint that names no absolute unix socket path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?}: expected unix:///absolute/path or an absolute path")]
pub struct BadEndpoint(pub String);

/// How often mount records are checked against the kernel's mount table
/// (and how old a record must be to be forgotten), by default.
pub const MOUNT_RECORD_CHECK: Duration = Duration::from_secs(60);
/// How often the capture index and the captured trees are looked at, by
/// default.
pub const CAPTURE_RELEASE_CHECK: Duration = Duration::from_secs(5);

/// How [`run`] runs the driver.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The driver's node, store and capture rules.
    pub driver: DriverConfig,
    /// The unix socket the CSI services are served on.
    pub socket: PathBuf,
    /// Registering with the kubelet; `None` for none (a
    /// node-driver-registrar sidecar registers instead).
    pub registration: Option<Registration>,
    /// Releasing capture trees once nothing will capture them; `None`
    /// keeps them (but with capture volumes disabled).
    pub release: Option<ReleaseOptions>,
    /// Where to serve `/healthz`, `/readyz` and `/metrics`; `None` for
    /// nowhere.
    pub metrics_addr: Option<SocketAddr>,
    /// How often mount records are checked against the mount table, and
    /// how old one must be to be forgotten ([`forget_stale_mount_records`]);
    /// how often, too, relocation layers no view stacks go, and how old one
    /// must be to go ([`remove_unused_layers`]).
    pub mount_record_check: Duration,
}

impl RunConfig {
    /// A configuration serving `driver` on `socket`, releasing capture
    /// trees every [`CAPTURE_RELEASE_CHECK`] (trees of captures that do not
    /// exist once a minute old), with no registration and no metrics.
    pub fn new(driver: DriverConfig, socket: impl Into<PathBuf>) -> RunConfig {
        RunConfig {
            driver,
            socket: socket.into(),
            registration: None,
            release: Some(ReleaseOptions {
                interval: CAPTURE_RELEASE_CHECK,
                grace: Duration::from_secs(60),
            }),
            metrics_addr: None,
            mount_record_check: MOUNT_RECORD_CHECK,
        }
    }
}

/// Registering with the kubelet's plugin watcher.
#[derive(Debug, Clone)]
pub struct Registration {
    /// The kubelet's `plugins_registry` directory, as this process sees it.
    pub dir: PathBuf,
    /// The CSI socket as the kubelet sees it (on the host).
    pub endpoint: PathBuf,
}

/// Why [`run`] stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The store could not be opened.
    #[error("opening the store {}: {source}", path.display())]
    Store {
        /// The store root.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The metrics endpoint could not listen.
    #[error("listening on --metrics-addr {addr}: {source}")]
    Metrics {
        /// The address asked for.
        addr: SocketAddr,
        /// What failed.
        source: std::io::Error,
    },
    /// Serving CSI failed.
    #[error("serving CSI: {0}")]
    Csi(SocketError),
    /// Serving the kubelet registration failed.
    #[error("serving plugin registration: {0}")]
    Registration(SocketError),
    /// A task of the driver panicked or was cancelled.
    #[error("{what}: {source}")]
    Task {
        /// Which task.
        what: &'static str,
        /// How it ended.
        source: tokio::task::JoinError,
    },
}

/// Runs the driver until `shutdown` completes (the binary passes the
/// process's SIGTERM): opens the store (sweeping stale uppers), says how
/// the capture trees stand, serves the metrics, the kubelet registration
/// and CSI, forgets stale mount records and releases capture trees as
/// `config` says; then stops them all.
pub async fn run(
    config: RunConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let store_root = config.driver.store_root.clone();
    let driver = Driver::new(&config.driver).map_err(|source| RunError::Store {
        path: store_root.clone(),
        source,
    })?;
    report_trees_at_start(&store_root);
    let metrics = match config.metrics_addr {
        None => None,
        Some(addr) => Some(serve_metrics(addr, &driver, &store_root).await?),
    };

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let registration = config.registration.map(|registration| {
        let socket = registration.dir.join(PLUGIN.socket_name());
        let service = RegistrationService::new(PLUGIN, registration.endpoint);
        let shutdown = stopped(stop_rx.clone());
        tokio::spawn(async move { serve_registration(&socket, service, shutdown).await })
    });
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("stopping");
        let _ = stop_tx.send(true);
    });
    tokio::spawn(forget_stale_mount_records(
        store_root,
        config.mount_record_check,
        config.mount_record_check,
        stopped(stop_rx.clone()),
    ));
    tokio::spawn(remove_unused_layers(
        driver.node.clone(),
        config.mount_record_check,
        config.mount_record_check,
        stopped(stop_rx.clone()),
    ));
    if let Some(options) = config.release {
        tokio::spawn(release_captures(
            driver.node.captures().clone(),
            options,
            stopped(stop_rx.clone()),
        ));
    }
    serve_csi(&config.socket, driver, stopped(stop_rx))
        .await
        .map_err(RunError::Csi)?;
    if let Some(server) = metrics {
        server.stop().await.map_err(|source| RunError::Task {
            what: "the metrics server",
            source,
        })?;
    }
    if let Some(task) = registration {
        task.await
            .map_err(|source| RunError::Task {
                what: "the registration task",
                source,
            })?
            .map_err(RunError::Registration)?;
    }
    Ok(())
}

/// Serves the driver's metrics ([`crate::metrics`]) and `/healthz`,
/// `/readyz` on `addr`.
async fn serve_metrics(
    addr: SocketAddr,
    driver: &Driver,
    store_root: &Path,
) -> Result<EndpointServer, RunError> {
    let mut registry = prometheus_client::registry::Registry::with_prefix("gkm");
    register_build_info(&mut registry, "gkm-csi", env!("CARGO_PKG_VERSION"));
    registry.register_collector(Box::new(CsiCollector::new(
        driver.node.metrics().clone(),
        store_root,
    )));
    let readiness = Readiness::default();
    readiness.check("driver").set(true);
    let server = EndpointServer::start(addr, registry, readiness)
        .await
        .map_err(|source| RunError::Metrics { addr, source })?;
    tracing::info!(%addr, "serving metrics");
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            endpoint_socket("unix:///csi/csi.sock").expect("ok"),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            endpoint_socket("unix:/csi/csi.sock").expect("ok"),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            endpoint_socket("/csi/csi.sock").expect("ok"),
            PathBuf::from("/csi/csi.sock")
        );
        assert!(endpoint_socket("tcp://0.0.0.0:1").is_err());
        assert!(endpoint_socket("unix://relative").is_err());
    }
}
