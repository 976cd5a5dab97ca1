//! A crash of a real node's containerd: killed with SIGKILL and started
//! again with the same configuration. Running containers stay (their shims
//! outlive containerd); the kubelet reconnects by itself.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::binaries::{Component, find_binary};
use crate::node::RealNode;
use crate::respawn::{Respawnable, find_process};

/// How long containerd may take to serve again.
const SERVE_TIMEOUT: Duration = Duration::from_secs(30);

/// The containerd of one [`RealNode`], to crash and restart; the
/// replacement is stopped when this is dropped.
pub struct ContainerdRestarts {
    containerd: Respawnable,
}

impl ContainerdRestarts {
    /// Takes over `node`'s containerd process.
    pub fn new(node: &RealNode) -> anyhow::Result<ContainerdRestarts> {
        let config = node.paths().containerd_config().display().to_string();
        let pid = find_process(&["containerd", &config]).ok_or_else(|| {
            anyhow::anyhow!(
                "no containerd process with --config {config} for node {}",
                node.name()
            )
        })?;
        Ok(ContainerdRestarts {
            containerd: Respawnable::adopt(
                "containerd",
                pid,
                &node.paths().dir.join("containerd.restarted.log"),
            )?,
        })
    }

    /// Kills containerd (SIGKILL), starts it again and waits until it
    /// answers on its socket; returns how long it was away.
    pub async fn restart(&mut self, node: &RealNode) -> anyhow::Result<Duration> {
        let began = Instant::now();
        self.containerd.kill();
        self.containerd.start()?;
        let ctr = find_binary(Component::Containerd)?.with_file_name("ctr");
        let socket = node.containerd_socket();
        let containerd = &mut self.containerd;
        crate::until(
            &format!("containerd of node {} serves again", node.name()),
            SERVE_TIMEOUT,
            || {
                containerd.check_running().is_ok()
                    && Command::new(&ctr)
                        .arg("--address")
                        .arg(&socket)
                        .arg("version")
                        .output()
                        .is_ok_and(|o| o.status.success())
            },
        )
        .await?;
        Ok(began.elapsed())
    }

    /// The running containerd's process id.
    pub fn pid(&self) -> u32 {
        self.containerd.pid()
    }
}
