//! What the extender knows of a node's GPUs: its model, its whole GPUs per
//! resource, and the devices shared GPUs are cut from.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use serde::{Deserialize, Serialize};

use super::request::whole_number;
use super::{CORES_PER_GPU, DEVICES_ANNOTATION, GPU_CORES, GPU_MEMORY};

/// One GPU that shared-GPU pods get a share of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// The device ID the device plugin knows it by.
    pub id: String,
    /// Its cores, in percent (100 for a whole GPU).
    #[serde(default = "full_gpu")]
    pub cores: i64,
    /// Its memory in MiB.
    #[serde(default)]
    pub memory: i64,
}

fn full_gpu() -> i64 {
    CORES_PER_GPU
}

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
    /// JSON list of `{"id", "cores", "memory"}`) when it is set; otherwise
    /// the node's allocatable `gkm.io/gpu-cores` is cut into GPUs of 100
    /// cores with IDs `0`, `1`, … sharing `gkm.io/gpu-memory` evenly.
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
            Some(Err(e)) => (Vec::new(), Some(e)),
            None => (even_devices(amount(GPU_CORES), amount(GPU_MEMORY)), None),
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
pub fn parse_devices(value: &str) -> Result<Vec<Device>, String> {
    let devices: Vec<Device> = serde_json::from_str(value).map_err(|e| {
        format!("node annotation {DEVICES_ANNOTATION} is not a JSON list of {{\"id\", \"cores\", \"memory\"}}: {e}")
    })?;
    for device in &devices {
        if device.id.is_empty() || device.cores < 0 || device.memory < 0 {
            return Err(format!(
                "node annotation {DEVICES_ANNOTATION}: device {:?} needs an ID and no negative capacity",
                device.id
            ));
        }
    }
    Ok(devices)
}

/// `cores / 100` GPUs sharing `memory` evenly, with IDs `0`, `1`, ….
fn even_devices(cores: i64, memory: i64) -> Vec<Device> {
    let count = cores / CORES_PER_GPU;
    (0..count)
        .map(|i| Device {
            id: i.to_string(),
            cores: CORES_PER_GPU,
            memory: memory / count,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(value: serde_json::Value) -> Node {
        serde_json::from_value(value).unwrap_or_default()
    }

    #[test]
    fn reads_model_whole_gpus_and_even_devices() {
        let n = node(json!({
            "metadata": {"name": "n", "labels": {"gkm.io/gpu.product": "T4"}},
            "status": {"allocatable": {"nvidia.com/gpu": "4", "gkm.io/gpu-cores": "200", "gkm.io/gpu-memory": "32768", "cpu": "8"}},
        }));
        let gpus = NodeGpus::from_node(&n, &["nvidia.com/gpu".into()], "gkm.io/gpu.product");
        assert_eq!(gpus.model.as_deref(), Some("T4"));
        assert_eq!(gpus.whole["nvidia.com/gpu"], 4);
        assert_eq!(
            gpus.devices,
            vec![
                Device {
                    id: "0".into(),
                    cores: 100,
                    memory: 16384
                },
                Device {
                    id: "1".into(),
                    cores: 100,
                    memory: 16384
                },
            ]
        );
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
