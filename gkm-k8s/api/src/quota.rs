//! The GPU-model quota decision ([`crate::crd::GKMGPUQuota`]), in one place
//! for everything that enforces it: the scheduler extender at bind, and the
//! operator's admission webhook for pods that name their node and binds
//! by any scheduler.
//!
//! Pure: callers count what a namespace holds on nodes of one model (each
//! pod that [`holds_on`] a node of it, by what it asks, and each GPU its
//! DRA claims were allocated there: [`usage`]) and ask [`check`] whether
//! one more pod fits.

pub mod claims;

use std::collections::HashSet;
use std::ops::{AddAssign, SubAssign};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::crd::GpuModelLimit;
use crate::gpu_request::GpuRequest;

/// What `request` asks for, as a quota counts it.
pub fn amount_of(request: &GpuRequest) -> Amount {
    Amount {
        gpus: request.gpus(),
        cores: request.cores,
        memory: request.memory,
    }
}

/// GPUs as a quota counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Amount {
    /// Whole GPUs.
    pub gpus: i64,
    /// Shared-GPU cores, percent of one GPU.
    pub cores: i64,
    /// Shared-GPU memory, MiB.
    pub memory: i64,
}

impl AddAssign for Amount {
    fn add_assign(&mut self, other: Amount) {
        self.gpus += other.gpus;
        self.cores += other.cores;
        self.memory += other.memory;
    }
}

impl SubAssign for Amount {
    fn sub_assign(&mut self, other: Amount) {
        self.gpus -= other.gpus;
        self.cores -= other.cores;
        self.memory -= other.memory;
    }
}

/// What `pod` asks for as a quota counts it: its GPU resources (`whole`
/// names the whole-GPU extended resources), less those a DRA claim serves
/// (counted from the claim instead). A request that cannot be read counts
/// nothing: it is the scheduler's and the device plugin's to refuse.
pub fn amount_of_pod(pod: &Pod, whole: &[String]) -> Amount {
    let served = claims::served_by_claims(pod);
    let whole: Vec<String> = whole
        .iter()
        .filter(|r| !served.contains(*r))
        .cloned()
        .collect();
    GpuRequest::from_pod(pod, &whole)
        .map(|r| amount_of(&r))
        .unwrap_or_default()
}

/// What `pod` would add on a node of one model (`model_nodes` are that
/// model's nodes), and what its namespace holds there besides (`pods` and
/// `claims` are the namespace's): `(used, asked)`. Each GPU a DRA claim was
/// allocated counts once, whatever DeviceClass asked for it, to the pod
/// whose claim it is or to the namespace's use otherwise.
pub fn usage(
    pod: &Pod,
    pods: &[Pod],
    claims: &[ResourceClaim],
    model_nodes: &HashSet<String>,
    whole: &[String],
) -> (Amount, Amount) {
    let name = pod.metadata.name.as_deref();
    let mut used = Amount::default();
    for other in pods.iter().filter(|p| p.metadata.name.as_deref() != name) {
        if holds_on(other).is_some_and(|node| model_nodes.contains(node)) {
            used += amount_of_pod(other, whole);
        }
    }
    let (claimed, held) = claims::split(pod, claims, model_nodes);
    used.gpus += held;
    let mut asked = amount_of_pod(pod, whole);
    asked.gpus += claimed;
    (used, asked)
}

/// The node whose GPUs `pod` holds against its namespace's quotas: the node
/// it is bound to, unless it has finished (`Succeeded` or `Failed`).
pub fn holds_on(pod: &Pod) -> Option<&str> {
    let node = pod.spec.as_ref()?.node_name.as_deref()?;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    Some(node)
}

/// A pod that would take its namespace over a quota.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "gkm: quota {namespace}/{quota} reached: namespace {namespace} holds {held} of {limit} {what} of model {model}, the pod asks {asked}"
)]
pub struct QuotaExceeded {
    /// The pod's namespace.
    pub namespace: String,
    /// The quota's name.
    pub quota: String,
    /// The GPU model.
    pub model: String,
    /// What is capped, in words with its unit (`GPUs`, `GPU cores (%)`,
    /// `GPU memory (MiB)`).
    pub what: &'static str,
    /// The cap.
    pub limit: i64,
    /// What the namespace holds now.
    pub held: i64,
    /// What the pod asks.
    pub asked: i64,
}

/// Whether a pod of `namespace` asking `asked` fits on a node of `model`
/// while the namespace holds `used` on nodes of that model, under every
/// quota of the namespace (`(name, limits)`): a pod fits only if it breaks
/// none. A dimension the pod does not ask for is never refused, so a
/// namespace already over a cap (the cap was lowered) can still run pods
/// that ask for something else.
pub fn check<'a>(
    namespace: &str,
    model: &str,
    quotas: impl IntoIterator<Item = (&'a str, &'a [GpuModelLimit])>,
    used: Amount,
    asked: Amount,
) -> Result<(), QuotaExceeded> {
    for (quota, limits) in quotas {
        for limit in limits.iter().filter(|l| l.model == model) {
            let dimensions = [
                (limit.gpus, used.gpus, asked.gpus, "GPUs"),
                (limit.cores, used.cores, asked.cores, "GPU cores (%)"),
                (limit.memory, used.memory, asked.memory, "GPU memory (MiB)"),
            ];
            for (cap, held, ask, what) in dimensions {
                if let Some(cap) = cap.filter(|&cap| ask > 0 && held + ask > cap) {
                    return Err(QuotaExceeded {
                        namespace: namespace.to_string(),
                        quota: quota.to_string(),
                        model: model.to_string(),
                        what,
                        limit: cap,
                        held,
                        asked: ask,
                    });
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(model: &str, gpus: i64) -> GpuModelLimit {
        GpuModelLimit {
            model: model.into(),
            gpus: Some(gpus),
            ..GpuModelLimit::default()
        }
    }

    #[test]
    fn a_pod_fits_up_to_the_cap_of_its_model_only() {
        let limits = vec![limit("A100", 2)];
        let quotas = || [("gpus", limits.as_slice())];
        let one = Amount {
            gpus: 1,
            ..Amount::default()
        };
        assert_eq!(check("ml", "A100", quotas(), one, one), Ok(()));
        let refused = check("ml", "A100", quotas(), Amount { gpus: 2, ..one }, one);
        assert_eq!(
            refused.map_err(|e| e.to_string()),
            Err("gkm: quota ml/gpus reached: namespace ml holds 2 of 2 GPUs of model A100, the pod asks 1".into())
        );
        // Another model is not capped; a pod asking no GPUs is never refused.
        assert_eq!(
            check("ml", "H100", quotas(), Amount { gpus: 9, ..one }, one),
            Ok(())
        );
        assert_eq!(
            check(
                "ml",
                "A100",
                quotas(),
                Amount { gpus: 9, ..one },
                Amount::default()
            ),
            Ok(())
        );
    }

    #[test]
    fn finished_and_unbound_pods_hold_nothing() {
        let pod = |node: Option<&str>, phase: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"nodeName": node, "containers": []},
                "status": {"phase": phase},
            }))
            .unwrap_or_default()
        };
        assert_eq!(holds_on(&pod(Some("n1"), "Running")), Some("n1"));
        assert_eq!(holds_on(&pod(Some("n1"), "Pending")), Some("n1"));
        assert_eq!(holds_on(&pod(Some("n1"), "Succeeded")), None);
        assert_eq!(holds_on(&pod(Some("n1"), "Failed")), None);
        assert_eq!(holds_on(&pod(None, "Pending")), None);
    }
}
