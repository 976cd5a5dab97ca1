//! Registering a plugin with the kubelet through its plugin-registration
//! API, in place of a registrar sidecar (node-driver-registrar for CSI).
//!
//! The kubelet watches `/var/lib/kubelet/plugins_registry/`; the plugin
//! serves `pluginregistration.Registration` on
//! `<registry dir>/<name>-reg.sock` ([`Plugin::socket_name`]) with
//! [`serve_registration`]. The kubelet calls `GetInfo`, connects to the
//! endpoint it names, and reports the outcome with
//! `NotifyRegistrationStatus`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use crate::authority::AuthorityFix;
use crate::proto::registration::registration_server::{Registration, RegistrationServer};
use crate::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use crate::socket::{SocketError, bind, finish};

/// The plugin type the kubelet expects of a CSI driver.
pub const CSI_PLUGIN_TYPE: &str = "CSIPlugin";

/// What a plugin tells the kubelet about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plugin {
    /// Its type ([`CSI_PLUGIN_TYPE`], `DRAPlugin`).
    pub kind: &'static str,
    /// Its name (a CSI driver's name).
    pub name: &'static str,
    /// The API versions it serves.
    pub versions: &'static [&'static str],
}

impl Plugin {
    /// The registration socket's file name in the kubelet's
    /// `plugins_registry`: `<name>-reg.sock`.
    pub fn socket_name(&self) -> String {
        format!("{}-reg.sock", self.name)
    }
}

/// The Registration service.
#[derive(Debug, Clone)]
pub struct RegistrationService {
    plugin: Plugin,
    endpoint: PathBuf,
    registered: Arc<AtomicBool>,
}

impl RegistrationService {
    /// The service announcing `plugin` at `kubelet_endpoint` (its socket as
    /// the kubelet sees it, e.g. `/var/lib/kubelet/plugins/csi.gkm.io/csi.sock`).
    pub fn new(plugin: Plugin, kubelet_endpoint: PathBuf) -> RegistrationService {
        RegistrationService {
            plugin,
            endpoint: kubelet_endpoint,
            registered: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether the kubelet reported a successful registration.
    pub fn is_registered(&self) -> bool {
        self.registered.load(Ordering::Relaxed)
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<InfoRequest>,
    ) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: self.plugin.kind.to_string(),
            name: self.plugin.name.to_string(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: self.plugin.versions.iter().map(|v| v.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        self.registered
            .store(status.plugin_registered, Ordering::Relaxed);
        if status.plugin_registered {
            tracing::info!(endpoint = %self.endpoint.display(), "registered with the kubelet");
        } else {
            tracing::error!(error = %status.error, "the kubelet refused the registration");
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// Serve the kubelet plugin-registration service on `socket` until
/// `shutdown` completes. Connections go through [`AuthorityFix`], so the
/// kubelet's plugin watcher, which sends the socket path as `:authority`, is
/// answered.
pub async fn serve_registration(
    socket: &Path,
    service: RegistrationService,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), SocketError> {
    let listener = bind(socket)?;
    tracing::info!(socket = %socket.display(), plugin = service.plugin.name, "serving kubelet plugin registration");
    let served = Server::builder()
        .add_service(RegistrationServer::new(service))
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(listener).map(|conn| conn.map(AuthorityFix::new)),
            shutdown,
        )
        .await;
    finish(socket, served)
}
