//! kube-scheduler against a [`ControlPlane`], with a configuration of the
//! test's choosing (extenders, plugins).

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::binaries::{Component, find_binary};
use crate::control_plane::ControlPlane;
use crate::process::Process;

static STARTED: AtomicUsize = AtomicUsize::new(0);

/// A running kube-scheduler, stopped when dropped.
pub struct Scheduler {
    process: Process,
}

impl Scheduler {
    /// Starts kube-scheduler against `plane` with the
    /// `KubeSchedulerConfiguration` `config_yaml` (`kubescheduler.config.k8s.io/v1`).
    ///
    /// The scheduler connects as the plane's admin (`clientConnection.kubeconfig`
    /// is set to it) and, unless the configuration says otherwise, without
    /// leader election; it serves no health port.
    pub fn start(plane: &ControlPlane, config_yaml: &str) -> anyhow::Result<Scheduler> {
        let mut config: serde_yaml::Value = serde_yaml::from_str(config_yaml)
            .map_err(|e| anyhow::anyhow!("the scheduler configuration is not YAML: {e}"))?;
        let map = config.as_mapping_mut().ok_or_else(|| {
            anyhow::anyhow!(
                "the scheduler configuration is not a KubeSchedulerConfiguration object"
            )
        })?;
        let kubeconfig = plane.kubeconfig().display().to_string();
        map.insert(
            "clientConnection".into(),
            serde_yaml::to_value(std::collections::BTreeMap::from([(
                "kubeconfig",
                kubeconfig,
            )]))?,
        );
        if !map.contains_key("leaderElection") {
            map.insert(
                "leaderElection".into(),
                serde_yaml::to_value(std::collections::BTreeMap::from([("leaderElect", false)]))?,
            );
        }
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let path = plane.dir().join(format!("kube-scheduler-{n}.yaml"));
        std::fs::write(&path, serde_yaml::to_string(&config)?)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
        let mut cmd = Command::new(find_binary(Component::KubeScheduler)?);
        cmd.arg(format!("--config={}", path.display()))
            .arg("--secure-port=0")
            .arg("--v=1");
        let process = Process::spawn(
            "kube-scheduler",
            cmd,
            &plane.dir().join(format!("kube-scheduler-{n}.log")),
        )?;
        Ok(Scheduler { process })
    }

    /// An error if the scheduler has exited, with the end of its log.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        self.process.check_running()
    }

    /// The last `lines` lines of the scheduler's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}
