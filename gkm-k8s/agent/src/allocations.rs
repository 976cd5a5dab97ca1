//! Which containers hold which devices, from the kubelet's pod-resources
//! API ([`gkm_k8s_kubelet::podresources`]), as dcgm-exporter reads it.
//!
//! [`Allocations`] maps device ids (as device plugins name them: a GPU UUID,
//! a PCI address) to the containers holding them; [`follow`] keeps it up to
//! date.
//!
//! ```
//! use gkm_k8s_agent::allocations::{Allocations, ContainerRef};
//! use gkm_k8s_kubelet::proto::podresources as proto;
//! let list = proto::ListPodResourcesResponse {
//!     pod_resources: vec![proto::PodResources {
//!         name: "train".into(),
//!         namespace: "ml".into(),
//!         containers: vec![proto::ContainerResources {
//!             name: "main".into(),
//!             devices: vec![proto::ContainerDevices {
//!                 resource_name: "nvidia.com/gpu".into(),
//!                 device_ids: vec!["GPU-1".into()],
//!                 topology: None,
//!             }],
//!             ..Default::default()
//!         }],
//!     }],
//! };
//! let allocations = Allocations::default();
//! allocations.replace(&list);
//! let holders = allocations.holders(["GPU-1"]);
//! assert_eq!(holders, [ContainerRef { namespace: "ml".into(), pod: "train".into(), container: "main".into() }]);
//! assert!(allocations.holders(["GPU-2"]).is_empty());
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tracing::{debug, info, warn};

use gkm_k8s_kubelet::podresources::list;
use gkm_k8s_kubelet::proto::podresources as proto;

pub use gkm_gpu::metrics::ContainerRef;

/// Device id → the containers holding it, shared between the task that
/// refreshes it and the readers. Clones share the same map.
#[derive(Debug, Clone, Default)]
pub struct Allocations {
    by_device: Arc<RwLock<BTreeMap<String, Vec<ContainerRef>>>>,
}

impl Allocations {
    /// Replaces the map with what the kubelet listed.
    pub fn replace(&self, list: &proto::ListPodResourcesResponse) {
        let mut by_device: BTreeMap<String, Vec<ContainerRef>> = BTreeMap::new();
        for pod in &list.pod_resources {
            for container in &pod.containers {
                let holder = ContainerRef {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: container.name.clone(),
                };
                for id in container.devices.iter().flat_map(|d| &d.device_ids) {
                    let holders = by_device.entry(device_key(id)).or_default();
                    if !holders.contains(&holder) {
                        holders.push(holder.clone());
                    }
                }
            }
        }
        for holders in by_device.values_mut() {
            holders.sort();
        }
        *self
            .by_device
            .write()
            .unwrap_or_else(PoisonError::into_inner) = by_device;
    }

    /// The containers holding any of the devices named `ids` (a GPU's UUID,
    /// its PCI address), sorted, each once.
    pub fn holders<'a>(&self, ids: impl IntoIterator<Item = &'a str>) -> Vec<ContainerRef> {
        let by_device = self
            .by_device
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let mut holders: Vec<ContainerRef> = ids
            .into_iter()
            .filter_map(|id| by_device.get(&device_key(id)))
            .flatten()
            .cloned()
            .collect();
        holders.sort();
        holders.dedup();
        holders
    }
}

impl gkm_gpu::metrics::Holders for Allocations {
    fn holders(&self, ids: &[&str]) -> Vec<ContainerRef> {
        Allocations::holders(self, ids.iter().copied())
    }
}

/// Device ids compared: PCI addresses in sysfs form (NVML's
/// `00000000:3B:00.0` is `0000:3b:00.0`), anything else as given.
fn device_key(id: &str) -> String {
    gkm_gpu::nvidia::normalise_bus_id(id).unwrap_or_else(|| id.to_string())
}

/// Lists the kubelet's pod resources every `every` into `allocations`,
/// forever. A failure keeps the last answer and is logged once until the
/// kubelet answers again.
pub async fn follow(socket: PathBuf, allocations: Allocations, every: Duration) {
    let mut failing = false;
    loop {
        match list(&socket, every.max(Duration::from_secs(1))).await {
            Ok(answer) => {
                if failing {
                    info!(socket = %socket.display(), "the kubelet's pod-resources API answers again");
                }
                failing = false;
                allocations.replace(&answer);
            }
            Err(e) if !failing => {
                warn!(error = %e, "cannot read which pods hold GPUs; GPU metrics carry no pod labels until it answers");
                failing = true;
            }
            Err(e) => debug!(error = %e, "pod-resources API"),
        }
        tokio::time::sleep(every).await;
    }
}
