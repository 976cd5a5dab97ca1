//! Writable cache volumes on a real node: README's stack (gkm from the
//! chart, its CSI driver a privileged pod), two non-root busybox pods
//! (`runAsUser: 1000`, `fsGroup: 1000`) on the real node mounting the same
//! `vector-add` cache at the same time without `readOnly`. Each writes what
//! Triton and torch.compile write (a new key directory, a file in a key
//! directory of the verified tree, `locks/x.lock`) into its own view, which
//! the other does not see; the node store's tree stays byte for byte the
//! verified one. The driver's process is killed (`SIGKILL`) while both
//! views are mounted: the kubelet restarts it, it sweeps the upper no view
//! names, the views keep what their pods wrote, and once both pods end no
//! upper and no overlay is left on the node.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gkm_k8s_api::crd::{CacheState, GKMCache};
use gkm_local::{SimulatedNode, Stack, fixture};
use gkm_oci::seal::SealCheck;
use gkm_testenv::{eventually, running_pod_log, tree_files};
use k8s_openapi::api::core::v1::{Pod, PodSecurityContext};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NODE: &str = "real-sm75";
const NS: &str = "default";
const TIMEOUT: Duration = Duration::from_secs(180);
/// A key directory of the fixture's tree.
const KEY: &str = "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ";

/// A busybox pod running as uid 1000 with fsGroup 1000, writing into its
/// writable cache volume at `/cache`, then waiting.
fn writer_pod(name: &str) -> anyhow::Result<Pod> {
    let script = format!(
        "set -e; D=/cache\n\
         mkdir \"$D/NEWKEY{name}\" && echo kernel-{name} > \"$D/NEWKEY{name}/k.cubin\"\n\
         echo group-{name} > \"$D/{KEY}/__grp__{name}.json\"\n\
         mkdir -p \"$D/locks\" && echo {name} > \"$D/locks/x.lock\"\n\
         echo WROTE; exec sleep 100000"
    );
    let mut pod = gkm_local::once_pod(
        NS,
        name,
        NODE,
        json!(["/bin/sh", "-c", script]),
        json!([{"name": "kernels", "mountPath": "/cache"}]),
        json!([{"name": "kernels", "csi": {"driver": "csi.gkm.io",
                "volumeAttributes": {"csi.gkm.io/GKMCache": "vector-add"}}}]),
    )?;
    if let Some(spec) = pod.spec.as_mut() {
        spec.security_context = Some(PodSecurityContext {
            run_as_user: Some(1000),
            run_as_non_root: Some(true),
            fs_group: Some(1000),
            ..Default::default()
        });
    }
    Ok(pod)
}

/// The host's path of pod `uid`'s cache volume.
fn volume_path(kubelet_dir: &Path, uid: &str) -> PathBuf {
    kubelet_dir
        .join("pods")
        .join(uid)
        .join("volumes/kubernetes.io~csi/kernels/mount")
}

/// The processes of `gkm-csi` serving the store `store` (the stack's, not
/// another's on the same machine).
fn driver_pids(store: &Path) -> Vec<i32> {
    let flag = format!("--store={}", store.display());
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.first().is_some_and(|a| a.ends_with("gkm-csi")) && args.contains(&flag) {
            pids.push(pid);
        }
    }
    pids
}

/// The lines of the host's mount table for writable views under
/// `kubelet_dir`.
fn writable_views(kubelet_dir: &Path) -> anyhow::Result<Vec<String>> {
    let dir = kubelet_dir.display().to_string();
    Ok(std::fs::read_to_string("/proc/self/mountinfo")?
        .lines()
        .filter(|l| l.contains("gkm-cache-rw:") && l.contains(&dir))
        .map(str::to_string)
        .collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn writable_cache_volumes_stay_private_survive_a_killed_driver_and_leave_nothing()
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
            &PatchParams::apply("writable-cache").force(),
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
    let store = stack.store_dir(NODE);
    let entry = store
        .join("sha256")
        .join(digest.trim_start_matches("sha256:"));
    let verified = tree_files(&entry)?;
    assert!(
        verified
            .iter()
            .any(|(p, _)| p.starts_with("io.triton.cache") && p.ends_with("add_kernel.cubin")),
        "the store holds the fixture's tree"
    );
    assert!(!tree_files(&fixture("triton-vector-add-cuda-sm75"))?.is_empty());
    let kubelet_dir = stack
        .real_node(NODE)
        .map(|n| n.kubelet_dir())
        .ok_or_else(|| anyhow::anyhow!("{NODE} is not a real node"))?;

    // Two non-root pods write into the same cache at the same time.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let names = ["writer-a", "writer-b"];
    let mut uids = Vec::new();
    for name in names {
        let pod = pods
            .create(&PostParams::default(), &writer_pod(name)?)
            .await?;
        uids.push(pod.metadata.uid.clone().unwrap_or_default());
    }
    for name in names {
        let log = running_pod_log(&pods, name, "main", "WROTE", TIMEOUT).await?;
        assert!(log.contains("WROTE"), "{name}: {log}");
    }
    // Each view holds its own pod's writes and none of the other's.
    for (i, uid) in uids.iter().enumerate() {
        let (own, other) = (names[i], names[1 - i]);
        let view = volume_path(&kubelet_dir, uid);
        assert_eq!(
            std::fs::read_to_string(view.join("locks/x.lock"))?,
            format!("{own}\n")
        );
        assert!(view.join(format!("NEWKEY{own}/k.cubin")).is_file());
        assert!(view.join(KEY).join(format!("__grp__{own}.json")).is_file());
        assert!(
            !view.join(format!("NEWKEY{other}")).exists(),
            "{own} sees {other}"
        );
        assert!(!view.join(KEY).join(format!("__grp__{other}.json")).exists());
    }
    assert!(
        tree_files(&entry)? == verified,
        "the store changed under writable volumes"
    );
    assert_eq!(gkm_oci::seal::check(&entry), SealCheck::Intact);

    // An upper no view names (as a node restart leaves one), then the
    // driver is killed: the kubelet restarts it and it sweeps that upper.
    let leftover = store.join("csi/uppers/csi-leftover");
    std::fs::create_dir_all(leftover.join("upper"))?;
    let killed = driver_pids(&store);
    anyhow::ensure!(
        !killed.is_empty(),
        "no gkm-csi process serves {}",
        store.display()
    );
    for pid in &killed {
        let status = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill -KILL {pid}: {status}");
    }
    eventually("the driver restarted and swept", TIMEOUT, || async {
        let restarted = driver_pids(&store).iter().any(|p| !killed.contains(p));
        Ok((restarted && !leftover.exists()).then_some(()))
    })
    .await?;
    // The views, and what their pods wrote, outlive the driver.
    for (i, uid) in uids.iter().enumerate() {
        let view = volume_path(&kubelet_dir, uid);
        assert_eq!(
            std::fs::read_to_string(view.join("locks/x.lock"))?,
            format!("{}\n", names[i])
        );
    }

    // Both pods end: no upper, no overlay is left.
    for name in names {
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await?;
    }
    let pods_ref = &pods;
    eventually("both pods are gone", TIMEOUT, || async move {
        for name in names {
            if pods_ref.get_opt(name).await?.is_some() {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await?;
    let uppers = store.join("csi/uppers");
    eventually("no upper is left", TIMEOUT, || async {
        let left = std::fs::read_dir(&uppers).map(|d| d.count()).unwrap_or(0);
        Ok((left == 0).then_some(()))
    })
    .await?;
    assert_eq!(writable_views(&kubelet_dir)?, Vec::<String>::new());
    assert!(
        tree_files(&entry)? == verified,
        "the store changed under writable volumes"
    );
    Ok(())
}
