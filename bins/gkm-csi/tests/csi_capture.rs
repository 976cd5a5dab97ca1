//! Capture volumes of `csi.gkm.io` over the driver's socket, called as the
//! kubelet calls it, with real mounts (run as root): a workload compiles
//! into its own bounded, writable tree, which outlives it; its capture Job,
//! in the same namespace, reads it read-only and finds the real Triton
//! cache intact; a pod of another namespace finds nothing. The driver
//! releases the tree only once the agent's capture index says its capture
//! is over (never on a missing or corrupt index, nor while the capture is
//! open), and then nothing is left on the node.
//!
//! A tenant who may only create pods cannot pin node memory with them: the
//! `gkm-csi` binary (which cargo builds for this package's tests) refuses a capture volume for a capture that is not
//! pending in the pod's namespace, or with capture volumes disabled, and
//! past its per-namespace and per-node caps; it releases a tree as its pod
//! ends when nothing will capture it, and a pending capture's tree nobody
//! reads a while after. A tree outlives a driver killed and started again
//! in a mount namespace set up as the chart's DaemonSet sets up the
//! driver's container (its volume mounts and their propagation, read from
//! the rendered chart), and the capture Job then reads it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../gkm-k8s/csi/tests/csi_support/mod.rs"]
mod csi_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_support::{clients, start_driver};
use gkm_k8s_csi::{CaptureConfig, ReleaseOptions, mount_at, release_captures};
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
use gkm_testenv::{Process, mounts_under, until};
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
    index_lists(store, &[("team", "warm", state)]);
}

/// The capture index as the agent writes it, naming `captures`
/// (namespace, name, state), observed now.
fn index_lists(store: &Path, captures: &[(&str, &str, CaptureState)]) {
    let mut index = Captures::new(jiff::Timestamp::now());
    for (namespace, name, state) in captures {
        index
            .states
            .insert(CaptureName::new(*namespace, *name), *state);
    }
    CaptureIndex::new(store)
        .publish(&index)
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
    let _cleanup = LeaveNoMounts(work.path().to_path_buf());
    index_says(&store, CaptureState::Open);

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
        capture: CaptureConfig::default(),
        views: csi_support::views_config(),
    })
    .expect("driver");
    let (stop, stopped) = oneshot::channel::<()>();
    let releasing = tokio::spawn(release_captures(
        driver.node.captures().clone(),
        ReleaseOptions {
            interval: RELEASE_EVERY,
            grace: Duration::ZERO,
        },
        async {
            let _ = stopped.await;
        },
    ));
    let index = CaptureIndex::new(&store);
    std::fs::remove_file(index.path()).expect("no index");
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

/// Unmounts whatever is left mounted below a test's directory when dropped
/// (trees, pods' volumes, the emulated container's mounts), deepest first,
/// so a failing test leaves no mount behind.
struct LeaveNoMounts(PathBuf);

impl Drop for LeaveNoMounts {
    fn drop(&mut self) {
        for _ in 0..4 {
            for mount in mounts_under(&self.0).iter().rev() {
                let _ = rustix::mount::unmount(mount, rustix::mount::UnmountFlags::DETACH);
            }
        }
    }
}

/// A `gkm-csi` process serving `<work>/csi.sock` for node `node-a`, with
/// its store at `store`.
struct CsiDriver {
    process: Process,
    socket: PathBuf,
}

impl CsiDriver {
    /// Starts the `gkm-csi` binary with `flags`, in this mount namespace
    /// or, with `container`, in one of its own set up as the chart's
    /// DaemonSet sets up the driver's container.
    fn start(
        work: &Path,
        store: &Path,
        flags: &[&str],
        container: Option<&ContainerMounts>,
    ) -> CsiDriver {
        let binary = PathBuf::from(env!("CARGO_BIN_EXE_gkm-csi"));
        let socket = work.join("csi.sock");
        let mut args = vec![
            format!("--endpoint=unix://{}", socket.display()),
            "--node-name=node-a".to_string(),
            format!("--store={}", store.display()),
        ];
        args.extend(flags.iter().map(|f| f.to_string()));
        let cmd = match container {
            None => {
                let mut cmd = std::process::Command::new(binary);
                cmd.args(&args);
                cmd
            }
            Some(mounts) => mounts.command(&binary, &args),
        };
        let process = Process::spawn("gkm-csi", cmd, &work.join("gkm-csi.log")).expect("gkm-csi");
        CsiDriver { process, socket }
    }

    async fn node(&self) -> NodeClient<Channel> {
        clients(&self.socket).await.0
    }
}

/// The driver's capture index and flags for the tests below: short
/// enough to watch a tree go, `--capture-unread-grace` long unless a test
/// says otherwise.
const RELEASE_FLAGS: &[&str] = &["--capture-orphan-grace=0s"];

/// A workload pod's capture volume of `capture`, bounded to `bytes`.
fn workload_volume(
    work: &Path,
    (namespace, name, uid): (&str, &str, &str),
    capture: &str,
    bytes: &str,
) -> NodePublishVolumeRequest {
    let target = work.join("pods").join(uid).join("mount");
    let attributes = [(ATTR_CAPTURE, capture), (ATTR_CAPTURE_MAX_BYTES, bytes)];
    publish(&target, (namespace, name, uid), &attributes, false)
}

/// A pod's capture volume target.
fn target_of(req: &NodePublishVolumeRequest) -> PathBuf {
    PathBuf::from(&req.target_path)
}

/// Whether anything is mounted, or any tree directory is left, below the
/// store's captures directory.
fn no_tree(store: &Path) -> bool {
    let captures = store.join("captures");
    mounts_under(&captures).iter().all(|m| *m == captures)
        && std::fs::read_dir(&captures).map_or(true, |mut d| d.next().is_none())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_capture_volume_for_a_capture_that_does_not_exist_is_refused() {
    let work = gkm_testenv::temp_dir().expect("tempdir");
    let _cleanup = LeaveNoMounts(work.path().to_path_buf());
    let store = work.path().join("store");
    let driver = CsiDriver::start(work.path(), &store, RELEASE_FLAGS, None);
    let mut node = driver.node().await;
    let pod = ("team", "warm-0", "uid-ghost");

    // No capture index yet: the agent has not said; the kubelet retries.
    let req = workload_volume(work.path(), pod, "warm", "1048576");
    let early = node
        .node_publish_volume(req.clone())
        .await
        .expect_err("no index");
    assert_eq!(early.code(), Code::Unavailable, "{early:?}");

    // The cluster has a pending `warm` in another namespace only, and an
    // `old` capture of the pod's namespace that is over.
    index_lists(
        &store,
        &[
            ("other", "warm", CaptureState::Open),
            ("team", "old", CaptureState::Over),
        ],
    );
    let refused = node
        .node_publish_volume(req.clone())
        .await
        .expect_err("no such capture");
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("no pending GKMCacheCapture team/warm"),
        "{refused:?}"
    );
    let over = workload_volume(work.path(), pod, "old", "1048576");
    let refused = node.node_publish_volume(over).await.expect_err("over");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("team/old is over"),
        "{refused:?}"
    );
    assert!(no_tree(&store), "no tree made for a refused volume");
    assert!(
        !target_of(&req).exists(),
        "no target made for a refused volume"
    );

    // Once the capture is pending in the pod's namespace, it is published.
    index_lists(&store, &[("team", "warm", CaptureState::Open)]);
    node.node_publish_volume(req.clone())
        .await
        .expect("a pending capture");
    unpublish(&mut node, &target_of(&req), pod.2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_capture_volume_is_refused_with_capture_disabled() {
    let work = gkm_testenv::temp_dir().expect("tempdir");
    let _cleanup = LeaveNoMounts(work.path().to_path_buf());
    let store = work.path().join("store");
    // A tree left from when capture was enabled.
    let left = store.join("captures/team/warm/uid-left");
    std::fs::create_dir_all(&left).expect("a left tree");
    gkm_k8s_csi::make_tree(&left, 1 << 20).expect("mounted");
    index_lists(&store, &[("team", "warm", CaptureState::Open)]);
    let driver = CsiDriver::start(
        work.path(),
        &store,
        &["--capture-volumes=false", "--capture-orphan-grace=0s"],
        None,
    );
    let mut node = driver.node().await;
    let req = workload_volume(
        work.path(),
        ("team", "warm-0", "uid-warm-0"),
        "warm",
        "1048576",
    );
    let refused = node
        .node_publish_volume(req.clone())
        .await
        .expect_err("disabled");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("capture.enabled"), "{refused:?}");
    let job = publish(
        &work.path().join("pods/job/mount"),
        ("team", "job", "uid-job"),
        &[(ATTR_CAPTURE, "warm"), (ATTR_CAPTURED_POD, "uid-left")],
        true,
    );
    let refused = node.node_publish_volume(job).await.expect_err("disabled");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    // Nothing will capture the left tree: it goes.
    until("the left tree released", Duration::from_secs(60), || {
        no_tree(&store)
    })
    .await
    .expect("a tree nothing will capture goes with capture disabled");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_capture_tree_is_released_within_a_minute_of_its_pods_end_when_nothing_will_capture_it() {
    let work = gkm_testenv::temp_dir().expect("tempdir");
    let _cleanup = LeaveNoMounts(work.path().to_path_buf());
    let store = work.path().join("store");
    let driver = CsiDriver::start(
        work.path(),
        &store,
        &["--capture-orphan-grace=0s", "--capture-unread-grace=3s"],
        None,
    );
    let mut node = driver.node().await;
    index_lists(
        &store,
        &[
            ("team", "deleted", CaptureState::Open),
            ("team", "done", CaptureState::Open),
            ("team", "never", CaptureState::Open),
        ],
    );
    let pods = [
        (("team", "a", "uid-a"), "deleted"),
        (("team", "b", "uid-b"), "done"),
        (("team", "c", "uid-c"), "never"),
    ];
    for (pod, capture) in pods {
        let req = workload_volume(work.path(), pod, capture, "4194304");
        node.node_publish_volume(req.clone())
            .await
            .expect("published");
        std::fs::write(target_of(&req).join("kernel.bin"), vec![7u8; 1 << 20]).expect("compiles");
    }
    // While the pods run, `deleted` is deleted and `done` ends; `never`
    // stays pending and no capture Job ever reads its tree.
    index_lists(
        &store,
        &[
            ("team", "deleted", CaptureState::Gone),
            ("team", "done", CaptureState::Over),
            ("team", "never", CaptureState::Open),
        ],
    );
    for ((_, _, uid), _) in pods {
        let target = work.path().join("pods").join(uid).join("mount");
        unpublish(&mut node, &target, uid).await;
    }
    // Nothing will capture the first two: they go as their pods end.
    for (uid, capture) in [("uid-a", "deleted"), ("uid-b", "done")] {
        let tree = store.join("captures/team").join(capture).join(uid);
        assert!(
            mount_at(&tree).expect("mountinfo").is_none() && !tree.exists(),
            "{} released at its pod's end",
            tree.display()
        );
    }
    // The pending one stays a while for its capture Job, then goes.
    let never = store.join("captures/team/never/uid-c");
    assert!(
        mount_at(&never).expect("mountinfo").is_some(),
        "kept for a while"
    );
    until("the unread tree released", Duration::from_secs(60), || {
        mount_at(&never).expect("mountinfo").is_none() && !never.exists()
    })
    .await
    .expect("a pending capture's tree no Job read goes after --capture-unread-grace");
    assert!(no_tree(&store), "nothing left on the node");
    no_markers(&store);
}

/// Asserts that no tree's marker (the times the driver keeps of a tree) is
/// left in the store.
fn no_markers(store: &Path) {
    for kind in ["capture-idle", "capture-published"] {
        let markers = gkm_testenv::tree_files(&store.join("csi").join(kind)).unwrap_or_default();
        assert!(markers.is_empty(), "{kind} markers left: {markers:?}");
    }
}

/// What a root pod does to the top of its capture tree: dates it in 2099
/// (`touch -t 2099…`).
fn date_in_the_future(dir: &Path) {
    let year_2099 = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(4_070_908_800);
    std::fs::File::open(dir)
        .and_then(|top| top.set_modified(year_2099))
        .expect("the pod dates its tree");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_capture_tree_its_pod_dated_in_the_future_is_released_all_the_same() {
    let work = gkm_testenv::temp_dir().expect("tempdir");
    let _cleanup = LeaveNoMounts(work.path().to_path_buf());
    let store = work.path().join("store");
    let driver = CsiDriver::start(work.path(), &store, RELEASE_FLAGS, None);
    let mut node = driver.node().await;
    index_lists(
        &store,
        &[
            ("team", "ending", CaptureState::Open),
            ("team", "deleted", CaptureState::Open),
        ],
    );
    let running = (("team", "a", "uid-a"), "ending");
    let ended = (("team", "b", "uid-b"), "deleted");
    for (pod, capture) in [running, ended] {
        let req = workload_volume(work.path(), pod, capture, "4194304");
        node.node_publish_volume(req.clone())
            .await
            .expect("published");
        std::fs::write(target_of(&req).join("kernel.bin"), vec![7u8; 1 << 20]).expect("compiles");
        date_in_the_future(&target_of(&req));
    }
    // `b` ends while its capture is pending: its tree stays for the Job.
    let b_target = work.path().join("pods/uid-b/mount");
    unpublish(&mut node, &b_target, "uid-b").await;
    let trees = [
        store.join("captures/team/ending/uid-a"),
        store.join("captures/team/deleted/uid-b"),
    ];
    assert!(
        trees
            .iter()
            .all(|t| mount_at(t).expect("mountinfo").is_some()),
        "both trees kept while their captures are pending"
    );
    // `ending` ends while `a` still runs; `deleted` is deleted.
    index_lists(
        &store,
        &[
            ("team", "ending", CaptureState::Over),
            ("team", "deleted", CaptureState::Gone),
        ],
    );
    until("both trees released", Duration::from_secs(30), || {
        trees
            .iter()
            .all(|t| mount_at(t).expect("mountinfo").is_none() && !t.exists())
    })
    .await
    .expect("a tree dated in 2099 goes as its capture ends or is deleted");
    unpublish(&mut node, &work.path().join("pods/uid-a/mount"), "uid-a").await;
    assert!(no_tree(&store), "nothing left on the node");
    no_markers(&store);
}

#[tokio::test(flavor = "multi_thread")]
async fn capture_trees_beyond_the_namespace_cap_are_refused_naming_the_cap() {
    let work = gkm_testenv::temp_dir().expect("tempdir");
    let _cleanup = LeaveNoMounts(work.path().to_path_buf());
    let store = work.path().join("store");
    let driver = CsiDriver::start(
        work.path(),
        &store,
        &[
            "--capture-namespace-max-bytes=2Mi",
            "--capture-node-max-bytes=3Mi",
        ],
        None,
    );
    let mut node = driver.node().await;
    index_lists(
        &store,
        &[
            ("team", "warm", CaptureState::Open),
            ("other", "warm", CaptureState::Open),
        ],
    );
    let mib = "1048576";
    let first = workload_volume(work.path(), ("team", "a", "uid-a"), "warm", mib);
    node.node_publish_volume(first.clone())
        .await
        .expect("1 MiB of 2");
    // A tree whose pod ended still holds its memory: it counts.
    unpublish(&mut node, &target_of(&first), "uid-a").await;
    let second = workload_volume(work.path(), ("team", "b", "uid-b"), "warm", mib);
    node.node_publish_volume(second).await.expect("2 MiB of 2");
    let third = workload_volume(work.path(), ("team", "c", "uid-c"), "warm", mib);
    let refused = node
        .node_publish_volume(third.clone())
        .await
        .expect_err("namespace cap");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("--capture-namespace-max-bytes=2097152")
            && refused.message().contains("namespace team"),
        "{refused:?}"
    );
    assert!(
        !store.join("captures/team/warm/uid-c").exists(),
        "no tree made"
    );
    // Another namespace has room of its own, up to the node's cap.
    let other = workload_volume(work.path(), ("other", "d", "uid-d"), "warm", mib);
    node.node_publish_volume(other)
        .await
        .expect("3 MiB of 3 on the node");
    let more = workload_volume(work.path(), ("other", "e", "uid-e"), "warm", mib);
    let refused = node.node_publish_volume(more).await.expect_err("node cap");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("--capture-node-max-bytes=3145728"),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tree_a_reader_still_views_stays_counted_until_the_reader_is_gone() {
    let work = gkm_testenv::temp_dir().expect("tempdir");
    let _cleanup = LeaveNoMounts(work.path().to_path_buf());
    let store = work.path().join("store");
    let driver = CsiDriver::start(
        work.path(),
        &store,
        &[
            "--capture-orphan-grace=0s",
            "--capture-namespace-max-bytes=2Mi",
        ],
        None,
    );
    let mut node = driver.node().await;
    index_lists(&store, &[("team", "warm", CaptureState::Open)]);
    // A writer fills its tree and ends; a `sleep` pod of the namespace
    // keeps a view of it.
    let writer = workload_volume(work.path(), ("team", "w", "uid-w"), "warm", "2097152");
    node.node_publish_volume(writer.clone())
        .await
        .expect("the writer's tree");
    std::fs::write(target_of(&writer).join("kernel.bin"), vec![7u8; 1 << 20]).expect("fills");
    unpublish(&mut node, &target_of(&writer), "uid-w").await;
    let reader_target = work.path().join("pods/uid-sleep/mount");
    let read = [(ATTR_CAPTURE, "warm"), (ATTR_CAPTURED_POD, "uid-w")];
    node.node_publish_volume(publish(
        &reader_target,
        ("team", "sleep", "uid-sleep"),
        &read,
        true,
    ))
    .await
    .expect("the reader's view");
    // The capture ends (or is deleted): the tree, still viewed, stays
    // counted against the namespace's cap while the reader holds it.
    index_lists(
        &store,
        &[
            ("team", "warm", CaptureState::Over),
            ("team", "next", CaptureState::Open),
        ],
    );
    let tree = store.join("captures/team/warm/uid-w");
    assert!(
        kept_after_a_while(&tree).await,
        "a tree a reader views is not released"
    );
    tokio::time::sleep(gkm_k8s_csi::CAPTURE_RELEASE_CHECK * 2).await;
    assert!(
        mount_at(&tree).expect("mountinfo").is_some(),
        "still kept after the driver's release looks"
    );
    let next = workload_volume(work.path(), ("team", "n", "uid-n"), "next", "1048576");
    let refused = node
        .node_publish_volume(next.clone())
        .await
        .expect_err("the viewed tree still counts");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    // Once the reader is gone, so is the tree, and the namespace has room.
    unpublish(&mut node, &reader_target, "uid-sleep").await;
    until("the tree released", Duration::from_secs(30), || {
        mount_at(&tree).expect("mountinfo").is_none() && !tree.exists()
    })
    .await
    .expect("released once its last reader is gone");
    node.node_publish_volume(next.clone())
        .await
        .expect("room again");
    unpublish(&mut node, &target_of(&next), "uid-n").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn capture_trees_are_capped_by_count_and_a_tiny_tree_is_refused() {
    let work = gkm_testenv::temp_dir().expect("tempdir");
    let _cleanup = LeaveNoMounts(work.path().to_path_buf());
    let store = work.path().join("store");
    let driver = CsiDriver::start(work.path(), &store, RELEASE_FLAGS, None);
    let mut node = driver.node().await;
    index_lists(
        &store,
        &[
            ("team", "warm", CaptureState::Open),
            ("other", "warm", CaptureState::Open),
        ],
    );
    // 4 KiB a tree would be millions of mounts within the byte caps.
    let tiny = workload_volume(work.path(), ("team", "t", "uid-tiny"), "warm", "4096");
    let refused = node
        .node_publish_volume(tiny.clone())
        .await
        .expect_err("below the floor");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("csi.gkm.io/captureMaxBytes")
            && refused.message().contains("1048576"),
        "{refused:?}"
    );
    assert!(!target_of(&tiny).exists(), "nothing made for a tiny tree");
    // By default a namespace may hold 32 trees on a node, whether their
    // pods run or ended.
    let mib = "1048576";
    for i in 0..32 {
        let uid = format!("uid-{i}");
        let req = workload_volume(work.path(), ("team", "p", &uid), "warm", mib);
        node.node_publish_volume(req.clone())
            .await
            .unwrap_or_else(|e| panic!("tree {i} of 32: {e:?}"));
        unpublish(&mut node, &target_of(&req), &uid).await;
    }
    let one_more = workload_volume(work.path(), ("team", "p", "uid-32"), "warm", mib);
    let refused = node
        .node_publish_volume(one_more)
        .await
        .expect_err("namespace count cap");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("--capture-namespace-max-trees=32")
            && refused.message().contains("capture.namespaceMaxTrees")
            && refused.message().contains("namespace team"),
        "{refused:?}"
    );
    assert!(
        !store.join("captures/team/warm/uid-32").exists(),
        "no tree made"
    );
    // The node's cap, as the chart sets it, counts every namespace's trees.
    drop(node);
    drop(driver);
    let driver = CsiDriver::start(
        work.path(),
        &store,
        &["--capture-orphan-grace=0s", "--capture-node-max-trees=33"],
        None,
    );
    let mut node = driver.node().await;
    let other = workload_volume(work.path(), ("other", "q", "uid-q"), "warm", mib);
    node.node_publish_volume(other)
        .await
        .expect("the node's 33rd tree");
    let more = workload_volume(work.path(), ("other", "r", "uid-r"), "warm", mib);
    let refused = node
        .node_publish_volume(more)
        .await
        .expect_err("node count cap");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("--capture-node-max-trees=33")
            && refused.message().contains("capture.nodeMaxTrees"),
        "{refused:?}"
    );
}

/// The volume mounts of the chart's `gkm-csi` container below a test's
/// directory, with their propagation, to set a mount namespace up as the
/// container runtime sets up the driver's container.
struct ContainerMounts {
    /// Mount path (the same on the host: the chart's hostPaths) and
    /// `mountPropagation`, parents first.
    mounts: Vec<(PathBuf, String)>,
}

impl ContainerMounts {
    /// Renders the chart with its store and kubelet directories below
    /// `work` and reads the driver container's volume mounts there.
    fn from_chart(work: &Path) -> ContainerMounts {
        let helm = gkm_testenv::find_binary(gkm_testenv::Component::Helm).expect("helm");
        let chart = gkm_testenv::repo_root().join("deploy/helm/gkm");
        let out = std::process::Command::new(helm)
            .args(["template", "gkm"])
            .arg(&chart)
            .args(["--namespace", "gkm-system", "--set"])
            .arg(format!("storeDir={}", work.join("gkm").display()))
            .arg("--set")
            .arg(format!("kubeletDir={}", work.join("kubelet").display()))
            .output()
            .expect("helm template");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rendered = work.join("chart.yaml");
        std::fs::write(&rendered, &out.stdout).expect("write");
        let docs = gkm_testenv::yaml_documents(&rendered).expect("yaml");
        let daemonset = docs
            .iter()
            .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["name"] == "gkm-csi")
            .expect("the gkm-csi DaemonSet");
        let spec = &daemonset["spec"]["template"]["spec"];
        let volumes = spec["volumes"].as_array().expect("volumes");
        let container = &spec["containers"][0];
        let mut mounts: Vec<(PathBuf, String)> = container["volumeMounts"]
            .as_array()
            .expect("volumeMounts")
            .iter()
            .filter_map(|m| {
                let path = PathBuf::from(m["mountPath"].as_str()?);
                if !path.starts_with(work) {
                    return None;
                }
                let volume = volumes.iter().find(|v| v["name"] == m["name"])?;
                assert_eq!(
                    volume["hostPath"]["path"].as_str(),
                    path.to_str(),
                    "the driver sees {} where the host has it",
                    path.display()
                );
                let propagation = m["mountPropagation"].as_str().unwrap_or("None");
                Some((path, propagation.to_string()))
            })
            .collect();
        mounts.sort_by_key(|(path, _)| path.components().count());
        // The host side, as the kubelet and the runtime need it: each
        // hostPath on a shared mount of its own.
        for (path, _) in &mounts {
            std::fs::create_dir_all(path).expect("hostPath");
            rustix::mount::mount_bind(path, path).expect("bind");
            rustix::mount::mount_change(path, rustix::mount::MountPropagationFlags::SHARED)
                .expect("shared");
        }
        ContainerMounts { mounts }
    }

    /// `binary args…` in a mount namespace of its own whose copies of the
    /// mounts propagate as the chart says: `Bidirectional` both ways (the
    /// copy stays a peer of the host's), `HostToContainer` from the host
    /// only (a slave), none at all (private). The driver's pid is the
    /// command's, so killing it ends the namespace, as a container's end
    /// does.
    fn command(&self, binary: &Path, args: &[String]) -> std::process::Command {
        let mut script = String::from("set -e\n");
        for (path, propagation) in &self.mounts {
            let how = match propagation.as_str() {
                "Bidirectional" => continue,
                "HostToContainer" => "--make-slave",
                _ => "--make-private",
            };
            script.push_str(&format!("mount {how} '{}'\n", path.display()));
        }
        script.push_str("exec \"$0\" \"$@\"\n");
        let mut cmd = std::process::Command::new("unshare");
        cmd.args(["--mount", "--propagation", "unchanged", "--", "sh", "-c"])
            .arg(script)
            .arg(binary)
            .args(args);
        cmd
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_captured_tree_survives_a_csi_driver_restart() {
    let work = gkm_testenv::temp_dir().expect("tempdir");
    let _cleanup = LeaveNoMounts(work.path().to_path_buf());
    let container = ContainerMounts::from_chart(work.path());
    let store = work.path().join("gkm/store");
    let pods = work.path().join("kubelet/pods");
    index_lists(&store, &[("team", "warm", CaptureState::Open)]);
    let mut driver = CsiDriver::start(work.path(), &store, RELEASE_FLAGS, Some(&container));
    let mut node = driver.node().await;

    // The workload compiles into its tree and ends.
    let uid = "uid-warm-0";
    let target = pods
        .join(uid)
        .join("volumes/kubernetes.io~csi/capture/mount");
    let attributes = [(ATTR_CAPTURE, "warm"), (ATTR_CAPTURE_MAX_BYTES, "8388608")];
    node.node_publish_volume(publish(
        &target,
        ("team", "warm-0", uid),
        &attributes,
        false,
    ))
    .await
    .expect("the workload's volume");
    gkm_testenv::copy_tree(&fixture(), &target).expect("the workload compiles");
    unpublish(&mut node, &target, uid).await;

    // The driver dies before the capture Job runs, and comes back.
    driver.process.kill();
    driver = CsiDriver::start(work.path(), &store, RELEASE_FLAGS, Some(&container));
    let mut node = driver.node().await;

    // The capture Job reads the whole tree.
    let job_target = pods.join("uid-job/volumes/kubernetes.io~csi/captured/mount");
    let read = [(ATTR_CAPTURE, "warm"), (ATTR_CAPTURED_POD, uid)];
    node.node_publish_volume(publish(
        &job_target,
        ("team", "capture-warm-1", "uid-job"),
        &read,
        true,
    ))
    .await
    .unwrap_or_else(|e| panic!("the Job's volume: {e:?}\n{}", driver.process.log_tail(20)));
    let scanned = gkm_core::cache::scan(&job_target).expect("a Triton cache");
    assert_eq!(scanned.summary().to_string(), "cuda/75/32");
    assert_eq!(
        gkm_testenv::tree_files(&job_target).expect("the Job's view"),
        gkm_testenv::tree_files(&fixture()).expect("the fixture"),
        "the tree the workload wrote, whole"
    );
    unpublish(&mut node, &job_target, "uid-job").await;
    driver.process.kill();
}
