//! The Kubernetes objects a [`Plan`](super::plan::Plan) asks for, as
//! server-side apply bodies. Pure: tests read the bodies.

use std::collections::BTreeMap;
use std::path::PathBuf;

use gkm_oci::ImageRef;
use gkm_oci::mirrors::{HostsConfig, parse_hosts};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use super::plan::{ClaimPlan, PvcMode};
use crate::job_pod::{ImagePullPolicy, JobContainer, restricted_pod};
use crate::names::{
    CACHE_LABEL, CACHE_NAME_ANNOTATION, KIND_LABEL, MANAGED_BY, NAMESPACE_LABEL, NODE_LABEL,
    NODE_NAME_ANNOTATION, label_value, labelled_name,
};
use gkm_k8s_api::cache_object::{CacheKey, Scope};
use gkm_k8s_api::crd::{CacheSpec, PodTemplate};

/// The annotation naming the digest a fill Job extracts.
pub const DIGEST_ANNOTATION: &str = "gkm.io/digest";
/// Where a fill Job mounts the claim.
pub const FILL_MOUNT: &str = "/cache";
/// How the operator makes claims, volumes and fill Jobs.
#[derive(Debug, Clone)]
pub struct PvcOptions {
    /// The image whose entrypoint is `gkm-operator` (the fill Job runs
    /// `gkm-operator fill`).
    pub job_image: String,
    /// The fill Job's `imagePullPolicy`.
    pub job_image_pull_policy: ImagePullPolicy,
    /// Run fill Jobs in the node's network namespace (a registry reachable
    /// only from the nodes themselves, such as a node-local mirror).
    pub job_host_network: bool,
    /// Speak plain HTTP to the registry from fill Jobs.
    pub insecure_registry: bool,
    /// Make PersistentVolumes under this directory on the nodes (hostPath),
    /// for clusters without a provisioner for the StorageClass.
    pub volume_dir: Option<PathBuf>,
    /// The size claims request (and gkm-made volumes offer).
    pub claim_size: String,
    /// The registry mirrors fill Jobs read through: the host file of each
    /// Job's image registry goes into the Job ([`FILL_HOSTS_ENV`]), once
    /// checked, so tenants' namespaces need no ConfigMap or host path.
    pub registry_hosts: HostsConfig,
}

/// The environment variable carrying the registry host file (hosts.toml)
/// of a fill Job's image registry (`gkm-operator fill --registry-hosts`).
pub const FILL_HOSTS_ENV: &str = "GKM_REGISTRY_HOSTS";

impl Default for PvcOptions {
    fn default() -> Self {
        PvcOptions {
            job_image: "ghcr.io/gkm-rs/gkm-operator:v0.1.0".into(),
            job_image_pull_policy: ImagePullPolicy::IfNotPresent,
            job_host_network: false,
            insecure_registry: false,
            volume_dir: None,
            claim_size: "1Gi".into(),
            registry_hosts: HostsConfig::None,
        }
    }
}

/// The labels every object made for `key` carries; listing by them finds
/// what the cache owns.
pub fn owner_labels(key: &CacheKey) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (CACHE_LABEL.to_string(), label_value(key.name())),
        (
            KIND_LABEL.to_string(),
            match key.scope() {
                Scope::Namespaced => "GKMCache",
                Scope::Cluster => "ClusterGKMCache",
            }
            .to_string(),
        ),
        (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
    ]);
    if let Some(ns) = key.namespace() {
        labels.insert(NAMESPACE_LABEL.to_string(), label_value(ns));
    }
    labels
}

/// The annotations every object made for `key` (for `claim`'s node, if
/// any) carries: the whole names its labels may hold cut.
fn owner_annotations(key: &CacheKey, claim: &ClaimPlan) -> BTreeMap<String, String> {
    let mut annotations =
        BTreeMap::from([(CACHE_NAME_ANNOTATION.to_string(), key.name().to_string())]);
    if let Some(node) = &claim.node {
        annotations.insert(NODE_NAME_ANNOTATION.to_string(), node.clone());
    }
    annotations
}

/// A label selector matching [`owner_labels`].
pub fn owner_selector(key: &CacheKey) -> String {
    owner_labels(key)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The label selector of everything gkm makes for PVC delivery, whichever
/// cache it belongs to: what the operator's watches of Jobs, claims and
/// volumes ask for.
pub fn managed_selector() -> String {
    format!(
        "{}={},{CACHE_LABEL},{KIND_LABEL}",
        MANAGED_BY.0, MANAGED_BY.1
    )
}

/// The cache an object made for it belongs to, read back from its
/// [`owner_labels`] and the whole name beside them ([`labelled_name`]);
/// `None` when they do not name one.
pub fn owner_of(meta: &ObjectMeta) -> Option<CacheKey> {
    let labels = meta.labels.as_ref()?;
    if labels.get(MANAGED_BY.0).map(String::as_str) != Some(MANAGED_BY.1) {
        return None;
    }
    let name = labelled_name(meta, CACHE_LABEL, CACHE_NAME_ANNOTATION)?;
    match labels.get(KIND_LABEL).map(String::as_str)? {
        "GKMCache" => Some(CacheKey::namespaced(labels.get(NAMESPACE_LABEL)?, name)),
        "ClusterGKMCache" => Some(CacheKey::cluster(name)),
        _ => None,
    }
}

fn labels_for(key: &CacheKey, claim: &ClaimPlan) -> BTreeMap<String, String> {
    let mut labels = owner_labels(key);
    if let Some(node) = &claim.node {
        labels.insert(NODE_LABEL.to_string(), label_value(node));
    }
    labels
}

/// The claim.
pub fn claim(key: &CacheKey, spec: &CacheSpec, plan: &ClaimPlan, options: &PvcOptions) -> Value {
    let mode = PvcMode::of(spec).unwrap_or(PvcMode::ReadOnlyMany);
    let mut body = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": plan.name, "namespace": plan.namespace,
                     "labels": labels_for(key, plan),
                     "annotations": owner_annotations(key, plan)},
        "spec": {
            "accessModes": [mode.access_mode()],
            "storageClassName": spec.storage_class_name,
            "resources": {"requests": {"storage": options.claim_size}},
        },
    });
    if let Some(volume) = &plan.volume {
        body["spec"]["volumeName"] = json!(volume);
    }
    body
}

/// The gkm-made volume of a claim (hostPath under the volume directory;
/// pinned to its node in ReadWriteOnce mode), pre-bound to the claim.
pub fn volume(
    key: &CacheKey,
    spec: &CacheSpec,
    plan: &ClaimPlan,
    options: &PvcOptions,
) -> Option<Value> {
    let name = plan.volume.as_ref()?;
    let dir = options.volume_dir.as_ref()?;
    let mode = PvcMode::of(spec).unwrap_or(PvcMode::ReadOnlyMany);
    let mut body = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": labels_for(key, plan),
                     "annotations": owner_annotations(key, plan)},
        "spec": {
            "accessModes": [mode.access_mode()],
            "capacity": {"storage": options.claim_size},
            "storageClassName": spec.storage_class_name,
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": plan.namespace, "name": plan.name},
            "hostPath": {"path": dir.join(name).display().to_string(),
                         "type": "DirectoryOrCreate"},
        },
    });
    if let Some(node) = &plan.node {
        body["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]}});
    }
    Some(body)
}

/// The fill Job of a claim: `gkm-operator fill` extracting `image` (pinned
/// to the verified digest) into the claim, with the cache's `podTemplate`
/// on its pod and gkm's own settings kept.
pub fn job(
    key: &CacheKey,
    spec: &CacheSpec,
    plan: &ClaimPlan,
    digest: &str,
    image: &str,
    options: &PvcOptions,
) -> Option<Value> {
    let name = plan.job.as_ref()?;
    let template = spec.pod_template.clone().unwrap_or_default();
    let mut pod_labels = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    pod_labels.extend(labels_for(key, plan));
    let annotations = template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    let mut args = vec![
        "fill".to_string(),
        format!("--image={image}"),
        format!("--into={FILL_MOUNT}"),
    ];
    if options.insecure_registry {
        args.push("--insecure-registry".into());
    }
    let mut pod_spec = restricted_pod(&JobContainer {
        name: "fill",
        image: &options.job_image,
        image_pull_policy: options.job_image_pull_policy,
        args: &args,
    });
    // The claim is given to the fill's group once, not on every mount.
    pod_spec["securityContext"]["fsGroupChangePolicy"] = json!("OnRootMismatch");
    pod_spec["containers"][0]["volumeMounts"] = json!([{"name": "cache", "mountPath": FILL_MOUNT}]);
    pod_spec["volumes"] =
        json!([{"name": "cache", "persistentVolumeClaim": {"claimName": plan.name}}]);
    if options.job_host_network {
        pod_spec["hostNetwork"] = json!(true);
    }
    if let Some(hosts) = fill_hosts(image, &options.registry_hosts) {
        pod_spec["containers"][0]["env"] = json!([{"name": FILL_HOSTS_ENV, "value": hosts}]);
    }
    apply_template(&mut pod_spec, &template, plan.node.as_deref());
    let mut job_annotations = owner_annotations(key, plan);
    job_annotations.insert(DIGEST_ANNOTATION.to_string(), digest.to_string());
    Some(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": plan.namespace,
                     "labels": labels_for(key, plan), "annotations": job_annotations},
        "spec": {
            "backoffLimit": 4,
            "template": {
                "metadata": {"labels": pod_labels, "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }))
}

/// The host file a fill of `image` reads its registry through, when there
/// is one and it is valid: a file gkm cannot use is logged and the fill
/// reads from the registry itself, and only a checked file (which holds no
/// credentials: gkm refuses `header`) reaches the Job in a tenant's
/// namespace.
fn fill_hosts(image: &str, hosts: &HostsConfig) -> Option<String> {
    let Ok(ImageRef::Registry(reference)) = image.parse::<ImageRef>() else {
        return None;
    };
    let registry = reference.registry();
    match hosts.file_for(registry) {
        Ok(None) => None,
        Ok(Some((path, text))) => match parse_hosts(&text, registry, registry, false) {
            Ok(_) => Some(text),
            Err(reason) => {
                tracing::warn!(%path, %reason, "fill Jobs ignore a registry host file gkm cannot use");
                None
            }
        },
        Err(error) => {
            tracing::warn!(%error, "fill Jobs cannot read the registry host files");
            None
        }
    }
}

/// Copies the template's scheduling fields onto `pod_spec`; a ReadWriteOnce
/// Job stays pinned to its node whatever the template's affinity says (the
/// node is added to every required term).
fn apply_template(pod_spec: &mut Value, template: &PodTemplate, node: Option<&str>) {
    let scheduling = template.spec.clone().unwrap_or_default();
    if let Some(selector) = &scheduling.node_selector {
        pod_spec["nodeSelector"] = json!(selector);
    }
    if let Some(tolerations) = &scheduling.tolerations {
        pod_spec["tolerations"] = json!(tolerations);
    }
    if let Some(class) = &scheduling.priority_class_name {
        pod_spec["priorityClassName"] = json!(class);
    }
    let mut affinity = scheduling
        .affinity
        .as_ref()
        .and_then(|a| serde_json::to_value(a).ok())
        .unwrap_or_else(|| json!({}));
    if let Some(node) = node {
        let pin = json!({"key": "metadata.name", "operator": "In", "values": [node]});
        let terms = &mut affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        match terms.as_array_mut() {
            Some(list) if !list.is_empty() => {
                for term in list {
                    match term["matchFields"].as_array_mut() {
                        Some(fields) => fields.push(pin.clone()),
                        None => term["matchFields"] = json!([pin.clone()]),
                    }
                }
            }
            _ => *terms = json!([{"matchFields": [pin]}]),
        }
    }
    if affinity.as_object().is_some_and(|a| !a.is_empty()) {
        pod_spec["affinity"] = affinity;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_k8s_api::crd::AccessMode;

    fn key() -> CacheKey {
        CacheKey::namespaced("team", "vector-add")
    }

    fn spec(modes: Vec<AccessMode>, template: Option<serde_json::Value>) -> CacheSpec {
        CacheSpec {
            image: "r.example/c:v1".into(),
            storage_class_name: Some("standard".into()),
            access_modes: Some(modes),
            pod_template: template.map(|t| serde_json::from_value(t).expect("template")),
            ..CacheSpec::default()
        }
    }

    fn claim_plan(node: Option<&str>) -> ClaimPlan {
        ClaimPlan {
            namespace: "team".into(),
            name: "vector-add".into(),
            node: node.map(String::from),
            volume: Some("gkm-abc".into()),
            job: Some("vector-add-0123".into()),
            fill_digest: None,
        }
    }

    #[test]
    fn the_template_reaches_the_job_pod_and_gkm_keeps_its_own() {
        let template = json!({
            "metadata": {"labels": {"team": "ml", CACHE_LABEL: "spoofed"},
                         "annotations": {"note": "x"}},
            "spec": {"nodeSelector": {"gpu": "yes"},
                     "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     "priorityClassName": "high",
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                         {"nodeSelectorTerms": [{"matchExpressions": [
                             {"key": "zone", "operator": "In", "values": ["a"]}]}]}}}},
        });
        let spec = spec(vec![AccessMode::ReadWriteOnce], Some(template));
        let options = PvcOptions::default();
        let job = job(
            &key(),
            &spec,
            &claim_plan(Some("n1")),
            "sha256:00",
            "r.example/c@sha256:00",
            &options,
        )
        .expect("a job");
        let pod = &job["spec"]["template"];
        assert_eq!(pod["metadata"]["labels"]["team"], "ml");
        assert_eq!(pod["metadata"]["labels"][CACHE_LABEL], "vector-add");
        assert_eq!(pod["metadata"]["annotations"]["note"], "x");
        assert_eq!(pod["spec"]["nodeSelector"]["gpu"], "yes");
        assert_eq!(pod["spec"]["tolerations"][0]["key"], "gpu");
        assert_eq!(pod["spec"]["priorityClassName"], "high");
        let term = &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0];
        assert_eq!(term["matchExpressions"][0]["key"], "zone");
        assert_eq!(term["matchFields"][0]["values"][0], "n1");
        assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
        assert_eq!(
            pod["spec"]["containers"][0]["args"][1],
            "--image=r.example/c@sha256:00"
        );
        let _: k8s_openapi::api::batch::v1::Job = serde_json::from_value(job).expect("a Job");
    }

    #[test]
    fn fill_jobs_carry_their_registrys_checked_host_file() {
        let mirrored = "[host.\"http://127.0.0.1:30020\"]\n  capabilities = [\"pull\"]\n";
        let spec = spec(vec![AccessMode::ReadOnlyMany], None);
        let with = |hosts: &str| PvcOptions {
            registry_hosts: HostsConfig::Text(hosts.into()),
            ..PvcOptions::default()
        };
        let digest = format!("sha256:{}", "0".repeat(64));
        let image = format!("r.example/c@{digest}");
        let fill = |options: &PvcOptions| {
            job(&key(), &spec, &claim_plan(None), &digest, &image, options).expect("a job")
        };
        let job = fill(&with(mirrored));
        let env = &job["spec"]["template"]["spec"]["containers"][0]["env"];
        assert_eq!(env[0]["name"], FILL_HOSTS_ENV);
        assert_eq!(env[0]["value"], mirrored);
        // A file gkm refuses (here: one carrying headers) never reaches the Job.
        let job = fill(&with(
            "[host.\"https://m\".header]\nauthorization = \"Basic x\"\n",
        ));
        assert!(
            job["spec"]["template"]["spec"]["containers"][0]
                .get("env")
                .is_none()
        );
        let job = fill(&PvcOptions::default());
        assert!(
            job["spec"]["template"]["spec"]["containers"][0]
                .get("env")
                .is_none()
        );
    }

    fn meta(labels: BTreeMap<String, String>, annotations: BTreeMap<String, String>) -> ObjectMeta {
        ObjectMeta {
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn the_owner_is_read_back_from_the_labels() {
        for key in [key(), CacheKey::cluster("shared")] {
            let mut labels = owner_labels(&key);
            assert_eq!(
                owner_of(&meta(labels.clone(), BTreeMap::new())),
                Some(key.clone())
            );
            labels.insert(NODE_LABEL.into(), "n1".into());
            let annotations = owner_annotations(&key, &claim_plan(Some("n1")));
            assert_eq!(
                owner_of(&meta(labels.clone(), annotations)),
                Some(key.clone()),
                "a node claim's"
            );
            labels.remove(MANAGED_BY.0);
            assert_eq!(
                owner_of(&meta(labels, BTreeMap::new())),
                None,
                "not made by gkm"
            );
        }
        let mut labels = owner_labels(&key());
        labels.remove(NAMESPACE_LABEL);
        assert_eq!(
            owner_of(&meta(labels.clone(), BTreeMap::new())),
            None,
            "a GKMCache names its namespace"
        );
        labels.insert(KIND_LABEL.into(), "Other".into());
        assert_eq!(owner_of(&meta(labels, BTreeMap::new())), None);
    }

    #[test]
    fn long_names_are_labelled_cut_and_read_back_whole() {
        let long = format!("vector-add-{}", "x".repeat(70));
        let node = format!("node-{}", "n".repeat(240));
        let key = CacheKey::namespaced("team", long.as_str());
        let plan = ClaimPlan {
            node: Some(node.clone()),
            ..claim_plan(None)
        };
        let spec = spec(vec![AccessMode::ReadWriteOnce], None);
        let options = PvcOptions::default();
        let bodies = [
            claim(&key, &spec, &plan, &options),
            job(
                &key,
                &spec,
                &plan,
                "sha256:00",
                "r.example/c@sha256:00",
                &options,
            )
            .expect("a job"),
        ];
        for body in bodies {
            let meta: ObjectMeta =
                serde_json::from_value(body["metadata"].clone()).expect("metadata");
            let labels = meta.labels.clone().unwrap_or_default();
            assert_eq!(labels[CACHE_LABEL], label_value(&long));
            assert_eq!(labels[NODE_LABEL], label_value(&node));
            assert!(labels.values().all(|v| v.len() <= 63), "{labels:?}");
            assert_eq!(owner_of(&meta), Some(key.clone()));
            assert_eq!(
                labelled_name(&meta, NODE_LABEL, NODE_NAME_ANNOTATION).as_deref(),
                Some(node.as_str())
            );
            let selector = owner_selector(&key);
            assert!(
                selector.contains(&format!("{CACHE_LABEL}={}", label_value(&long))),
                "{selector}"
            );
        }
        // A name beside a label it does not give is not believed.
        let labels = owner_labels(&key);
        let other = BTreeMap::from([(CACHE_NAME_ANNOTATION.to_string(), "other".to_string())]);
        assert_eq!(owner_of(&meta(labels, other)), None);
    }

    #[test]
    fn volumes_are_pre_bound_and_rwo_ones_pinned() {
        let options = PvcOptions {
            volume_dir: Some("/var/lib/gkm/volumes".into()),
            ..PvcOptions::default()
        };
        let rox = spec(vec![AccessMode::ReadOnlyMany], None);
        let v = volume(&key(), &rox, &claim_plan(None), &options).expect("a volume");
        assert_eq!(v["spec"]["claimRef"]["name"], "vector-add");
        assert_eq!(
            v["spec"]["hostPath"]["path"],
            "/var/lib/gkm/volumes/gkm-abc"
        );
        assert_eq!(v["spec"]["accessModes"][0], "ReadOnlyMany");
        assert!(v["spec"].get("nodeAffinity").is_none());
        let rwo = spec(vec![], None);
        let v = volume(&key(), &rwo, &claim_plan(Some("n1")), &options).expect("a volume");
        assert_eq!(
            v["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchFields"][0]["values"]
                [0],
            "n1"
        );
        let c = claim(&key(), &rwo, &claim_plan(Some("n1")), &options);
        assert_eq!(c["spec"]["volumeName"], "gkm-abc");
        assert_eq!(c["spec"]["accessModes"][0], "ReadWriteOnce");
        assert!(volume(&key(), &rox, &claim_plan(None), &PvcOptions::default()).is_none());
    }

    #[test]
    fn the_webhook_reads_long_cache_and_node_names_whole() {
        use crate::admission::pvc_mutation::{node_claim, node_claims};
        use crate::cache::pvc::plan::ClaimPlan;
        use gkm_k8s_runtime::watched_index::Indexed;
        use kube::runtime::watcher;
        use std::collections::BTreeMap;
        let cache = format!("cache-{}", "c".repeat(70));
        let node = format!("node-{}", "n".repeat(70));
        let plan = ClaimPlan {
            namespace: "team".into(),
            name: "per-node".into(),
            node: Some(node.clone()),
            volume: None,
            job: None,
            fill_digest: None,
        };
        let key = gkm_k8s_api::cache_object::CacheKey::namespaced("team", cache.as_str());
        let spec = gkm_k8s_api::crd::CacheSpec {
            storage_class_name: Some("standard".into()),
            ..Default::default()
        };
        let body = claim(&key, &spec, &plan, &PvcOptions::default());
        let index = Indexed::default();
        let made = serde_json::from_value(body).expect("a claim");
        index.observe(&watcher::Event::Apply(made), node_claim);
        assert_eq!(
            node_claims(index.under(&"team".to_string())),
            BTreeMap::from([(cache, BTreeMap::from([(node, "per-node".to_string())]))])
        );
    }
}
