//! Finding the device assignment (`gkm.io/gpu-assignment`) of the pod the
//! kubelet allocates for, so that `GetPreferredAllocation` can answer with
//! it.
//!
//! The kubelet does not tell a device plugin which pod it allocates for. It
//! admits a node's pods one at a time, oldest first, and allocates a pod's
//! devices when it admits it; the pod-resources API lists the pods that hold
//! devices already. So the pod meant is the oldest pod of this node that is
//! still `Pending`, asks for the resource and holds none of it yet
//! ([`next_assignment`]). Only that pod's assignment is used: another pod's
//! is never borrowed, even when it has the size asked for.
//!
//! An assignment only steers the choice among the devices the kubelet offers
//! as available; the container always gets the devices the kubelet
//! allocated, so a pod that wrote its own assignment (a forgery the chart's
//! `gkm-gpu-assignment` admission policy refuses) can never be handed a
//! device another pod holds.

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
    /// The devices of `resource` assigned to the pod the kubelet allocates
    /// for now (see [`next_assignment`]); `None` when that pod has none.
    /// Failures are logged and read as "none".
    async fn next(&self, resource: &str) -> Option<Vec<String>>;
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
    async fn next(&self, resource: &str) -> Option<Vec<String>> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let params = ListParams::default().fields(&format!(
            "spec.nodeName={},status.phase=Pending",
            self.node_name
        ));
        let list = match pods.list(&params).await {
            Ok(list) => list.items,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list this node's pending pods");
                return None;
            }
        };
        let holding = self.holding(resource).await;
        next_assignment(&list, &holding, resource)
    }
}

/// `namespace/name` of a pod.
fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Whether any container of `pod` (init containers too) asks for `resource`.
fn asks_for(pod: &Pod, resource: &str) -> bool {
    pod.spec.iter().any(|spec| {
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .filter_map(|c| c.resources.as_ref())
            .any(|r| {
                r.limits.as_ref().is_some_and(|l| l.contains_key(resource))
                    || r.requests
                        .as_ref()
                        .is_some_and(|q| q.contains_key(resource))
            })
    })
}

/// The assignment of `resource` of the pod the kubelet allocates for, among
/// `pending` (this node's `Pending` pods): the oldest (by creation time,
/// then `namespace/name`) that asks for `resource` and is not in `holding`
/// (`namespace/name` of the pods that hold devices of it already). `None`
/// when there is no such pod, or it has no usable assignment of `resource`:
/// another pod's assignment is never taken instead.
pub fn next_assignment(
    pending: &[Pod],
    holding: &BTreeSet<String>,
    resource: &str,
) -> Option<Vec<String>> {
    let pod = pending
        .iter()
        .filter(|p| asks_for(p, resource) && !holding.contains(&pod_key(p)))
        .min_by_key(|p| (p.metadata.creation_timestamp.clone(), pod_key(p)))?;
    let value = pod.metadata.annotations.as_ref()?.get(ANNOTATION)?;
    match Assignment::parse(value) {
        Ok(assignment) => {
            let devices = assigned_devices(pod, &assignment, resource);
            (!devices.is_empty()).then_some(devices)
        }
        Err(e) => {
            tracing::warn!(pod = %pod_key(pod), error = %e, "ignoring a malformed assignment");
            None
        }
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

    /// A pending pod asking for one `nvidia.com/gpu`, created at `created`,
    /// with `assigned` as its assignment.
    fn pending(name: &str, created: &str, assigned: Option<&str>) -> Pod {
        let annotations = assigned.map(|gpu| {
            serde_json::json!({ANNOTATION: Assignment::new()
                .with("nvidia.com/gpu", vec![gpu.to_string()])
                .format()})
        });
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "team", "creationTimestamp": created,
                         "annotations": annotations},
            "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            ]},
        }))
        .unwrap_or_default()
    }

    #[test]
    fn only_the_pod_allocated_for_lends_its_assignment() {
        let gpu = "nvidia.com/gpu";
        let older = pending("older", "2026-01-01T00:00:00Z", None);
        let newer = pending("newer", "2026-01-01T00:00:05Z", Some("GPU-b"));
        let no_gpu: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cpu", "namespace": "team", "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "a"}]},
        }))
        .unwrap_or_default();
        let pods = [newer.clone(), older.clone(), no_gpu];
        // The oldest pod asking for GPUs has no assignment: none is used,
        // not the newer pod's of the same size.
        assert_eq!(next_assignment(&pods, &BTreeSet::new(), gpu), None);
        // Once the older pod holds its GPU, the newer one is next.
        let holding = BTreeSet::from(["team/older".to_string()]);
        assert_eq!(
            next_assignment(&pods, &holding, gpu),
            Some(vec!["GPU-b".to_string()])
        );
        // A pod that asks for nothing of the resource is never the one.
        assert_eq!(
            next_assignment(&pods, &BTreeSet::new(), "amd.com/gpu"),
            None
        );
    }
}
