//! A crash of a real node's kubelet: killed with SIGKILL (no chance to
//! clean up), then started again with the same configuration.

use std::time::{Duration, Instant};

use crate::node::RealNode;
use crate::respawn::find_process;

/// Kills `node`'s kubelet with SIGKILL, starts it again and waits until the
/// Node is Ready with a fresh device-plugin socket; returns how long it was
/// away. Pods and their mounts stay.
pub async fn crash_kubelet(node: &mut RealNode) -> anyhow::Result<Duration> {
    let began = Instant::now();
    let root = format!("--root-dir={}", node.kubelet_dir().display());
    let pid = find_process(&["kubelet", &root]).ok_or_else(|| {
        anyhow::anyhow!("no kubelet process with {root} for node {}", node.name())
    })?;
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
    }
    node.restart_kubelet().await?;
    Ok(began.elapsed())
}
