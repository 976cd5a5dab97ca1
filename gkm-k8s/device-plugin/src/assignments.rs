//! Finding the device assignments (`gkm.io/gpu-assignment`) of pods waiting
//! on this node, so that `GetPreferredAllocation` can answer with them.
//!
//! The kubelet does not tell a device plugin which pod it allocates for. The
//! pods that can be meant are this node's pods that are still `Pending`,
//! carry an assignment for the resource, and hold no devices of it yet (the
//! kubelet's pod-resources API lists those that do); the oldest comes first.

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use gkm_core::assignment::{ANNOTATION, Assignment, unit_id};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::resources::{GPU_CORES, GPU_MEMORY};

/// Where assignments come from.
#[tonic::async_trait]
pub trait AssignmentSource: Send + Sync {
    /// Device sets assigned of `resource` to pods waiting for it on this
    /// node, oldest pod first. Failures are logged and read as "none".
    async fn pending(&self, resource: &str) -> Vec<Vec<String>>;
}

/// Assignments read from the apiserver, minus pods the kubelet already gave
/// devices to.
#[derive(Clone)]
pub struct PodAssignments {
    client: kube::Client,
    node_name: String,
    pod_resources_socket: Option<PathBuf>,
}

impl fmt::Debug for PodAssignments {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PodAssignments")
            .field("node_name", &self.node_name)
            .field("pod_resources_socket", &self.pod_resources_socket)
            .finish_non_exhaustive()
    }
}

impl PodAssignments {
    /// Reads the pods of `node_name`; asks the kubelet's pod-resources socket
    /// (when given) which of them hold devices already.
    pub fn new(
        client: kube::Client,
        node_name: String,
        pod_resources_socket: Option<PathBuf>,
    ) -> PodAssignments {
        PodAssignments {
            client,
            node_name,
            pod_resources_socket,
        }
    }

    /// `namespace/name` of pods holding devices of `resource`.
    async fn holding(&self, resource: &str) -> BTreeSet<String> {
        let Some(socket) = &self.pod_resources_socket else {
            return BTreeSet::new();
        };
        match gkm_k8s_kubelet::podresources::list(socket, Duration::from_secs(2)).await {
            Ok(response) => response
                .pod_resources
                .into_iter()
                .filter(|p| {
                    p.containers
                        .iter()
                        .flat_map(|c| &c.devices)
                        .any(|d| d.resource_name == resource && !d.device_ids.is_empty())
                })
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot ask the kubelet which pods hold devices");
                BTreeSet::new()
            }
        }
    }
}

#[tonic::async_trait]
impl AssignmentSource for PodAssignments {
    async fn pending(&self, resource: &str) -> Vec<Vec<String>> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let params = ListParams::default().fields(&format!(
            "spec.nodeName={},status.phase=Pending",
            self.node_name
        ));
        let list = match pods.list(&params).await {
            Ok(list) => list.items,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list this node's pending pods");
                return Vec::new();
            }
        };
        let holding = self.holding(resource).await;
        let mut found: Vec<(String, Vec<String>)> = Vec::new();
        for pod in list {
            let meta = &pod.metadata;
            let Some(value) = meta.annotations.as_ref().and_then(|a| a.get(ANNOTATION)) else {
                continue;
            };
            let key = format!(
                "{}/{}",
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default()
            );
            if holding.contains(&key) {
                continue;
            }
            match Assignment::parse(value) {
                Ok(assignment) => {
                    let devices = assigned_devices(&pod, &assignment, resource);
                    if !devices.is_empty() {
                        let created = meta
                            .creation_timestamp
                            .as_ref()
                            .map(|t| t.0.to_string())
                            .unwrap_or_default();
                        found.push((created, devices));
                    }
                }
                Err(e) => tracing::warn!(pod = %key, error = %e, "ignoring a malformed assignment"),
            }
        }
        found.sort();
        found.into_iter().map(|(_, devices)| devices).collect()
    }
}

/// The devices `assignment` gives `pod` of `resource`, as
/// `preferred` compares them with what the kubelet offers.
///
/// For the unit resources (`gkm.io/gpu-cores`, `gkm.io/gpu-memory`) the
/// assignment names GPUs; each is expanded to as many unit IDs `<gpu>-<i>`
/// as the pod asks units of it ([`Assignment::units`] of the containers'
/// summed limits, or requests where a limit is missing). Other resources'
/// device IDs are as listed.
pub fn assigned_devices(pod: &Pod, assignment: &Assignment, resource: &str) -> Vec<String> {
    if resource != GPU_CORES && resource != GPU_MEMORY {
        return assignment.devices(resource).to_vec();
    }
    let asked: u64 = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .filter_map(|c| {
            let r = c.resources.as_ref()?;
            let q = r
                .limits
                .as_ref()
                .and_then(|l| l.get(resource))
                .or_else(|| r.requests.as_ref().and_then(|q| q.get(resource)))?;
            q.0.parse::<u64>().ok()
        })
        .sum();
    assignment
        .units(resource, asked)
        .into_iter()
        .flat_map(|(gpu, units)| (0..units).map(move |i| unit_id(gpu, i)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_units_are_expanded_per_assigned_gpu_and_other_ids_kept() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"gkm.io/gpu-cores": "2", "gkm.io/gpu-memory": "3"}}},
                {"name": "b", "resources": {"requests": {"gkm.io/gpu-memory": "2"}}},
            ]},
        }))
        .unwrap_or_default();
        let assignment = Assignment::new()
            .with(GPU_CORES, vec!["GPU-a".into()])
            .with(GPU_MEMORY, vec!["GPU-a".into(), "GPU-b".into()])
            .with("nvidia.com/gpu", vec!["GPU-c".into()]);
        assert_eq!(
            assigned_devices(&pod, &assignment, GPU_CORES),
            ["GPU-a-0", "GPU-a-1"]
        );
        assert_eq!(
            assigned_devices(&pod, &assignment, GPU_MEMORY),
            ["GPU-a-0", "GPU-a-1", "GPU-a-2", "GPU-b-0", "GPU-b-1"]
        );
        assert_eq!(
            assigned_devices(&pod, &assignment, "nvidia.com/gpu"),
            ["GPU-c"]
        );
        assert!(assigned_devices(&pod, &Assignment::new(), GPU_CORES).is_empty());
    }
}
