//! What must be gone once every reader, capture and claimed cache is
//! deleted: CSI mounts and overlays, writable views' uppers, captured trees
//! and their mounts, the store's staging directories, any Job, claim or
//! volume, and the volumes' directories.

use std::path::Path;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::Api;

/// Everything left behind, in words; empty when nothing is.
pub async fn leftovers(
    client: &kube::Client,
    kubelet_dir: &Path,
    store: &Path,
    volume_dir: &Path,
) -> anyhow::Result<Vec<String>> {
    let mut found = Vec::new();
    // CSI volumes still mounted into pods' directories.
    for mount in gkm_testenv::mounts_under(&kubelet_dir.join("pods")) {
        if mount.to_string_lossy().contains("kubernetes.io~csi") {
            found.push(format!("mount {}", mount.display()));
        }
    }
    // Overlays over the store (writable views), wherever mounted.
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let store_text = store.display().to_string();
    for line in table.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let fstype = fields.get(dash + 1).copied().unwrap_or_default();
        let options = fields.get(dash + 3).copied().unwrap_or_default();
        if fstype == "overlay" && options.contains(&store_text) {
            found.push(format!(
                "overlay at {} over the store",
                fields.get(4).copied().unwrap_or_default()
            ));
        }
    }
    for (dir, what) in [
        (store.join("csi/uppers"), "upper"),
        (store.join("staging"), "staging directory"),
    ] {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                found.push(format!("{what} {}", entry.path().display()));
            }
        }
    }
    // Captured trees: <store>/captures/<namespace>/<capture>/<pod uid>.
    let captures = store.join(gkm_k8s_node::captures::CAPTURES_DIR);
    for mount in gkm_testenv::mounts_under(&captures) {
        found.push(format!("capture mount {}", mount.display()));
    }
    for namespace in children(&captures) {
        for capture in children(&namespace) {
            for tree in children(&capture) {
                found.push(format!("captured tree {}", tree.display()));
            }
        }
    }
    for volume in children(volume_dir) {
        found.push(format!("volume directory {}", volume.display()));
    }
    for volume in Api::<PersistentVolume>::all(client.clone())
        .list(&Default::default())
        .await?
    {
        found.push(format!(
            "volume {}",
            volume.metadata.name.unwrap_or_default()
        ));
    }
    for job in Api::<Job>::all(client.clone())
        .list(&Default::default())
        .await?
    {
        found.push(format!(
            "Job {}/{}",
            job.metadata.namespace.unwrap_or_default(),
            job.metadata.name.unwrap_or_default()
        ));
    }
    for claim in Api::<PersistentVolumeClaim>::all(client.clone())
        .list(&Default::default())
        .await?
    {
        found.push(format!(
            "claim {}/{}",
            claim.metadata.namespace.unwrap_or_default(),
            claim.metadata.name.unwrap_or_default()
        ));
    }
    Ok(found)
}

/// The entries of `dir`; none when it cannot be read.
fn children(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}
