//! Registering `csi.gkm.io` with the kubelet through its plugin-registration
//! API, in place of the node-driver-registrar sidecar.
//!
//! The kubelet watches `/var/lib/kubelet/plugins_registry/`; the driver
//! serves `pluginregistration.Registration` on
//! `<registry dir>/csi.gkm.io-reg.sock` ([`socket_name`]). The kubelet calls
//! `GetInfo`, connects to the CSI endpoint it names, calls `NodeGetInfo`,
//! and reports the outcome with `NotifyRegistrationStatus`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tonic::{Request, Response, Status};

use super::DRIVER_NAME;
use super::registration_proto::registration_server::Registration;
use super::registration_proto::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};

/// The plugin type the kubelet expects of a CSI driver.
pub const CSI_PLUGIN_TYPE: &str = "CSIPlugin";
/// The CSI versions served.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

/// The registration socket's file name in the kubelet's `plugins_registry`.
pub fn socket_name() -> String {
    format!("{DRIVER_NAME}-reg.sock")
}

/// The Registration service.
#[derive(Debug, Clone)]
pub struct RegistrationService {
    endpoint: PathBuf,
    registered: Arc<AtomicBool>,
}

impl RegistrationService {
    /// The service announcing the CSI socket at `kubelet_endpoint` (the path
    /// the kubelet sees, e.g. `/var/lib/kubelet/plugins/csi.gkm.io/csi.sock`).
    pub fn new(kubelet_endpoint: PathBuf) -> RegistrationService {
        RegistrationService {
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
            r#type: CSI_PLUGIN_TYPE.to_string(),
            name: DRIVER_NAME.to_string(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
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
