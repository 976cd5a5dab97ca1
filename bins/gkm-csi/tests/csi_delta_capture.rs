//! Writable cache volumes that also name a capture (a delta capture), over
//! the `gkm-csi` binary's socket (which cargo builds for this package's tests), with
//! real mounts and a real non-root writer (run as root): the pod gets the
//! usual copy-on-write view of the delivered cache, but its upper is a
//! capture tree, kept after the pod ends while its capture is pending,
//! beside the record of the base the view showed (never inside what the
//! pod wrote); the capture Job reads both back; the tree goes once the
//! capture is over. A read-only volume naming a capture is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../gkm-k8s/csi/tests/csi_support/mod.rs"]
mod csi_support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use csi_support::{clients, extract_fixture, gkmcache};
use gkm_k8s_csi::{
    DELTA_RECORD_FILE as RECORD_FILE, DELTA_UPPER_DIR as UPPER_DIR, DeltaBase, mount_at,
};
use gkm_k8s_kubelet::proto::csi::node_client::NodeClient;
use gkm_k8s_kubelet::proto::csi::volume_capability::{AccessType, MountVolume};
use gkm_k8s_kubelet::proto::csi::{
    NodePublishVolumeRequest, NodeUnpublishVolumeRequest, VolumeCapability,
};
use gkm_k8s_node::captures::{CaptureIndex, CaptureName, CaptureState, Captures};
use gkm_k8s_node::delivery::{Delivery, DeliveryIndex};
use gkm_k8s_node::mount_records::MountRecords;
use gkm_k8s_node::volume::{
    ATTR_CACHE, ATTR_CAPTURE, ATTR_CAPTURED_POD, CTX_EPHEMERAL, CTX_POD_NAME, CTX_POD_NAMESPACE,
    CTX_POD_UID,
};
use gkm_oci::Digest;
use gkm_testenv::{Process, mounts_under, until};
use tonic::Code;
use tonic::transport::Channel;

/// The cache's `spec.image`, as the agent records it.
const IMAGE: &str = "registry.example:5000/ml/vector-add:v1";
/// A key directory of the Triton sm75 fixture, in the store's tree.
const KEY: &str = "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ";
/// The workload pod's uid and its fsGroup.
const POD_UID: &str = "5a0e1c2a-0000-4000-8000-00000000warm";
const FS_GROUP: u32 = 1000;

/// A `gkm-csi` process for node `node-a`, with a store holding the Triton
/// sm75 fixture, deliverable as `ml/vector-add`.
struct Node {
    work: tempfile::TempDir,
    store: PathBuf,
    digest: Digest,
    _driver: Process,
    node: NodeClient<Channel>,
}

impl Node {
    async fn start(extra_flags: &[&str]) -> Node {
        let work = gkm_testenv::temp_dir().expect("tempdir");
        fs::set_permissions(work.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let store = work.path().join("store");
        let digest = extract_fixture(work.path(), &store, "triton-vector-add-cuda-sm75").await;
        DeliveryIndex::new(&store)
            .publish(&gkmcache("ml", "vector-add"), &{
                let mut d = Delivery::deliverable(digest.clone());
                d.image = Some(IMAGE.into());
                d
            })
            .expect("index");
        let binary = PathBuf::from(env!("CARGO_BIN_EXE_gkm-csi"));
        let socket = work.path().join("csi.sock");
        let mut cmd = Command::new(binary);
        cmd.args([
            format!("--endpoint=unix://{}", socket.display()),
            "--node-name=node-a".to_string(),
            format!("--store={}", store.display()),
            "--capture-orphan-grace=0s".to_string(),
        ]);
        cmd.args(extra_flags);
        let driver =
            Process::spawn("gkm-csi", cmd, &work.path().join("gkm-csi.log")).expect("gkm-csi");
        let (node, _) = clients(&socket).await;
        Node {
            work,
            store,
            digest,
            _driver: driver,
            node,
        }
    }

    /// The target of pod `uid`'s volume.
    fn target(&self, uid: &str) -> PathBuf {
        self.work.path().join(format!(
            "kubelet/pods/{uid}/volumes/kubernetes.io~csi/kernels/mount"
        ))
    }

    /// The capture tree of the workload pod for `ml/warm`.
    fn tree(&self) -> PathBuf {
        self.store.join("captures/ml/warm").join(POD_UID)
    }

    /// The capture index as the agent writes it: `ml/warm` in `state`.
    fn index_says(&self, state: CaptureState) {
        let mut index = Captures::new(jiff::Timestamp::now());
        index.states.insert(CaptureName::new("ml", "warm"), state);
        CaptureIndex::new(&self.store)
            .publish(&index)
            .expect("the agent writes the index");
    }

    /// The kubelet's publish for pod `pod` (uid `uid`) of the volume
    /// `attrs`, read-only as asked, with the workload's fsGroup.
    async fn publish(
        &mut self,
        (pod, uid): (&str, &str),
        read_only: bool,
        attrs: &[(&str, &str)],
    ) -> Result<PathBuf, tonic::Status> {
        let target = self.target(uid);
        let mut ctx: Vec<(&str, &str)> = vec![
            (CTX_EPHEMERAL, "true"),
            (CTX_POD_NAMESPACE, "ml"),
            (CTX_POD_NAME, pod),
            (CTX_POD_UID, uid),
        ];
        ctx.extend_from_slice(attrs);
        let req = NodePublishVolumeRequest {
            volume_id: format!("csi-{}", Digest::of(uid.as_bytes()).hex()),
            target_path: target.display().to_string(),
            readonly: read_only,
            volume_capability: Some(VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume {
                    volume_mount_group: FS_GROUP.to_string(),
                    ..Default::default()
                })),
                access_mode: None,
            }),
            volume_context: ctx
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        self.node.node_publish_volume(req).await?;
        Ok(target)
    }

    /// The kubelet's unpublish of pod `uid`'s volume.
    async fn unpublish(&mut self, uid: &str) {
        self.node
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: format!("csi-{}", Digest::of(uid.as_bytes()).hex()),
                target_path: self.target(uid).display().to_string(),
            })
            .await
            .expect("unpublish");
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for _ in 0..4 {
            for mount in mounts_under(self.work.path()).iter().rev() {
                let _ = rustix::mount::unmount(mount, rustix::mount::UnmountFlags::DETACH);
            }
        }
    }
}

/// Runs `script` with `sh` as a non-root pod user in the fsGroup, `$1`
/// being `target`.
fn as_pod_user(script: &str, target: &Path) {
    let out = Command::new("setpriv")
        .args([
            "--reuid=1000".to_string(),
            "--regid=3000".into(),
            format!("--groups={FS_GROUP}"),
            "--".into(),
            "/bin/sh".into(),
            "-c".into(),
            script.into(),
            "sh".into(),
        ])
        .arg(target)
        .output()
        .expect("setpriv");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_writable_view_named_by_a_capture_keeps_its_upper_after_the_pod_ends_and_releases_it_when_the_capture_is_done()
 {
    let mut node = Node::start(&[]).await;
    node.index_says(CaptureState::Open);
    let workload = ("warm-0", POD_UID);
    let delta = [(ATTR_CACHE, "vector-add"), (ATTR_CAPTURE, "warm")];

    // A read-only volume has nothing to capture.
    let refused = node
        .publish(
            ("reader", "5a0e1c2a-0000-4000-8000-000000reader"),
            true,
            &delta,
        )
        .await
        .expect_err("a read-only view naming a capture");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("nothing to capture"),
        "{refused:?}"
    );

    // The workload sees the delivered cache, and compiles one new kernel
    // into its view as a non-root user of its fsGroup.
    let target = node
        .publish(workload, false, &delta)
        .await
        .expect("the workload's writable view");
    assert!(target.join(KEY).is_dir(), "the delivered kernel is there");
    as_pod_user(
        "set -e; mkdir \"$1/NEWKEY\"; printf cubin > \"$1/NEWKEY/k.cubin\"",
        &target,
    );
    assert!(
        !target.join(RECORD_FILE).exists(),
        "the record is not in the pod's view"
    );
    let tree = node.tree();
    assert!(
        mount_at(&tree).expect("mountinfo").is_some(),
        "a capture tree"
    );
    let upper = tree.join(UPPER_DIR);
    let written = gkm_testenv::tree_files(&upper).expect("the upper");
    assert_eq!(
        written,
        [(PathBuf::from("NEWKEY/k.cubin"), b"cubin".to_vec())],
        "the upper holds only the new kernel"
    );
    let entry = node.store.join("sha256").join(node.digest.hex());
    assert!(
        !entry.join("io.triton.cache/NEWKEY").exists(),
        "the store is never written"
    );
    let record: DeltaBase =
        serde_json::from_slice(&fs::read(tree.join(RECORD_FILE)).expect("the record"))
            .expect("a DeltaBase");
    assert_eq!(
        record.image,
        format!("registry.example:5000/ml/vector-add@{}", node.digest),
        "the base is the digest the view showed, in the cache's repository"
    );
    assert_eq!(
        record.build_path,
        gkm_core::cache::tree_build_path(&entry.join("io.triton.cache")).expect("build path")
    );

    // The pod ends: its view goes, its upper stays for the pending capture.
    node.unpublish(workload.1).await;
    assert!(!target.exists(), "the target is removed");
    assert!(
        MountRecords::new(&node.store)
            .list()
            .expect("records")
            .is_empty(),
        "no mount record left"
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        mount_at(&tree).expect("mountinfo").is_some() && upper.join("NEWKEY/k.cubin").is_file(),
        "the upper outlives the pod while its capture is pending"
    );

    // The capture Job reads the upper and the record back, read-only.
    let job = ("capture-warm-1", "5a0e1c2a-0000-4000-8000-0000000000job");
    let job_target = node
        .publish(
            job,
            true,
            &[(ATTR_CAPTURE, "warm"), (ATTR_CAPTURED_POD, POD_UID)],
        )
        .await
        .expect("the capture Job's volume");
    assert_eq!(
        fs::read(job_target.join(UPPER_DIR).join("NEWKEY/k.cubin")).expect("the new kernel"),
        b"cubin"
    );
    assert!(job_target.join(RECORD_FILE).is_file(), "the record");
    assert!(fs::write(job_target.join("x"), b"x").is_err(), "read-only");
    node.unpublish(job.1).await;

    // The capture is done: the tree goes, and nothing is left on the node.
    node.index_says(CaptureState::Over);
    until("the delta tree released", Duration::from_secs(60), || {
        mount_at(&tree).expect("mountinfo").is_none() && !tree.exists()
    })
    .await
    .expect("the upper goes once its capture is over");
    let captures = node.store.join("captures");
    assert!(
        mounts_under(&captures).iter().all(|m| *m == captures),
        "no mount left under {}",
        captures.display()
    );
}

/// The value of the sample `name` with `labels` in the exposition `text`.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    gkm_testenv::samples(text)
        .expect("samples")
        .into_iter()
        .find(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(*v)))
        .map(|s| s.value)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_driver_serves_the_bytes_pods_wrote_into_writable_views_and_its_writable_publishes() {
    let port = gkm_testenv::free_port().expect("a port");
    let mut node = Node::start(&[&format!("--metrics-addr=127.0.0.1:{port}")]).await;
    node.index_says(CaptureState::Open);
    let scrape = || async {
        let (status, body) = gkm_testenv::http_get(port, "/metrics")
            .await
            .expect("the driver serves /metrics");
        assert_eq!(status, 200, "{body}");
        body
    };
    // Nothing written yet: the counters are there, at zero.
    let idle = scrape().await;
    gkm_testenv::promlint(&idle).expect("promlint");
    assert_eq!(value(&idle, "gkm_csi_uppers_swept_total", &[]), Some(0.0));

    // One pod with a plain writable view, one with a delta capture's, and
    // a read-only one, all of namespace ml; each writer writes 1 MiB.
    let writer = ("writer", "5a0e1c2a-0000-4000-8000-0000000writer");
    let warm = ("warm-0", POD_UID);
    let reader = ("reader", "5a0e1c2a-0000-4000-8000-0000000reader");
    let plain = node
        .publish(writer, false, &[(ATTR_CACHE, "vector-add")])
        .await
        .expect("a writable view");
    let delta = node
        .publish(
            warm,
            false,
            &[(ATTR_CACHE, "vector-add"), (ATTR_CAPTURE, "warm")],
        )
        .await
        .expect("a delta capture's writable view");
    node.publish(reader, true, &[(ATTR_CACHE, "vector-add")])
        .await
        .expect("a read-only view");
    for target in [&plain, &delta] {
        as_pod_user(
            "set -e; head -c 1048576 /dev/zero > \"$1/NEWKEY.bin\"",
            target,
        );
    }
    let text = scrape().await;
    gkm_testenv::promlint(&text).expect("promlint");
    for pod in [writer.0, warm.0] {
        let bytes = value(
            &text,
            "gkm_csi_upper_bytes",
            &[("namespace", "ml"), ("pod", pod)],
        )
        .unwrap_or_else(|| panic!("no upper bytes for {pod}:\n{text}"));
        assert!(
            (1048576.0..2.0 * 1048576.0).contains(&bytes),
            "{pod}: {bytes}\n{text}"
        );
    }
    assert_eq!(
        value(&text, "gkm_csi_upper_bytes", &[("pod", reader.0)]),
        None,
        "a read-only view has no upper:\n{text}"
    );
    let namespace = value(
        &text,
        "gkm_csi_namespace_upper_bytes",
        &[("namespace", "ml")],
    )
    .expect("the namespace's upper bytes");
    assert!(namespace >= 2.0 * 1048576.0, "{namespace}\n{text}");
    assert_eq!(
        value(
            &text,
            "gkm_csi_writable_publishes_total",
            &[("namespace", "ml")]
        ),
        Some(2.0),
        "{text}"
    );

    // Once the pods are gone, so are their series.
    for uid in [writer.1, warm.1, reader.1] {
        node.unpublish(uid).await;
    }
    let after = scrape().await;
    assert_eq!(value(&after, "gkm_csi_upper_bytes", &[]), None, "{after}");
}
