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

use gkm_core::assignment::{ANNOTATION, Assignment};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

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
        match crate::podresources::list(socket, Duration::from_secs(2)).await {
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
                Ok(assignment) if !assignment.devices(resource).is_empty() => {
                    let created = meta
                        .creation_timestamp
                        .as_ref()
                        .map(|t| t.0.to_string())
                        .unwrap_or_default();
                    found.push((created, assignment.devices(resource).to_vec()));
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(pod = %key, error = %e, "ignoring a malformed assignment"),
            }
        }
        found.sort();
        found.into_iter().map(|(_, devices)| devices).collect()
    }
}
