//! Serving the driver's gRPC services on unix sockets.

use std::future::Future;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use gkm_oci::Store;
use tokio::net::UnixListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

use super::authority::AuthorityFix;
use super::identity::IdentityService;
use super::node::NodeService;
use super::proto::identity_server::IdentityServer;
use super::proto::node_server::NodeServer;
use super::registration::RegistrationService;
use super::registration_proto::registration_server::RegistrationServer;
use crate::error::{Error, Result};

/// What the driver needs to know.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// This node's name: the CSI node id, and the node named in refusals.
    pub node_name: String,
    /// The node store's root (the agent's `--store`).
    pub store_root: PathBuf,
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
    /// The driver for `config`, opening (creating if needed) the store.
    pub fn new(config: &DriverConfig) -> Result<Driver> {
        let store = Store::open(&config.store_root)?;
        Ok(Driver {
            identity: IdentityService::new(config.store_root.clone()),
            node: NodeService::new(config.node_name.clone(), store),
        })
    }
}

/// Serve the CSI Identity and Node services on the unix socket `socket`
/// until `shutdown` completes; the socket file is replaced if stale and
/// removed at the end.
pub async fn serve_csi(
    socket: &Path,
    driver: Driver,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let listener = bind(socket)?;
    tracing::info!(socket = %socket.display(), node = %driver.node.node_name(), "serving CSI");
    let served = Server::builder()
        .add_service(IdentityServer::new(driver.identity))
        .add_service(NodeServer::new(driver.node))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await;
    finish(socket, served)
}

/// Serve the kubelet plugin-registration service on `socket` until
/// `shutdown` completes. Connections go through [`AuthorityFix`], so the
/// kubelet's plugin watcher, which sends the socket path as `:authority`, is
/// answered.
pub async fn serve_registration(
    socket: &Path,
    service: RegistrationService,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let listener = bind(socket)?;
    tracing::info!(socket = %socket.display(), "serving kubelet plugin registration");
    let served = Server::builder()
        .add_service(RegistrationServer::new(service))
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(listener).map(|conn| conn.map(AuthorityFix::new)),
            shutdown,
        )
        .await;
    finish(socket, served)
}

/// Removes mount records no mount backs (a node crash, a driver killed
/// between an unmount and the record's removal) at once and then every
/// `every`, until `shutdown` completes; records younger than `grace` are
/// kept, as their publish may still be under way. See
/// [`crate::node_files::mount_table`].
pub async fn forget_stale_mount_records(
    store_root: PathBuf,
    every: std::time::Duration,
    grace: std::time::Duration,
    shutdown: impl Future<Output = ()> + Send,
) {
    let records = crate::node_files::mount_records::MountRecords::new(&store_root);
    let work = async {
        loop {
            let records = records.clone();
            match tokio::task::spawn_blocking(move || {
                crate::node_files::mount_table::reconcile_with_kernel(&records, grace)
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

fn finish(socket: &Path, served: std::result::Result<(), tonic::transport::Error>) -> Result<()> {
    let _ = std::fs::remove_file(socket);
    served.map_err(|e| Error::Io {
        path: socket.to_path_buf(),
        source: io::Error::other(e),
    })
}

/// Listen on `socket`, creating its directory and removing a stale socket
/// file (but nothing that is not a socket).
pub(crate) fn bind(socket: &Path) -> Result<UnixListener> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    match std::fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(socket).map_err(io_err(socket))?
        }
        Ok(_) => {
            return Err(Error::Io {
                path: socket.to_path_buf(),
                source: io::Error::new(io::ErrorKind::AlreadyExists, "exists and is not a socket"),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(socket)(e)),
    }
    UnixListener::bind(socket).map_err(io_err(socket))
}
