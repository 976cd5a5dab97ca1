//! The CSI volume a pod mounts a cache with: the driver's name, the volume
//! attributes a pod sets, and the pod information the kubelet adds. The
//! driver reads them, the scheduler extender reads the same from pod specs.

/// The driver's name.
pub const DRIVER_NAME: &str = "csi.gkm.io";
/// The volume attribute naming a `GKMCache`.
pub const ATTR_CACHE: &str = "csi.gkm.io/GKMCache";
/// The volume attribute naming the `GKMCache`'s namespace.
pub const ATTR_NAMESPACE: &str = "csi.gkm.io/namespace";
/// The volume attribute naming a `ClusterGKMCache`.
pub const ATTR_CLUSTER_CACHE: &str = "csi.gkm.io/ClusterGKMCache";
/// The volume attribute naming a `GKMCacheCapture` of the pod's namespace:
/// a writable, pod-private capture volume (a workload), or, with
/// [`ATTR_CAPTURED_POD`], that pod's captured tree read-only (the capture
/// Job).
pub const ATTR_CAPTURE: &str = "csi.gkm.io/GKMCacheCapture";
/// The volume attribute naming, by uid, the workload pod whose captured
/// tree a capture Job mounts.
pub const ATTR_CAPTURED_POD: &str = "csi.gkm.io/capturedPodUID";
/// The volume attribute lowering the bound of a workload's capture volume
/// (bytes; the driver's own bound is the most it may be).
pub const ATTR_CAPTURE_MAX_BYTES: &str = "csi.gkm.io/captureMaxBytes";
/// The volume attribute lowering the bound of a writable cache volume's
/// private upper layer (bytes; the driver's own bound is the most it may
/// be). A volume the pod mounts `readOnly` has no upper layer.
pub const ATTR_WRITABLE_MAX_BYTES: &str = "csi.gkm.io/writableMaxBytes";
/// The volume attribute naming the path the pod mounts a cache volume at
/// (its `volumeMount.mountPath`, which the CSI driver is not told): a
/// Triton tree built at another path is then shown with its group files
/// rewritten for this one ([`crate::relocation`]), so every kernel is a hit
/// there. Admission checks that every mount of the volume is at this path,
/// without `subPath`.
pub const ATTR_MOUNT_PATH: &str = "csi.gkm.io/mountPath";
/// The kubelet's marker of an inline ephemeral volume (`"true"`).
pub const CTX_EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
/// The pod's namespace, as the kubelet passes it.
pub const CTX_POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";
/// The pod's name, as the kubelet passes it.
pub const CTX_POD_NAME: &str = "csi.storage.k8s.io/pod.name";
/// The pod's uid, as the kubelet passes it.
pub const CTX_POD_UID: &str = "csi.storage.k8s.io/pod.uid";
