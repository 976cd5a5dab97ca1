//! What a tenant who may only create pods can make the `gkm-csi` binary
//! (which cargo builds for this package's tests) do to a node through the
//! views of a cache, over the driver's socket, called as the kubelet calls
//! it, with real mounts (run as root) of real Triton caches extracted into
//! a real node store:
//!
//! - every fresh `csi.gkm.io/mountPath` makes a relocation layer on the
//!   node's disk: the layers of a digest, those made for a namespace's
//!   pods, and the node's are capped, a
//!   layer must leave the store's filesystem its free-space reserve, and a
//!   mount path is at most 1024 bytes; each refusal names the flag and the
//!   chart's value, and a layer made already is reused;
//! - a layer no view stacks goes, and frees its place under the caps;
//! - a writable view for a pod with an fsGroup makes every directory of the
//!   tree group-writable, one copy-up each by the driver in its own memory:
//!   a tree with more directories than the driver allows is refused before
//!   anything is made.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../gkm-k8s/csi/tests/csi_support/mod.rs"]
mod csi_support;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Command;

use csi_support::{clients, cluster_cache, extract_fixture, gkmcache};
use gkm_k8s_kubelet::proto::csi::node_client::NodeClient;
use gkm_k8s_kubelet::proto::csi::volume_capability::{AccessType, MountVolume};
use gkm_k8s_kubelet::proto::csi::{
    NodePublishVolumeRequest, NodeUnpublishVolumeRequest, VolumeCapability,
};
use gkm_k8s_node::delivery::{Delivery, DeliveryIndex};
use gkm_k8s_node::mount_records::MountRecords;
use gkm_k8s_node::volume::{
    ATTR_CACHE, ATTR_CLUSTER_CACHE, ATTR_MOUNT_PATH, CTX_EPHEMERAL, CTX_POD_NAME,
    CTX_POD_NAMESPACE, CTX_POD_UID,
};
use gkm_oci::Digest;
use gkm_testenv::{Process, mounts_under};
use tonic::Code;
use tonic::transport::Channel;

/// A key directory of the Triton sm75 fixture and its group file.
const KEY: &str = "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ";
const GROUP: &str = "__grp__add_kernel.json";
/// The pods' fsGroup.
const FS_GROUP: u32 = 1000;

/// A node store holding the Triton sm75 fixture (`ml/vector-add`) and the
/// ROCm one (`ml/rocm`, and the `ClusterGKMCache` `shared`), deliverable,
/// and a `gkm-csi` serving it.
struct Node {
    work: tempfile::TempDir,
    store: PathBuf,
    digest: Digest,
    driver: Option<Process>,
    node: Option<NodeClient<Channel>>,
}

impl Node {
    async fn start(flags: &[&str]) -> Node {
        let work = gkm_testenv::temp_dir().expect("tempdir");
        let store = work.path().join("store");
        let digest = extract_fixture(work.path(), &store, "triton-vector-add-cuda-sm75").await;
        let rocm = extract_fixture(work.path(), &store, "triton-vector-add-rocm-gfx90a").await;
        let index = DeliveryIndex::new(&store);
        for (name, digest) in [("vector-add", &digest), ("rocm", &rocm)] {
            index
                .publish(
                    &gkmcache("ml", name),
                    &Delivery::deliverable(digest.clone()),
                )
                .expect("the agent's decision");
        }
        index
            .publish(&cluster_cache("shared"), &Delivery::deliverable(rocm))
            .expect("the agent's decision");
        let mut node = Node {
            work,
            store,
            digest,
            driver: None,
            node: None,
        };
        node.restart(flags).await;
        node
    }

    /// Stops the driver, if it runs, and starts it again with `flags`.
    async fn restart(&mut self, flags: &[&str]) {
        self.node = None;
        if let Some(mut driver) = self.driver.take() {
            driver.kill();
        }
        let socket = self.work.path().join("csi.sock");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gkm-csi"));
        cmd.args([
            format!("--endpoint=unix://{}", socket.display()),
            "--node-name=node-a".to_string(),
            format!("--store={}", self.store.display()),
        ]);
        cmd.args(flags);
        let log = self.work.path().join("gkm-csi.log");
        self.driver = Some(Process::spawn("gkm-csi", cmd, &log).expect("gkm-csi"));
        self.node = Some(clients(&socket).await.0);
    }

    /// The target of pod `uid`'s volume, as the kubelet lays it out.
    fn target(&self, uid: &str) -> PathBuf {
        self.work.path().join(format!(
            "kubelet/pods/{uid}/volumes/kubernetes.io~csi/kernels/mount"
        ))
    }

    /// The kubelet's publish for pod `uid` of namespace `ml` of the cache
    /// volume `attrs`, read-only as asked, with the pods' fsGroup.
    async fn publish(
        &mut self,
        uid: &str,
        read_only: bool,
        attrs: &[(&str, &str)],
    ) -> Result<PathBuf, tonic::Status> {
        self.publish_in("ml", uid, read_only, attrs).await
    }

    /// [`Node::publish`] for a pod of `namespace`.
    async fn publish_in(
        &mut self,
        namespace: &str,
        uid: &str,
        read_only: bool,
        attrs: &[(&str, &str)],
    ) -> Result<PathBuf, tonic::Status> {
        let target = self.target(uid);
        let mut ctx: Vec<(&str, &str)> = vec![
            (CTX_EPHEMERAL, "true"),
            (CTX_POD_NAMESPACE, namespace),
            (CTX_POD_NAME, uid),
            (CTX_POD_UID, uid),
        ];
        ctx.extend_from_slice(attrs);
        let req = NodePublishVolumeRequest {
            volume_id: volume_id(uid),
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
        self.node
            .as_mut()
            .expect("the driver runs")
            .node_publish_volume(req)
            .await?;
        Ok(target)
    }

    /// Pod `uid`'s read-only view of `cache` at `mount_path`.
    async fn view_at(
        &mut self,
        uid: &str,
        cache: &str,
        mount_path: &str,
    ) -> Result<PathBuf, tonic::Status> {
        self.publish(
            uid,
            true,
            &[(ATTR_CACHE, cache), (ATTR_MOUNT_PATH, mount_path)],
        )
        .await
    }

    /// Pod `uid` of namespace `other`'s read-only view of the
    /// `ClusterGKMCache` `shared` at `mount_path`.
    async fn shared_view_at(
        &mut self,
        uid: &str,
        mount_path: &str,
    ) -> Result<PathBuf, tonic::Status> {
        self.publish_in(
            "other",
            uid,
            true,
            &[
                (ATTR_CLUSTER_CACHE, "shared"),
                (ATTR_MOUNT_PATH, mount_path),
            ],
        )
        .await
    }

    /// The kubelet's unpublish of pod `uid`'s volume.
    async fn unpublish(&mut self, uid: &str) {
        let target = self.target(uid);
        self.node
            .as_mut()
            .expect("the driver runs")
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: volume_id(uid),
                target_path: target.display().to_string(),
            })
            .await
            .expect("unpublish");
    }

    /// How many relocation layers `digest` has in the store.
    fn layers_of(&self, digest: &Digest) -> usize {
        let dir = gkm_k8s_node::relocation::layers_of(&self.store, digest);
        fs::read_dir(dir).map_or(0, |d| d.count())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.node = None;
        self.driver = None;
        for _ in 0..4 {
            for mount in mounts_under(self.work.path()).iter().rev() {
                let _ = rustix::mount::unmount(mount, rustix::mount::UnmountFlags::DETACH);
            }
        }
    }
}

fn volume_id(uid: &str) -> String {
    format!("csi-{}", Digest::of(uid.as_bytes()).hex())
}

/// Asserts that `refused` is `RESOURCE_EXHAUSTED` and names each of `named`.
fn exhausted(refused: &tonic::Status, named: &[&str]) {
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    for name in named {
        assert!(refused.message().contains(name), "{name}: {refused:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn relocation_layers_are_capped_per_digest_namespace_and_node_and_keep_the_stores_disk_free()
{
    // The machine's disk keeps little of its size free
    // (gkm_testenv::AGENT_KEEP_FREE_ARG says why): a reserve of bytes.
    let reserve = gkm_testenv::CSI_KEEP_FREE_ARG;
    let mut node = Node::start(&[reserve]).await;
    let digest = node.digest.clone();

    // By default a digest gets 16 layers, one per mount path: each view
    // shows the group files rewritten for its path.
    for i in 0..16 {
        let path = format!("/mnt/path-{i}");
        let view = node
            .view_at(&format!("uid-{i}"), "vector-add", &path)
            .await
            .unwrap_or_else(|e| panic!("layer {i} of 16: {e:?}"));
        let group = fs::read_to_string(view.join(KEY).join(GROUP)).expect("group file");
        assert!(group.contains(&format!("{path}/{KEY}/")), "{group}");
    }
    let refused = node
        .view_at("uid-16", "vector-add", "/mnt/path-16")
        .await
        .expect_err("a 17th layer of the digest");
    exhausted(
        &refused,
        &[
            "--relocation-digest-max-layers=16",
            "views.relocation.digestMaxLayers",
            "/mnt/path-16",
        ],
    );
    assert!(!node.target("uid-16").exists(), "nothing made for it");
    assert_eq!(node.layers_of(&digest), 16, "no layer made past the cap");
    // A path its pods use already is a layer made already.
    node.view_at("uid-again", "vector-add", "/mnt/path-3")
        .await
        .expect("the layer of /mnt/path-3, reused");

    // A mount path of more than 1024 bytes is refused before anything.
    let long = format!("/{}", "a".repeat(1100));
    let refused = node
        .view_at("uid-long", "vector-add", &long)
        .await
        .expect_err("too long");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    for named in [ATTR_MOUNT_PATH, "1101 bytes", "1024"] {
        assert!(refused.message().contains(named), "{refused:?}");
    }
    assert_eq!(node.layers_of(&digest), 16);

    // A namespace's cap counts the layers made for its pods, of every
    // digest; the node's, every namespace's.
    node.restart(&[
        "--relocation-namespace-max-layers=17",
        "--relocation-node-max-layers=18",
        reserve,
    ])
    .await;
    node.view_at("uid-rocm-0", "rocm", "/mnt/path-0")
        .await
        .expect("the namespace's 17th layer");
    let refused = node
        .view_at("uid-rocm-1", "rocm", "/mnt/path-1")
        .await
        .expect_err("an 18th layer for the namespace");
    exhausted(
        &refused,
        &[
            "--relocation-namespace-max-layers=17",
            "views.relocation.namespaceMaxLayers",
            "namespace ml's",
        ],
    );
    // Another namespace has room of its own, up to the node's cap, and
    // reuses a layer made for the first for nothing.
    node.shared_view_at("uid-other-1", "/mnt/path-1")
        .await
        .expect("the node's 18th layer, for namespace other");
    node.shared_view_at("uid-other-0", "/mnt/path-0")
        .await
        .expect("a layer made for namespace ml, reused");
    let refused = node
        .shared_view_at("uid-other-2", "/mnt/path-2")
        .await
        .expect_err("a 19th layer on the node");
    exhausted(
        &refused,
        &[
            "--relocation-node-max-layers=18",
            "views.relocation.nodeMaxLayers",
        ],
    );

    // A layer must leave the store's filesystem its free-space reserve.
    node.restart(&["--relocation-keep-free=100%"]).await;
    let refused = node
        .view_at("uid-rocm-3", "rocm", "/mnt/path-3")
        .await
        .expect_err("no room within the reserve");
    exhausted(
        &refused,
        &["--relocation-keep-free=100%", "views.relocation.keepFree"],
    );
    node.view_at("uid-rocm-again", "rocm", "/mnt/path-0")
        .await
        .expect("a layer made already needs no room");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relocation_layer_no_view_stacks_goes_and_frees_its_place() {
    let reserve = gkm_testenv::CSI_KEEP_FREE_ARG;
    let mut node = Node::start(&[reserve, "--relocation-digest-max-layers=2"]).await;
    let digest = node.digest.clone();
    // The driver's work on the store, as the binary's does it every
    // minute, called here when the test says.
    let driver_on = |store: &std::path::Path| {
        gkm_k8s_csi::Driver::new(&gkm_k8s_csi::DriverConfig {
            node_name: "node-a".into(),
            store_root: store.to_path_buf(),
            capture: Default::default(),
            views: csi_support::views_config(),
        })
        .expect("driver")
    };
    let driver = driver_on(&node.store);
    node.view_at("uid-a", "vector-add", "/mnt/a")
        .await
        .expect("the first layer");
    let b = node
        .view_at("uid-b", "vector-add", "/mnt/b")
        .await
        .expect("the second layer");
    let refused = node
        .view_at("uid-c", "vector-add", "/mnt/c")
        .await
        .expect_err("a third layer of the digest");
    exhausted(&refused, &["--relocation-digest-max-layers=2"]);

    // The pod at /mnt/a ends: its layer goes when the driver next looks,
    // /mnt/b's stays under the pod that still views it.
    node.unpublish("uid-a").await;
    let removed = driver
        .node
        .remove_unused_layers(std::time::Duration::ZERO)
        .expect("removed");
    let layer = |path: &str| {
        gkm_k8s_node::relocation::layer_dir(&node.store, &digest, std::path::Path::new(path))
    };
    assert_eq!(removed, [layer("/mnt/a")]);
    assert!(layer("/mnt/b").is_dir());
    let group = fs::read_to_string(b.join(KEY).join(GROUP)).expect("the view at /mnt/b");
    assert!(group.contains("/mnt/b/"), "{group}");
    assert_eq!(node.layers_of(&digest), 1);

    // Its place is free for another path.
    node.view_at("uid-c", "vector-add", "/mnt/c")
        .await
        .expect("a layer in the place /mnt/a's left");

    // A driver started after a view was recorded by one that recorded no
    // mount path keeps every layer of its digest while the record stands.
    let records = MountRecords::new(&node.store);
    let mut old = records
        .get(&volume_id("uid-b"))
        .expect("records")
        .expect("uid-b's record");
    old.mount_path = None;
    records
        .record(&old)
        .expect("recorded as an older driver did");
    node.unpublish("uid-c").await;
    let upgraded = driver_on(&node.store);
    let removed = upgraded
        .node
        .remove_unused_layers(std::time::Duration::ZERO)
        .expect("none removed");
    assert!(removed.is_empty(), "{removed:?}");
    let group = fs::read_to_string(b.join(KEY).join(GROUP)).expect("the view at /mnt/b");
    assert!(group.contains("/mnt/b/"), "still relocated: {group}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_writable_view_for_an_fs_group_of_a_tree_with_too_many_directories_is_refused() {
    let mut node = Node::start(&[]).await;
    // A signed cache of 10,106 directories, stored as the agent leaves an
    // extraction: the Triton fixture and 10,103 more directories, sealed.
    let many = Digest::of(b"a cache of many directories");
    let entry = node.store.join("sha256").join(many.hex());
    let tree = entry.join("io.triton.cache");
    gkm_testenv::copy_tree(
        &gkm_testenv::fixture_cache("triton-vector-add-cuda-sm75"),
        &tree,
    )
    .expect("the tree");
    for i in 0..10_001 {
        fs::create_dir_all(tree.join(format!("dirs/{:03}/{i:05}", i / 100))).expect("dir");
    }
    gkm_oci::seal::seal(&entry).expect("sealed");
    DeliveryIndex::new(&node.store)
        .publish(&gkmcache("ml", "many"), &Delivery::deliverable(many))
        .expect("the agent's decision");

    // Writable by the group, it is refused before anything is made.
    let refused = node
        .publish("uid-many", false, &[(ATTR_CACHE, "many")])
        .await
        .expect_err("too many directories to copy up");
    exhausted(
        &refused,
        &[
            "--writable-group-max-dirs=10000",
            "views.writableGroupMaxDirs",
            "fsGroup 1000",
        ],
    );
    assert!(!node.target("uid-many").exists(), "no target made");
    let uppers = node.store.join("csi/uppers");
    assert!(
        fs::read_dir(&uppers).map_or(true, |mut d| d.next().is_none()),
        "no upper left"
    );
    assert!(
        MountRecords::new(&node.store)
            .get(&volume_id("uid-many"))
            .expect("records")
            .is_none(),
        "no mount recorded"
    );
    // Read-only, nothing is copied up: it is mounted.
    let view = node
        .publish("uid-many-ro", true, &[(ATTR_CACHE, "many")])
        .await
        .expect("the read-only view");
    assert!(view.join("dirs/099/09999").is_dir());

    // A cache within the bound gets its group-writable view.
    let view = node
        .publish("uid-small", false, &[(ATTR_CACHE, "vector-add")])
        .await
        .expect("the writable view");
    let key = fs::metadata(view.join(KEY)).expect("key directory");
    assert_eq!(key.gid(), FS_GROUP, "the group writes the key directory");
    fs::write(view.join(KEY).join("new.json"), b"{}").expect("written");
    let stored = node.store.join("sha256").join(node.digest.hex());
    assert!(
        !stored
            .join("io.triton.cache")
            .join(KEY)
            .join("new.json")
            .exists(),
        "the store's tree is never written"
    );
}
