//! No pod can write into the node's verified store, whatever its volume
//! asks: README's stack (gkm from the chart, its CSI driver a privileged pod
//! whose mounts reach the host through `Bidirectional` propagation), a
//! tenant's busybox pod on the real node mounting the `vector-add` cache
//! through `csi.gkm.io` without `readOnly` on the volume or its mount, as
//! nothing requires it. Its volume is a copy-on-write view: every write it
//! tries succeeds in the view, into an upper layer private to that pod, and
//! the store entry holds the same files before and after, its seal intact.
//! A pod whose volume says `readOnly: true` gets the read-only view: every
//! write it tries is refused with `EROFS` and the published target is
//! read-only in the host's mount table (`findmnt`). The same holds for a
//! captured tree mounted for reading (`csi.gkm.io/capturedPodUID`), whose
//! mount in the pod does not say `readOnly`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gkm_k8s_api::crd::{CacheState, GKMCache, GKMCacheCapture};
use gkm_local::{SimulatedNode, Stack, fixture};
use gkm_oci::seal::SealCheck;
use gkm_testenv::{running_pod_log, tree_files, wait_for_pod};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NODE: &str = "real-sm75";
const NS: &str = "default";
const TIMEOUT: Duration = Duration::from_secs(180);

/// Every write a tenant could try on a cache tree at `$D`: a new key
/// directory, a new group file, a kernel rewritten, appended to, deleted
/// and renamed. Each prints `REFUSED: <what>: <error>` or `WROTE: <what>`.
const TRY_WRITES: &str = r#"
try() { what=$1; shift; if out=$("$@" 2>&1); then echo "WROTE: $what"; else echo "REFUSED: $what: $out"; fi; }
K=$(ls "$D" | head -n 1)
F=$(ls "$D/$K" | head -n 1)
echo "KEY $K FILE $F"
try "a new key directory" mkdir "$D/NEWKEYAAAA"
try "a new group file" sh -c "echo {} > '$D/$K/__grp__planted.json'"
try "a kernel rewritten" sh -c "echo planted > '$D/$K/$F'"
try "a kernel appended to" sh -c "echo planted >> '$D/$K/$F'"
try "a kernel deleted" rm -f "$D/$K/$F"
try "a key directory renamed" mv "$D/$K" "$D/MOVED"
echo DONE
exec sleep 100000
"#;

/// A busybox pod on the real node running [`TRY_WRITES`] on `volume`,
/// mounted at `/cache` without `readOnly` on the mount.
fn tenant_pod(name: &str, volume: Value) -> anyhow::Result<Pod> {
    pod_running(name, &format!("D=/cache\n{TRY_WRITES}"), volume)
}

/// A busybox pod on the real node running `script` once with `volume`
/// mounted at `/cache`, without `readOnly` on the mount.
fn pod_running(name: &str, script: &str, volume: Value) -> anyhow::Result<Pod> {
    gkm_local::once_pod(
        NS,
        name,
        NODE,
        json!(["/bin/sh", "-c", script]),
        json!([{"name": "kernels", "mountPath": "/cache"}]),
        json!([volume]),
    )
}

/// Checks that every write in `log` landed (in the pod's own view).
fn assert_all_written(pod: &str, log: &str) {
    let wrote = log.lines().filter(|l| l.starts_with("WROTE")).count();
    assert_eq!(wrote, 6, "{pod}:\n{log}");
}

/// Checks that every write in `log` was refused as a read-only file system.
fn assert_all_refused(pod: &str, log: &str) {
    let refused: Vec<&str> = log.lines().filter(|l| l.starts_with("REFUSED")).collect();
    let wrote: Vec<&str> = log.lines().filter(|l| l.starts_with("WROTE")).collect();
    assert!(wrote.is_empty(), "{pod} wrote: {wrote:?}\n{log}");
    assert_eq!(refused.len(), 6, "{pod}:\n{log}");
    for line in refused {
        assert!(line.contains("Read-only file system"), "{pod}: {line}");
    }
}

/// The mount options of the CSI target of pod `uid`'s volume `volume` as
/// the host's `findmnt` shows them (its source and type are printed too).
fn host_mount_options(kubelet_dir: &Path, uid: &str, volume: &str) -> anyhow::Result<String> {
    let target = kubelet_dir
        .join("pods")
        .join(uid)
        .join("volumes/kubernetes.io~csi")
        .join(volume)
        .join("mount");
    let out = std::process::Command::new("findmnt")
        .args([
            "--noheadings",
            "--output",
            "SOURCE,FSTYPE,OPTIONS",
            "--mountpoint",
        ])
        .arg(&target)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "findmnt {}: {}",
        target.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout)?.trim().to_string();
    eprintln!(
        "$ findmnt -no SOURCE,FSTYPE,OPTIONS -M {}\n{line}",
        target.display()
    );
    Ok(line
        .split_whitespace()
        .last()
        .unwrap_or_default()
        .to_string())
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn no_pod_writes_the_node_store_or_a_captured_tree_whatever_its_volume_asks()
-> anyhow::Result<()> {
    let work = gkm_testenv::temp_dir()?;
    let mut stack = Stack::start_for_chart(work.path(), Vec::new()).await?;
    stack
        .add_real_node(SimulatedNode::new(NODE, "gpus:\n- profile: T4\n"))
        .await?;
    let (key, image, digest) = stack
        .push_signed_fixture(
            &work.path().join("keys"),
            "triton-vector-add-cuda-sm75",
            "gkm/vector-add",
            "cuda",
        )
        .await?;
    stack.set_args(
        vec!["--tenant-signer-namespaces=default".into()],
        vec!["--resync=2s".into()],
    );
    stack.import_images()?;
    stack.install_chart().await?;

    let client = stack.plane.client().await?;
    let caches: Api<GKMCache> = Api::namespaced(client.clone(), NS);
    let cache = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": "vector-add", "namespace": NS},
        "spec": {"image": image, "signature": {"signers": [{"key": {"publicKey": key.public_pem}}]}}
    });
    caches
        .patch(
            "vector-add",
            &PatchParams::apply("store-read-only").force(),
            &Patch::Apply(&cache),
        )
        .await?;
    let caches_ref = &caches;
    stack
        .eventually(
            "the cache is extracted on the node",
            TIMEOUT,
            || async move {
                let status = caches_ref
                    .get("vector-add")
                    .await?
                    .status
                    .unwrap_or_default();
                Ok((status.state == Some(CacheState::Extracted)).then_some(()))
            },
        )
        .await?;
    let hex = digest.trim_start_matches("sha256:");
    let entry = stack.store_dir(NODE).join("sha256").join(hex);
    let before = tree_files(&entry)?;
    let cache_tree: Vec<(PathBuf, Vec<u8>)> = before
        .iter()
        .filter_map(|(p, bytes)| {
            Some((
                p.strip_prefix("io.triton.cache").ok()?.to_path_buf(),
                bytes.clone(),
            ))
        })
        .collect();
    assert_eq!(
        cache_tree,
        tree_files(&fixture("triton-vector-add-cuda-sm75"))?,
        "the store holds the verified tree"
    );

    // A tenant's pod asking for a writable cache volume gets a
    // copy-on-write view: its writes land in its own upper layer.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let writer = tenant_pod(
        "store-writer",
        json!({"name": "kernels", "csi": {"driver": "csi.gkm.io",
               "volumeAttributes": {"csi.gkm.io/GKMCache": "vector-add"}}}),
    )?;
    let writer = pods.create(&PostParams::default(), &writer).await?;
    let log = running_pod_log(&pods, "store-writer", "main", "DONE", TIMEOUT).await?;
    let kubelet_dir = stack
        .real_node(NODE)
        .map(|n| n.kubelet_dir())
        .ok_or_else(|| anyhow::anyhow!("{NODE} is not a real node"))?;
    let options = host_mount_options(&kubelet_dir, &uid(&writer), "kernels")?;
    assert!(
        options.split(',').any(|o| o == "rw"),
        "the host's mount of the writable cache volume is {options}"
    );
    assert_all_written("store-writer", &log);
    assert!(
        tree_files(&entry)? == before,
        "the node store's files changed under a tenant's pod"
    );

    // A tenant's pod whose volume says readOnly gets the read-only view.
    let reader = tenant_pod(
        "store-reader",
        json!({"name": "kernels", "csi": {"driver": "csi.gkm.io", "readOnly": true,
               "volumeAttributes": {"csi.gkm.io/GKMCache": "vector-add"}}}),
    )?;
    let reader = pods.create(&PostParams::default(), &reader).await?;
    let log = running_pod_log(&pods, "store-reader", "main", "DONE", TIMEOUT).await?;
    let options = host_mount_options(&kubelet_dir, &uid(&reader), "kernels")?;
    assert!(
        options.split(',').any(|o| o == "ro"),
        "the host's mount of the read-only cache volume is {options}"
    );
    assert_all_refused("store-reader", &log);
    assert!(
        tree_files(&entry)? == before,
        "the node store's files changed under a tenant's pod"
    );
    assert_eq!(
        gkm_oci::seal::check(&entry),
        SealCheck::Intact,
        "the node store's tree changed under a tenant's pod"
    );

    // A capture volume is the workload's own and writable; the captured
    // tree, mounted for reading by the capture's Job, is read-only even
    // where the pod's mount does not say so. The driver publishes one only
    // for a pending capture; this one names a signing Secret that does not
    // exist, so its Job never reads the tree and the capture stays pending.
    let probe = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheCapture",
        "metadata": {"name": "probe", "namespace": NS},
        "spec": {"targetImage": "registry.invalid/probe:v1",
                 "signing": {"secretName": "no-such-secret"}, "cacheName": "probe"},
    });
    Api::<GKMCacheCapture>::namespaced(client.clone(), NS)
        .patch(
            "probe",
            &PatchParams::apply("store-read-only").force(),
            &Patch::Apply(&probe),
        )
        .await?;
    let compiler = pod_running(
        "compiler",
        "mkdir /cache/KEY && echo kernel > /cache/KEY/k.cubin && echo COMPILED",
        json!({"name": "kernels", "csi": {"driver": "csi.gkm.io",
               "volumeAttributes": {"csi.gkm.io/GKMCacheCapture": "probe"}}}),
    )?;
    let compiler = pods.create(&PostParams::default(), &compiler).await?;
    wait_for_pod(&pods, "compiler", TIMEOUT, |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded")
    })
    .await?;
    let reader = tenant_pod(
        "captured-reader",
        json!({"name": "kernels", "csi": {"driver": "csi.gkm.io", "readOnly": true,
               "volumeAttributes": {"csi.gkm.io/GKMCacheCapture": "probe",
                                    "csi.gkm.io/capturedPodUID": uid(&compiler)}}}),
    )?;
    let reader = pods.create(&PostParams::default(), &reader).await?;
    let log = running_pod_log(&pods, "captured-reader", "main", "DONE", TIMEOUT).await?;
    assert!(log.contains("KEY KEY FILE k.cubin"), "{log}");
    assert_all_refused("captured-reader", &log);
    let options = host_mount_options(&kubelet_dir, &uid(&reader), "kernels")?;
    assert!(
        options.split(',').any(|o| o == "ro"),
        "the host's mount of the captured tree is {options}"
    );
    Ok(())
}
