//! Serving the driver's gRPC services on unix sockets.

use std::future::Future;
use std::path::{Path, PathBuf};

use gkm_core::store_layout::StoreLayout;
use gkm_k8s_kubelet::socket::{SocketError, bind, finish};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

use crate::identity::IdentityService;
use crate::node::NodeService;
use crate::proto::identity_server::IdentityServer;
use crate::proto::node_server::NodeServer;

/// What the driver needs to know.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// This node's name: the CSI node id, and the node named in refusals.
    pub node_name: String,
    /// The node store's root (the agent's `--store`).
    pub store_root: PathBuf,
    /// What is allowed of capture volumes.
    pub capture: crate::capture_admission::CaptureConfig,
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
            node: NodeService::new(config.node_name.clone(), store, config.capture.clone()),
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
