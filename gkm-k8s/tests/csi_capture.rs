//! Capture volumes of `csi.gkm.io` over the driver's socket, with real
//! mounts (run as root): a workload compiles into its own bounded,
//! writable tree, which outlives it; its capture Job, in the same
//! namespace, reads it read-only and finds the real Triton cache intact;
//! a pod of another namespace finds nothing. The driver releases the tree
//! only once the agent's capture index says its capture is over (never on a
//! missing or corrupt index, nor while the capture is open), and then
//! nothing is left on the node.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod csi_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_support::{clients, start_driver};
use gkm_k8s_csi::capture_release::{ReleaseOptions, release_captures};
use gkm_k8s_csi::mount::mount_at;
use gkm_k8s_kubelet::proto::csi::node_client::NodeClient;
use gkm_k8s_kubelet::proto::csi::volume_capability::{AccessType, MountVolume};
use gkm_k8s_kubelet::proto::csi::{
    NodePublishVolumeRequest, NodeUnpublishVolumeRequest, VolumeCapability,
};
use gkm_k8s_node::captures::{CaptureIndex, CaptureName, CaptureState, Captures};
use gkm_k8s_node::volume::{
    ATTR_CAPTURE, ATTR_CAPTURE_MAX_BYTES, ATTR_CAPTURED_POD, CTX_EPHEMERAL, CTX_POD_NAME,
    CTX_POD_NAMESPACE, CTX_POD_UID,
};
use tokio::sync::oneshot;
use tonic::Code;
use tonic::transport::Channel;

/// A publish request of pod `namespace/name` (`uid`) for the capture volume
/// `attributes`, at `target`.
fn publish(
    target: &Path,
    (namespace, name, uid): (&str, &str, &str),
    attributes: &[(&str, &str)],
    readonly: bool,
) -> NodePublishVolumeRequest {
    let mut ctx: Vec<(&str, &str)> = vec![
        (CTX_EPHEMERAL, "true"),
        (CTX_POD_NAMESPACE, namespace),
        (CTX_POD_NAME, name),
        (CTX_POD_UID, uid),
    ];
    ctx.extend_from_slice(attributes);
    NodePublishVolumeRequest {
        volume_id: format!("csi-{uid}"),
        target_path: target.display().to_string(),
        readonly,
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: None,
        }),
        volume_context: ctx
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

async fn unpublish(node: &mut NodeClient<Channel>, target: &Path, uid: &str) {
    node.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: format!("csi-{uid}"),
        target_path: target.display().to_string(),
    })
    .await
    .expect("unpublish");
}

fn fixture() -> PathBuf {
    gkm_testenv::repo_root().join("fixtures/triton/cuda-75-32")
}

/// How often the driver looks at the capture index in this test.
const RELEASE_EVERY: Duration = Duration::from_millis(100);

/// The capture index as the agent writes it: `warm` of `team` in `state`,
/// observed now.
fn index_says(store: &Path, state: CaptureState) {
    let mut captures = Captures::new(jiff::Timestamp::now());
    captures
        .states
        .insert(CaptureName::new("team", "warm"), state);
    CaptureIndex::new(store)
        .publish(&captures)
        .expect("the agent writes the index");
}

/// Whether the tree is still mounted after the driver had several looks
/// at the index.
async fn kept_after_a_while(tree: &Path) -> bool {
    tokio::time::sleep(RELEASE_EVERY * 10).await;
    mount_at(tree).expect("mountinfo").is_some() && tree.is_dir()
}

#[tokio::test]
async fn a_workloads_capture_tree_outlives_it_and_only_its_namespaces_job_reads_it() {
    let work = tempfile::tempdir().expect("tempdir");
    let store = work.path().join("store");
    let socket = work.path().join("csi.sock");
    let _driver = start_driver(&socket, "node-a", &store).await;
    let (mut node, _) = clients(&socket).await;
    let workload = ("team", "warm-0", "uid-warm-0");
    let tree = store.join("captures/team/warm/uid-warm-0");

    // The workload compiles into its volume: the real Triton cache, copied
    // in as Triton would have written it; the bound holds.
    let target = work.path().join("pods/warm-0/mount");
    let attributes = [(ATTR_CAPTURE, "warm"), (ATTR_CAPTURE_MAX_BYTES, "1048576")];
    node.node_publish_volume(publish(&target, workload, &attributes, false))
        .await
        .expect("the workload's volume");
    gkm_testenv::copy_tree(&fixture(), &target).expect("the workload compiles");
    let too_big = std::fs::write(target.join("padding"), vec![0u8; 2 << 20]).expect_err("bounded");
    assert_eq!(too_big.kind(), std::io::ErrorKind::StorageFull, "{too_big}");
    std::fs::remove_file(target.join("padding")).expect("remove the padding");
    unpublish(&mut node, &target, workload.2).await;
    assert!(!target.exists(), "the workload's target is removed");
    assert!(
        mount_at(&tree).expect("mountinfo").is_some(),
        "the tree outlives the pod"
    );

    // The capture Job of the same namespace reads it, read-only, whole.
    let job = ("team", "capture-warm-1", "uid-job");
    let job_target = work.path().join("pods/job/mount");
    let read = [(ATTR_CAPTURE, "warm"), (ATTR_CAPTURED_POD, "uid-warm-0")];
    let writable = node
        .node_publish_volume(publish(&job_target, job, &read, false))
        .await
        .expect_err("a captured tree is read-only");
    assert_eq!(writable.code(), Code::InvalidArgument, "{writable:?}");
    node.node_publish_volume(publish(&job_target, job, &read, true))
        .await
        .expect("the Job's volume");
    let stats = gkm_oci::tree_check::check_tree(&job_target, &gkm_oci::ExtractPolicy::default())
        .expect("the tree passes the capture's rules");
    let scanned = gkm_core::cache::scan(&job_target).expect("a Triton cache");
    assert_eq!(scanned.summary().to_string(), "cuda/75/32");
    assert_eq!(
        stats.bytes,
        gkm_oci::tree_check::check_tree(&fixture(), &gkm_oci::ExtractPolicy::default())
            .expect("fixture")
            .bytes
    );
    let write = std::fs::write(job_target.join("x"), b"x").expect_err("read-only");
    assert_eq!(
        write.kind(),
        std::io::ErrorKind::ReadOnlyFilesystem,
        "{write}"
    );

    // A pod of another namespace naming the same capture and pod finds
    // nothing: trees are looked up in the pod's own namespace.
    let stranger = work.path().join("pods/stranger/mount");
    let refused = node
        .node_publish_volume(publish(
            &stranger,
            ("other", "thief", "uid-thief"),
            &read,
            true,
        ))
        .await
        .expect_err("another namespace");
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    assert!(!stranger.exists(), "nothing made for a refused pod");
    unpublish(&mut node, &job_target, job.2).await;

    // The driver releases trees from the capture index alone: nothing while
    // the agent wrote none, while it cannot be read, or while the capture
    // is open; once the index says it is over, nothing is left on the node.
    let driver = gkm_k8s_csi::Driver::new(&gkm_k8s_csi::DriverConfig {
        node_name: "node-a".into(),
        store_root: store.clone(),
    })
    .expect("driver");
    let (stop, stopped) = oneshot::channel::<()>();
    let releasing = tokio::spawn(release_captures(
        driver.node.clone(),
        ReleaseOptions {
            interval: RELEASE_EVERY,
            grace: Duration::ZERO,
        },
        async {
            let _ = stopped.await;
        },
    ));
    let index = CaptureIndex::new(&store);
    assert!(
        kept_after_a_while(&tree).await,
        "no index yet: the tree stays"
    );
    std::fs::create_dir_all(index.path().parent().expect("the index's directory")).expect("mkdir");
    std::fs::write(index.path(), br#"{"observed": "2026-"#).expect("a torn index");
    assert!(
        kept_after_a_while(&tree).await,
        "a corrupt index: the tree stays"
    );
    index_says(&store, CaptureState::Open);
    assert!(
        kept_after_a_while(&tree).await,
        "the capture is open: the tree stays"
    );
    index_says(&store, CaptureState::Over);
    gkm_testenv::until("the released tree is gone", Duration::from_secs(10), || {
        mount_at(&tree).expect("mountinfo").is_none() && !tree.exists()
    })
    .await
    .expect("released once the index says the capture is over");
    assert!(
        !store.join("captures/team").exists(),
        "its empty parents go with it"
    );
    let _ = stop.send(());
    releasing.await.expect("the release loop ends");
    let gone = node
        .node_publish_volume(publish(&job_target, job, &read, true))
        .await
        .expect_err("released");
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
}
