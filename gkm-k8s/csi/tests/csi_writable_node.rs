//! Writable cache volumes on a real node: a kubelet with its own containerd
//! and runc calls gkm's CSI driver (served by this process, registered
//! through the kubelet's plugin registry, the `CSIDriver` object as
//! `deploy/` ships it) for busybox pods running as uid 1000 with fsGroup
//! 1000. Two pods mounting the same cache without `readOnly` at the same
//! time each write what Triton and torch.compile write and see only their
//! own writes; a third, `readOnly`, can write nothing; the store's tree
//! stays byte for byte the verified one. The driver restarts under them and
//! sweeps an upper no view names; once the pods end, no upper and no
//! overlay is left.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod csi_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_support::{extract_fixture, gkmcache, start_driver};
use gkm_k8s_csi::{PLUGIN, RegistrationService, serve_registration};
use gkm_k8s_node::delivery::{Delivery, DeliveryIndex};
use gkm_testenv::{
    BUSYBOX_IMAGE, ControlPlane, RealNode, RealNodeOptions, eventually, repo_root, running_pod_log,
    tree_files, yaml_documents,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

const NS: &str = "writable";
const TIMEOUT: Duration = Duration::from_secs(180);
/// A key directory of the Triton sm75 fixture.
const KEY: &str = "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ";

/// A busybox pod on `node` running as uid 1000 with fsGroup 1000, its cache
/// volume at `/cache` (`readOnly` as asked), running `script` then waiting.
fn pod(node: &str, name: &str, read_only: bool, script: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 1000,
                                "runAsNonRoot": true},
            "containers": [{
                "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", format!("{script}\nexec sleep 100000")],
                "volumeMounts": [{"name": "kernels", "mountPath": "/cache"}],
            }],
            "volumes": [{"name": "kernels", "csi": {"driver": "csi.gkm.io", "readOnly": read_only,
                         "volumeAttributes": {"csi.gkm.io/GKMCache": "vector-add"}}}],
        }
    }))?)
}

/// What a compiling workload writes, as pod `name`: a new key directory, a
/// file in a key directory of the verified tree, `locks/x.lock`. Prints
/// `WROTE`, or `REFUSED: <error>` at the first refusal.
fn writes_of(name: &str) -> String {
    format!(
        "D=/cache\n\
         if out=$( (mkdir \"$D/NEWKEY{name}\" && echo kernel-{name} > \"$D/NEWKEY{name}/k.cubin\" \
           && echo group-{name} > \"$D/{KEY}/__grp__{name}.json\" \
           && mkdir -p \"$D/locks\" && echo {name} > \"$D/locks/x.lock\") 2>&1 ); \
         then echo WROTE; else echo \"REFUSED: $out\"; fi"
    )
}

/// The host's path of pod `uid`'s cache volume.
fn view(kubelet_dir: &Path, uid: &str) -> PathBuf {
    kubelet_dir
        .join("pods")
        .join(uid)
        .join("volumes/kubernetes.io~csi/kernels/mount")
}

/// The lines of this process's mount table naming a writable view or an
/// upper under `dirs`.
fn leftover_mounts(dirs: &[&Path]) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter(|l| l.contains("gkm-cache-rw:") || l.contains("gkm-upper:"))
        .filter(|l| dirs.iter().any(|d| l.contains(&d.display().to_string())))
        .map(str::to_string)
        .collect()
}

fn count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_writable_cache_volume_gives_each_pod_a_private_upper_and_never_writes_the_store() {
    let plane = ControlPlane::shared().await.expect("control plane");
    for doc in yaml_documents(&repo_root().join("deploy/manifests/csi.yaml")).expect("csi.yaml") {
        if doc["kind"] == "CSIDriver" {
            assert_eq!(doc["spec"]["fsGroupPolicy"], "File", "{doc}");
            plane.apply_object(&doc, false).await.expect("CSIDriver");
        }
    }
    plane.ensure_pod_namespace(NS).await.expect("namespace");
    let name = "writable-node";
    let real = RealNode::start(
        plane,
        RealNodeOptions {
            name: name.into(),
            ..RealNodeOptions::default()
        },
    )
    .await
    .expect("real node");
    let kubelet_dir = real.kubelet_dir();
    let store = real.paths().dir.join("gkm-store");
    let digest = extract_fixture(&real.paths().dir, &store, "triton-vector-add-cuda-sm75").await;
    DeliveryIndex::new(&store)
        .publish(
            &gkmcache(NS, "vector-add"),
            &Delivery::deliverable(digest.clone()),
        )
        .expect("delivery");
    let entry = store.join("sha256").join(digest.hex());
    let verified = tree_files(&entry).expect("the store's tree");

    let socket = real.plugins_dir().join("csi.gkm.io/csi.sock");
    let mut driver = start_driver(&socket, name, &store).await;
    let registration = RegistrationService::new(PLUGIN, socket.clone());
    let registry_socket = real.plugins_registry_dir().join(PLUGIN.socket_name());
    tokio::spawn({
        let service = registration.clone();
        async move {
            let _ = serve_registration(&registry_socket, service, std::future::pending()).await;
        }
    });
    let registration = &registration;
    eventually("the kubelet registers csi.gkm.io", TIMEOUT, || async move {
        Ok(registration.is_registered().then_some(()))
    })
    .await
    .expect("registered");

    // Two writers and a reader, on the node at the same time.
    let client = plane.client().await.expect("client");
    let pods: Api<Pod> = Api::namespaced(client, NS);
    let writers = ["writer-a", "writer-b"];
    let mut uids = Vec::new();
    for (pod_name, read_only) in [(writers[0], false), (writers[1], false), ("reader", true)] {
        let created = pods
            .create(
                &PostParams::default(),
                &pod(name, pod_name, read_only, &writes_of(pod_name)).expect("pod"),
            )
            .await
            .expect("create");
        uids.push(created.metadata.uid.unwrap_or_default());
    }
    for pod_name in writers {
        let log = running_pod_log(&pods, pod_name, "main", "WROTE", TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{pod_name} did not write: {e:#}"));
        assert!(!log.contains("REFUSED"), "{pod_name}: {log}");
    }
    let log = running_pod_log(&pods, "reader", "main", "REFUSED", TIMEOUT)
        .await
        .expect("the reader's log");
    assert!(log.contains("Read-only file system"), "reader: {log}");

    // Each writer's view holds its writes and none of the other's.
    for (i, uid) in uids.iter().take(2).enumerate() {
        let (own, other) = (writers[i], writers[1 - i]);
        let seen = view(&kubelet_dir, uid);
        assert_eq!(
            std::fs::read_to_string(seen.join("locks/x.lock")).expect("lock"),
            format!("{own}\n")
        );
        assert!(seen.join(format!("NEWKEY{own}/k.cubin")).is_file());
        assert!(seen.join(KEY).join(format!("__grp__{own}.json")).is_file());
        assert!(
            !seen.join(format!("NEWKEY{other}")).exists(),
            "{own} sees {other}"
        );
        assert!(!seen.join(KEY).join(format!("__grp__{other}.json")).exists());
    }
    assert!(!view(&kubelet_dir, &uids[2]).join("locks").exists());
    assert!(
        tree_files(&entry).expect("tree") == verified,
        "the store changed"
    );
    let uppers = store.join("csi/uppers");
    assert_eq!(count(&uppers), 2, "one upper per writable volume");

    // The driver restarts under the pods: it sweeps an upper no view names
    // and keeps the two in use, with what their pods wrote.
    let leftover = uppers.join("csi-leftover");
    std::fs::create_dir_all(leftover.join("upper")).expect("a leftover upper");
    drop(driver);
    driver = start_driver(&socket, name, &store).await;
    assert!(!leftover.exists(), "the leftover upper is swept at start");
    assert_eq!(count(&uppers), 2);
    let seen = view(&kubelet_dir, &uids[0]);
    assert_eq!(
        std::fs::read_to_string(seen.join("locks/x.lock")).expect("lock"),
        "writer-a\n"
    );

    // The pods end: the kubelet unpublishes, nothing is left.
    for pod_name in [writers[0], writers[1], "reader"] {
        pods.delete(pod_name, &DeleteParams::default().grace_period(0))
            .await
            .expect("delete");
    }
    eventually("every upper is removed", TIMEOUT, || async {
        Ok((count(&uppers) == 0).then_some(()))
    })
    .await
    .expect("no upper left");
    eventually("every view is unmounted", TIMEOUT, || async {
        Ok(leftover_mounts(&[&kubelet_dir, &store])
            .is_empty()
            .then_some(()))
    })
    .await
    .expect("no overlay left");
    assert!(
        tree_files(&entry).expect("tree") == verified,
        "the store changed"
    );
    drop(driver);
}
