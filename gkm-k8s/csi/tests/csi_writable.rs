//! Writable cache volumes of `csi.gkm.io` over the driver's socket, with
//! real mounts and real non-root writers (run as root): a volume the pod
//! does not mount read-only is a copy-on-write view whose writes go to an
//! upper layer private to that publish, bounded, and removed at unpublish;
//! the node store's verified tree is never written. A volume mounted
//! read-only stays the read-only view. Uppers a killed driver left are
//! swept when it starts again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod csi_support;

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use csi_support::{clients, extract_fixture, gkmcache, start_driver};
use gkm_k8s_csi::mount_at;
use gkm_k8s_kubelet::proto::csi::node_client::NodeClient;
use gkm_k8s_kubelet::proto::csi::volume_capability::{AccessType, MountVolume};
use gkm_k8s_kubelet::proto::csi::{
    NodePublishVolumeRequest, NodeUnpublishVolumeRequest, VolumeCapability,
};
use gkm_k8s_node::delivery::{Delivery, DeliveryIndex};
use gkm_k8s_node::mount_records::MountRecords;
use gkm_k8s_node::volume::{
    ATTR_CACHE, ATTR_WRITABLE_MAX_BYTES, CTX_EPHEMERAL, CTX_POD_NAME, CTX_POD_NAMESPACE,
    CTX_POD_UID,
};
use gkm_oci::Digest;
use gkm_oci::seal::SealCheck;
use tonic::transport::Channel;

/// A key directory of the Triton sm75 fixture, in the store's tree.
const KEY: &str = "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ";

/// The pod's uid and fsGroup in these tests, as a pod with
/// `runAsUser: 1000` and `fsGroup: 1000` runs (its primary group is not
/// the fsGroup: the kubelet adds the fsGroup as a supplementary group).
const POD_UID: u32 = 1000;
const FS_GROUP: u32 = 1000;

/// A store holding the Triton sm75 fixture, deliverable as `ml/vector-add`,
/// and the driver serving it.
struct Node {
    work: tempfile::TempDir,
    store: PathBuf,
    digest: Digest,
    node: NodeClient<Channel>,
    driver: Option<csi_support::RunningDriver>,
}

impl Node {
    async fn new() -> Node {
        let work = tempfile::tempdir().expect("tempdir");
        // Non-root writers reach their targets below it.
        fs::set_permissions(work.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let store = work.path().join("store");
        let driver = start_driver(&work.path().join("csi.sock"), "sm75-node", &store).await;
        let (node, _) = clients(&driver.socket).await;
        let digest = extract_fixture(work.path(), &store, "triton-vector-add-cuda-sm75").await;
        DeliveryIndex::new(&store)
            .publish(
                &gkmcache("ml", "vector-add"),
                &Delivery::deliverable(digest.clone()),
            )
            .expect("index");
        Node {
            work,
            store,
            digest,
            node,
            driver: Some(driver),
        }
    }

    /// The driver stops (its process gone, as when it is killed) and a new
    /// one starts on the same store.
    async fn restart_driver(&mut self) {
        drop(self.driver.take());
        let socket = self.work.path().join("csi-restarted.sock");
        let driver = start_driver(&socket, "sm75-node", &self.store).await;
        self.node = clients(&driver.socket).await.0;
        self.driver = Some(driver);
    }

    fn entry(&self) -> PathBuf {
        self.store.join("sha256").join(self.digest.hex())
    }

    fn upper(&self, volume: &str) -> PathBuf {
        self.store.join("csi/uppers").join(volume)
    }

    fn target(&self, pod: &str) -> PathBuf {
        self.work.path().join(format!(
            "kubelet/pods/{}/volumes/kubernetes.io~csi/kernels/mount",
            uid(pod)
        ))
    }

    /// The kubelet's publish for pod `pod`'s volume: read-only as asked,
    /// with the pod's fsGroup when it has one.
    async fn publish(
        &mut self,
        pod: &str,
        read_only: bool,
        fs_group: Option<u32>,
        attrs: &[(&str, &str)],
    ) -> Result<PathBuf, tonic::Status> {
        let target = self.target(pod);
        let uid = uid(pod);
        let mut ctx: Vec<(&str, &str)> = vec![
            (CTX_EPHEMERAL, "true"),
            (CTX_POD_NAMESPACE, "ml"),
            (CTX_POD_NAME, pod),
            (CTX_POD_UID, &uid),
            (ATTR_CACHE, "vector-add"),
        ];
        ctx.extend_from_slice(attrs);
        let req = NodePublishVolumeRequest {
            volume_id: volume(pod),
            target_path: target.display().to_string(),
            readonly: read_only,
            volume_capability: Some(VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume {
                    volume_mount_group: fs_group.map(|g| g.to_string()).unwrap_or_default(),
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

    async fn unpublish(&mut self, pod: &str) {
        self.node
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: volume(pod),
                target_path: self.target(pod).display().to_string(),
            })
            .await
            .expect("unpublish");
    }
}

/// The uid of test pod `pod`.
fn uid(pod: &str) -> String {
    format!("5a0e1c2a-0000-4000-8000-{pod:0>12}")
}

/// The kubelet's volume id of pod `pod`'s cache volume.
fn volume(pod: &str) -> String {
    format!("csi-{}", Digest::of(pod.as_bytes()).hex())
}

/// Runs `script` with `sh` as the pod's user (uid 1000, primary group
/// 3000, the fsGroup 1000 as a supplementary group); its output, or the
/// failure with what it printed.
fn as_pod_user(script: &str, target: &Path) -> Result<String, String> {
    let out = Command::new("setpriv")
        .args([
            format!("--reuid={POD_UID}"),
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
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

/// What a compiling workload writes, as pod `name`: a new key directory
/// (Triton's miss), a file in an existing key directory of the store's
/// tree, and a lock file under `locks/` (torch.compile, even on a hit).
fn writes_of(name: &str) -> String {
    format!(
        "set -e; D=$1\n\
         mkdir \"$D/NEWKEY{name}\" && echo kernel-{name} > \"$D/NEWKEY{name}/k.cubin\"\n\
         echo group-{name} > \"$D/{KEY}/__grp__{name}.json\"\n\
         mkdir -p \"$D/locks\" && echo {name} > \"$D/locks/x.lock\"\n\
         echo WROTE"
    )
}

/// The lines of this process's mount table naming any of `names`.
fn mounts_naming(names: &[String]) -> Vec<String> {
    fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter(|l| names.iter().any(|n| l.contains(n.as_str())))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn each_writable_publish_gets_a_private_upper_and_the_store_is_never_written() {
    let mut n = Node::new().await;
    let verified = gkm_testenv::tree_files(&n.entry()).expect("the store's tree");
    let pods = ["writer-a", "writer-b"];
    let mut targets = Vec::new();
    for pod in pods {
        targets.push(
            n.publish(pod, false, Some(FS_GROUP), &[])
                .await
                .expect("a writable volume"),
        );
    }
    let names: Vec<String> = pods.iter().map(|p| volume(p)).collect();

    // Both views are mounted at once, writable, nosuid, nodev, and both
    // publishes are recorded: the agent keeps the digest they use.
    for target in &targets {
        let mount = mount_at(target).expect("mountinfo").expect("mounted");
        assert_eq!(mount.fs_type, "overlay");
        assert!(!mount.is_read_only(), "{}", mount.options);
        for opt in ["nosuid", "nodev"] {
            assert!(
                mount.options.split(',').any(|o| o == opt),
                "{}",
                mount.options
            );
        }
    }
    let users = MountRecords::new(&n.store)
        .pods_by_digest()
        .expect("records");
    assert_eq!(users[&n.digest].len(), 2, "{users:?}");

    // Each pod, running as uid 1000 with fsGroup 1000, writes what Triton
    // and torch.compile write…
    for (pod, target) in pods.iter().zip(&targets) {
        let wrote = as_pod_user(&writes_of(pod), target)
            .unwrap_or_else(|e| panic!("{pod} could not write its cache volume:\n{e}"));
        assert!(wrote.contains("WROTE"), "{wrote}");
    }
    // …and sees its own writes, none of the other's, and the whole cache.
    for (i, target) in targets.iter().enumerate() {
        let (own, other) = (pods[i], pods[1 - i]);
        assert_eq!(
            fs::read_to_string(target.join(format!("NEWKEY{own}/k.cubin"))).expect("own key"),
            format!("kernel-{own}\n")
        );
        assert!(
            !target.join(format!("NEWKEY{other}")).exists(),
            "{own} sees {other}'s key"
        );
        assert!(
            target
                .join(KEY)
                .join(format!("__grp__{own}.json"))
                .is_file()
        );
        assert!(
            !target
                .join(KEY)
                .join(format!("__grp__{other}.json"))
                .exists()
        );
        assert_eq!(
            fs::read_to_string(target.join("locks/x.lock")).expect("lock"),
            format!("{own}\n")
        );
        assert!(
            target.join(KEY).join("add_kernel.cubin").is_file(),
            "the cache is there"
        );
    }
    // What they wrote is in their uppers, the store's tree is byte for byte
    // the verified one and its seal holds.
    assert!(
        n.upper(&volume(pods[0]))
            .join("upper/locks/x.lock")
            .is_file()
    );
    assert_eq!(
        gkm_testenv::tree_files(&n.entry()).expect("the store's tree"),
        verified,
        "the store changed under a writable volume"
    );
    assert_eq!(gkm_oci::seal::check(&n.entry()), SealCheck::Intact);

    // Once both pods end, nothing is left: no upper, no overlay, no tmpfs.
    for pod in pods {
        n.unpublish(pod).await;
    }
    for (pod, target) in pods.iter().zip(&targets) {
        assert!(!target.exists(), "{pod}'s target is removed");
        assert!(!n.upper(&volume(pod)).exists(), "{pod}'s upper is removed");
    }
    let left = fs::read_dir(n.store.join("csi/uppers"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(left, 0, "uppers left");
    assert_eq!(mounts_naming(&names), Vec::<String>::new(), "mounts left");
    assert_eq!(
        gkm_testenv::tree_files(&n.entry()).expect("the store's tree"),
        verified
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_cache_volume_stays_read_only() {
    let mut n = Node::new().await;
    let verified = gkm_testenv::tree_files(&n.entry()).expect("the store's tree");
    let target = n
        .publish("reader", true, Some(FS_GROUP), &[])
        .await
        .expect("a read-only volume");
    let mount = mount_at(&target).expect("mountinfo").expect("mounted");
    assert!(mount.is_read_only(), "{}", mount.options);
    let err = fs::create_dir(target.join("NEWKEY")).expect_err("read-only");
    assert_eq!(err.kind(), io::ErrorKind::ReadOnlyFilesystem, "{err}");
    let err = fs::write(target.join("locks"), b"x").expect_err("read-only");
    assert_eq!(err.kind(), io::ErrorKind::ReadOnlyFilesystem, "{err}");
    let refused = as_pod_user(&writes_of("reader"), &target).expect_err("read-only");
    assert!(refused.contains("Read-only file system"), "{refused}");
    assert!(
        !n.upper(&volume("reader")).exists(),
        "a read-only view has no upper"
    );
    n.unpublish("reader").await;
    assert_eq!(gkm_testenv::tree_files(&n.entry()).expect("tree"), verified);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_upper_fails_the_pods_write_and_a_pod_without_fs_group_writes_only_as_root() {
    let mut n = Node::new().await;
    let target = n
        .publish(
            "bounded",
            false,
            None,
            &[(ATTR_WRITABLE_MAX_BYTES, "1048576")],
        )
        .await
        .expect("a writable volume");
    // Root writes, up to the bound; past it the write fails, not the node.
    fs::write(target.join("small"), vec![1u8; 64 << 10]).expect("within the bound");
    let full = fs::write(target.join("padding"), vec![0u8; 2 << 20]).expect_err("bounded");
    assert_eq!(full.kind(), io::ErrorKind::StorageFull, "{full}");
    // Without an fsGroup, the store's directories stay root's 0755.
    let refused = as_pod_user(&writes_of("bounded"), &target).expect_err("root only");
    assert!(refused.contains("Permission denied"), "{refused}");
    n.unpublish("bounded").await;
    assert!(!n.upper(&volume("bounded")).exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn uppers_and_overlays_left_by_a_killed_driver_are_swept_at_start() {
    let mut n = Node::new().await;
    // A pod whose view stays mounted across the restart…
    let live = n
        .publish("survivor", false, Some(FS_GROUP), &[])
        .await
        .expect("publish");
    as_pod_user(&writes_of("survivor"), &live).expect("writes");
    // …one whose publish the driver did not finish (its upper mounted, its
    // view not attached: what a driver killed between the two leaves)…
    let torn = n
        .publish("torn", false, Some(FS_GROUP), &[])
        .await
        .expect("publish");
    gkm_k8s_csi::unmount_all(&torn).expect("detach the view only");
    assert!(
        mount_at(&n.upper(&volume("torn")))
            .expect("mountinfo")
            .is_some()
    );
    // …and an upper directory whose mounts a node restart took.
    let rebooted = n.upper("csi-rebooted");
    fs::create_dir_all(rebooted.join("upper")).expect("a leftover upper");

    n.restart_driver().await;
    assert!(
        !n.upper(&volume("torn")).exists(),
        "the torn publish's upper is swept"
    );
    assert!(!rebooted.exists(), "the restarted node's upper is swept");
    assert_eq!(
        mounts_naming(&[format!("gkm-upper:{}", volume("torn"))]),
        Vec::<String>::new()
    );
    // The live view keeps its upper and what its pod wrote.
    assert!(
        fs::read_to_string(live.join("locks/x.lock")).expect("kept") == "survivor\n",
        "the live view lost its writes"
    );
    as_pod_user("echo again > \"$1/locks/y.lock\"", &live).expect("still writable");

    // The kubelet unpublishes both pods: nothing is left.
    n.unpublish("torn").await;
    n.unpublish("survivor").await;
    let left = fs::read_dir(n.store.join("csi/uppers"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(left, 0, "uppers left");
    let names = [volume("torn"), volume("survivor")];
    assert_eq!(mounts_naming(&names), Vec::<String>::new(), "mounts left");
}
