//! The kubelet's `DRAPlugin` service: `NodePrepareResources` reads each
//! claim from the apiserver, prepares it ([`crate::prepare`]) and records it
//! ([`ClaimStore`]); `NodeUnprepareResources` forgets it. A claim already
//! prepared is answered from the store, so a kubelet that asks again (after
//! its own restart or the plugin's) gets the same devices.
//!
//! Served as `v1.DRAPlugin` and, for kubelets before 1.34, as
//! `v1beta1.DRAPlugin`, whose messages are v1's without `share_id`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use tokio::sync::{Mutex, watch};
use tonic::{Request, Response, Status};

use crate::checkpoint::ClaimStore;
use crate::devices::NodeDevices;
use crate::prepare::{PrepareContext, PreparedClaim, prepare};
use crate::proto::v1::dra_plugin_server::DraPlugin;
use crate::proto::v1::{
    Claim, Device, NodePrepareResourceResponse, NodePrepareResourcesRequest,
    NodePrepareResourcesResponse, NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest,
    NodeUnprepareResourcesResponse,
};
use crate::proto::v1beta1;

/// Reads claims from the apiserver.
#[tonic::async_trait]
pub trait ClaimSource: Send + Sync {
    /// The ResourceClaim `namespace/name`.
    async fn claim(&self, namespace: &str, name: &str) -> crate::Result<ResourceClaim>;
}

/// Claims read through the apiserver (needs `get` on resourceclaims).
#[derive(Clone)]
pub struct ApiClaims(pub kube::Client);

#[tonic::async_trait]
impl ClaimSource for ApiClaims {
    async fn claim(&self, namespace: &str, name: &str) -> crate::Result<ResourceClaim> {
        Api::<ResourceClaim>::namespaced(self.0.clone(), namespace)
            .get(name)
            .await
            .map_err(crate::Error::api(format!(
                "reading ResourceClaim {namespace}/{name}"
            )))
    }
}

/// The service; clones share the store.
#[derive(Clone)]
pub struct DraService {
    inner: Arc<Inner>,
}

struct Inner {
    driver: String,
    pool: String,
    dev_root: PathBuf,
    devices: watch::Receiver<NodeDevices>,
    claims: Arc<dyn ClaimSource>,
    store: Mutex<ClaimStore>,
}

impl DraService {
    /// The service for `driver`'s pool `pool` (the node's name), preparing
    /// the devices `devices` holds now, with device nodes under `dev_root`.
    pub fn new(
        driver: &str,
        pool: &str,
        dev_root: PathBuf,
        devices: watch::Receiver<NodeDevices>,
        claims: Arc<dyn ClaimSource>,
        store: ClaimStore,
    ) -> DraService {
        DraService {
            inner: Arc::new(Inner {
                driver: driver.to_string(),
                pool: pool.to_string(),
                dev_root,
                devices,
                claims,
                store: Mutex::new(store),
            }),
        }
    }

    /// Prepares one claim: from the store when already prepared, else from
    /// the apiserver's claim.
    async fn prepare_one(&self, claim: &Claim) -> Result<PreparedClaim, String> {
        let inner = &self.inner;
        if let Some(prepared) = inner.store.lock().await.get(&claim.uid) {
            return Ok(prepared.clone());
        }
        let object = inner
            .claims
            .claim(&claim.namespace, &claim.name)
            .await
            .map_err(|e| e.to_string())?;
        let devices = inner.devices.borrow().clone();
        let dev_root = inner.dev_root.clone();
        let present = |rel: &str| dev_root.join(rel).exists();
        let metadata_dir = inner.store.lock().await.metadata_dir().to_path_buf();
        let prepared = prepare(
            &claim.uid,
            &object,
            &PrepareContext {
                driver: &inner.driver,
                pool: &inner.pool,
                devices: &devices,
                dev_root: &inner.dev_root,
                present: &present,
                metadata_dir: &metadata_dir,
            },
        )
        .map_err(|e| e.to_string())?;
        let mut store = inner.store.lock().await;
        // Another call may have prepared it meanwhile: keep the first.
        if let Some(prepared) = store.get(&claim.uid) {
            return Ok(prepared.clone());
        }
        store
            .insert(&claim.uid, prepared.clone())
            .map_err(|e| e.to_string())?;
        tracing::info!(
            claim = %format!("{}/{}", claim.namespace, claim.name),
            uid = %claim.uid,
            devices = ?prepared.devices.iter().map(|d| d.device.as_str()).collect::<Vec<_>>(),
            "prepared"
        );
        Ok(prepared)
    }
}

fn answer(prepared: Result<PreparedClaim, String>) -> NodePrepareResourceResponse {
    match prepared {
        Ok(prepared) => NodePrepareResourceResponse {
            devices: prepared
                .devices
                .into_iter()
                .map(|d| Device {
                    request_names: d.request_names,
                    pool_name: d.pool,
                    device_name: d.device,
                    cdi_device_ids: d.cdi_device_ids,
                    share_id: None,
                })
                .collect(),
            error: String::new(),
        },
        Err(error) => NodePrepareResourceResponse {
            devices: Vec::new(),
            error,
        },
    }
}

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let mut claims = HashMap::new();
        for claim in request.into_inner().claims {
            let prepared = self.prepare_one(&claim).await;
            if let Err(error) = &prepared {
                tracing::warn!(claim = %format!("{}/{}", claim.namespace, claim.name), %error, "cannot prepare");
            }
            claims.insert(claim.uid.clone(), answer(prepared));
        }
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let mut claims = HashMap::new();
        let mut store = self.inner.store.lock().await;
        for claim in request.into_inner().claims {
            let error = match store.remove(&claim.uid) {
                Ok(()) => {
                    tracing::info!(claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, "unprepared");
                    String::new()
                }
                Err(e) => e.to_string(),
            };
            claims.insert(claim.uid, NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

/// `message` re-read as the same message of the other API version (the
/// two versions' messages share field numbers; v1's `share_id` has no
/// v1beta1 counterpart and is dropped).
fn convert<A: prost::Message, B: prost::Message + Default>(message: &A) -> Result<B, Status> {
    B::decode(message.encode_to_vec().as_slice())
        .map_err(|e| Status::internal(format!("converting between DRA API versions: {e}")))
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let request = convert(request.get_ref())?;
        let response = DraPlugin::node_prepare_resources(self, Request::new(request)).await?;
        Ok(Response::new(convert(response.get_ref())?))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let request = convert(request.get_ref())?;
        let response = DraPlugin::node_unprepare_resources(self, Request::new(request)).await?;
        Ok(Response::new(convert(response.get_ref())?))
    }
}
