//! Publishing the node's shared GPUs for gkm's scheduler extender: the node
//! annotation `gkm.io/gpu-devices` ([`gkm_core::assignment`]) lists each GPU
//! whose units the plugin offers, under the ID its units carry, so the GPU
//! the extender assigns is one the plugin can hand over.

use std::fmt;

use gkm_core::assignment::{GpuDevice, NODE_GPUS_ANNOTATION, format_node_gpus};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::resources::{Access, GPU_CORES, GPU_MEMORY, Snapshot};

/// The GPUs `snapshot` offers units of, in ID order, with their compute and
/// memory unit counts (a GPU offered only in compute units has memory 0).
pub fn node_gpus(snapshot: &Snapshot) -> Vec<GpuDevice> {
    let mut gpus: Vec<GpuDevice> = Vec::new();
    for (name, is_cores) in [(GPU_CORES, true), (GPU_MEMORY, false)] {
        let Some(resource) = snapshot.resources.get(name) else {
            continue;
        };
        for device in &resource.devices {
            let Access::Share { gpu, .. } = &device.access else {
                continue;
            };
            let entry = match gpus.iter_mut().position(|g| &g.id == gpu) {
                Some(i) => &mut gpus[i],
                None => {
                    gpus.push(GpuDevice {
                        id: gpu.clone(),
                        cores: 0,
                        memory: 0,
                    });
                    let last = gpus.len() - 1;
                    &mut gpus[last]
                }
            };
            if is_cores {
                entry.cores += 1;
            } else {
                entry.memory += 1;
            }
        }
    }
    gpus.sort_by(|a, b| a.id.cmp(&b.id));
    gpus
}

/// Where the node's GPU list goes.
#[tonic::async_trait]
pub trait NodeGpusSink: Send + Sync {
    /// Publishes `gpus` as the node's shared GPUs.
    async fn publish(&self, gpus: &[GpuDevice]) -> Result<(), String>;
}

/// The node's `gkm.io/gpu-devices` annotation, written through the apiserver.
#[derive(Clone)]
pub struct NodeAnnotation {
    client: kube::Client,
    node_name: String,
}

impl fmt::Debug for NodeAnnotation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeAnnotation")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

impl NodeAnnotation {
    /// Writes the annotation of node `node_name` (needs `patch` on nodes).
    pub fn new(client: kube::Client, node_name: String) -> NodeAnnotation {
        NodeAnnotation { client, node_name }
    }
}

#[tonic::async_trait]
impl NodeGpusSink for NodeAnnotation {
    async fn publish(&self, gpus: &[GpuDevice]) -> Result<(), String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let patch =
            json!({"metadata": {"annotations": {NODE_GPUS_ANNOTATION: format_node_gpus(gpus)}}});
        nodes
            .patch(
                &self.node_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map(|_| ())
            .map_err(|e| {
                format!(
                    "writing {NODE_GPUS_ANNOTATION} on node {}: {e}",
                    self.node_name
                )
            })
    }
}
