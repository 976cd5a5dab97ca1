//! A process of the test ground killed as a crash would (SIGKILL) and
//! started again with the same command line, environment and working
//! directory: what a supervisor (systemd, a static pod) does after a crash.
//!
//! The process is found by its command line in `/proc`, so this works on
//! processes another owner started (a [`crate::ControlPlane`]'s apiserver,
//! a [`crate::RealNode`]'s containerd); the first owner keeps its handle to
//! the dead process, which reaps it, and the replacement lives as long as
//! the [`Respawnable`].

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context as _;

use crate::process::Process;

/// A process that can be killed and started again; the replacement is
/// stopped when this is dropped.
pub(crate) struct Respawnable {
    name: String,
    argv: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    cwd: PathBuf,
    log: PathBuf,
    pid: u32,
    own: Option<Process>,
}

impl Respawnable {
    /// Takes over the running process `pid` (named `name` in errors),
    /// whose replacements log to `log`.
    pub(crate) fn adopt(name: &str, pid: u32, log: &Path) -> anyhow::Result<Respawnable> {
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let argv = split_nul(
            std::fs::read(proc_dir.join("cmdline"))
                .with_context(|| format!("reading the command line of {name} (pid {pid})"))?,
        );
        anyhow::ensure!(!argv.is_empty(), "{name} (pid {pid}) has no command line");
        let env = split_nul(std::fs::read(proc_dir.join("environ")).unwrap_or_default())
            .into_iter()
            .filter_map(|kv| {
                let bytes = kv.into_vec();
                let eq = bytes.iter().position(|&b| b == b'=')?;
                Some((
                    OsString::from_vec(bytes[..eq].to_vec()),
                    OsString::from_vec(bytes[eq + 1..].to_vec()),
                ))
            })
            .collect();
        let cwd = std::fs::read_link(proc_dir.join("cwd")).unwrap_or_else(|_| PathBuf::from("/"));
        Ok(Respawnable {
            name: name.to_string(),
            argv,
            env,
            cwd,
            log: log.to_path_buf(),
            pid,
            own: None,
        })
    }

    /// The running process's id.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Kills the process with SIGKILL and waits until it is dead.
    pub(crate) fn kill(&mut self) {
        if let Some(mut own) = self.own.take() {
            own.kill();
            return;
        }
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
        }
        // Its first owner reaps it; until then it is a zombie.
        for _ in 0..500 {
            if !alive(self.pid) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the process again as it was started first.
    pub(crate) fn start(&mut self) -> anyhow::Result<()> {
        let mut cmd = Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..])
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.cwd);
        let process = Process::spawn(&self.name, cmd, &self.log)?;
        self.pid = process.pid();
        self.own = Some(process);
        Ok(())
    }

    /// An error if the replacement exited, with its log's end.
    pub(crate) fn check_running(&mut self) -> anyhow::Result<()> {
        match self.own.as_mut() {
            Some(own) => own.check_running(),
            None => Ok(()),
        }
    }
}

/// The id of the first process whose command line has every one of
/// `needles` among its arguments (substring match).
pub(crate) fn find_process(needles: &[&str]) -> Option<u32> {
    let entries = std::fs::read_dir("/proc").ok()?;
    let mut pids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids.into_iter().find(|pid| {
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            return false;
        };
        let args: Vec<String> = split_nul(raw)
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        alive(*pid)
            && needles
                .iter()
                .all(|needle| args.iter().any(|a| a.contains(needle)))
    })
}

/// Whether `pid` runs (exists and is not a zombie).
/// Whether `pid` has not finished exiting. A killed multi-threaded process
/// (a Go daemon) shows its first thread as a zombie while the others are
/// still exiting, holding its files, listening sockets included: it is gone
/// only once no thread but that zombie is left.
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses.
    let exited = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_none_or(|state| state == "Z" || state == "X");
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count);
    !exited || threads > 1
}

fn split_nul(raw: Vec<u8>) -> Vec<OsString> {
    raw.split(|&b| b == 0)
        .filter(|part| !part.is_empty())
        .map(|part| OsString::from_vec(part.to_vec()))
        .collect()
}
