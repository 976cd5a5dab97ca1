//! Crashes of the control plane: kube-apiserver or etcd killed with SIGKILL
//! and started again with the same flags, data and port, as a supervisor
//! would after a crash.

use std::time::{Duration, Instant};

use crate::control_plane::ControlPlane;
use crate::respawn::Respawnable;

/// How long the apiserver may take to answer `/readyz` again.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// The apiserver and etcd of one [`ControlPlane`], to crash and restart;
/// the replacements are stopped when this is dropped (drop it before the
/// control plane).
pub struct ControlPlaneRestarts {
    apiserver: Respawnable,
    etcd: Respawnable,
}

impl ControlPlaneRestarts {
    /// Takes over `plane`'s apiserver and etcd processes.
    pub fn new(plane: &ControlPlane) -> anyhow::Result<ControlPlaneRestarts> {
        let pids = plane.pids();
        let (Some(&apiserver), Some(&etcd)) = (pids.first(), pids.get(1)) else {
            anyhow::bail!("the control plane reports no apiserver and etcd process ids");
        };
        Ok(ControlPlaneRestarts {
            apiserver: Respawnable::adopt(
                "kube-apiserver",
                apiserver,
                &plane.dir().join("kube-apiserver.restarted.log"),
            )?,
            etcd: Respawnable::adopt("etcd", etcd, &plane.dir().join("etcd.restarted.log"))?,
        })
    }

    /// Kills kube-apiserver (SIGKILL), starts it again and waits until it
    /// answers `/readyz`; returns how long it was away.
    pub async fn restart_apiserver(&mut self, plane: &ControlPlane) -> anyhow::Result<Duration> {
        let began = Instant::now();
        self.apiserver.kill();
        self.apiserver.start()?;
        self.wait_ready(plane).await?;
        Ok(began.elapsed())
    }

    /// Kills etcd (SIGKILL), starts it again on the same data and waits
    /// until the apiserver answers `/readyz` (which checks etcd); returns
    /// how long it was away.
    pub async fn restart_etcd(&mut self, plane: &ControlPlane) -> anyhow::Result<Duration> {
        let began = Instant::now();
        self.etcd.kill();
        self.etcd.start()?;
        self.wait_ready(plane).await?;
        Ok(began.elapsed())
    }

    /// The running apiserver's and etcd's process ids.
    pub fn pids(&self) -> (u32, u32) {
        (self.apiserver.pid(), self.etcd.pid())
    }

    async fn wait_ready(&mut self, plane: &ControlPlane) -> anyhow::Result<()> {
        let (apiserver, etcd) = (&mut self.apiserver, &mut self.etcd);
        crate::eventually(
            "kube-apiserver answers /readyz after a restart",
            READY_TIMEOUT,
            || {
                let checked = apiserver
                    .check_running()
                    .and_then(|()| etcd.check_running());
                async move {
                    checked?;
                    Ok(readyz(plane).await.then_some(()))
                }
            },
        )
        .await
    }
}

/// Whether the apiserver answers `/readyz` with `ok`.
async fn readyz(plane: &ControlPlane) -> bool {
    let Ok(client) = plane.client().await else {
        return false;
    };
    let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else {
        return false;
    };
    matches!(client.request_text(request).await, Ok(body) if body.trim() == "ok")
}
