//! What a pod holds on its node: whole GPUs, shares of devices, and the
//! amounts a quota counts.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use gkm_core::assignment::split_units;

use super::request::GpuRequest;
use super::{GPU_CORES, GPU_MEMORY};

pub use gkm_k8s_api::quota::{Amount, amount_of};

/// A share of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// The device ID (empty when a pod holds a share but carries no
    /// assignment: it counts against its quota, not against a device).
    pub device: String,
    /// Cores, percent of the device.
    pub cores: i64,
    /// Memory, MiB.
    pub memory: i64,
}

/// Cuts `cores` and `memory` over `devices`: a share of one device, or
/// whole devices (100 cores each) with the memory split evenly, as
/// [`gkm_core::assignment::split_units`] cuts them for the device plugin too.
pub fn split_shares(devices: &[String], cores: i64, memory: i64) -> Vec<Share> {
    let units = |total: i64| {
        split_units(u64::try_from(total).unwrap_or(0), devices.len())
            .into_iter()
            .map(|n| i64::try_from(n).unwrap_or(i64::MAX))
    };
    devices
        .iter()
        .zip(units(cores).zip(units(memory)))
        .map(|(device, (cores, memory))| Share {
            device: device.clone(),
            cores,
            memory,
        })
        .collect()
}

/// A pod's hold on a node: seen bound by the watch, or reserved by a bind
/// call that is writing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The node.
    pub node: String,
    /// What it asks for.
    pub amount: Amount,
    /// Whole GPUs per resource.
    pub whole: BTreeMap<String, i64>,
    /// Its device shares.
    pub shares: Vec<Share>,
    /// Reserved by a bind call; the watch has not shown the pod bound yet.
    pub reserved: bool,
    /// The node's GPU model when the hold was counted.
    pub(super) model: Option<String>,
}

impl Hold {
    /// A hold of `request` on `node` with `shares`.
    pub fn new(
        namespace: &str,
        name: &str,
        node: &str,
        request: &GpuRequest,
        shares: Vec<Share>,
        reserved: bool,
    ) -> Hold {
        Hold {
            namespace: namespace.to_string(),
            name: name.to_string(),
            node: node.to_string(),
            amount: amount_of(request),
            whole: request.whole.clone(),
            shares,
            reserved,
            model: None,
        }
    }

    /// The hold of a bound pod, as the watch shows it: `None` for a pod that
    /// is not bound, has finished, holds no GPU or asks for GPUs in a way
    /// that cannot be read.
    pub fn of_pod(pod: &Pod, whole_resources: &[String]) -> Option<Hold> {
        let node = gkm_k8s_api::quota::holds_on(pod)?;
        let request = GpuRequest::from_pod(pod, whole_resources).ok()?;
        if request.is_empty() {
            return None;
        }
        let shares = if request.is_shared() {
            let assigned = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(gkm_core::assignment::ANNOTATION))
                .and_then(|v| gkm_core::assignment::Assignment::parse(v).ok())
                .map(|a| {
                    let cores = a.devices(GPU_CORES);
                    if cores.is_empty() {
                        a.devices(GPU_MEMORY).to_vec()
                    } else {
                        cores.to_vec()
                    }
                })
                .filter(|d| !d.is_empty())
                .unwrap_or_else(|| vec![String::new()]);
            split_shares(&assigned, request.cores, request.memory)
        } else {
            Vec::new()
        };
        Some(Hold::new(
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default(),
            node,
            &request,
            shares,
            false,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_of_one_device_or_whole_devices() {
        assert_eq!(
            split_shares(&["0".into()], 30, 1000),
            vec![Share {
                device: "0".into(),
                cores: 30,
                memory: 1000
            }]
        );
        let two = split_shares(&["0".into(), "1".into()], 200, 1001);
        assert_eq!(
            two.iter().map(|s| (s.cores, s.memory)).collect::<Vec<_>>(),
            vec![(100, 501), (100, 500)]
        );
        assert!(split_shares(&[], 10, 10).is_empty());
    }

    #[test]
    fn a_bound_pod_holds_its_assigned_devices() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml", "annotations": {
                "gkm.io/gpu-assignment": r#"{"gkm.io/gpu-cores":["1"],"gkm.io/gpu-memory":["1"]}"#}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": {
                "gkm.io/gpu-cores": "30", "gkm.io/gpu-memory": "4096"}}}]},
            "status": {"phase": "Running"},
        }))
        .unwrap_or_default();
        let hold = Hold::of_pod(&pod, &[]);
        assert_eq!(
            hold.map(|h| (h.node, h.shares)),
            Some((
                "n1".to_string(),
                vec![Share {
                    device: "1".into(),
                    cores: 30,
                    memory: 4096
                }]
            ))
        );
    }
}
