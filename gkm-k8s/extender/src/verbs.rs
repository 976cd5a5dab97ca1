//! Filter and prioritize: pure functions of the index and the call.
//!
//! # Scoring
//!
//! A node's score (0 to 10) favours, in this order:
//!
//! 1. for a pod mounting gkm caches, nodes where every cache is extracted
//!    at its current digest (6 points), then nodes whose agent reported a
//!    GPU that fits every cache (3 points);
//! 2. nodes whose asked-for GPUs would be the most used with the pod placed
//!    (up to 4 points for a pod with caches, 10 without): the most packed
//!    node that still fits wins, so an idle node stays whole for a job that
//!    needs all its GPUs. Whole GPUs count the node's allocatable of the
//!    asked resources; shared GPUs count the cores of the node's devices.
//!
//! On the chosen node, a shared-GPU pod gets the device that leaves the
//! fewest cores (then the least memory) stranded.

use std::collections::BTreeMap;

use super::cache::CacheFit;
use super::index::{Choice, Index};
use super::protocol::{
    ExtenderArgs, ExtenderFilterResult, HostPriority, HostPriorityList, MAX_PRIORITY,
};
use super::request::GpuRequest;

/// The filter verb: the candidates that fit, and why the others do not.
/// Nothing is written: the same call always gives the same answer for the
/// same index.
pub fn filter(index: &Index, args: &ExtenderArgs) -> ExtenderFilterResult {
    let candidates = args.candidates();
    let Some(pod) = &args.pod else {
        return ExtenderFilterResult {
            error: "the filter call carries no pod".into(),
            ..ExtenderFilterResult::default()
        };
    };
    let mut passed = Vec::with_capacity(candidates.len());
    let mut failed = BTreeMap::new();
    match GpuRequest::from_pod(pod, &index.config().whole_resources) {
        Err(e) => {
            let reason = format!("gkm: {e}");
            failed = candidates
                .into_iter()
                .map(|n| (n, reason.clone()))
                .collect();
        }
        Ok(request) if request.is_empty() => passed = candidates,
        Ok(request) => {
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
            let placer = index.placer(uid, namespace, &request);
            for node in candidates {
                match placer.check(&node) {
                    Ok(_) => passed.push(node),
                    Err(refusal) => {
                        failed.insert(node, refusal.into_reason());
                    }
                }
            }
        }
    }
    ExtenderFilterResult {
        node_names: Some(passed),
        failed_nodes: BTreeMap::new(),
        // Preempting pods cannot free what a quota or a cache refuses, and
        // the scheduler's preemption does not ask the extender: say so, so
        // it does not evict pods for nothing.
        failed_and_unresolvable_nodes: failed,
        error: String::new(),
    }
}

/// The prioritize verb: a score per candidate (0 where the pod does not fit).
pub fn prioritize(index: &Index, args: &ExtenderArgs) -> HostPriorityList {
    let candidates = args.candidates();
    let request = args
        .pod
        .as_ref()
        .and_then(|p| GpuRequest::from_pod(p, &index.config().whole_resources).ok())
        .filter(|r| !r.is_empty());
    let (Some(pod), Some(request)) = (&args.pod, request) else {
        return candidates
            .into_iter()
            .map(|host| HostPriority { host, score: 0 })
            .collect();
    };
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let placer = index.placer(uid, namespace, &request);
    candidates
        .into_iter()
        .map(|host| {
            let score = placer
                .check(&host)
                .map_or(0, |choice| score(&choice, !request.caches.is_empty()));
            HostPriority { host, score }
        })
        .collect()
}

/// A node's score for a pod that fits it; see the module documentation.
pub fn score(choice: &Choice, mounts_caches: bool) -> i64 {
    let packing = choice.packing.clamp(0.0, 1.0);
    let points = if mounts_caches {
        let cache = match choice.cache {
            CacheFit::Ready => 6.0,
            CacheFit::Compatible => 3.0,
            CacheFit::Unknown => 0.0,
        };
        cache + 4.0 * packing
    } else {
        MAX_PRIORITY as f64 * packing
    };
    (points.round() as i64).clamp(0, MAX_PRIORITY)
}
