//! The kernel's mount table as a process sees it (`/proc/<pid>/mountinfo`):
//! the one parser of it, for the CSI driver's mounts and the check of the
//! mount records against what is mounted.

use std::path::PathBuf;

/// Where the kernel lists this process's mounts.
pub const MOUNTINFO: &str = "/proc/self/mountinfo";

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// The directory of the source filesystem mounted (for a bind mount, the
    /// source directory relative to its filesystem's root).
    pub root: PathBuf,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// The per-mount options (`ro,nosuid,nodev,relatime`).
    pub options: String,
    /// The filesystem type.
    pub fs_type: String,
    /// The mount source (a device, or the name a filesystem was given).
    pub source: String,
}

impl MountInfo {
    /// Whether the mount is read-only.
    pub fn is_read_only(&self) -> bool {
        self.options.split(',').any(|o| o == "ro")
    }
}

/// Parse `/proc/self/mountinfo` content; malformed lines are skipped.
///
/// ```
/// use gkm_k8s_node::mountinfo::parse_mountinfo;
/// let m = parse_mountinfo(
///     "42 27 254:0 /store/sha256/ab /var/lib/kubelet/pods/p/my\\040vol ro,nosuid,nodev,relatime - ext4 /dev/vda rw\n",
/// );
/// assert_eq!(m[0].mount_point.to_str(), Some("/var/lib/kubelet/pods/p/my vol"));
/// assert!(m[0].is_read_only());
/// assert_eq!(m[0].source, "/dev/vda");
/// ```
pub fn parse_mountinfo(content: &str) -> Vec<MountInfo> {
    content
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let sep = fields.iter().position(|f| *f == "-")?;
            if sep < 6 || fields.len() < sep + 3 {
                return None;
            }
            Some(MountInfo {
                root: PathBuf::from(unescape(fields[3])),
                mount_point: PathBuf::from(unescape(fields[4])),
                options: fields[5].to_string(),
                fs_type: fields[sep + 1].to_string(),
                source: unescape(fields[sep + 2]),
            })
        })
        .collect()
}

/// Undo the kernel's octal escapes (`\040` for a space…).
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(octal) = s.get(i + 1..i + 4)
            && octal.bytes().all(|b| (b'0'..=b'7').contains(&b))
            && let Ok(v) = u8::from_str_radix(octal, 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines() {
        let content = "\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
42 27 254:0 /tmp/src /tmp/dst ro,nosuid,nodev,relatime - ext4 /dev/vda rw,discard
garbage line
";
        let m = parse_mountinfo(content);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mount_point, PathBuf::from("/proc"));
        assert_eq!(m[0].fs_type, "proc");
        assert!(!m[0].is_read_only());
        assert_eq!(m[1].root, PathBuf::from("/tmp/src"));
        assert!(m[1].is_read_only());
    }

    #[test]
    fn escapes() {
        assert_eq!(unescape(r"a\040b\011c\134d"), "a b\tc\\d");
        assert_eq!(unescape(r"trailing\04"), r"trailing\04");
        assert_eq!(unescape(r"\"), r"\");
    }
}
