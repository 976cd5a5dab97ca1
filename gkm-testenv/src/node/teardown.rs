//! Removing everything a real node started or made: containers, shims and
//! daemons, mounts, its bridge, and the kubelet's log links. Every step is
//! idempotent, so teardown may run on drop and again at exit.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The directory where the kubelet links container logs (fixed in the kubelet).
const CONTAINER_LOG_LINKS: &str = "/var/log/containers";

/// Tears down the node living in `dir`: its containers (through `runc` with
/// state root `runc_root`), every process of the node (see
/// [`kill_node_processes`]), the mounts under `dir`, the bridge `bridge`, and
/// the kubelet's log links into `dir`.
pub fn teardown(dir: &Path, runc: &Path, runc_root: &Path, bridge: &str) {
    let containers = kill_containers(runc, runc_root);
    kill_node_processes(dir, &containers);
    for mount in mounts_under(dir).iter().rev() {
        unmount(mount);
    }
    let _ = Command::new("ip")
        .args(["link", "delete", bridge])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    remove_log_links(dir);
}

/// Kills and deletes every container in runc's state root; returns their ids.
fn kill_containers(runc: &Path, root: &Path) -> Vec<String> {
    if !root.is_dir() {
        return Vec::new();
    }
    let Ok(out) = Command::new(runc)
        .arg("--root")
        .arg(root)
        .args(["list", "-q"])
        .stderr(Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    for id in &ids {
        for args in [vec!["kill", id, "KILL"], vec!["delete", "--force", id]] {
            let _ = Command::new(runc)
                .arg("--root")
                .arg(root)
                .args(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
    ids
}

/// How long teardown waits for the node's processes to be gone.
const PROCESSES_GONE_WITHIN: Duration = Duration::from_secs(10);

/// SIGKILLs every process of the node but this one, and their children,
/// until none is left (killed processes that are still exiting, or not yet
/// reaped, included) or [`PROCESSES_GONE_WITHIN`] passes. A process of the
/// node is one whose command line contains `dir` (the kubelet, containerd,
/// the shims), one whose root is under `dir` (a container's process, even
/// one runc no longer lists because containerd was killed while making it),
/// or one in the cgroup of one of `containers`.
///
/// The children are the containers' first processes, whose parents are the
/// shims. Waiting for the processes, not only signalling them, means that
/// whatever runs after a node's teardown finds none of its processes left.
fn kill_node_processes(dir: &Path, containers: &[String]) {
    let me = std::process::id();
    let deadline = Instant::now() + PROCESSES_GONE_WITHIN;
    loop {
        let pids = node_processes(dir, containers, me);
        if pids.is_empty() || Instant::now() > deadline {
            return;
        }
        for pid in pids {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The processes of the node in `dir` (see [`kill_node_processes`]) and
/// their children, but `me`, from one listing of `/proc`.
fn node_processes(dir: &Path, containers: &[String], me: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let pids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .collect();
    let needle = dir.as_os_str().as_bytes();
    let cgroups: Vec<String> = containers.iter().map(|id| container_cgroup(id)).collect();
    let mut node: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| cmdline.windows(needle.len()).any(|w| w == needle))
                || std::fs::read_link(format!("/proc/{pid}/root"))
                    .is_ok_and(|root| root.starts_with(dir))
                || std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                    .is_ok_and(|table| in_any_cgroup(&table, &cgroups))
        })
        .collect();
    let children: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|pid| !node.contains(pid) && parent_of(*pid).is_some_and(|p| node.contains(&p)))
        .collect();
    node.extend(children);
    node
}

/// The cgroup path of container `id`: containerd's `k8s.io` namespace
/// under the cgroupfs driver, the kubelet making no pod or QoS cgroups.
fn container_cgroup(id: &str) -> String {
    format!("/k8s.io/{id}")
}

/// Whether a `/proc/PID/cgroup` table puts the process in one of `cgroups`
/// (in any hierarchy).
fn in_any_cgroup(table: &str, cgroups: &[String]) -> bool {
    table
        .lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .any(|path| cgroups.iter().any(|c| c == path))
}

/// The parent of process `pid`, while it exists.
fn parent_of(pid: u32) -> Option<u32> {
    // `pid (comm) state ppid …`: the command may hold spaces and
    // parentheses, so the fields are read after its last `)`.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The mount points at or below `dir`, in the order they were mounted.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape(field)))
        .filter(|mount| mount.starts_with(dir))
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Detaches the mount at `path` (lazily, so a busy mount goes too).
fn unmount(path: &Path) {
    if let Ok(c) = CString::new(path.as_os_str().as_bytes()) {
        // SAFETY: `c` is a valid NUL-terminated path for the call's duration.
        unsafe {
            libc::umount2(c.as_ptr(), libc::MNT_DETACH);
        }
    }
}

/// Removes the links in `/var/log/containers` that point into `dir`.
fn remove_log_links(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(CONTAINER_LOG_LINKS) else {
        return;
    };
    for entry in entries.flatten() {
        let link = entry.path();
        if std::fs::read_link(&link).is_ok_and(|target| target.starts_with(dir)) {
            let _ = std::fs::remove_file(&link);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_in_a_containers_cgroup_in_any_hierarchy_but_not_a_prefix() {
        let cgroups = vec![container_cgroup("abc")];
        let table = "9:name=systemd:/\n4:memory:/k8s.io/abc\n0::/\n";
        assert!(in_any_cgroup(table, &cgroups));
        assert!(!in_any_cgroup("4:memory:/k8s.io/abcd\n0::/\n", &cgroups));
        assert!(!in_any_cgroup("4:memory:/\n", &cgroups));
    }

    #[test]
    fn mountinfo_escapes_are_read_back() {
        assert_eq!(unescape(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape(r"/plain"), "/plain");
    }
}
