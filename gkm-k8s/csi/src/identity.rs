//! The CSI Identity service: name, version, capabilities, readiness.

use std::path::PathBuf;

use tonic::{Request, Response, Status};

use gkm_k8s_kubelet::proto::csi::identity_server::Identity;
use gkm_k8s_kubelet::proto::csi::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, ProbeRequest, ProbeResponse,
};
use gkm_k8s_node::volume::DRIVER_NAME;

/// The Identity service of `csi.gkm.io`.
#[derive(Debug, Clone)]
pub struct IdentityService {
    store_root: PathBuf,
}

impl IdentityService {
    /// The service for a driver serving the store at `store_root`.
    pub fn new(store_root: PathBuf) -> IdentityService {
        IdentityService { store_root }
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER_NAME.to_string(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    /// No controller service (inline volumes need none), no topology.
    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: Vec::new(),
        }))
    }

    /// Ready while the store directory is there; an error otherwise (the
    /// store is a host directory the pod spec mounts).
    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        let root = self.store_root.clone();
        let is_dir = tokio::task::spawn_blocking(move || root.is_dir())
            .await
            .map_err(|e| Status::internal(format!("probe: {e}")))?;
        if !is_dir {
            return Err(Status::failed_precondition(format!(
                "the cache store {} is not a directory",
                self.store_root.display()
            )));
        }
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}
