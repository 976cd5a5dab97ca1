//! The CSI driver over its socket, against a real node store holding the
//! fixture caches: a deliverable cache is bind-mounted read-only and recorded;
//! every other case is refused with a status that says why; unpublish undoes
//! it all. These tests mount for real, so they run as root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod csi_support;

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use csi_support::{clients, cluster_cache, extract_fixture, gkmcache, start_driver};
use gkm_core::compat::{NODE_CHECK, check_summary};
use gkm_core::{Backend, Gpu, Vendor};
use gkm_k8s_csi::mount_at;
use gkm_k8s_kubelet::proto::csi::node_client::NodeClient;
use gkm_k8s_kubelet::proto::csi::volume_capability::{
    AccessMode, AccessType, MountVolume, access_mode,
};
use gkm_k8s_kubelet::proto::csi::{
    GetPluginCapabilitiesRequest, GetPluginInfoRequest, NodeGetCapabilitiesRequest,
    NodeGetInfoRequest, NodePublishVolumeRequest, NodeUnpublishVolumeRequest, ProbeRequest,
    VolumeCapability,
};
use gkm_k8s_node::delivery::{Delivery, DeliveryIndex, Verdict};
use gkm_k8s_node::mount_records::{MountRecords, PodRef};
use tonic::Code;
use tonic::transport::Channel;

/// A tree of relative paths and file contents.
fn tree(root: &Path) -> HashMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut HashMap<PathBuf, Vec<u8>>) {
        for entry in fs::read_dir(dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).expect("prefix").to_path_buf();
                out.insert(rel, fs::read(&path).expect("read"));
            }
        }
    }
    let mut out = HashMap::new();
    walk(root, root, &mut out);
    out
}

fn t4() -> Gpu {
    Gpu {
        vendor: Vendor::Nvidia,
        product: "Tesla T4".into(),
        backend: Some(Backend::Cuda),
        arch: Some("sm_75".parse().expect("arch")),
        warp_size: Some(32),
        toolkit_version: Some("12.4".into()),
        ..Default::default()
    }
}

/// The uid of test pod `pod` (the kubelet's target path names it).
fn pod_uid(pod: &str) -> String {
    format!("9f6e1c2a-0000-4000-8000-{pod:0>12}")
}

/// The kernel binary of the Triton sm75 fixture, relative to the volume root.
const CUBIN: &str = "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.cubin";

/// A publish request as the kubelet sends it for an inline volume of pod
/// `pod` in namespace `ml` mounted `readOnly: true`, with `attrs` as the
/// volume attributes. (A volume not mounted read-only is writable
/// copy-on-write: `csi_writable.rs`.)
fn publish_request(
    volume_id: &str,
    target: &Path,
    pod: &str,
    attrs: &[(&str, &str)],
) -> NodePublishVolumeRequest {
    let uid = pod_uid(pod);
    let mut ctx: HashMap<String, String> = [
        ("csi.storage.k8s.io/ephemeral", "true"),
        ("csi.storage.k8s.io/pod.namespace", "ml"),
        ("csi.storage.k8s.io/pod.name", pod),
        ("csi.storage.k8s.io/pod.uid", uid.as_str()),
        ("csi.storage.k8s.io/serviceAccount.name", "default"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    ctx.extend(attrs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.display().to_string(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode {
                mode: access_mode::Mode::SingleNodeWriter as i32,
            }),
        }),
        volume_context: ctx,
        readonly: true,
        ..Default::default()
    }
}

/// Unmounts a test's target even when an assertion fails first.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = gkm_k8s_csi::unmount_all(&self.0);
    }
}

struct Setup {
    work: tempfile::TempDir,
    store: PathBuf,
    index: DeliveryIndex,
    mounts: MountRecords,
    node: NodeClient<Channel>,
    _driver: csi_support::RunningDriver,
}

impl Setup {
    async fn new(node_name: &str) -> Setup {
        let work = tempfile::tempdir().expect("tempdir");
        let store = work.path().join("store");
        let driver = start_driver(&work.path().join("csi.sock"), node_name, &store).await;
        let (node, _) = clients(&driver.socket).await;
        Setup {
            index: DeliveryIndex::new(&store),
            mounts: MountRecords::new(&store),
            store,
            node,
            _driver: driver,
            work,
        }
    }

    /// A driver on `node_name` whose agent made `ml/vector-add` (the Triton
    /// sm75 fixture) deliverable.
    async fn delivering_vector_add(node_name: &str) -> Setup {
        let s = Setup::new(node_name).await;
        let digest = extract_fixture(s.work.path(), &s.store, "triton-vector-add-cuda-sm75").await;
        s.index
            .publish(
                &gkmcache("ml", "vector-add"),
                &Delivery::deliverable(digest),
            )
            .expect("index");
        s
    }

    fn target(&self, pod: &str) -> PathBuf {
        self.work.path().join(format!(
            "kubelet/pods/{}/volumes/kubernetes.io~csi/kernels/mount",
            pod_uid(pod)
        ))
    }

    async fn publish(&mut self, req: NodePublishVolumeRequest) -> Result<(), tonic::Status> {
        self.node.node_publish_volume(req).await.map(|_| ())
    }

    async fn unpublish(&mut self, volume_id: &str, target: &Path) -> Result<(), tonic::Status> {
        let req = NodeUnpublishVolumeRequest {
            volume_id: volume_id.into(),
            target_path: target.display().to_string(),
        };
        self.node.node_unpublish_volume(req).await.map(|_| ())
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn identity_and_node_info() {
    let s = Setup::new("node-a").await;
    let (mut node, mut identity) = clients(&s._driver.socket).await;
    let info = identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.name, "csi.gkm.io");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    let caps = identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .expect("caps")
        .into_inner();
    assert!(
        caps.capabilities.is_empty(),
        "no controller service: {caps:?}"
    );
    let probe = identity
        .probe(ProbeRequest {})
        .await
        .expect("probe")
        .into_inner();
    assert_eq!(probe.ready, Some(true));
    let info = node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .expect("node info")
        .into_inner();
    assert_eq!(info.node_id, "node-a");
    let caps = node
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .expect("node caps")
        .into_inner();
    // Only VOLUME_MOUNT_GROUP: the kubelet passes the pod's fsGroup and
    // changes no ownership itself; no staging.
    use gkm_k8s_kubelet::proto::csi::node_service_capability::{Rpc, Type, rpc};
    let types: Vec<Option<Type>> = caps.capabilities.into_iter().map(|c| c.r#type).collect();
    assert_eq!(
        types,
        [Some(Type::Rpc(Rpc {
            r#type: rpc::Type::VolumeMountGroup as i32
        }))]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn publish_mounts_the_cache_read_only_and_unpublish_undoes_it() {
    let mut s = Setup::new("sm75-node").await;
    let digest = extract_fixture(s.work.path(), &s.store, "triton-vector-add-cuda-sm75").await;
    let key = gkmcache("ml", "vector-add");
    s.index
        .publish(&key, &Delivery::deliverable(digest.clone()))
        .expect("index");
    let target = s.target("infer-0");
    let _cleanup = Unmount(target.clone());
    let req = publish_request(
        "csi-0001",
        &target,
        "infer-0",
        &[("csi.gkm.io/GKMCache", "vector-add")],
    );

    s.publish(req.clone()).await.expect("publish");

    // The pod sees the cache tree at the volume root, byte for byte, as
    // GKM's pods do (the image's manifest stays outside)…
    let source = s.store.join("sha256").join(digest.hex());
    let seen = tree(&target);
    assert_eq!(seen, tree(&source.join("io.triton.cache")));
    assert!(seen.contains_key(Path::new(CUBIN)), "{:?}", seen.keys());
    assert!(!seen.keys().any(|k| k.starts_with("io.triton.manifest")));
    // …and cannot change it.
    let err = fs::write(target.join(CUBIN), b"{}").expect_err("read-only");
    assert_eq!(err.kind(), io::ErrorKind::ReadOnlyFilesystem, "{err}");
    let err = fs::create_dir(target.join("new")).expect_err("read-only");
    assert_eq!(err.kind(), io::ErrorKind::ReadOnlyFilesystem, "{err}");
    let mount = mount_at(&target).expect("mountinfo").expect("mounted");
    for opt in ["ro", "nosuid", "nodev"] {
        assert!(
            mount.options.split(',').any(|o| o == opt),
            "{opt} missing in {}",
            mount.options
        );
    }

    // The agent can see who uses the digest.
    let record = s
        .mounts
        .get("csi-0001")
        .expect("read record")
        .expect("recorded");
    assert_eq!(record.digest, digest);
    assert_eq!(record.cache, key);
    assert_eq!(record.target_path, target);
    assert_eq!(
        record.pod,
        PodRef {
            namespace: "ml".into(),
            name: "infer-0".into(),
            uid: Some(pod_uid("infer-0"))
        }
    );
    assert_eq!(s.mounts.pods_by_digest().expect("count")[&digest].len(), 1);

    // Publishing again is a no-op: still one mount.
    s.publish(req).await.expect("publish again");
    let content = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let at_target = content
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(target.to_str().expect("utf-8")))
        .count();
    assert_eq!(at_target, 1, "{content}");

    s.unpublish("csi-0001", &target).await.expect("unpublish");
    assert_eq!(mount_at(&target).expect("mountinfo"), None);
    assert!(!target.exists(), "the target directory is removed");
    assert_eq!(s.mounts.get("csi-0001").expect("read record"), None);
    assert!(
        source.join("io.triton.manifest/manifest.json").is_file(),
        "the store is untouched"
    );

    // Unpublishing what is already gone succeeds.
    s.unpublish("csi-0001", &target)
        .await
        .expect("unpublish again");
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_cache_is_published_to_pods_of_any_namespace() {
    let mut s = Setup::new("sm75-node").await;
    let digest = extract_fixture(s.work.path(), &s.store, "triton-vector-add-cuda-sm75").await;
    s.index
        .publish(
            &cluster_cache("vector-add"),
            &Delivery::deliverable(digest.clone()),
        )
        .expect("index");
    let target = s.target("infer-1");
    let _cleanup = Unmount(target.clone());
    let req = publish_request(
        "csi-0002",
        &target,
        "infer-1",
        &[("csi.gkm.io/ClusterGKMCache", "vector-add")],
    );
    s.publish(req).await.expect("publish");
    assert!(target.join(CUBIN).is_file());
    assert_eq!(
        s.mounts
            .get("csi-0002")
            .expect("record")
            .expect("recorded")
            .cache,
        cluster_cache("vector-add")
    );
    s.unpublish("csi-0002", &target).await.expect("unpublish");
    assert!(!target.exists());
}

/// The refusal of publishing `attrs`, after checking nothing was mounted or
/// recorded.
async fn refusal(s: &mut Setup, attrs: &[(&str, &str)]) -> tonic::Status {
    let target = s.target("refused");
    let _cleanup = Unmount(target.clone());
    let status = s
        .publish(publish_request("csi-refused", &target, "refused", attrs))
        .await
        .expect_err("refused");
    assert_eq!(mount_at(&target).expect("mountinfo"), None);
    assert_eq!(s.mounts.get("csi-refused").expect("record"), None);
    status
}

/// The CUDA sm75 cache on two nodes, decided as each node's agent decides:
/// mounted on the node with a Tesla T4, refused with the per-GPU reasons on
/// the node with an MI210.
#[tokio::test(flavor = "multi_thread")]
async fn cuda_cache_publishes_on_the_sm75_node_and_is_refused_on_the_gfx90a_node() {
    let fixture = "triton-vector-add-cuda-sm75";
    let summary = gkm_core::cache::scan(&gkm_testenv::fixture_cache(fixture))
        .expect("scan")
        .summary();
    let key = gkmcache("ml", "vector-add");
    let attrs = [("csi.gkm.io/GKMCache", "vector-add")];

    let mut sm75 = Setup::new("sm75-node").await;
    let digest = extract_fixture(sm75.work.path(), &sm75.store, fixture).await;
    let report = check_summary(&summary, &[t4()], &NODE_CHECK);
    sm75.index
        .publish(&key, &Delivery::from_report(digest.clone(), &report))
        .expect("index");
    let target = sm75.target("infer-0");
    let _cleanup = Unmount(target.clone());
    sm75.publish(publish_request("csi-sm75", &target, "infer-0", &attrs))
        .await
        .expect("published on sm75-node");
    assert!(target.join(CUBIN).is_file());
    sm75.unpublish("csi-sm75", &target)
        .await
        .expect("unpublish");

    let mut gfx90a = Setup::new("gfx90a-node").await;
    let mi210 = Gpu {
        vendor: Vendor::Amd,
        product: "AMD Instinct MI210".into(),
        backend: Some(Backend::Hip),
        arch: Some("gfx90a".parse().expect("arch")),
        warp_size: Some(64),
        ..Default::default()
    };
    let report = check_summary(&summary, &[mi210], &NODE_CHECK);
    // The agent does not extract an incompatible cache; it records why.
    gfx90a
        .index
        .publish(&key, &Delivery::from_report(digest.clone(), &report))
        .expect("index");
    let status = refusal(&mut gfx90a, &attrs).await;
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    let msg = status.message();
    println!("refusal on gfx90a-node: {msg}");
    let expected = format!(
        "GKMCache ml/vector-add digest {digest} is not compatible with any GPU on node gfx90a-node: GPU 0 AMD Instinct MI210"
    );
    assert!(msg.starts_with(&expected), "{msg}");
    assert!(
        msg.contains("cuda") && msg.contains("hip"),
        "names both backends: {msg}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unverified_unknown_unextracted_missing_and_unsealed_caches_are_refused() {
    let mut s = Setup::new("node-b").await;
    let digest = extract_fixture(s.work.path(), &s.store, "triton-vector-add-cuda-sm75").await;

    s.index
        .publish(
            &gkmcache("ml", "unsigned"),
            &Delivery::refused(
                digest.clone(),
                Verdict::NotVerified,
                "no signature matches the policy",
            ),
        )
        .expect("index");
    let status = refusal(&mut s, &[("csi.gkm.io/GKMCache", "unsigned")]).await;
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(
        status.message(),
        format!(
            "GKMCache ml/unsigned digest {digest} is not verified: no signature matches the policy"
        )
    );

    let status = refusal(&mut s, &[("csi.gkm.io/GKMCache", "nope")]).await;
    assert_eq!(status.code(), Code::NotFound);
    assert!(
        status
            .message()
            .starts_with("GKMCache ml/nope is not known on node node-b"),
        "{}",
        status.message()
    );

    // Another namespace's cache: refused by rule, known or not, so the
    // refusal tells nothing about what exists there.
    s.index
        .publish(
            &gkmcache("other", "known"),
            &Delivery::deliverable(digest.clone()),
        )
        .expect("index");
    let mut messages = Vec::new();
    for name in ["known", "nope"] {
        let status = refusal(
            &mut s,
            &[
                ("csi.gkm.io/GKMCache", name),
                ("csi.gkm.io/namespace", "other"),
            ],
        )
        .await;
        assert_eq!(status.code(), Code::PermissionDenied);
        messages.push(status.message().replace(name, "NAME"));
    }
    assert_eq!(messages[0], messages[1]);
    assert!(
        messages[0].contains("only by pods in its own namespace"),
        "{}",
        messages[0]
    );

    let other = gkm_oci::Digest::of(b"not extracted");
    s.index
        .publish(
            &gkmcache("ml", "pulling"),
            &Delivery::refused(other.clone(), Verdict::NotExtracted, "pulling"),
        )
        .expect("index");
    let status = refusal(&mut s, &[("csi.gkm.io/GKMCache", "pulling")]).await;
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.message(),
        format!("GKMCache ml/pulling digest {other} is not extracted on node node-b yet: pulling")
    );

    // Marked deliverable, but the store directory is gone.
    s.index
        .publish(
            &gkmcache("ml", "gone"),
            &Delivery::deliverable(other.clone()),
        )
        .expect("index");
    let status = refusal(&mut s, &[("csi.gkm.io/GKMCache", "gone")]).await;
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status.message().contains("store directory") && status.message().contains(other.hex()),
        "{}",
        status.message()
    );

    // Stored without a seal (by a gkm whose deliveries could write into
    // the store): not delivered until the agent has checked it.
    s.index
        .publish(
            &gkmcache("ml", "unsealed"),
            &Delivery::deliverable(digest.clone()),
        )
        .expect("index");
    let entry = s.store.join("sha256").join(digest.hex());
    fs::remove_file(entry.join(gkm_oci::seal::SEAL_FILE)).expect("unseal");
    let status = refusal(&mut s, &[("csi.gkm.io/GKMCache", "unsealed")]).await;
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status.message().contains("without a seal"),
        "{}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_requests_are_invalid_arguments() {
    let mut s = Setup::new("node-c").await;
    let status = refusal(&mut s, &[]).await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("csi.gkm.io/GKMCache"),
        "{}",
        status.message()
    );

    let status = refusal(&mut s, &[("csi.gkm.io/GKMCache", "../../../etc")]).await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("not a valid object name"),
        "{}",
        status.message()
    );

    let target = s.target("x");
    let mut no_ephemeral = publish_request("csi-x", &target, "x", &[("csi.gkm.io/GKMCache", "c")]);
    no_ephemeral
        .volume_context
        .remove("csi.storage.k8s.io/ephemeral");
    let status = s.publish(no_ephemeral).await.expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("inline ephemeral"),
        "{}",
        status.message()
    );

    let status = s.unpublish("", &target).await.expect_err("refused");
    assert_eq!(
        (status.code(), status.message()),
        (Code::InvalidArgument, "volume_id is required")
    );
    let status = s
        .unpublish("csi-x", Path::new(""))
        .await
        .expect_err("refused");
    assert_eq!(
        (status.code(), status.message()),
        (Code::InvalidArgument, "target_path is required")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_target_holding_another_mount_is_refused() {
    let mut s = Setup::delivering_vector_add("sm75-node").await;
    let target = s.target("busy");
    let _cleanup = Unmount(target.clone());
    let other = s.work.path().join("other");
    fs::create_dir_all(&other).expect("mkdir");
    fs::create_dir_all(&target).expect("mkdir");
    gkm_k8s_csi::bind(&other, &target).expect("bind");

    let status = s
        .publish(publish_request(
            "csi-busy",
            &target,
            "busy",
            &[("csi.gkm.io/GKMCache", "vector-add")],
        ))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains("already a mount point"),
        "{}",
        status.message()
    );
    assert_eq!(s.mounts.get("csi-busy").expect("record"), None);
}

/// Undoes a test's own mounts, the propagated ones with them, even when an
/// assertion fails first.
struct DetachAll(Vec<PathBuf>);

impl Drop for DetachAll {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = rustix::mount::unmount(path, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

/// The driver in its container and the kubelet on the host share the pods
/// directory through `Bidirectional` propagation: two views of one peer
/// group. The copy of a cache published read-only that reaches the
/// kubelet's view is read-only too, and stays so when the container runtime
/// binds it into a container and remounts that bind `rw`. A
/// driver that remounted a bind read-only after attaching it gave the
/// kubelet a writable copy of the node store, and a read-only bind alone is
/// made writable by the runtime's remount.
#[tokio::test(flavor = "multi_thread")]
async fn a_published_cache_is_read_only_in_every_view_it_propagates_to() {
    use rustix::mount::{MountPropagationFlags, mount_bind, mount_change};
    let mut s = Setup::delivering_vector_add("sm75-node").await;
    // `kubelet/` as the driver's view, made a shared mount, and `host/` its
    // peer, as the host's view of a Bidirectional volume is.
    let driver_view = s.work.path().join("kubelet");
    let host_view = s.work.path().join("host");
    fs::create_dir_all(&driver_view).expect("mkdir");
    fs::create_dir_all(&host_view).expect("mkdir");
    let _cleanup = DetachAll(vec![host_view.clone(), driver_view.clone()]);
    mount_bind(&driver_view, &driver_view).expect("bind the driver's view");
    mount_change(&driver_view, MountPropagationFlags::SHARED).expect("make it shared");
    mount_bind(&driver_view, &host_view).expect("bind its peer");

    let target = s.target("writer-0");
    s.publish(publish_request(
        "csi-peer",
        &target,
        "writer-0",
        &[("csi.gkm.io/GKMCache", "vector-add")],
    ))
    .await
    .expect("publish");

    let seen_by_host = host_view.join(target.strip_prefix(&driver_view).expect("below"));
    let mount = mount_at(&seen_by_host)
        .expect("mountinfo")
        .expect("the mount reached the host's view");
    assert!(
        mount.options.split(',').any(|o| o == "ro"),
        "the host's copy is mounted {}",
        mount.options
    );
    let err = fs::create_dir(seen_by_host.join("NEWKEYAAAA")).expect_err("read-only");
    assert_eq!(err.kind(), io::ErrorKind::ReadOnlyFilesystem, "{err}");
    let err = fs::write(seen_by_host.join(CUBIN), b"planted").expect_err("read-only");
    assert_eq!(err.kind(), io::ErrorKind::ReadOnlyFilesystem, "{err}");
    // A container runtime asked for a writable volume binds the host's copy
    // into the container and remounts that bind `rw`: still nothing can be
    // written, the view's filesystem itself is read-only.
    let container = s.work.path().join("container-rootfs-volume");
    fs::create_dir_all(&container).expect("mkdir");
    let _container = DetachAll(vec![container.clone()]);
    mount_bind(&seen_by_host, &container).expect("the runtime's bind");
    rustix::mount::mount_remount(&container, rustix::mount::MountFlags::BIND, c"")
        .expect("the runtime's rw remount");
    let mount = mount_at(&container).expect("mountinfo").expect("bound");
    assert!(
        !mount.is_read_only(),
        "the runtime's bind is rw: {}",
        mount.options
    );
    let err = fs::create_dir(container.join("NEWKEYAAAA")).expect_err("read-only");
    assert_eq!(err.kind(), io::ErrorKind::ReadOnlyFilesystem, "{err}");
    let err = fs::write(container.join(CUBIN), b"planted").expect_err("read-only");
    assert_eq!(err.kind(), io::ErrorKind::ReadOnlyFilesystem, "{err}");
    drop(_container);

    s.unpublish("csi-peer", &target).await.expect("unpublish");
    assert_eq!(
        mount_at(&seen_by_host).expect("mountinfo"),
        None,
        "the unmount propagated too"
    );
}
