//! Mount records checked against the kernel's mount table.
//!
//! The CSI driver writes a [`MountRecord`] before each bind mount and removes
//! it after the unmount, so the records are a superset of what is mounted. A node crash, or a driver killed
//! between an unmount and the record's removal, leaves records no mount
//! backs; the agent would count their pods forever, keep their store
//! directories, and a cache's deletion would wait on them. The CSI driver
//! calls [`reconcile_mount_records`] (at start and from time to time) to
//! remove them.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::Timestamp;

use super::mount_records::{MountRecord, MountRecords};
use super::mountinfo::{MOUNTINFO, parse_mountinfo};
use crate::error::{Error, Result};

/// The mount points listed in `mountinfo` (the text of a
/// `/proc/<pid>/mountinfo`).
pub fn mounted_targets(mountinfo: &str) -> HashSet<PathBuf> {
    parse_mountinfo(mountinfo)
        .into_iter()
        .map(|m| m.mount_point)
        .collect()
}

/// Removes the records whose target is not in `mountinfo` and that were
/// written more than `grace` before `now` (a record is written just before
/// its mount, so a young one may be a mount under way). Returns the records
/// removed.
pub fn reconcile_mount_records(
    records: &MountRecords,
    mountinfo: &str,
    grace: Duration,
    now: Timestamp,
) -> Result<Vec<MountRecord>> {
    let mounted = mounted_targets(mountinfo);
    let mut removed = Vec::new();
    for record in records.list()? {
        let age = now.as_second().saturating_sub(record.published.as_second());
        if mounted.contains(&record.target_path) || age < grace.as_secs() as i64 {
            continue;
        }
        if records.remove(&record.volume_id)? {
            tracing::info!(
                volume = %record.volume_id,
                pod = %format!("{}/{}", record.pod.namespace, record.pod.name),
                target = %record.target_path.display(),
                "removed a mount record no mount backs"
            );
            removed.push(record);
        }
    }
    Ok(removed)
}

/// [`reconcile_mount_records`] against this process's mount table.
pub fn reconcile_with_kernel(records: &MountRecords, grace: Duration) -> Result<Vec<MountRecord>> {
    let mountinfo = std::fs::read_to_string(MOUNTINFO).map_err(|source| Error::Io {
        path: Path::new(MOUNTINFO).to_path_buf(),
        source,
    })?;
    reconcile_mount_records(records, &mountinfo, grace, Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mount_records::PodRef;
    use gkm_core::CacheKey;
    use jiff::SignedDuration;

    const MOUNTINFO_TEXT: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
301 22 8:1 /var/lib/gkm/sha256/aa /var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/cache/mount ro,relatime shared:1 - ext4 /dev/sda1 rw
302 22 8:1 /var/lib/gkm/sha256/aa /var/lib/kubelet/pods/p3/volumes/with\\040space/mount ro - ext4 /dev/sda1 rw
";

    fn record(volume: &str, target: &str, published: Timestamp) -> MountRecord {
        MountRecord {
            volume_id: volume.into(),
            pod: PodRef {
                namespace: "ml".into(),
                name: volume.into(),
                uid: None,
            },
            cache: CacheKey::namespaced("ml", "llama"),
            digest: gkm_core::Digest::of(b"x"),
            target_path: target.into(),
            mount_path: None,
            published,
        }
    }

    #[test]
    fn records_without_a_mount_go_once_past_the_grace() {
        let store = tempfile::tempdir().expect("tempdir");
        let records = MountRecords::new(store.path());
        let now = Timestamp::now();
        let old = now
            .checked_sub(SignedDuration::from_secs(600))
            .expect("time");
        let mounted = "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/cache/mount";
        let spaced = "/var/lib/kubelet/pods/p3/volumes/with space/mount";
        let crashed = "/var/lib/kubelet/pods/p2/volumes/kubernetes.io~csi/cache/mount";
        for r in [
            record("mounted", mounted, old),
            record("spaced", spaced, old),
            record("crashed", crashed, old),
            record("mounting", crashed, now),
        ] {
            records.record(&r).expect("record");
        }
        let removed =
            reconcile_mount_records(&records, MOUNTINFO_TEXT, Duration::from_secs(60), now)
                .expect("reconcile");
        let removed: Vec<&str> = removed.iter().map(|r| r.volume_id.as_str()).collect();
        assert_eq!(removed, vec!["crashed"]);
        let left: Vec<String> = records
            .list()
            .expect("list")
            .into_iter()
            .map(|r| r.volume_id)
            .collect();
        assert_eq!(left, vec!["mounted", "mounting", "spaced"]);
    }
}
