//! Real Triton inside a pod on a real node, against a `csi.gkm.io` cache
//! volume, as a workload meets it: the pod runs as uid 1000 (fsGroup 1000),
//! sets `TRITON_CACHE_DIR` to its cache volume, mounted at the path the
//! cache was built at, and runs the fleet's checker
//! (`hack/fixtures/triton_fleet.py check`): the kernels the cache holds for
//! `cuda/75/32`, then the same kernels for a target the cache never saw,
//! reporting for each whether Triton's last compile stage ran.
//!
//! A writable cache volume (not `readOnly`) reuses every delivered kernel
//! and takes the new ones into the pod's own upper: a second pod on the
//! node at the same time sees none of them, and once both end no upper is
//! left and the store's tree is byte for byte the verified one. A read-only
//! cache volume makes Triton fail on its first miss.
//!
//! The node is a real kubelet with containerd and runc; the driver is
//! gkm-csi's, served by this process and registered with that kubelet
//! (`triton_pod_support`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../csi/tests/csi_support/mod.rs"]
mod csi_support;
mod triton_pod_support;

use std::path::{Path, PathBuf};

use gkm_testenv::triton::{TritonReport, VIRTUALENV_LINK, checker_dir, key_dir, virtualenv};
use gkm_testenv::{BUSYBOX_IMAGE, pod_log, running_pod_log, tree_files, wait_for_pod};
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use serde_json::{Value, json};
use triton_pod_support::{
    CACHE, NS, SCRATCH, TIMEOUT, TritonNode, delete_all, ended, exit_code, node, phase, pods_api,
    usage_record, workload_pod,
};

/// A target the delivered cache holds no kernel for.
const NEW_TARGET: &str = "cuda/80/32";
/// Where the pod sees the fleet's checker.
const CHECKER: &str = "/checks";
/// The non-root security context every test pod runs with.
fn non_root() -> Value {
    json!({"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000, "runAsNonRoot": true})
}

/// The cache volume, mounted read-only or not, with `attrs` as volume
/// attributes besides the cache's name.
fn cache_volume(read_only: bool, attrs: &[(&str, &str)]) -> Value {
    let mut attributes = serde_json::Map::new();
    attributes.insert("csi.gkm.io/GKMCache".into(), CACHE.into());
    for (k, v) in attrs {
        attributes.insert((*k).into(), (*v).into());
    }
    json!({"name": "kernels", "csi": {
        "driver": "csi.gkm.io",
        "readOnly": read_only,
        "volumeAttributes": attributes,
    }})
}

/// A pod running real Triton from the host's virtualenv against its cache
/// volume at `mount`: the fleet's checker compiles the fixture's kernels for
/// its target, then for [`NEW_TARGET`], and prints a JSON report a target.
fn triton_pod(
    n: &TritonNode,
    name: &str,
    mount: &Path,
    read_only: bool,
    attrs: &[(&str, &str)],
) -> anyhow::Result<Pod> {
    let mount = mount.display().to_string();
    let venv = virtualenv()?.display().to_string();
    let volumes = vec![
        cache_volume(read_only, attrs),
        json!({"name": "venv", "hostPath": {"path": venv, "type": "Directory"}}),
        json!({"name": "checker", "hostPath": {
            "path": checker_dir().display().to_string(), "type": "Directory"}}),
        json!({"name": "scratch", "emptyDir": {}}),
    ];
    let mounts = vec![
        json!({"name": "kernels", "mountPath": mount, "readOnly": read_only}),
        json!({"name": "venv", "mountPath": VIRTUALENV_LINK, "readOnly": true}),
        json!({"name": "checker", "mountPath": CHECKER, "readOnly": true}),
        json!({"name": "scratch", "mountPath": SCRATCH}),
    ];
    let command = [
        format!("{VIRTUALENV_LINK}/bin/python"),
        format!("{CHECKER}/triton_fleet.py"),
        "check".into(),
        "--target".into(),
        n.fixture.target.clone(),
        "--cache".into(),
        mount.clone(),
        "--target".into(),
        NEW_TARGET.into(),
        "--cache".into(),
        mount.clone(),
    ];
    let env = [("TRITON_CACHE_DIR", mount.as_str())];
    workload_pod(n, name, "triton", json!(command), &env, volumes, mounts)
}

/// A busybox pod with a writable cache volume at `mount`, waiting.
fn idle_pod(
    n: &TritonNode,
    name: &str,
    mount: &Path,
    attrs: &[(&str, &str)],
) -> anyhow::Result<Pod> {
    let mount = mount.display().to_string();
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": n.name,
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "securityContext": non_root(),
            "containers": [{
                "name": "idle", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "ls \"$1\" >/dev/null && echo READY; exec sleep 100000", "sh", mount],
                "volumeMounts": [{"name": "kernels", "mountPath": mount}],
            }],
            "volumes": [cache_volume(false, attrs)],
        }
    }))?)
}

/// The checker's reports in a pod's log (Python's warnings may share it).
fn reports_in(log: &str) -> anyhow::Result<Vec<TritonReport>> {
    Ok(log
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?)
}

/// Real Triton in a non-root pod with a writable cache volume at `mount`
/// (with `attrs` as volume attributes besides the cache's name), and
/// another pod of the same cache beside it (pods `triton-<name>` and
/// `idle-<name>`): every delivered kernel is a hit, every kernel for
/// [`NEW_TARGET`] is compiled into the first pod's view only, and once both
/// pods end no upper is left and the store's tree is the verified one.
async fn hits_every_delivered_kernel_and_compiles_new_ones(
    name: &str,
    mount: &Path,
    attrs: &[(&str, &str)],
) -> anyhow::Result<()> {
    let n = node();
    let (triton, idle_name) = (format!("triton-{name}"), format!("idle-{name}"));
    let (triton, idle_name) = (triton.as_str(), idle_name.as_str());
    let verified = tree_files(&n.entry)?;
    let pods = pods_api().await?;

    // A second pod of the same cache, up before Triton starts and after it ends.
    let idle = pods
        .create(
            &PostParams::default(),
            &idle_pod(n, idle_name, mount, attrs)?,
        )
        .await?;
    running_pod_log(&pods, idle_name, "idle", "READY", TIMEOUT).await?;

    let triton_uid = pods
        .create(
            &PostParams::default(),
            &triton_pod(n, triton, mount, false, attrs)?,
        )
        .await?
        .metadata
        .uid
        .unwrap_or_default();
    let idle_uid = idle.metadata.uid.clone().unwrap_or_default();
    // Each view is writable: the driver gave it an upper of its own.
    let uppers = [
        n.upper(&idle_uid, "kernels"),
        n.upper(&triton_uid, "kernels"),
    ];
    assert!(uppers[0].is_dir(), "{idle_name} has no upper");
    let done = wait_for_pod(&pods, triton, TIMEOUT, ended).await?;
    let log = pod_log(&pods, triton, "triton").await?;
    eprintln!("{triton}:\n{log}");
    assert_eq!(phase(&done), Some("Succeeded"), "{log}");
    assert_eq!(exit_code(&done), Some(0), "{log}");

    let reports = reports_in(&log)?;
    assert_eq!(reports.len(), 2, "{log}");
    let (delivered, new) = (&reports[0], &reports[1]);
    // Every delivered kernel is a hit, read from the volume.
    assert_eq!(delivered.target, n.fixture.target);
    assert_eq!(delivered.cache, mount);
    assert_eq!(delivered.kernels.len(), n.fixture.kernels, "{delivered:#?}");
    assert!(
        delivered.reused_whole(),
        "Triton compiled a delivered kernel:\n{delivered:#?}"
    );
    // Every kernel the cache never saw is compiled, into the volume.
    assert_eq!(new.target, NEW_TARGET);
    assert_eq!(new.kernels.len(), n.fixture.kernels, "{new:#?}");
    assert_eq!(new.compiled, new.kernels.len(), "{new:#?}");
    assert!(
        new.kernels
            .iter()
            .all(|k| k.read_from == [mount.to_path_buf()]),
        "{new:#?}"
    );

    // The other pod, still running, sees the delivered kernels and none of
    // the new ones; the store's tree holds none of them either.
    let idle_now = pods.get(idle_name).await?;
    assert_eq!(phase(&idle_now), Some("Running"));
    let view = n.view(&idle_uid, "kernels");
    for kernel in &delivered.kernels {
        let key = key_dir(&kernel.hash)?;
        assert!(
            view.join(&key).is_dir(),
            "{idle_name} lacks delivered {key}"
        );
    }
    for kernel in &new.kernels {
        let key = key_dir(&kernel.hash)?;
        assert!(
            !view.join(&key).exists(),
            "{idle_name} sees {key}, which {triton} compiled"
        );
        assert!(
            !verified
                .iter()
                .any(|(p, _)| p.components().any(|c| c.as_os_str() == key.as_str())),
            "the store holds {key}"
        );
    }

    // Once both pods end, neither upper is left and the store is untouched.
    delete_all(&pods, &[triton, idle_name]).await?;
    let uppers = &uppers;
    gkm_testenv::eventually("no upper is left", TIMEOUT, || async move {
        Ok(uppers.iter().all(|u| !u.exists()).then_some(()))
    })
    .await?;
    assert!(
        tree_files(&n.entry)? == verified,
        "the store changed under a writable cache volume"
    );

    // The driver counted what each pod compiled as its view went: the
    // Triton pod's misses, each kernel by its key and name, and none for
    // the pod that only read.
    let counted = usage_record(n, triton)?;
    assert_eq!(counted.kind, "triton");
    assert_eq!(
        counted.usage.new_entries,
        new.kernels.len() as u64,
        "{counted:#?}"
    );
    let mut expected: Vec<(String, String)> = new
        .kernels
        .iter()
        .map(|k| Ok((key_dir(&k.hash)?, kernel_name(&k.kernel).to_string())))
        .collect::<anyhow::Result<_>>()?;
    expected.sort();
    let mut named: Vec<(String, String)> = counted
        .usage
        .named
        .iter()
        .map(|e| (e.key.clone(), e.name.clone().unwrap_or_default()))
        .collect();
    named.sort();
    assert_eq!(named, expected, "the new kernels, by key and name");
    assert!(usage_record(n, idle_name)?.usage.all_hits());
    // And its metrics count them, per namespace, cache and kind (with the
    // misses of the other test's pods of the same cache, which may end
    // meanwhile).
    let metrics = csi_support::metrics_text(&n.metrics, &n.store);
    let misses = format!(
        "gkm_csi_view_new_entries_total{{namespace=\"{NS}\",cache=\"{CACHE}\",kind=\"triton\"}} "
    );
    let counted_by_metric: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(misses.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {misses}in:\n{metrics}"));
    assert!(
        counted_by_metric >= counted.usage.new_entries,
        "{misses}{counted_by_metric}, fewer than {triton}'s {} misses",
        counted.usage.new_entries
    );
    Ok(())
}

/// The kernel's name in a report's `kernel` (`add_kernel[BLOCK=64]`: the
/// kernel and its configuration).
fn kernel_name(kernel: &str) -> &str {
    kernel.split(['[', ' ', '(']).next().unwrap_or(kernel)
}

#[tokio::test(flavor = "multi_thread")]
async fn real_triton_in_a_non_root_pod_hits_every_delivered_kernel_and_compiles_a_new_one()
-> anyhow::Result<()> {
    // Where the pod mounts its cache: where it was built (its group files
    // name the files there).
    let mount: PathBuf = node().fixture.compiled_at.clone();
    hits_every_delivered_kernel_and_compiles_new_ones("rw", &mount, &[]).await
}

/// The same at a path the cache was not built at, named to the driver by
/// `csi.gkm.io/mountPath`: the driver stacks the tree's group files
/// rewritten for that path above it (without them Triton misses every
/// delivered kernel there).
#[tokio::test(flavor = "multi_thread")]
async fn real_triton_in_a_non_root_pod_hits_every_delivered_kernel_and_compiles_a_new_one_at_another_mount_path()
-> anyhow::Result<()> {
    let mount = Path::new("/models/kernels/triton");
    let at = mount.display().to_string();
    hits_every_delivered_kernel_and_compiles_new_ones(
        "moved",
        mount,
        &[("csi.gkm.io/mountPath", at.as_str())],
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_cache_volume_makes_triton_fail_on_its_first_miss() -> anyhow::Result<()> {
    let n = node();
    let mount: PathBuf = n.fixture.compiled_at.clone();
    let verified = tree_files(&n.entry)?;
    let pods = pods_api().await?;
    pods.create(
        &PostParams::default(),
        &triton_pod(n, "triton-ro", &mount, true, &[])?,
    )
    .await?;
    let done = wait_for_pod(&pods, "triton-ro", TIMEOUT, ended).await?;
    let log = pod_log(&pods, "triton-ro", "triton").await?;
    eprintln!("triton-ro:\n{log}");
    assert_eq!(phase(&done), Some("Failed"), "{log}");
    assert_ne!(exit_code(&done), Some(0), "{log}");
    // It failed writing the key directory of a kernel the cache does not
    // hold (its first miss), having printed no report.
    let refused = format!("Read-only file system: '{}/", mount.display());
    let key = log
        .split_once(&refused)
        .and_then(|(_, rest)| rest.split(['\'', '/']).next())
        .unwrap_or_else(|| panic!("Triton did not fail on a read-only write:\n{log}"));
    assert!(
        !verified
            .iter()
            .any(|(p, _)| p.components().any(|c| c.as_os_str() == key)),
        "Triton failed on {key}, a kernel the cache holds:\n{log}"
    );
    assert!(reports_in(&log)?.is_empty(), "{log}");
    delete_all(&pods, &["triton-ro"]).await?;
    assert!(tree_files(&n.entry)? == verified);
    Ok(())
}
