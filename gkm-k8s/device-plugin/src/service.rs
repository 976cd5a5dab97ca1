//! The `v1beta1.DevicePlugin` gRPC service for one resource.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::allocate::{AllocateOptions, allocate};
use super::assignments::AssignmentSource;
use super::preferred::{self, preferred};
use super::resources::Resource;
use crate::proto::device_plugin_server::DevicePlugin;
use crate::proto::{
    AllocateRequest, AllocateResponse, ContainerPreferredAllocationResponse, Device,
    DevicePluginOptions, Empty, ListAndWatchResponse, NumaNode, PreStartContainerRequest,
    PreStartContainerResponse, PreferredAllocationRequest, PreferredAllocationResponse,
    TopologyInfo,
};

/// The kubelet's word for a usable device.
pub const HEALTHY: &str = "Healthy";
/// The kubelet's word for a device it must not allocate.
pub const UNHEALTHY: &str = "Unhealthy";

/// One resource's service. The resource's devices arrive through a watch
/// channel, so `ListAndWatch` streams every change.
#[derive(Clone)]
pub struct ResourceService {
    resource: watch::Receiver<Arc<Resource>>,
    stop: watch::Receiver<bool>,
    options: Arc<AllocateOptions>,
    assignments: Option<Arc<dyn AssignmentSource>>,
}

impl fmt::Debug for ResourceService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResourceService")
            .field("resource", &self.resource.borrow().name)
            .finish_non_exhaustive()
    }
}

impl ResourceService {
    /// A service serving what `resource` holds until `stop` turns true (open
    /// `ListAndWatch` streams end then).
    pub fn new(
        resource: watch::Receiver<Arc<Resource>>,
        stop: watch::Receiver<bool>,
        options: Arc<AllocateOptions>,
        assignments: Option<Arc<dyn AssignmentSource>>,
    ) -> ResourceService {
        ResourceService {
            resource,
            stop,
            options,
            assignments,
        }
    }

    fn current(&self) -> Arc<Resource> {
        self.resource.borrow().clone()
    }
}

/// The kubelet's view of a resource's devices.
pub fn devices(resource: &Resource) -> Vec<Device> {
    resource
        .devices
        .iter()
        .map(|d| Device {
            id: d.id.clone(),
            health: if d.unhealthy.is_none() {
                HEALTHY
            } else {
                UNHEALTHY
            }
            .to_string(),
            topology: d.numa_node.map(|n| TopologyInfo {
                nodes: vec![NumaNode { id: i64::from(n) }],
            }),
        })
        .collect()
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for ResourceService {
    async fn get_device_plugin_options(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut rx = self.resource.clone();
        rx.mark_changed();
        let state = (rx, self.stop.clone(), None::<Vec<Device>>);
        let stream = futures::stream::unfold(state, |(mut rx, mut stop, last)| async move {
            loop {
                if *stop.borrow() {
                    return None;
                }
                tokio::select! {
                    changed = rx.changed() => changed.ok()?,
                    stopped = stop.changed() => {
                        stopped.ok()?;
                        continue;
                    }
                }
                let now = devices(&rx.borrow_and_update());
                if last.as_ref() != Some(&now) {
                    let response = ListAndWatchResponse {
                        devices: now.clone(),
                    };
                    return Some((Ok(response), (rx, stop, Some(now))));
                }
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let resource = self.current();
        let assigned = match &self.assignments {
            Some(source) => source.next(&resource.name).await,
            None => None,
        };
        let mut response = PreferredAllocationResponse::default();
        for container in request.into_inner().container_requests {
            let size = usize::try_from(container.allocation_size).unwrap_or(0);
            let ids = preferred(
                &resource,
                preferred::Request {
                    available: &container.available_device_i_ds,
                    must_include: &container.must_include_device_i_ds,
                    size,
                },
                assigned.as_deref(),
            );
            tracing::debug!(resource = %resource.name, ?ids, "preferred allocation");
            response
                .container_responses
                .push(ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(response))
    }

    /// Hands each container exactly the devices the kubelet allocated: the
    /// kubelet never allocates a device another container holds, and its
    /// pod-resources API reports what each pod holds, so no assignment
    /// (which only steers `GetPreferredAllocation`) can change them.
    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let resource = self.current();
        let mut response = AllocateResponse::default();
        for container in request.into_inner().container_requests {
            match allocate(&resource, &container.devices_ids, &self.options) {
                Ok(answer) => {
                    tracing::info!(resource = %resource.name, devices = ?container.devices_ids, "allocated");
                    response.container_responses.push(answer);
                }
                Err(status) => {
                    tracing::warn!(resource = %resource.name, devices = ?container.devices_ids, error = %status.message(), "allocation refused");
                    return Err(status);
                }
            }
        }
        Ok(Response::new(response))
    }

    async fn pre_start_container(
        &self,
        _request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
