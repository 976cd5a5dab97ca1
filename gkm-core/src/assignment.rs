//! The device assignment a scheduler writes on a pod and a device plugin
//! honours: which devices of which extended resource the pod gets.
//!
//! The annotation [`ANNOTATION`] (`gkm.io/gpu-assignment`) holds a JSON
//! object mapping an extended resource name to the device IDs the pod gets
//! on its node, the IDs the device plugin advertises for that resource (PCI
//! addresses, mdev UUIDs, GPU UUIDs, or `<gpu>-<n>` units):
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
//! For resources made of units of a GPU (`gkm.io/gpu-cores`,
//! `gkm.io/gpu-memory`, IDs `<gpu>-<n>`), an ID stands for one unit of that
//! GPU, whichever `n`: `["GPU-8f3a-0", "GPU-8f3a-1"]` asks for two units of
//! `GPU-8f3a`, and the device plugin picks two free ones.

use std::collections::BTreeMap;

/// The pod annotation carrying the assignment.
pub const ANNOTATION: &str = "gkm.io/gpu-assignment";

/// Why an annotation value is not an assignment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignmentError {
    /// Not a JSON object of string arrays.
    #[error("{ANNOTATION} is not a JSON object mapping resource names to device ID lists: {0}")]
    Json(String),
    /// An empty resource name or device ID.
    #[error("{ANNOTATION}: empty {0}")]
    Empty(&'static str),
    /// A device listed twice for one resource.
    #[error("{ANNOTATION}: device {device} is listed twice for {resource}")]
    Duplicate {
        /// The resource.
        resource: String,
        /// The repeated device ID.
        device: String,
    },
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
