//! What the extender knows of a node's GPUs: its model, its whole GPUs per
//! resource, and the devices shared GPUs are cut from.

use std::collections::BTreeMap;

use super::request::whole_number;
use super::{DEVICES_ANNOTATION, GPU_CORES};
use gkm_core::assignment::AssignmentError;
use k8s_openapi::api::core::v1::Node;

/// One GPU that shared-GPU pods get a share of, under the ID the device
/// plugin offers its units by.
pub use gkm_core::assignment::GpuDevice as Device;

/// A node's GPUs, as the extender schedules against them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeGpus {
    /// The GPU model (the model label's value).
    pub model: Option<String>,
    /// Allocatable whole GPUs per resource.
    pub whole: BTreeMap<String, i64>,
    /// The devices shared-GPU pods are placed on.
    pub devices: Vec<Device>,
    /// Why the devices annotation could not be used, if it could not.
    pub devices_error: Option<String>,
}

impl NodeGpus {
    /// Reads `node`: its `model_label`, the allocatable of `whole_resources`
    /// and its shared-GPU devices.
    ///
    /// The devices come from the node annotation `gkm.io/gpu-devices` (a
    /// JSON list of `{"id", "cores", "memory"}`), which gkm's device plugin
    /// publishes under the IDs its units carry. A node offering
    /// `gkm.io/gpu-cores` without it has no devices, and the reason says so:
    /// an ID the device plugin does not know could not be honoured.
    pub fn from_node(node: &Node, whole_resources: &[String], model_label: &str) -> NodeGpus {
        let allocatable = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref()));
        let amount = |resource: &str| {
            allocatable
                .and_then(|a| a.get(resource))
                .and_then(|q| whole_number(resource, q).ok())
                .unwrap_or(0)
        };
        let whole = whole_resources
            .iter()
            .map(|r| (r.clone(), amount(r)))
            .filter(|(_, n)| *n > 0)
            .collect();
        let model = node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(model_label))
            .filter(|m| !m.is_empty())
            .cloned();
        let annotation = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DEVICES_ANNOTATION));
        let (devices, devices_error) = match annotation.map(|a| parse_devices(a)) {
            Some(Ok(devices)) => (devices, None),
            Some(Err(e)) => (Vec::new(), Some(e.to_string())),
            None if amount(GPU_CORES) > 0 => (
                Vec::new(),
                Some(format!(
                    "the node offers {GPU_CORES} but has no {DEVICES_ANNOTATION} annotation naming its GPUs (gkm-device-plugin --gpu-shares publishes it)"
                )),
            ),
            None => (Vec::new(), None),
        };
        NodeGpus {
            model,
            whole,
            devices,
            devices_error,
        }
    }
}

/// Reads the devices annotation.
pub fn parse_devices(value: &str) -> Result<Vec<Device>, AssignmentError> {
    gkm_core::assignment::parse_node_gpus(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(value: serde_json::Value) -> Node {
        serde_json::from_value(value).unwrap_or_default()
    }

    #[test]
    fn reads_model_and_whole_gpus_and_wants_the_devices_named() {
        let n = node(json!({
            "metadata": {"name": "n", "labels": {"gkm.io/gpu.product": "T4"}},
            "status": {"allocatable": {"nvidia.com/gpu": "4", "gkm.io/gpu-cores": "200", "gkm.io/gpu-memory": "32768", "cpu": "8"}},
        }));
        let gpus = NodeGpus::from_node(&n, &["nvidia.com/gpu".into()], "gkm.io/gpu.product");
        assert_eq!(gpus.model.as_deref(), Some("T4"));
        assert_eq!(gpus.whole["nvidia.com/gpu"], 4);
        // Shared units without the annotation: no device IDs to give, and
        // the reason names the annotation.
        assert!(gpus.devices.is_empty());
        assert!(
            gpus.devices_error
                .is_some_and(|e| e.contains(DEVICES_ANNOTATION) && e.contains("--gpu-shares"))
        );
        let plain = node(json!({"metadata": {"name": "n"}}));
        assert_eq!(NodeGpus::from_node(&plain, &[], "m").devices_error, None);
    }

    #[test]
    fn the_annotation_names_the_devices() {
        let n = node(json!({
            "metadata": {"name": "n", "annotations": {DEVICES_ANNOTATION: r#"[{"id":"GPU-a","memory":8192}]"#}},
        }));
        let gpus = NodeGpus::from_node(&n, &[], "gkm.io/gpu.product");
        assert_eq!(gpus.devices[0].id, "GPU-a");
        assert_eq!(gpus.devices[0].cores, 100);
        let bad =
            node(json!({"metadata": {"name": "n", "annotations": {DEVICES_ANNOTATION: "[{]"}}}));
        let gpus = NodeGpus::from_node(&bad, &[], "gkm.io/gpu.product");
        assert!(gpus.devices.is_empty());
        assert!(
            gpus.devices_error
                .is_some_and(|e| e.contains(DEVICES_ANNOTATION))
        );
    }
}
