//! What must be gone once every reader is deleted: CSI mounts and
//! overlays, writable views' uppers, the store's staging directories, and
//! any Job or claim.

use std::path::Path;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;

/// Everything left behind, in words; empty when nothing is.
pub async fn leftovers(
    client: &kube::Client,
    kubelet_dir: &Path,
    store: &Path,
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
