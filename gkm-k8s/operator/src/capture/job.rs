//! The capture Job: `gkm capture` of one workload pod's captured tree, in
//! the capture's own namespace, on the node the tree is on.
//!
//! What keeps it to its tenant: the Job is the tenant's (its namespace, its
//! Secrets), so no gkm component reads a tenant's signing key or registry
//! credentials, and a Secret of another namespace cannot be mounted at all.
//! The tree comes in read-only through `csi.gkm.io` (the volume names the
//! capture and the pod), the key and the registry's `config.json` as Secret
//! volumes, the key's password as an environment variable from the same
//! Secret. The pod passes Pod Security `restricted`, has no service account
//! token, and writes only an `emptyDir` bounded to the capture's size
//! limit (the temporary image). The target and limits come from the
//! capture's spec, never from the workload.

use gkm_k8s_api::crd::{
    CaptureSignatureFormat, DEFAULT_CAPTURE_MAX_BYTES, DEFAULT_CAPTURE_MAX_FILES, GKMCacheCapture,
};
use gkm_k8s_node::captures::{DELTA_RECORD_FILE, DELTA_UPPER_DIR};
use gkm_k8s_node::volume::{ATTR_CAPTURE, ATTR_CAPTURED_POD, DRIVER_NAME};
use serde_json::{Value, json};

use crate::job_pod::{ImagePullPolicy, JobContainer, restricted_pod};

/// The label on capture Jobs and their pods holding the capture's uid
/// (always a valid label value, unlike a long name).
pub const CAPTURE_LABEL: &str = "gkm.io/capture-uid";
/// Where the Job mounts the captured tree.
pub const TREE_MOUNT: &str = "/capture";
/// Where the Job mounts the signing Secret.
pub const SIGNING_MOUNT: &str = "/signing";
/// Where the Job mounts the registry credentials (`config.json`).
pub const REGISTRY_MOUNT: &str = "/registry";
/// The default key of the private key in the signing Secret.
pub const DEFAULT_KEY: &str = "cosign.key";
/// The default key of the key's password in the signing Secret.
pub const DEFAULT_PASSWORD_KEY: &str = "cosign.password";
/// The longest a capture Job may run.
pub const DEADLINE_SECONDS: i64 = 1800;
/// Room in the temporary image's `emptyDir` beyond the tree's limit (the
/// compressed layer is smaller than the tree; the rest is the image's
/// small documents).
const WORK_MARGIN_BYTES: u64 = 64 << 20;

/// How the operator makes capture Jobs.
#[derive(Debug, Clone)]
pub struct JobOptions {
    /// The image whose entrypoint is the `gkm` command line.
    pub image: String,
    /// Its `imagePullPolicy`.
    pub image_pull_policy: ImagePullPolicy,
    /// Run capture Jobs in the node's network namespace (a registry
    /// reachable only from the nodes themselves, as for fill Jobs).
    pub host_network: bool,
}

/// The workload pod whose tree the Job captures.
#[derive(Debug, Clone, PartialEq)]
pub struct CapturedPod<'a> {
    /// Its uid (names its tree on the node).
    pub uid: &'a str,
    /// The node the tree is on.
    pub node: &'a str,
    /// Its tolerations, so the Job is not evicted from the same (possibly
    /// tainted) node.
    pub tolerations: Value,
}

/// What a capture Job makes of the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Harvest {
    /// The tree is the cache: `gkm capture /capture`.
    Tree,
    /// The tree is a writable cache view's upper over a delivered cache,
    /// beside the record of that base (the CSI driver's delta tree): `gkm
    /// capture /capture/upper --delta-base-record=/capture/delta-base.json`,
    /// an image of the base's layers plus one layer of what was compiled.
    Delta,
}

/// Where a delta tree's upper is, in the Job (the tree at [`TREE_MOUNT`]).
pub fn delta_upper() -> String {
    format!("{TREE_MOUNT}/{DELTA_UPPER_DIR}")
}

/// The flag naming a delta tree's record of its base, in the Job.
pub fn delta_base_record_arg() -> String {
    format!("--delta-base-record={TREE_MOUNT}/{DELTA_RECORD_FILE}")
}

/// The Job `name` capturing `pod`'s tree for `capture` (a [`Harvest::Tree`]),
/// or `None` when the capture has no namespace, name or uid (it was not
/// read from the cluster) or a size limit that does not parse.
pub fn job(
    capture: &GKMCacheCapture,
    name: &str,
    pod: &CapturedPod<'_>,
    options: &JobOptions,
) -> Option<Value> {
    job_harvesting(capture, name, pod, Harvest::Tree, options)
}

/// The Job `name` making `harvest` of `pod`'s tree for `capture`; `None` as
/// for [`job`].
pub fn job_harvesting(
    capture: &GKMCacheCapture,
    name: &str,
    pod: &CapturedPod<'_>,
    harvest: Harvest,
    options: &JobOptions,
) -> Option<Value> {
    let namespace = capture.metadata.namespace.as_deref()?;
    let capture_name = capture.metadata.name.as_deref()?;
    let spec = &capture.spec;
    let max_bytes = gkm_oci::disk::parse_bytes(
        spec.max_bytes
            .as_deref()
            .unwrap_or(DEFAULT_CAPTURE_MAX_BYTES),
    )
    .ok()?;
    let max_files = spec.max_files.unwrap_or(DEFAULT_CAPTURE_MAX_FILES);
    let key = spec.signing.key.as_deref().unwrap_or(DEFAULT_KEY);
    let password_key = spec
        .signing
        .password_key
        .as_deref()
        .unwrap_or(DEFAULT_PASSWORD_KEY);
    let tree = match harvest {
        Harvest::Tree => TREE_MOUNT.to_string(),
        Harvest::Delta => delta_upper(),
    };
    let mut args = vec![
        "capture".to_string(),
        tree,
        format!("--target={}", spec.target_image),
        format!("--key={SIGNING_MOUNT}/key"),
        format!("--max-bytes={max_bytes}"),
        format!("--max-files={max_files}"),
        "--termination-log=/dev/termination-log".to_string(),
        "--json".to_string(),
    ];
    if harvest == Harvest::Delta {
        args.push(delta_base_record_arg());
    }
    if spec.signing.format == Some(CaptureSignatureFormat::V2) {
        args.push("--format=v2".into());
    }
    if spec.insecure_registry {
        args.push("--insecure".into());
    }
    let mut env = vec![json!({
        "name": "COSIGN_PASSWORD",
        "valueFrom": {"secretKeyRef": {
            "name": spec.signing.secret_name, "key": password_key, "optional": true}},
    })];
    let mut mounts = vec![
        json!({"name": "tree", "mountPath": TREE_MOUNT, "readOnly": true}),
        json!({"name": "signing", "mountPath": SIGNING_MOUNT, "readOnly": true}),
        json!({"name": "work", "mountPath": "/tmp"}),
    ];
    let mut volumes = vec![
        json!({"name": "tree", "csi": {
            "driver": DRIVER_NAME,
            "readOnly": true,
            "volumeAttributes": {ATTR_CAPTURE: capture_name, ATTR_CAPTURED_POD: pod.uid},
        }}),
        json!({"name": "signing", "secret": {
            "secretName": spec.signing.secret_name,
            "items": [{"key": key, "path": "key"}],
            "defaultMode": 0o440,
        }}),
        json!({"name": "work", "emptyDir": {
            "sizeLimit": (max_bytes.saturating_add(WORK_MARGIN_BYTES)).to_string(),
        }}),
    ];
    if let Some(secret) = &spec.registry_credentials_secret {
        env.push(json!({"name": "DOCKER_CONFIG", "value": REGISTRY_MOUNT}));
        mounts.push(json!({"name": "registry", "mountPath": REGISTRY_MOUNT, "readOnly": true}));
        volumes.push(json!({"name": "registry", "secret": {
            "secretName": secret,
            "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
            "defaultMode": 0o440,
        }}));
    }
    let mut pod_spec = restricted_pod(&JobContainer {
        name: "capture",
        image: &options.image,
        image_pull_policy: options.image_pull_policy,
        args: &args,
    });
    pod_spec["hostNetwork"] = json!(options.host_network);
    pod_spec["enableServiceLinks"] = json!(false);
    pod_spec["tolerations"] = pod.tolerations.clone();
    // Bound to the node by name: the tree is there only, so there is
    // nothing to schedule (and a cordoned node still gets its tree
    // captured).
    pod_spec["nodeName"] = json!(pod.node);
    let container = &mut pod_spec["containers"][0];
    container["env"] = json!(env);
    container["volumeMounts"] = json!(mounts);
    container["terminationMessagePath"] = json!("/dev/termination-log");
    container["terminationMessagePolicy"] = json!("File");
    pod_spec["volumes"] = json!(volumes);
    let labels = json!({CAPTURE_LABEL: capture.metadata.uid.as_deref()?});
    let owner = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheCapture",
        "name": capture_name, "uid": capture.metadata.uid.as_deref()?,
        "controller": true, "blockOwnerDeletion": true,
    });
    Some(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels,
                     "ownerReferences": [owner]},
        "spec": {
            // The operator retries registry failures itself, with backoff,
            // and fails the rest at once.
            "backoffLimit": 0,
            "activeDeadlineSeconds": DEADLINE_SECONDS,
            "template": {
                "metadata": {"labels": labels},
                "spec": pod_spec,
            },
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_k8s_api::crd::{CaptureSigning, GKMCacheCaptureSpec};

    fn capture() -> GKMCacheCapture {
        let mut c = GKMCacheCapture::new(
            "warm",
            GKMCacheCaptureSpec {
                target_image: "registry.example/team/llama:h100".into(),
                signing: CaptureSigning {
                    secret_name: "signing".into(),
                    ..CaptureSigning::default()
                },
                registry_credentials_secret: Some("push".into()),
                max_bytes: Some("1GiB".into()),
                ..GKMCacheCaptureSpec::default()
            },
        );
        c.metadata.namespace = Some("team".into());
        c.metadata.uid = Some("uid-capture".into());
        c
    }

    fn pod() -> CapturedPod<'static> {
        CapturedPod {
            uid: "uid-w",
            node: "node-1",
            tolerations: json!([{"key": "gpu", "operator": "Exists"}]),
        }
    }

    fn options() -> JobOptions {
        JobOptions {
            image: "ghcr.io/gkm-rs/gkm:v0.1.0".into(),
            image_pull_policy: ImagePullPolicy::IfNotPresent,
            host_network: false,
        }
    }

    #[test]
    fn the_job_runs_in_the_captures_namespace_on_the_trees_node_with_its_secrets() {
        let job = job(&capture(), "capture-warm-1", &pod(), &options()).expect("a job");
        let _: k8s_openapi::api::batch::v1::Job =
            serde_json::from_value(job.clone()).expect("a Job");
        assert_eq!(job["metadata"]["namespace"], "team");
        assert_eq!(job["metadata"]["ownerReferences"][0]["uid"], "uid-capture");
        let pod_spec = &job["spec"]["template"]["spec"];
        assert_eq!(pod_spec["nodeName"], "node-1");
        assert_eq!(pod_spec["tolerations"][0]["key"], "gpu");
        assert_eq!(pod_spec["automountServiceAccountToken"], false);
        let volumes = pod_spec["volumes"].as_array().expect("volumes");
        let tree = &volumes[0]["csi"];
        assert_eq!(tree["readOnly"], true);
        assert_eq!(tree["volumeAttributes"][ATTR_CAPTURE], "warm");
        assert_eq!(tree["volumeAttributes"][ATTR_CAPTURED_POD], "uid-w");
        assert_eq!(volumes[1]["secret"]["secretName"], "signing");
        assert_eq!(volumes[1]["secret"]["items"][0]["key"], DEFAULT_KEY);
        assert_eq!(volumes[3]["secret"]["secretName"], "push");
        // Secret volumes name Secrets of the Job's own namespace only.
        for v in volumes {
            assert!(v["secret"].get("namespace").is_none(), "{v}");
        }
        let container = &pod_spec["containers"][0];
        let args: Vec<&str> = container["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            args.contains(&"--target=registry.example/team/llama:h100"),
            "{args:?}"
        );
        assert!(args.contains(&"--max-bytes=1073741824"), "{args:?}");
        assert!(
            args.contains(&"--termination-log=/dev/termination-log"),
            "{args:?}"
        );
        assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(
            container["env"][0]["valueFrom"]["secretKeyRef"]["name"],
            "signing"
        );
        assert_eq!(container["env"][1]["value"], REGISTRY_MOUNT);
    }

    #[test]
    fn a_delta_job_captures_the_upper_on_the_base_its_record_names() {
        let args = |harvest| {
            let job = job_harvesting(&capture(), "capture-warm-1", &pod(), harvest, &options())
                .expect("a job");
            job["spec"]["template"]["spec"]["containers"][0]["args"]
                .as_array()
                .expect("args")
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let delta = args(Harvest::Delta);
        assert_eq!(delta[1], "/capture/upper", "{delta:?}");
        assert_eq!(delta[8], delta_base_record_arg(), "{delta:?}");
        let full = args(Harvest::Tree);
        assert_eq!(full[1], TREE_MOUNT, "{full:?}");
        assert!(!full.iter().any(|a| a.starts_with("--delta")), "{full:?}");
    }

    #[test]
    fn a_size_limit_that_does_not_parse_makes_no_job() {
        let mut c = capture();
        c.spec.max_bytes = Some("ten".into());
        assert!(job(&c, "capture-warm-1", &pod(), &options()).is_none());
    }
}
