//! The decisions over an index fed by hand, as the watches would feed it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

use super::index::{Index, IndexConfig};
use super::protocol::ExtenderArgs;
use super::request::GpuRequest;
use super::verbs::{filter, prioritize};
use gkm_k8s_api::crd::{CacheNodeStatus, CacheState, GpuModelLimit, NodeCacheStatus};

fn node(name: &str, model: &str, allocatable: Value) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"gkm.io/gpu.product": model}},
        "status": {"allocatable": allocatable},
    }))
    .unwrap_or_default()
}

/// A node offering `gpus` shared GPUs of `memory` MiB each, named `0`, `1`,
/// … in its devices annotation, as gkm's device plugin publishes them.
fn shared_node(name: &str, model: &str, gpus: i64, memory: i64) -> Node {
    let devices: Vec<Value> = (0..gpus)
        .map(|i| json!({"id": i.to_string(), "cores": 100, "memory": memory}))
        .collect();
    let mut n = node(
        name,
        model,
        json!({"gkm.io/gpu-cores": (gpus * 100).to_string(), "gkm.io/gpu-memory": (gpus * memory).to_string()}),
    );
    n.metadata.annotations = Some(BTreeMap::from([(
        "gkm.io/gpu-devices".to_string(),
        Value::Array(devices).to_string(),
    )]));
    n
}

fn pod(name: &str, ns: &str, node: Option<&str>, limits: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}")},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]},
    }))
    .unwrap_or_default()
}

fn args(pod: Pod, nodes: &[&str]) -> ExtenderArgs {
    ExtenderArgs {
        pod: Some(pod),
        nodes: None,
        node_names: Some(nodes.iter().map(|n| n.to_string()).collect()),
    }
}

fn passed(index: &Index, a: &ExtenderArgs) -> Vec<String> {
    filter(index, a).node_names.unwrap_or_default()
}

fn scores(index: &Index, a: &ExtenderArgs) -> BTreeMap<String, i64> {
    prioritize(index, a)
        .into_iter()
        .map(|h| (h.host, h.score))
        .collect()
}

fn request(p: &Pod) -> GpuRequest {
    GpuRequest::from_pod(p, &IndexConfig::default().whole_resources).unwrap_or_default()
}

#[test]
fn whole_gpus_fit_where_enough_are_free() {
    let mut index = Index::new(IndexConfig::default());
    index.upsert_node(&node("a", "T4", json!({"nvidia.com/gpu": "2"})));
    index.upsert_node(&node("b", "T4", json!({"nvidia.com/gpu": "4"})));
    index.upsert_pod(&pod("old", "ml", Some("a"), json!({"nvidia.com/gpu": "1"})));
    let a = args(
        pod("p", "ml", None, json!({"nvidia.com/gpu": "2"})),
        &["a", "b"],
    );
    let result = filter(&index, &a);
    assert_eq!(result.node_names, Some(vec!["b".to_string()]));
    assert_eq!(
        result.failed_and_unresolvable_nodes["a"],
        "gkm: 1 of 2 nvidia.com/gpu free, the pod asks 2"
    );
}

#[test]
fn a_pod_without_gpus_passes_everywhere_with_no_preference() {
    let mut index = Index::new(IndexConfig::default());
    index.upsert_node(&node("a", "T4", json!({})));
    let a = args(pod("p", "ml", None, json!({"cpu": "1"})), &["a", "unknown"]);
    assert_eq!(passed(&index, &a), ["a", "unknown"]);
    assert_eq!(
        scores(&index, &a),
        BTreeMap::from([("a".into(), 0), ("unknown".into(), 0)])
    );
}

#[test]
fn shared_gpus_go_to_the_device_that_strands_least() {
    let mut index = Index::new(IndexConfig::default());
    index.upsert_node(&shared_node("a", "T4", 2, 16384));
    let mut old: Pod = pod(
        "old",
        "ml",
        Some("a"),
        json!({"gkm.io/gpu-cores": "70", "gkm.io/gpu-memory": "1024"}),
    );
    old.metadata.annotations = Some(BTreeMap::from([(
        "gkm.io/gpu-assignment".to_string(),
        r#"{"gkm.io/gpu-cores":["1"]}"#.to_string(),
    )]));
    index.upsert_pod(&old);
    // 30% is left on device 1: a 20% pod goes there, not onto the idle device 0.
    let small = pod(
        "small",
        "ml",
        None,
        json!({"gkm.io/gpu-cores": "20", "gkm.io/gpu-memory": "1024"}),
    );
    let shares = index.reserve("uid-ml-small", "small", "ml", &request(&small), "a");
    assert_eq!(shares.map(|s| s[0].device.clone()), Ok("1".to_string()));
    // 10% is left on device 1 now: a 50% pod gets device 0.
    let half = pod("half", "ml", None, json!({"gkm.io/gpu-cores": "50"}));
    let shares = index.reserve("uid-ml-half", "half", "ml", &request(&half), "a");
    assert_eq!(shares.map(|s| s[0].device.clone()), Ok("0".to_string()));
    // 60% of a GPU is free nowhere.
    let big = args(
        pod("big", "ml", None, json!({"gkm.io/gpu-cores": "60"})),
        &["a"],
    );
    assert_eq!(
        filter(&index, &big).failed_and_unresolvable_nodes["a"],
        "gkm: no GPU has 60% cores and 0 MiB free (the freest has 50% cores and 16384 MiB)"
    );
}

#[test]
fn quota_refusals_name_namespace_model_use_and_limit() {
    let mut index = Index::new(IndexConfig::default());
    index.upsert_node(&node("a", "A100", json!({"nvidia.com/gpu": "8"})));
    index.upsert_node(&node("t", "T4", json!({"nvidia.com/gpu": "8"})));
    let limit = GpuModelLimit {
        model: "A100".into(),
        gpus: Some(2),
        ..GpuModelLimit::default()
    };
    index.upsert_quota("team", "gpus", vec![limit.clone()]);
    index.upsert_pod(&pod(
        "one",
        "team",
        Some("a"),
        json!({"nvidia.com/gpu": "2"}),
    ));
    let a = args(
        pod("p", "team", None, json!({"nvidia.com/gpu": "1"})),
        &["a", "t"],
    );
    let result = filter(&index, &a);
    assert_eq!(result.node_names, Some(vec!["t".to_string()]));
    assert_eq!(
        result.failed_and_unresolvable_nodes["a"],
        "gkm: quota team/gpus reached: namespace team holds 2 of 2 GPUs of model A100, the pod asks 1"
    );
    // Another namespace is not limited.
    let other = args(
        pod("p", "other", None, json!({"nvidia.com/gpu": "1"})),
        &["a"],
    );
    assert_eq!(passed(&index, &other), ["a"]);
    let used = index.quota_use("team", &[limit]);
    assert_eq!((used[0].model.as_str(), used[0].gpus), ("A100", 2));
}

#[test]
fn reservations_never_overshoot_a_quota_and_free_on_release_or_delete() {
    let mut index = Index::new(IndexConfig::default());
    for n in ["a", "b"] {
        index.upsert_node(&node(n, "A100", json!({"nvidia.com/gpu": "8"})));
    }
    let limit = GpuModelLimit {
        model: "A100".into(),
        gpus: Some(8),
        ..GpuModelLimit::default()
    };
    index.upsert_quota("team", "gpus", vec![limit]);
    let pods: Vec<Pod> = (0..12)
        .map(|i| {
            pod(
                &format!("p{i}"),
                "team",
                None,
                json!({"nvidia.com/gpu": "1"}),
            )
        })
        .collect();
    let reserved: Vec<bool> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let uid = format!("uid-team-p{i}");
            let node = if i % 2 == 0 { "a" } else { "b" };
            index
                .reserve(&uid, &format!("p{i}"), "team", &request(p), node)
                .is_ok()
        })
        .collect();
    assert_eq!(reserved.iter().filter(|r| **r).count(), 8);
    // A retried bind of a pod holding room succeeds again.
    assert!(
        index
            .reserve("uid-team-p0", "p0", "team", &request(&pods[0]), "a")
            .is_ok()
    );
    index.release("uid-team-p0");
    index.remove_pod("uid-team-p1");
    let next = |index: &mut Index, i: usize| {
        index.reserve(
            &format!("uid-team-p{i}"),
            "p",
            "team",
            &request(&pods[i]),
            "a",
        )
    };
    assert!(next(&mut index, 8).is_ok());
    assert!(next(&mut index, 9).is_ok());
    assert!(next(&mut index, 10).is_err());
}

#[test]
fn the_watch_takes_over_a_reservation() {
    let mut index = Index::new(IndexConfig::default());
    index.upsert_node(&node("a", "T4", json!({"nvidia.com/gpu": "1"})));
    let p = pod("p", "ml", None, json!({"nvidia.com/gpu": "1"}));
    assert!(
        index
            .reserve("uid-ml-p", "p", "ml", &request(&p), "a")
            .is_ok()
    );
    // The watch still shows the pod unbound: the reservation stays.
    index.upsert_pod(&p);
    let q = args(pod("q", "ml", None, json!({"nvidia.com/gpu": "1"})), &["a"]);
    assert!(passed(&index, &q).is_empty());
    // Bound, then gone.
    index.upsert_pod(&pod("p", "ml", Some("a"), json!({"nvidia.com/gpu": "1"})));
    index.release("uid-ml-p");
    assert!(passed(&index, &q).is_empty());
    index.remove_pod("uid-ml-p");
    assert_eq!(passed(&index, &q), ["a"]);
}

#[test]
fn the_most_packed_node_that_fits_scores_highest() {
    let mut index = Index::new(IndexConfig::default());
    for (n, used) in [("a", 3), ("b", 0), ("c", 1), ("d", 4)] {
        index.upsert_node(&node(n, "T4", json!({"nvidia.com/gpu": "4"})));
        for i in 0..used {
            index.upsert_pod(&pod(
                &format!("{n}{i}"),
                "ml",
                Some(n),
                json!({"nvidia.com/gpu": "1"}),
            ));
        }
    }
    let a = args(
        pod("p", "ml", None, json!({"nvidia.com/gpu": "1"})),
        &["a", "b", "c", "d"],
    );
    let s = scores(&index, &a);
    assert!(s["a"] > s["c"] && s["c"] > s["b"], "{s:?}");
    assert_eq!(s["d"], 0);
}

fn report(fits: bool, state: CacheState, digest: &str) -> CacheNodeStatus {
    let entry = NodeCacheStatus {
        state: Some(state),
        compatible_gpus: Some(if fits { vec![0] } else { vec![] }),
        incompatible_gpus: Some(if fits { vec![] } else { vec![0] }),
        incompatible_reasons: Some(if fits {
            vec![]
        } else {
            vec![gkm_k8s_api::crd::IncompatibleGpu {
                id: 0,
                reasons: vec!["backend cuda is not hip".into()],
            }]
        }),
        ..NodeCacheStatus::default()
    };
    CacheNodeStatus {
        caches: Some(BTreeMap::from([(
            "vector-add".to_string(),
            BTreeMap::from([(digest.to_string(), entry)]),
        )])),
        ..CacheNodeStatus::default()
    }
}

#[test]
fn caches_keep_pods_off_nodes_they_do_not_fit_and_prefer_extracted_ones() {
    let mut index = Index::new(IndexConfig::default());
    for n in ["ready", "compatible", "unknown", "wrong", "old"] {
        index.upsert_node(&node(n, "T4", json!({"nvidia.com/gpu": "1"})));
    }
    index.upsert_report(
        Some("ml"),
        "ready",
        &report(true, CacheState::Extracted, "sha256:new"),
    );
    index.upsert_report(
        Some("ml"),
        "compatible",
        &report(true, CacheState::Downloading, "sha256:new"),
    );
    index.upsert_report(
        Some("ml"),
        "wrong",
        &report(false, CacheState::Error, "sha256:new"),
    );
    index.upsert_report(
        Some("ml"),
        "old",
        &report(true, CacheState::Extracted, "sha256:old"),
    );
    index.upsert_cache(
        gkm_k8s_api::cache_object::CacheKey::namespaced("ml", "vector-add"),
        Some("sha256:new".into()),
    );
    let mut p = pod("p", "ml", None, json!({"nvidia.com/gpu": "1"}));
    if let Some(spec) = p.spec.as_mut() {
        spec.volumes = serde_json::from_value(json!([{"name": "k", "csi": {
            "driver": "csi.gkm.io", "volumeAttributes": {"csi.gkm.io/GKMCache": "vector-add"}}}]))
        .ok();
    }
    let a = args(p, &["ready", "compatible", "unknown", "wrong", "old"]);
    let result = filter(&index, &a);
    assert_eq!(
        result.failed_and_unresolvable_nodes["wrong"],
        "gkm: GKMCache ml/vector-add does not fit this node's GPUs (GPU 0: backend cuda is not hip)"
    );
    let s = scores(&index, &a);
    assert!(s["ready"] > s["compatible"], "{s:?}");
    assert_eq!(
        s["compatible"], s["old"],
        "an outdated digest is not ready: {s:?}"
    );
    assert!(s["compatible"] > s["unknown"], "{s:?}");
}

#[test]
fn a_claim_of_a_pvc_gkm_filled_counts_as_its_cache() {
    let mut index = Index::new(IndexConfig::default());
    index.upsert_node(&node("wrong", "T4", json!({"nvidia.com/gpu": "1"})));
    let mut status = report(false, CacheState::Error, "sha256:new");
    if let Some(entry) = status
        .caches
        .as_mut()
        .and_then(|c| c.get_mut("vector-add"))
        .and_then(|d| d.get_mut("sha256:new"))
    {
        entry.pvc_status = Some(BTreeMap::from([(
            "ml".to_string(),
            gkm_k8s_api::crd::PvcStatus {
                pvc_name: Some("kernels".into()),
                ..Default::default()
            },
        )]));
    }
    index.upsert_report(Some("ml"), "wrong", &status);
    let mut p = pod("p", "ml", None, json!({"nvidia.com/gpu": "1"}));
    if let Some(spec) = p.spec.as_mut() {
        spec.volumes = serde_json::from_value(json!([
            {"name": "k", "persistentVolumeClaim": {"claimName": "kernels"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}},
        ]))
        .ok();
    }
    let result = filter(&index, &args(p, &["wrong"]));
    assert!(
        result.failed_and_unresolvable_nodes["wrong"]
            .starts_with("gkm: GKMCache ml/vector-add does not fit this node's GPUs"),
        "{result:?}"
    );
}

#[test]
fn more_than_one_gpu_of_cores_takes_whole_free_devices() {
    let mut index = Index::new(IndexConfig::default());
    index.upsert_node(&shared_node("a", "T4", 3, 1000));
    let small = pod("s", "ml", None, json!({"gkm.io/gpu-cores": "10"}));
    let taken = index.reserve("uid-ml-s", "s", "ml", &request(&small), "a");
    assert_eq!(taken.map(|s| s[0].device.clone()), Ok("0".to_string()));
    let two = pod(
        "two",
        "ml",
        None,
        json!({"gkm.io/gpu-cores": "200", "gkm.io/gpu-memory": "2000"}),
    );
    let shares = index.reserve("uid-ml-two", "two", "ml", &request(&two), "a");
    assert_eq!(
        shares.map(|s| s
            .iter()
            .map(|s| (s.device.clone(), s.cores, s.memory))
            .collect::<Vec<_>>()),
        Ok(vec![
            ("1".to_string(), 100, 1000),
            ("2".to_string(), 100, 1000)
        ])
    );
    let three = args(
        pod("three", "ml", None, json!({"gkm.io/gpu-cores": "200"})),
        &["a"],
    );
    assert_eq!(
        filter(&index, &three).failed_and_unresolvable_nodes["a"],
        "gkm: 0 of the 2 whole GPUs the pod asks are free"
    );
}
