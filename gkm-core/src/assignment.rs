//! The device assignment a pod carries: which devices of each resource it was
//! given, written by the scheduler extender at bind time and read by the
//! device plugin when the kubelet allocates.
//!
//! The annotation [`ANNOTATION`] (`gkm.io/gpu-assignment`) holds a JSON
//! object mapping a resource name to the device IDs chosen for it:
//!
//! ```
//! use gkm_core::assignment::{self, Assignment};
//!
//! let mut chosen = Assignment::new();
//! chosen.insert("gkm.io/gpu-cores".into(), vec!["gpu-1".into()]);
//! let value = assignment::format(&chosen);
//! assert_eq!(value, r#"{"gkm.io/gpu-cores":["gpu-1"]}"#);
//! assert_eq!(assignment::parse(&value)?, chosen);
//! # Ok::<(), assignment::AssignmentError>(())
//! ```

use std::collections::BTreeMap;

/// The pod annotation holding the assignment.
pub const ANNOTATION: &str = "gkm.io/gpu-assignment";

/// Device IDs per resource name, in a stable order.
pub type Assignment = BTreeMap<String, Vec<String>>;

/// Why an annotation value is not an assignment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignmentError {
    /// Not a JSON object of string arrays.
    #[error("{ANNOTATION} is not a JSON object mapping resource names to device ID lists: {0}")]
    Malformed(String),
    /// A resource name or a device ID is empty.
    #[error("{ANNOTATION} names an empty {0}")]
    Empty(&'static str),
}

/// Reads an annotation value.
pub fn parse(value: &str) -> Result<Assignment, AssignmentError> {
    let parsed: Assignment =
        serde_json::from_str(value).map_err(|e| AssignmentError::Malformed(e.to_string()))?;
    for (resource, devices) in &parsed {
        if resource.is_empty() {
            return Err(AssignmentError::Empty("resource name"));
        }
        if devices.iter().any(String::is_empty) {
            return Err(AssignmentError::Empty("device ID"));
        }
    }
    Ok(parsed)
}

/// Writes an annotation value: compact JSON, resources in name order.
pub fn format(assignment: &Assignment) -> String {
    // A map of strings to string lists always serialises.
    serde_json::to_string(assignment).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_in_a_stable_order() {
        let mut a = Assignment::new();
        a.insert("gkm.io/gpu-memory".into(), vec!["gpu-0".into()]);
        a.insert("gkm.io/gpu-cores".into(), vec!["gpu-0".into()]);
        let text = format(&a);
        assert_eq!(
            text,
            r#"{"gkm.io/gpu-cores":["gpu-0"],"gkm.io/gpu-memory":["gpu-0"]}"#
        );
        assert_eq!(parse(&text), Ok(a));
    }

    #[test]
    fn refuses_what_is_not_an_assignment() {
        for bad in ["", "[]", r#"{"a":"gpu-0"}"#, r#"{"a":[1]}"#, "{"] {
            assert!(
                matches!(parse(bad), Err(AssignmentError::Malformed(_))),
                "{bad}"
            );
        }
        assert_eq!(
            parse(r#"{"":["gpu-0"]}"#),
            Err(AssignmentError::Empty("resource name"))
        );
        assert_eq!(
            parse(r#"{"nvidia.com/gpu":[""]}"#),
            Err(AssignmentError::Empty("device ID"))
        );
    }
}
