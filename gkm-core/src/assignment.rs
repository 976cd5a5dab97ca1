//! The device assignment a scheduler writes on a pod and a device plugin
//! honours: which devices of which extended resource the pod gets.
//!
//! The annotation [`ANNOTATION`] (`gkm.io/gpu-assignment`) holds a JSON
//! object mapping an extended resource name to the device IDs the pod gets
//! on its node, the IDs the device plugin advertises for that resource (PCI
//! addresses, mdev UUIDs, GPU UUIDs; for shared-GPU units, the GPUs' IDs,
//! see below):
//!
//! ```
//! use gkm_core::assignment::{ANNOTATION, Assignment};
//! let value = r#"{"nvidia.com/gpu":["GPU-8f3a","GPU-1c2d"]}"#;
//! let assignment = Assignment::parse(value)?;
//! assert_eq!(assignment.devices("nvidia.com/gpu"), ["GPU-8f3a", "GPU-1c2d"]);
//! assert!(assignment.devices("amd.com/gpu").is_empty());
//! assert_eq!(assignment.format(), value);
//! assert_eq!(ANNOTATION, "gkm.io/gpu-assignment");
//! # Ok::<(), gkm_core::assignment::AssignmentError>(())
//! ```
//!
//! The assignment is for the whole pod: when several containers request the
//! same resource, each gets its share of the listed devices.
//!
//! # Shared GPUs: one naming for the scheduler and the device plugin
//!
//! Shared GPUs are offered by gkm's device plugin as units of a GPU:
//! `gkm.io/gpu-cores` (100 per GPU) and `gkm.io/gpu-memory` (one per MiB),
//! each unit's device ID being [`unit_id`] `<gpu>-<n>`, where `<gpu>` is the
//! GPU's ID (its UUID, or its PCI address when it has none). The plugin
//! publishes the node's GPUs under those same IDs in the node annotation
//! [`NODE_GPUS_ANNOTATION`] (`gkm.io/gpu-devices`, [`GpuDevice`]), which is
//! what the scheduler extender places shares on.
//!
//! For those unit resources an assignment names GPUs, not units:
//! `{"gkm.io/gpu-cores":["GPU-8f3a"],"gkm.io/gpu-memory":["GPU-8f3a"]}`
//! gives the pod's cores and memory on `GPU-8f3a`. A pod asking for more than
//! one GPU's cores lists several GPUs, and its units are cut over them by
//! [`split_units`] ([`Assignment::units`]); the device plugin prefers that
//! many free units of each named GPU when the kubelet asks which units to
//! allocate, and hands the container exactly the units the kubelet
//! allocated, so an assignment steers the choice among free units and never
//! reaches a unit another pod holds.
//!
//! ```
//! use gkm_core::assignment::{Assignment, unit_id, unit_gpu};
//! let a = Assignment::parse(r#"{"gkm.io/gpu-memory":["GPU-8f3a","GPU-1c2d"]}"#)?;
//! assert_eq!(a.units("gkm.io/gpu-memory", 3001), [("GPU-8f3a", 1501), ("GPU-1c2d", 1500)]);
//! assert_eq!(unit_id("GPU-8f3a", 7), "GPU-8f3a-7");
//! assert_eq!(unit_gpu("GPU-8f3a-7"), Some("GPU-8f3a"));
//! # Ok::<(), gkm_core::assignment::AssignmentError>(())
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The pod annotation carrying the assignment.
pub const ANNOTATION: &str = "gkm.io/gpu-assignment";

/// Why an annotation value is not an assignment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AssignmentError {
    /// Not a JSON object of string arrays.
    #[error("{ANNOTATION} is not a JSON object mapping resource names to device ID lists: {0}")]
    Json(String),
    /// An empty resource name or device ID.
    #[error("{ANNOTATION}: empty {0}")]
    Empty(&'static str),
    /// The node annotation listing a node's GPUs is malformed.
    #[error("node annotation {NODE_GPUS_ANNOTATION}: {0}")]
    NodeGpus(String),
    /// A device listed twice for one resource.
    #[error("{ANNOTATION}: device {device} is listed twice for {resource}")]
    Duplicate {
        /// The resource.
        resource: String,
        /// The repeated device ID.
        device: String,
    },
}

/// The node annotation listing the node's GPUs that shared-GPU pods get
/// units of: a JSON list of [`GpuDevice`], written by gkm's device plugin
/// (`--gpu-shares`) and read by gkm's scheduler extender.
pub const NODE_GPUS_ANNOTATION: &str = "gkm.io/gpu-devices";

/// The compute units of one GPU (`gkm.io/gpu-cores` is in percent).
pub const CORES_PER_GPU: i64 = 100;

/// One GPU of a node, as [`NODE_GPUS_ANNOTATION`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDevice {
    /// The GPU's ID: the `<gpu>` of its units' IDs `<gpu>-<n>`.
    pub id: String,
    /// Its compute units (100 for a GPU).
    #[serde(default = "full_gpu")]
    pub cores: i64,
    /// Its memory units, MiB (0 when the device plugin does not know its
    /// memory size).
    #[serde(default)]
    pub memory: i64,
}

fn full_gpu() -> i64 {
    CORES_PER_GPU
}

/// Reads the [`NODE_GPUS_ANNOTATION`] value, refusing empty IDs and
/// negative capacities.
pub fn parse_node_gpus(value: &str) -> Result<Vec<GpuDevice>, AssignmentError> {
    let gpus: Vec<GpuDevice> = serde_json::from_str(value).map_err(|e| {
        AssignmentError::NodeGpus(format!(
            "not a JSON list of {{\"id\", \"cores\", \"memory\"}}: {e}"
        ))
    })?;
    for (i, gpu) in gpus.iter().enumerate() {
        if gpu.id.is_empty() || gpu.cores < 0 || gpu.memory < 0 {
            return Err(AssignmentError::NodeGpus(format!(
                "device {:?} needs an ID and no negative capacity",
                gpu.id
            )));
        }
        if gpus[..i].iter().any(|g| g.id == gpu.id) {
            return Err(AssignmentError::NodeGpus(format!(
                "device {} is listed twice",
                gpu.id
            )));
        }
    }
    Ok(gpus)
}

/// The [`NODE_GPUS_ANNOTATION`] value for `gpus`: compact JSON.
pub fn format_node_gpus(gpus: &[GpuDevice]) -> String {
    serde_json::to_string(gpus).unwrap_or_else(|_| "[]".to_string())
}

/// The device ID of unit `n` of GPU `gpu`: `<gpu>-<n>`.
pub fn unit_id(gpu: &str, n: u64) -> String {
    format!("{gpu}-{n}")
}

/// The GPU a unit ID `<gpu>-<n>` belongs to; `None` when `id` is not one.
pub fn unit_gpu(id: &str) -> Option<&str> {
    let (gpu, n) = id.rsplit_once('-')?;
    (!gpu.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then_some(gpu)
}

/// `total` units cut over `gpus` GPUs: evenly, the first GPU taking what
/// does not divide (`split_units(3001, 2)` is `[1501, 1500]`). Empty for no
/// GPU.
pub fn split_units(total: u64, gpus: usize) -> Vec<u64> {
    let Ok(count) = u64::try_from(gpus) else {
        return Vec::new();
    };
    (0..count)
        .map(|i| total / count + if i == 0 { total % count } else { 0 })
        .collect()
}

/// Resource name → device IDs, in the order the scheduler chose them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assignment {
    devices: BTreeMap<String, Vec<String>>,
}

impl Assignment {
    /// An empty assignment.
    pub fn new() -> Assignment {
        Assignment::default()
    }

    /// Assigns `devices` of `resource` (replacing what was assigned of it).
    pub fn with(mut self, resource: impl Into<String>, devices: Vec<String>) -> Assignment {
        self.devices.insert(resource.into(), devices);
        self
    }

    /// Reads an annotation value, refusing empty names and repeated devices.
    pub fn parse(value: &str) -> Result<Assignment, AssignmentError> {
        let devices: BTreeMap<String, Vec<String>> =
            serde_json::from_str(value).map_err(|e| AssignmentError::Json(e.to_string()))?;
        for (resource, ids) in &devices {
            if resource.is_empty() {
                return Err(AssignmentError::Empty("resource name"));
            }
            for (i, id) in ids.iter().enumerate() {
                if id.is_empty() {
                    return Err(AssignmentError::Empty("device ID"));
                }
                if ids[..i].contains(id) {
                    return Err(AssignmentError::Duplicate {
                        resource: resource.clone(),
                        device: id.clone(),
                    });
                }
            }
        }
        Ok(Assignment { devices })
    }

    /// The annotation value: compact JSON, resources in name order.
    pub fn format(&self) -> String {
        serde_json::to_string(&self.devices).unwrap_or_else(|_| "{}".to_string())
    }

    /// The devices assigned of `resource` (empty when none).
    pub fn devices(&self, resource: &str) -> &[String] {
        self.devices.get(resource).map_or(&[], Vec::as_slice)
    }

    /// For a unit resource (`gkm.io/gpu-cores`, `gkm.io/gpu-memory`), the
    /// units of each assigned GPU when the pod asks `total` units of it: the
    /// GPUs in order, with [`split_units`] of `total`.
    pub fn units(&self, resource: &str, total: u64) -> Vec<(&str, u64)> {
        let gpus = self.devices(resource);
        gpus.iter()
            .map(String::as_str)
            .zip(split_units(total, gpus.len()))
            .collect()
    }

    /// Every resource with its devices.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.devices.iter().map(|(r, d)| (r.as_str(), d.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_and_parse_round_trip() {
        let a = Assignment::new()
            .with(
                "nvidia.com/GH100_H100_SXM5_80GB",
                vec!["0000:3b:00.0".into()],
            )
            .with("gkm.io/gpu-cores", vec!["GPU-a-0".into(), "GPU-a-1".into()]);
        let text = a.format();
        assert_eq!(
            text,
            r#"{"gkm.io/gpu-cores":["GPU-a-0","GPU-a-1"],"nvidia.com/GH100_H100_SXM5_80GB":["0000:3b:00.0"]}"#
        );
        assert_eq!(Assignment::parse(&text), Ok(a));
    }

    #[test]
    fn unit_ids_name_their_gpu() {
        let uuid = "GPU-6e000000-1111-2222-3333-444444444444";
        assert_eq!(unit_gpu(&unit_id(uuid, 42)), Some(uuid));
        assert_eq!(unit_gpu("0000:40:00.0-0"), Some("0000:40:00.0"));
        for not_unit in ["GPU", "GPU-", "-3", "GPU-a", ""] {
            assert_eq!(unit_gpu(not_unit), None, "{not_unit}");
        }
    }

    #[test]
    fn units_are_cut_evenly_the_first_gpu_taking_the_rest() {
        assert_eq!(split_units(30, 1), [30]);
        assert_eq!(split_units(200, 2), [100, 100]);
        assert_eq!(split_units(1001, 2), [501, 500]);
        assert!(split_units(5, 0).is_empty());
        let a = Assignment::new().with("gkm.io/gpu-cores", vec!["A".into(), "B".into()]);
        assert_eq!(a.units("gkm.io/gpu-cores", 200), [("A", 100), ("B", 100)]);
        assert!(a.units("gkm.io/gpu-memory", 200).is_empty());
    }

    #[test]
    fn node_gpus_round_trip_and_bad_lists_are_refused() {
        let gpus = vec![
            GpuDevice {
                id: "GPU-a".into(),
                cores: 100,
                memory: 1024,
            },
            GpuDevice {
                id: "0000:40:00.0".into(),
                cores: 100,
                memory: 0,
            },
        ];
        let text = format_node_gpus(&gpus);
        assert_eq!(
            text,
            r#"[{"id":"GPU-a","cores":100,"memory":1024},{"id":"0000:40:00.0","cores":100,"memory":0}]"#
        );
        assert_eq!(parse_node_gpus(&text), Ok(gpus));
        assert_eq!(
            parse_node_gpus(r#"[{"id":"x"}]"#).map(|g| (g[0].cores, g[0].memory)),
            Ok((100, 0))
        );
        for bad in [
            "{",
            r#"[{"id":""}]"#,
            r#"[{"id":"x","memory":-1}]"#,
            r#"[{"id":"x"},{"id":"x"}]"#,
        ] {
            let err = parse_node_gpus(bad).unwrap_err().to_string();
            assert!(
                err.starts_with("node annotation gkm.io/gpu-devices: "),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn malformed_values_are_refused_with_the_annotation_named() {
        for bad in ["", "[]", r#"{"nvidia.com/gpu":"GPU-a"}"#, r#"{"a":[1]}"#] {
            let err = Assignment::parse(bad).unwrap_err();
            assert!(err.to_string().starts_with(ANNOTATION), "{bad}: {err}");
        }
        assert_eq!(
            Assignment::parse(r#"{"":["x"]}"#),
            Err(AssignmentError::Empty("resource name"))
        );
        assert_eq!(
            Assignment::parse(r#"{"r":[""]}"#),
            Err(AssignmentError::Empty("device ID"))
        );
        assert_eq!(
            Assignment::parse(r#"{"r":["x","y","x"]}"#),
            Err(AssignmentError::Duplicate {
                resource: "r".into(),
                device: "x".into()
            })
        );
    }
}
