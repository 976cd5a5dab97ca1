//! Reading a `NodePublishVolume` request, once, into the volume it asks
//! for ([`Volume`]), with an `INVALID_ARGUMENT` status naming what is wrong.
//!
//! The driver mounts four trees, and each is one value of [`Volume`]:
//!
//! | volume attributes | `readOnly` | volume |
//! |---|---|---|
//! | a cache | yes | [`Volume::Cache`], [`View::ReadOnly`]: the read-only view |
//! | a cache | no | [`Volume::Cache`], [`View::Writable`]: a copy-on-write view over a private upper |
//! | a cache and a capture | no | [`Volume::Cache`], [`View::Writable`] with [`CacheVolume::capture`]: a copy-on-write view keeping its upper as the capture's delta |
//! | a capture only | no / yes | [`Volume::Capture`]: the workload's own capture tree, or ([`TreeOf::Captured`]) a workload's tree read-only for the capture Job |

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tonic::Status;

use crate::capture::tree::{
    CAPTURE_MAX_BYTES, CAPTURE_MIN_BYTES, capture_dir, check_uid, view_name,
};
use crate::views::upper::{WRITABLE_MAX_BYTES, WRITABLE_MAX_BYTES_LIMIT, is_upper_name};
use gkm_core::CacheKey;
use gkm_k8s_kubelet::proto::csi::NodePublishVolumeRequest;
use gkm_k8s_kubelet::proto::csi::volume_capability::AccessType;
use gkm_k8s_node::captures::{CaptureName, is_pod_uid};
use gkm_k8s_node::mount_records::PodRef;
use gkm_k8s_node::names::check_key;
use gkm_k8s_node::names::is_dns1123_subdomain;
use gkm_k8s_node::relocation::{MOUNT_PATH_MAX_BYTES, is_mount_path};
use gkm_k8s_node::volume::{
    ATTR_CACHE, ATTR_CAPTURE, ATTR_CAPTURE_MAX_BYTES, ATTR_CAPTURED_POD, ATTR_CLUSTER_CACHE,
    ATTR_MOUNT_PATH, ATTR_NAMESPACE, ATTR_WRITABLE_MAX_BYTES, CTX_EPHEMERAL, CTX_POD_NAME,
    CTX_POD_NAMESPACE, CTX_POD_UID, DRIVER_NAME,
};

/// The volume a `NodePublishVolume` request asks for, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Volume {
    /// A view of a cache the agent delivered: read-only, or copy-on-write
    /// (whose upper a capture may keep, for a delta capture).
    Cache(CacheVolume),
    /// A capture volume, naming a capture and no cache: a workload's own
    /// capture tree, or a workload's tree read-only for the capture Job.
    Capture(CaptureVolume),
}

impl Volume {
    /// The kubelet's volume id.
    pub fn volume_id(&self) -> &str {
        match self {
            Volume::Cache(cache) => &cache.volume_id,
            Volume::Capture(capture) => &capture.volume.volume_id,
        }
    }
}

/// A checked request for a view of a cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheVolume {
    /// The kubelet's volume id.
    pub volume_id: String,
    /// Where to mount.
    pub target_path: PathBuf,
    /// The cache asked for.
    pub cache: CacheKey,
    /// The pod asking.
    pub pod: PodRef,
    /// The view the pod gets.
    pub view: View,
    /// The path the pod mounts the volume at, when the volume says
    /// ([`ATTR_MOUNT_PATH`]): the view then shows a tree built elsewhere
    /// relocated there.
    pub mount_path: Option<String>,
    /// The `GKMCacheCapture` of the pod's namespace that keeps this
    /// writable view's upper for a delta capture, when the volume names one
    /// ([`ATTR_CAPTURE`]): the upper is then the pod's capture tree of it
    /// (only with a [`View::Writable`], and a pod uid).
    pub capture: Option<String>,
}

/// A checked capture volume request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureVolume {
    /// The volume, its target and the pod.
    pub volume: PodVolume,
    /// The `GKMCacheCapture`, in the pod's namespace.
    pub capture: String,
    /// Whose tree: the pod's own (a workload), or the named pod's, read-only
    /// (a capture Job).
    pub tree_of: TreeOf,
    /// The bound of a workload's tree, in bytes, at least
    /// [`CAPTURE_MIN_BYTES`]: [`CAPTURE_MAX_BYTES`], or
    /// less when the volume asks for less.
    pub max_bytes: u64,
}

/// Whose tree a capture volume shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeOf {
    /// The requesting workload pod's own, writable.
    Own {
        /// The pod's uid.
        uid: String,
    },
    /// A workload pod's tree, read-only, for the capture Job.
    Captured {
        /// The workload pod's uid.
        uid: String,
    },
}

/// The view of the cache a publish mounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// The request asked for a read-only volume (the pod's `readOnly:
    /// true`): the read-only view, no upper layer.
    ReadOnly,
    /// Copy-on-write: the store's tree under a private, bounded upper layer
    /// (`csi/uppers/<volume id>`).
    Writable {
        /// The pod's fsGroup (`volume_mount_group`), which may write
        /// anywhere in the view; without one only root may.
        group: Option<u32>,
        /// The upper layer's bound, in bytes.
        max_bytes: u64,
    },
}

impl CaptureVolume {
    /// The tree this request shows, below the store root `root`.
    pub fn tree(&self, root: &Path) -> PathBuf {
        capture_dir(root, &self.volume.pod.namespace, &self.capture).join(self.uid())
    }

    /// The uid of the workload pod whose tree this volume shows.
    pub fn uid(&self) -> &str {
        match &self.tree_of {
            TreeOf::Own { uid } | TreeOf::Captured { uid } => uid,
        }
    }

    /// The `GKMCacheCapture` this volume names, in the pod's namespace.
    pub fn capture_name(&self) -> CaptureName {
        CaptureName::new(self.volume.pod.namespace.clone(), self.capture.clone())
    }

    /// The name (mount source) of the read-only view of the tree this
    /// volume shows, or of a writable cache view keeping its upper there.
    pub fn view_name(&self) -> String {
        view_name(&self.volume.pod.namespace, &self.capture, self.uid())
    }
}

/// A required, non-empty string field.
pub fn required<'a>(value: &'a str, field: &str) -> Result<&'a str, Status> {
    if value.is_empty() {
        Err(Status::invalid_argument(format!("{field} is required")))
    } else {
        Ok(value)
    }
}

/// A required absolute path field.
pub fn absolute_path(value: &str, field: &str) -> Result<PathBuf, Status> {
    let path = PathBuf::from(required(value, field)?);
    if !path.is_absolute() {
        return Err(Status::invalid_argument(format!(
            "{field} {value:?} is not an absolute path"
        )));
    }
    Ok(path)
}

/// What every publish request carries: the volume, its target, and the
/// pod the kubelet vouches for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodVolume {
    /// The kubelet's volume id.
    pub volume_id: String,
    /// Where to mount.
    pub target_path: PathBuf,
    /// The pod asking.
    pub pod: PodRef,
}

/// Checks the parts of `req` every volume of this driver needs: a volume
/// id, an absolute target, filesystem access, an inline ephemeral volume
/// and the pod's identity.
pub fn parse_pod_volume(req: &NodePublishVolumeRequest) -> Result<PodVolume, Status> {
    let volume_id = required(&req.volume_id, "volume_id")?.to_string();
    let target_path = absolute_path(&req.target_path, "target_path")?;
    let capability = req
        .volume_capability
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
    match capability.access_type {
        Some(AccessType::Mount(_)) => {}
        Some(AccessType::Block(_)) => {
            return Err(Status::invalid_argument(
                "block access is not supported: a gkm cache is a directory (use a filesystem volume)",
            ));
        }
        None => {
            return Err(Status::invalid_argument(
                "volume_capability has no access type (mount or block)",
            ));
        }
    }
    let ctx = &req.volume_context;
    if get(ctx, CTX_EPHEMERAL) != Some("true") {
        return Err(Status::invalid_argument(format!(
            "{} serves only inline ephemeral volumes: the volume context lacks {CTX_EPHEMERAL}=\"true\" \
             (declare the volume under the pod's volumes[].csi, and podInfoOnMount: true in the CSIDriver)",
            DRIVER_NAME
        )));
    }
    let pod_namespace =
        get(ctx, CTX_POD_NAMESPACE).ok_or_else(|| missing_pod_info(CTX_POD_NAMESPACE))?;
    let pod_name = get(ctx, CTX_POD_NAME).ok_or_else(|| missing_pod_info(CTX_POD_NAME))?;
    let pod = PodRef {
        namespace: pod_namespace.to_string(),
        name: pod_name.to_string(),
        uid: get(ctx, CTX_POD_UID).map(str::to_string),
    };
    Ok(PodVolume {
        volume_id,
        target_path,
        pod,
    })
}

/// Checks `req` and reads it into the volume it asks for: a capture volume
/// when its attributes name a capture and no cache, a cache volume
/// otherwise.
///
/// ```
/// use gkm_k8s_kubelet::proto::csi::{NodePublishVolumeRequest, VolumeCapability, volume_capability};
/// use gkm_k8s_csi::{Volume, parse_volume};
///
/// let req = NodePublishVolumeRequest {
///     volume_id: "csi-1".into(),
///     target_path: "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/kernels/mount".into(),
///     volume_capability: Some(VolumeCapability {
///         access_type: Some(volume_capability::AccessType::Mount(Default::default())),
///         access_mode: None,
///     }),
///     volume_context: [
///         ("csi.storage.k8s.io/ephemeral", "true"),
///         ("csi.storage.k8s.io/pod.namespace", "ml"),
///         ("csi.storage.k8s.io/pod.name", "infer-0"),
///         ("csi.gkm.io/GKMCache", "vector-add"),
///     ]
///     .into_iter()
///     .map(|(k, v)| (k.to_string(), v.to_string()))
///     .collect(),
///     ..Default::default()
/// };
/// let Volume::Cache(parsed) = parse_volume(&req).unwrap() else {
///     panic!("a cache volume");
/// };
/// assert_eq!(parsed.cache.namespace(), Some("ml")); // the pod's namespace
/// assert_eq!(parsed.cache.name(), "vector-add");
/// ```
pub fn parse(req: &NodePublishVolumeRequest) -> Result<Volume, Status> {
    let ctx = &req.volume_context;
    let names_cache = ctx.contains_key(ATTR_CACHE) || ctx.contains_key(ATTR_CLUSTER_CACHE);
    if ctx.contains_key(ATTR_CAPTURE) && !names_cache {
        parse_capture(req).map(Volume::Capture)
    } else {
        parse_cache(req).map(Volume::Cache)
    }
}

/// Checks a request for a view of a cache.
fn parse_cache(req: &NodePublishVolumeRequest) -> Result<CacheVolume, Status> {
    let PodVolume {
        volume_id,
        target_path,
        pod,
    } = parse_pod_volume(req)?;
    let pod_namespace = pod.namespace.as_str();
    let ctx = &req.volume_context;
    let cache = match (get(ctx, ATTR_CACHE), get(ctx, ATTR_CLUSTER_CACHE)) {
        (Some(_), Some(_)) => {
            return Err(Status::invalid_argument(format!(
                "volume attributes name both {ATTR_CACHE} and {ATTR_CLUSTER_CACHE}; give one"
            )));
        }
        (None, None) => {
            return Err(Status::invalid_argument(format!(
                "volume attributes name no cache: set {ATTR_CACHE} (with {ATTR_NAMESPACE}, default the pod's \
                 namespace) or {ATTR_CLUSTER_CACHE}"
            )));
        }
        (Some(name), None) => {
            CacheKey::namespaced(get(ctx, ATTR_NAMESPACE).unwrap_or(pod_namespace), name)
        }
        (None, Some(name)) => {
            if let Some(ns) = get(ctx, ATTR_NAMESPACE) {
                return Err(Status::invalid_argument(format!(
                    "{ATTR_NAMESPACE} ({ns:?}) applies to {ATTR_CACHE}, not to a {ATTR_CLUSTER_CACHE}"
                )));
            }
            CacheKey::cluster(name)
        }
    };
    check_key(&cache).map_err(|e| Status::invalid_argument(format!("volume attributes: {e}")))?;
    let view = parse_view(req)?;
    if matches!(view, View::Writable { .. }) && !is_upper_name(&volume_id) {
        return Err(Status::invalid_argument(format!(
            "volume_id {volume_id:?} cannot name the writable volume's upper directory \
             (letters, digits, '-', '_', '.'; at most 128)"
        )));
    }
    let mount_path = req.volume_context.get(ATTR_MOUNT_PATH).cloned();
    if let Some(path) = mount_path
        .as_deref()
        .filter(|p| p.len() > MOUNT_PATH_MAX_BYTES)
    {
        return Err(Status::invalid_argument(format!(
            "volume attribute {ATTR_MOUNT_PATH} is {} bytes long, over the {MOUNT_PATH_MAX_BYTES} \
             bytes a mount path may be",
            path.len()
        )));
    }
    if let Some(path) = mount_path.as_deref().filter(|p| !is_mount_path(p)) {
        return Err(Status::invalid_argument(format!(
            "volume attribute {ATTR_MOUNT_PATH} {path:?} must be an absolute path without \
             `.`, `..`, empty components or a trailing `/`"
        )));
    }
    let capture = parse_delta_capture(req, &pod, view)?;
    Ok(CacheVolume {
        volume_id,
        target_path,
        cache,
        pod,
        view,
        mount_path,
        capture,
    })
}

/// The capture a cache volume names to keep its upper for (a delta
/// capture): only a writable view has an upper to keep, only the pod's own
/// (its uid names the tree), and a cache volume never reads another pod's
/// tree back.
fn parse_delta_capture(
    req: &NodePublishVolumeRequest,
    pod: &PodRef,
    view: View,
) -> Result<Option<String>, Status> {
    let Some(capture) = req.volume_context.get(ATTR_CAPTURE) else {
        return Ok(None);
    };
    if !is_dns1123_subdomain(capture) {
        return Err(Status::invalid_argument(format!(
            "{ATTR_CAPTURE} {capture:?} is not the name of a GKMCacheCapture"
        )));
    }
    if req.volume_context.contains_key(ATTR_CAPTURED_POD) {
        return Err(Status::invalid_argument(format!(
            "a cache volume naming {ATTR_CAPTURE} keeps its own pod's writes: \
             {ATTR_CAPTURED_POD} applies only to a capture Job's volume, which names no cache"
        )));
    }
    if view == View::ReadOnly {
        return Err(Status::invalid_argument(format!(
            "a read-only cache volume has nothing to capture: {ATTR_CAPTURE} {capture:?} \
             needs a writable view (drop readOnly)"
        )));
    }
    match pod.uid.as_deref() {
        Some(uid) if is_pod_uid(uid) => Ok(Some(capture.clone())),
        Some(uid) => Err(Status::invalid_argument(format!(
            "the pod uid {uid:?} is not a pod uid"
        ))),
        None => Err(Status::invalid_argument(
            "a cache volume naming a capture needs the pod's uid (podInfoOnMount: true)",
        )),
    }
}

/// The view `req` asks for: read-only when the request says `readonly`,
/// else writable, for the request's `volume_mount_group` (the pod's
/// fsGroup, a number), bounded to [`WRITABLE_MAX_BYTES`] or the less the
/// volume's [`ATTR_WRITABLE_MAX_BYTES`] asks for.
fn parse_view(req: &NodePublishVolumeRequest) -> Result<View, Status> {
    if req.readonly {
        return Ok(View::ReadOnly);
    }
    let group = match req
        .volume_capability
        .as_ref()
        .and_then(|c| c.access_type.as_ref())
    {
        Some(AccessType::Mount(mount)) if !mount.volume_mount_group.is_empty() => {
            let text = &mount.volume_mount_group;
            Some(text.parse::<u32>().map_err(|_| {
                Status::invalid_argument(format!(
                    "volume_mount_group {text:?} is not a group id (the pod's fsGroup)"
                ))
            })?)
        }
        _ => None,
    };
    let max_bytes = max_bytes(
        get(&req.volume_context, ATTR_WRITABLE_MAX_BYTES),
        ATTR_WRITABLE_MAX_BYTES,
        WRITABLE_MAX_BYTES,
        WRITABLE_MAX_BYTES_LIMIT,
    )?;
    Ok(View::Writable { group, max_bytes })
}

/// The bound a volume attribute `attr` whose value is `text` asks for, in
/// bytes: `default` when it asks for none, at most `limit`. A value that is
/// not a number of bytes (digits, more than 0) is refused.
fn max_bytes(text: Option<&str>, attr: &str, default: u64, limit: u64) -> Result<u64, Status> {
    let Some(text) = text else {
        return Ok(default);
    };
    let bytes = text.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
        Status::invalid_argument(format!("{attr} {text:?} is not a number of bytes"))
    })?;
    Ok(bytes.min(limit))
}

/// Checks a capture volume request.
fn parse_capture(req: &NodePublishVolumeRequest) -> Result<CaptureVolume, Status> {
    let volume = parse_pod_volume(req)?;
    let ctx = &req.volume_context;
    let capture = ctx.get(ATTR_CAPTURE).cloned().unwrap_or_default();
    if !is_dns1123_subdomain(&capture) {
        return Err(Status::invalid_argument(format!(
            "{ATTR_CAPTURE} {capture:?} is not the name of a GKMCacheCapture"
        )));
    }
    let tree_of = match ctx.get(ATTR_CAPTURED_POD) {
        Some(uid) => {
            check_uid(uid, ATTR_CAPTURED_POD)?;
            if !req.readonly {
                return Err(Status::invalid_argument(format!(
                    "a captured tree ({ATTR_CAPTURED_POD}) is mounted read-only only: set readOnly: true"
                )));
            }
            TreeOf::Captured { uid: uid.clone() }
        }
        None => {
            let uid = volume.pod.uid.clone().ok_or_else(|| {
                Status::invalid_argument(
                    "a capture volume needs the pod's uid (podInfoOnMount: true)",
                )
            })?;
            check_uid(&uid, "the pod uid")?;
            if req.readonly {
                return Err(Status::invalid_argument(
                    "a workload's capture volume is writable: the workload compiles into it (drop readOnly)",
                ));
            }
            TreeOf::Own { uid }
        }
    };
    let max_bytes = max_bytes(
        ctx.get(ATTR_CAPTURE_MAX_BYTES).map(String::as_str),
        ATTR_CAPTURE_MAX_BYTES,
        CAPTURE_MAX_BYTES,
        CAPTURE_MAX_BYTES,
    )?;
    if max_bytes < CAPTURE_MIN_BYTES {
        return Err(Status::invalid_argument(format!(
            "{ATTR_CAPTURE_MAX_BYTES} {max_bytes} is below the least a capture tree may be bounded to, \
             {CAPTURE_MIN_BYTES} bytes (1Mi): ask for at least that"
        )));
    }
    Ok(CaptureVolume {
        volume,
        capture,
        tree_of,
        max_bytes,
    })
}

/// A non-empty value of `key`.
fn get<'a>(ctx: &'a HashMap<String, String>, key: &str) -> Option<&'a str> {
    ctx.get(key).map(String::as_str).filter(|v| !v.is_empty())
}

fn missing_pod_info(key: &str) -> Status {
    Status::invalid_argument(format!(
        "the volume context lacks {key}: set podInfoOnMount: true in the {DRIVER_NAME} CSIDriver"
    ))
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;
    use gkm_k8s_kubelet::proto::csi::VolumeCapability;
    use gkm_k8s_kubelet::proto::csi::volume_capability::{BlockVolume, MountVolume};

    /// A request for a filesystem volume with the volume context `ctx`.
    pub(super) fn request(ctx: &[(&str, &str)]) -> NodePublishVolumeRequest {
        NodePublishVolumeRequest {
            volume_id: "csi-1".into(),
            target_path: "/pods/p/mount".into(),
            volume_capability: Some(VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume::default())),
                access_mode: None,
            }),
            volume_context: ctx
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    const POD: [(&str, &str); 4] = [
        (CTX_EPHEMERAL, "true"),
        (CTX_POD_NAMESPACE, "ml"),
        (CTX_POD_NAME, "infer-0"),
        (CTX_POD_UID, "0c1d"),
    ];

    fn with(extra: &[(&'static str, &'static str)]) -> NodePublishVolumeRequest {
        let mut ctx = POD.to_vec();
        ctx.extend_from_slice(extra);
        request(&ctx)
    }

    fn refusal(req: &NodePublishVolumeRequest) -> String {
        let status = parse_cache(req).expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        status.message().to_string()
    }

    #[test]
    fn namespaced_cache_in_another_namespace() {
        let p = parse_cache(&with(&[
            (ATTR_CACHE, "vector-add"),
            (ATTR_NAMESPACE, "shared"),
        ]))
        .expect("ok");
        assert_eq!(p.cache, CacheKey::namespaced("shared", "vector-add"));
        assert_eq!(
            p.pod,
            PodRef {
                namespace: "ml".into(),
                name: "infer-0".into(),
                uid: Some("0c1d".into())
            }
        );
    }

    #[test]
    fn cluster_cache() {
        let p = parse_cache(&with(&[(ATTR_CLUSTER_CACHE, "vector-add")])).expect("ok");
        assert_eq!(p.cache, CacheKey::cluster("vector-add"));
    }

    #[test]
    fn a_volume_not_asked_read_only_is_writable_for_the_pods_fs_group() {
        let cache = [(ATTR_CACHE, "vector-add")];
        let mut read_only = with(&cache);
        read_only.readonly = true;
        assert_eq!(parse_cache(&read_only).expect("ok").view, View::ReadOnly);
        assert_eq!(
            parse_cache(&with(&cache)).expect("ok").view,
            View::Writable {
                group: None,
                max_bytes: WRITABLE_MAX_BYTES
            }
        );
        let mut grouped = with(&[
            (ATTR_CACHE, "vector-add"),
            (ATTR_WRITABLE_MAX_BYTES, "4096"),
        ]);
        grouped.volume_capability = Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume {
                volume_mount_group: "1000".into(),
                ..Default::default()
            })),
            access_mode: None,
        });
        assert_eq!(
            parse_cache(&grouped).expect("ok").view,
            View::Writable {
                group: Some(1000),
                max_bytes: 4096
            }
        );
        let huge = with(&[
            (ATTR_CACHE, "c"),
            (ATTR_WRITABLE_MAX_BYTES, "99999999999999"),
        ]);
        assert_eq!(
            parse_cache(&huge).expect("ok").view,
            View::Writable {
                group: None,
                max_bytes: WRITABLE_MAX_BYTES_LIMIT
            }
        );
        assert!(
            refusal(&with(&[
                (ATTR_CACHE, "c"),
                (ATTR_WRITABLE_MAX_BYTES, "1GiB")
            ]))
            .contains("not a number of bytes")
        );
        let mut bad_group = grouped.clone();
        if let Some(AccessType::Mount(m)) = bad_group
            .volume_capability
            .as_mut()
            .and_then(|c| c.access_type.as_mut())
        {
            m.volume_mount_group = "staff".into();
        }
        assert!(refusal(&bad_group).contains("not a group id"));
        let mut odd_id = with(&cache);
        odd_id.volume_id = "../x".into();
        assert!(refusal(&odd_id).contains("cannot name the writable volume's upper"));
        odd_id.readonly = true;
        assert!(
            parse_cache(&odd_id).is_ok(),
            "a read-only view has no upper"
        );
    }

    #[test]
    fn refusals_name_what_is_wrong() {
        let mut no_id = with(&[(ATTR_CACHE, "c")]);
        no_id.volume_id.clear();
        assert_eq!(refusal(&no_id), "volume_id is required");

        let mut relative = with(&[(ATTR_CACHE, "c")]);
        relative.target_path = "pods/p".into();
        assert!(refusal(&relative).contains("not an absolute path"));

        let mut no_cap = with(&[(ATTR_CACHE, "c")]);
        no_cap.volume_capability = None;
        assert_eq!(refusal(&no_cap), "volume_capability is required");

        let mut block = with(&[(ATTR_CACHE, "c")]);
        block.volume_capability = Some(VolumeCapability {
            access_type: Some(AccessType::Block(BlockVolume {})),
            access_mode: None,
        });
        assert!(refusal(&block).contains("block access is not supported"));

        assert!(refusal(&request(&[(ATTR_CACHE, "c")])).contains(CTX_EPHEMERAL));
        assert!(
            refusal(&request(&[(CTX_EPHEMERAL, "true"), (ATTR_CACHE, "c")]))
                .contains(CTX_POD_NAMESPACE)
        );
        assert!(refusal(&with(&[])).contains("name no cache"));
        assert!(refusal(&with(&[(ATTR_CACHE, "a"), (ATTR_CLUSTER_CACHE, "b")])).contains("both"));
        assert!(
            refusal(&with(&[(ATTR_CLUSTER_CACHE, "b"), (ATTR_NAMESPACE, "ml")]))
                .contains("applies to")
        );
        assert!(refusal(&with(&[(ATTR_CACHE, "../../etc")])).contains("not a valid object name"));
        assert!(
            refusal(&with(&[(ATTR_CACHE, "c"), (ATTR_NAMESPACE, "a/b")]))
                .contains("not a valid namespace")
        );
        for path in ["cache", "/a/../etc", "/a/", "/a//b"] {
            assert!(
                refusal(&with(&[(ATTR_CACHE, "c"), (ATTR_MOUNT_PATH, path)]))
                    .contains(ATTR_MOUNT_PATH),
                "{path}"
            );
        }
        let p = parse_cache(&with(&[
            (ATTR_CACHE, "c"),
            (ATTR_MOUNT_PATH, "/root/.triton"),
        ]))
        .expect("ok");
        assert_eq!(p.mount_path.as_deref(), Some("/root/.triton"));
    }
}

#[cfg(test)]
mod capture_tests {
    use super::*;
    use tonic::Code;

    fn request(extra: &[(&str, &str)], readonly: bool) -> NodePublishVolumeRequest {
        let mut ctx: Vec<(&str, &str)> = vec![
            (CTX_EPHEMERAL, "true"),
            (CTX_POD_NAMESPACE, "team"),
            (CTX_POD_NAME, "warm-0"),
            (CTX_POD_UID, "6f1c-22"),
        ];
        ctx.extend_from_slice(extra);
        NodePublishVolumeRequest {
            readonly,
            ..tests::request(&ctx)
        }
    }

    fn refused(req: &NodePublishVolumeRequest) -> String {
        let status = parse_capture(req).expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        status.message().to_string()
    }

    #[test]
    fn a_workload_gets_its_own_tree_in_its_own_namespace() {
        let req = parse_capture(&request(&[(ATTR_CAPTURE, "warm")], false)).expect("parsed");
        assert_eq!(
            req.tree(Path::new("/store")),
            Path::new("/store/captures/team/warm/6f1c-22")
        );
        assert_eq!(req.max_bytes, CAPTURE_MAX_BYTES);
        assert!(refused(&request(&[(ATTR_CAPTURE, "warm")], true)).contains("writable"));
        let lower = [(ATTR_CAPTURE, "warm"), (ATTR_CAPTURE_MAX_BYTES, "1048576")];
        assert_eq!(
            parse_capture(&request(&lower, false))
                .expect("parsed")
                .max_bytes,
            1 << 20
        );
        let higher = [
            (ATTR_CAPTURE, "warm"),
            (ATTR_CAPTURE_MAX_BYTES, "99999999999999"),
        ];
        assert_eq!(
            parse_capture(&request(&higher, false))
                .expect("parsed")
                .max_bytes,
            CAPTURE_MAX_BYTES
        );
        let bad = [(ATTR_CAPTURE, "warm"), (ATTR_CAPTURE_MAX_BYTES, "1GiB")];
        assert!(refused(&request(&bad, false)).contains("not a number of bytes"));
    }

    #[test]
    fn a_capture_job_reads_a_named_pods_tree_of_its_own_namespace_read_only() {
        let job = request(
            &[(ATTR_CAPTURE, "warm"), (ATTR_CAPTURED_POD, "6f1c-22")],
            true,
        );
        let req = parse_capture(&job).expect("parsed");
        assert_eq!(
            req.tree_of,
            TreeOf::Captured {
                uid: "6f1c-22".into()
            }
        );
        assert_eq!(
            req.tree(Path::new("/store")),
            Path::new("/store/captures/team/warm/6f1c-22")
        );
        let writable = request(
            &[(ATTR_CAPTURE, "warm"), (ATTR_CAPTURED_POD, "6f1c-22")],
            false,
        );
        assert!(refused(&writable).contains("read-only"));
        for bad in ["../../etc", "a/b", ""] {
            let escape = request(&[(ATTR_CAPTURE, "warm"), (ATTR_CAPTURED_POD, bad)], true);
            assert!(refused(&escape).contains("not a pod uid"), "{bad}");
        }
        for bad in ["../x", "Warm", ""] {
            assert!(refused(&request(&[(ATTR_CAPTURE, bad)], false)).contains("GKMCacheCapture"));
        }
    }
}
