//! `GKMCacheCapture` (namespaced): a workload's warmed kernel cache, captured
//! from a gkm capture volume into a signed image in the repository the
//! capture names. Shaped after KServe's `KernelCacheCapture` (v1alpha1):
//! a target image, a signing profile, phases `Pending` → `Capturing` →
//! `Pushing` → `Complete` / `Failed`, a digest-pinned result.
//!
//! Where KServe's capture names a `cachePath` inside the workload, a gkm
//! capture names nothing in the workload: the workload mounts a `csi.gkm.io`
//! volume with the `csi.gkm.io/GKMCacheCapture` attribute at its cache
//! directory, so what is captured is exactly that volume, never another
//! path of the pod or the node.
//!
//! What keeps a capture inside its namespace is in the schema: the Secrets
//! it names have no namespace field (they are mounted into a Job in the
//! capture's own namespace, which can mount no other), and the target is a
//! repository with at most a tag, fixed once the capture exists.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::validation::{DNS1123_SUBDOMAIN, IMAGE_REFERENCE};

/// The default of [`GKMCacheCaptureSpec::max_bytes`]: the most a captured
/// tree's files may add up to.
pub const DEFAULT_CAPTURE_MAX_BYTES: &str = "10GiB";
/// The default of [`GKMCacheCaptureSpec::max_files`].
pub const DEFAULT_CAPTURE_MAX_FILES: i64 = 100_000;

/// A byte size as `gkm_oci::disk::parse_bytes` reads it: `1073741824`,
/// `512MiB`, `10GiB`.
pub const BYTE_SIZE: &str = r"^[0-9]+ ?(KiB|MiB|GiB|TiB)?$";

/// Capture the cache a workload compiles into its capture volume.
#[derive(CustomResource, Debug, Clone, PartialEq, Default, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "gkm.io",
    version = "v1alpha1",
    kind = "GKMCacheCapture",
    plural = "gkmcachecaptures",
    namespaced,
    status = "CaptureStatus",
    shortname = "gkmcap",
    category = "gkm",
    // The CSI node plugin watches only the captures of its own node
    // (`--field-selector status.node=<node>`).
    selectable = ".status.node",
    doc = "Captures the kernel cache a workload compiled into its csi.gkm.io capture volume into a signed cache image.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.reason"),
    printcolumn(
        name = "Digest",
        type_ = "string",
        json_path = ".status.digest",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.targetImage == oldSelf.targetImage")
    .message("targetImage cannot change: a capture pushes only where it was created to"))]
pub struct GKMCacheCaptureSpec {
    /// The repository and tag to push to (`registry/path[:tag]`); the
    /// capture pushes by digest, signs, verifies, and moves the tag last.
    #[schemars(length(min = 1, max = 450), regex(pattern = IMAGE_REFERENCE))]
    #[x_kube(validation = Rule::new("!self.contains('@')")
        .message("targetImage names a repository and tag, not a digest: the digest is what the capture produces"))]
    pub target_image: String,
    /// What the workload compiles with; the captured tree must be a cache of
    /// this kind. Any kind gkm reads when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework: Option<CaptureFramework>,
    /// How the image is signed.
    pub signing: CaptureSigning,
    /// A `kubernetes.io/dockerconfigjson` Secret of this namespace with the
    /// credentials to push to the target; none when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS1123_SUBDOMAIN))]
    pub registry_credentials_secret: Option<String>,
    /// Speak plain HTTP to the registry.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure_registry: bool,
    /// The most the captured files may add up to (default 10GiB); the
    /// capture volume is bounded to it and a larger tree is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 24), regex(pattern = BYTE_SIZE))]
    pub max_bytes: Option<String>,
    /// The most files and directories the tree may hold (default 100000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_files: Option<i64>,
    /// A `GKMCache` of this namespace to create, or point at the captured
    /// digest, once the capture is complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS1123_SUBDOMAIN))]
    pub cache_name: Option<String>,
}

/// The frameworks a capture reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CaptureFramework {
    /// A Triton cache (`TRITON_CACHE_DIR`).
    Triton,
    /// A vLLM cache (`VLLM_CACHE_ROOT` or its `torch_compile_cache`).
    Vllm,
}

/// The signing profile: a key in a Secret of the capture's namespace.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaptureSigning {
    /// The Secret holding the private key (cosign's encrypted key or an
    /// unencrypted PKCS#8 PEM) and, for an encrypted key, its password.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS1123_SUBDOMAIN))]
    pub secret_name: String,
    /// The key of the private key in the Secret (default `cosign.key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub key: Option<String>,
    /// The key of the password in the Secret (default `cosign.password`;
    /// an absent key means an unencrypted private key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub password_key: Option<String>,
    /// The signature format: `v3` (a sigstore bundle, the default) or `v2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<CaptureSignatureFormat>,
}

/// A signature format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CaptureSignatureFormat {
    /// cosign v2's `sha256-<hex>.sig` tag.
    V2,
    /// A sigstore bundle as an OCI 1.1 referrer (cosign v3).
    V3,
}

/// Where a capture is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum CapturePhase {
    /// Waiting for a workload to mount the capture volume and end.
    #[default]
    Pending,
    /// The workload ended; its tree is being checked and packed.
    Capturing,
    /// The image is being pushed, signed and verified. Not written yet:
    /// the capture Job has no API token and reports only its outcome, so
    /// `Capturing` lasts until the capture is over.
    Pushing,
    /// The image is in the registry, signed and verified; `digest` names it.
    Complete,
    /// The capture failed; `reason` and `message` say why. Nothing was
    /// tagged.
    Failed,
}

impl CapturePhase {
    /// Whether the capture is over (`Complete` or `Failed`).
    pub fn is_final(self) -> bool {
        matches!(self, CapturePhase::Complete | CapturePhase::Failed)
    }
}

/// What the capture did.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaptureStatus {
    /// Where the capture is.
    #[serde(default)]
    pub phase: CapturePhase,
    /// Why it is there, one word (`UnsafeTree`, `NotACache`,
    /// `DeltaChangesBase`, `RegistryError`, `SecretNotFound`…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What happened, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The workload pod whose capture volume is captured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The node it ran on, where the captured tree is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The capture Job running now, or last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// The uid of that Job, as the API server answered the operator's
    /// create: the only Job whose outcome is read (a Job of the same name
    /// made by anyone else has another uid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_uid: Option<String>,
    /// Capture Jobs run so far (a registry outage is retried with backoff).
    #[serde(default)]
    pub attempts: i32,
    /// The image pushed, pinned to its digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The digest pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// For a delta capture (the workload's writable cache volume named the
    /// capture): the base image the delta was taken on, pinned to the
    /// digest the node delivered (`<repository>@sha256:…`); the image
    /// pushed is its layers plus one layer of what the workload compiled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// `Ready` (Complete) and `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
    /// When the phase last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition: Option<Time>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn the_schema_fixes_the_target_and_names_no_other_namespace() {
        let crd = serde_json::to_value(GKMCacheCapture::crd()).expect("CRD");
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let rules = schema["x-kubernetes-validations"].to_string();
        assert!(
            rules.contains("self.targetImage == oldSelf.targetImage"),
            "{rules}"
        );
        let target = &schema["properties"]["targetImage"];
        assert!(
            target["x-kubernetes-validations"]
                .to_string()
                .contains("'@'")
        );
        let signing = &schema["properties"]["signing"]["properties"];
        assert!(signing.get("namespace").is_none(), "{signing}");
        assert!(signing["secretName"].is_object(), "{signing}");
        assert_eq!(schema["properties"]["maxBytes"]["pattern"], BYTE_SIZE);
    }
}
