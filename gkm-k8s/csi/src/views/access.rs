//! Who may mount which cache, decided from what the kubelet vouches for.
//!
//! The kubelet passes the pod's namespace, name and uid in the volume
//! context (`podInfoOnMount: true` in the `CSIDriver`), over anything the
//! pod's author wrote in `volumeAttributes`. The rules:
//!
//! - a `GKMCache` is mounted only into pods of its own namespace;
//! - a `ClusterGKMCache` with `workloadNamespaces` only into pods of those
//!   namespaces; one without `workloadNamespaces` into pods of any
//!   namespace (it is a cluster-wide cache, as in GKM);
//! - when the target path is the kubelet's
//!   (`…/pods/<uid>/volumes/kubernetes.io~csi/…`), the pod uid in the
//!   volume context must be that uid, so a volume context that does not come
//!   from the kubelet (a `CSIDriver` without `podInfoOnMount`) cannot claim
//!   another pod's namespace.
//!
//! A refusal is `PERMISSION_DENIED` naming the rule; the kubelet shows it in
//! the pod's `FailedMount` event. The namespace rule is checked before the
//! cache is looked up, so a refusal never tells whether another namespace's
//! cache exists.

use std::path::{Component, Path};

use tonic::Status;

use crate::volume::CacheVolume;
use gkm_core::Scope;
use gkm_k8s_node::delivery::Delivery;

/// Refuses a pod whose volume context does not match the pod the kubelet
/// publishes for, or a `GKMCache` of another namespace.
pub fn check_pod(req: &CacheVolume) -> Result<(), Status> {
    if let Some(path_uid) = kubelet_pod_uid(&req.target_path) {
        match req.pod.uid.as_deref() {
            Some(uid) if uid == path_uid => {}
            Some(uid) => {
                return Err(Status::permission_denied(format!(
                    "the volume context names pod uid {uid}, but the kubelet publishes for pod {path_uid}"
                )));
            }
            None => {
                return Err(Status::permission_denied(format!(
                    "the volume context lacks {}: set podInfoOnMount: true in the {} CSIDriver",
                    gkm_k8s_node::volume::CTX_POD_UID,
                    gkm_k8s_node::volume::DRIVER_NAME
                )));
            }
        }
    }
    if req.cache.scope() == Scope::Namespaced
        && let Some(namespace) = req.cache.namespace()
        && namespace != req.pod.namespace
    {
        return Err(Status::permission_denied(format!(
            "pod {}/{} may not mount GKMCache {namespace}/{}: a GKMCache is mountable only by pods in its own \
             namespace (use a ClusterGKMCache with workloadNamespaces to share a cache)",
            req.pod.namespace,
            req.pod.name,
            req.cache.name()
        )));
    }
    Ok(())
}

/// Refuses a pod outside a `ClusterGKMCache`'s `workloadNamespaces`.
pub fn check_workload_namespace(req: &CacheVolume, delivery: &Delivery) -> Result<(), Status> {
    if req.cache.scope() != Scope::Cluster {
        return Ok(());
    }
    match &delivery.workload_namespaces {
        Some(allowed) if !allowed.contains(&req.pod.namespace) => {
            Err(Status::permission_denied(format!(
                "pod {}/{} may not mount ClusterGKMCache {}: its workloadNamespaces ({}) do not include namespace {}",
                req.pod.namespace,
                req.pod.name,
                req.cache.name(),
                allowed.join(", "),
                req.pod.namespace
            )))
        }
        _ => Ok(()),
    }
}

/// The pod uid in a kubelet target path `…/pods/<uid>/volumes/…`.
fn kubelet_pod_uid(target: &Path) -> Option<&str> {
    let parts: Vec<&str> = target
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect();
    parts
        .windows(3)
        .rev()
        .find(|w| w[0] == "pods" && w[2] == "volumes")
        .map(|w| w[1])
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use tonic::Code;

    use super::*;
    use gkm_core::CacheKey;
    use gkm_k8s_node::mount_records::PodRef;

    /// A request from a pod in `pod_ns` for the `GKMCache` in `cache_ns`,
    /// or the `ClusterGKMCache` when `None`.
    fn request(
        cache_ns: Option<&str>,
        pod_ns: &str,
        uid: Option<&str>,
        target: &str,
    ) -> CacheVolume {
        CacheVolume {
            volume_id: "csi-1".into(),
            target_path: PathBuf::from(target),
            cache: CacheKey::named(cache_ns, "vector-add"),
            pod: PodRef {
                namespace: pod_ns.into(),
                name: "infer-0".into(),
                uid: uid.map(str::to_string),
            },
            view: crate::volume::View::ReadOnly,
            mount_path: None,
            capture: None,
        }
    }

    const TARGET: &str = "/var/lib/kubelet/pods/0c1d/volumes/kubernetes.io~csi/kernels/mount";

    fn denied(result: Result<(), Status>) -> String {
        let status = result.expect_err("refused");
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        status.message().to_string()
    }

    #[test]
    fn a_gkmcache_only_in_its_own_namespace() {
        assert!(check_pod(&request(Some("ml"), "ml", Some("0c1d"), TARGET)).is_ok());
        let why = denied(check_pod(&request(
            Some("other"),
            "ml",
            Some("0c1d"),
            TARGET,
        )));
        assert!(why.contains("only by pods in its own namespace"), "{why}");
        assert!(why.contains("GKMCache other/vector-add"), "{why}");
    }

    #[test]
    fn the_pod_uid_must_be_the_kubelets() {
        let why = denied(check_pod(&request(Some("ml"), "ml", Some("beef"), TARGET)));
        assert!(why.contains("publishes for pod 0c1d"), "{why}");
        let why = denied(check_pod(&request(Some("ml"), "ml", None, TARGET)));
        assert!(why.contains("podInfoOnMount"), "{why}");
        // A target outside the kubelet's layout (csi-sanity's) has no uid to match.
        assert!(check_pod(&request(Some("ml"), "ml", None, "/tmp/target")).is_ok());
    }

    #[test]
    fn a_cluster_cache_within_its_workload_namespaces() {
        let digest: gkm_core::Digest =
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
                .parse()
                .expect("digest");
        let any = Delivery::deliverable(digest.clone());
        let limited =
            Delivery::deliverable(digest).for_namespaces(Some(vec!["a".into(), "b".into()]));
        let pod_in = |ns: &str| request(None, ns, Some("0c1d"), TARGET);
        assert!(check_workload_namespace(&pod_in("ml"), &any).is_ok());
        assert!(check_workload_namespace(&pod_in("b"), &limited).is_ok());
        let why = denied(check_workload_namespace(&pod_in("ml"), &limited));
        assert!(
            why.contains("workloadNamespaces (a, b) do not include namespace ml"),
            "{why}"
        );
    }
}
