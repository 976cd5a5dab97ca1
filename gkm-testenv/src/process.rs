//! Child processes that never outlive the test process.
//!
//! Processes are spawned by one supervisor thread that lives as long as the
//! process, with `PR_SET_PDEATHSIG(SIGKILL)`: the kernel kills them when that
//! thread (so the test process) dies, however it dies. On top of that a
//! [`Process`] is killed when dropped, and an `atexit` handler kills what is
//! left and removes the directories registered with [`remove_at_exit`] when
//! the test harness exits normally (statics are never dropped).

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

struct Supervisor {
    requests: Mutex<mpsc::Sender<SpawnRequest>>,
}

static SUPERVISOR: OnceLock<Supervisor> = OnceLock::new();
static LIVE_PIDS: Mutex<Vec<u32>> = Mutex::new(Vec::new());
static EXIT_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
type ExitHook = Box<dyn Fn() + Send>;
static EXIT_HOOKS: Mutex<Vec<ExitHook>> = Mutex::new(Vec::new());

extern "C" fn cleanup_at_exit() {
    // Hooks first (real nodes: containers, shims, mounts), then processes.
    if let Ok(hooks) = EXIT_HOOKS.lock() {
        for hook in hooks.iter() {
            hook();
        }
    }
    if let Ok(pids) = LIVE_PIDS.lock() {
        for &pid in pids.iter() {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
    }
    if let Ok(dirs) = EXIT_DIRS.lock() {
        for dir in dirs.iter() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn supervisor() -> &'static Supervisor {
    SUPERVISOR.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("gkm-testenv-supervisor".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    // SAFETY: the closure only calls async-signal-safe prctl(2).
                    unsafe {
                        cmd.pre_exec(|| {
                            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                                return Err(std::io::Error::last_os_error());
                            }
                            Ok(())
                        });
                    }
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawning the supervisor thread");
        // SAFETY: registering a plain extern "C" fn with atexit(3).
        unsafe {
            libc::atexit(cleanup_at_exit);
        }
        Supervisor {
            requests: Mutex::new(tx),
        }
    })
}

/// Removes `dir` (recursively) when the test process exits.
pub fn remove_at_exit(dir: &Path) {
    supervisor();
    if let Ok(mut dirs) = EXIT_DIRS.lock() {
        dirs.push(dir.to_path_buf());
    }
}

/// Runs `hook` when the test process exits normally, before the remaining
/// processes are killed and the registered directories removed.
pub(crate) fn at_exit(hook: ExitHook) {
    supervisor();
    if let Ok(mut hooks) = EXIT_HOOKS.lock() {
        hooks.push(hook);
    }
}

/// A running child process, killed when dropped. Its output goes to a log file.
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Starts `cmd`, logging stdout and stderr to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Process> {
        let out = File::create(log)?;
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let (tx, rx) = mpsc::channel();
        supervisor()
            .requests
            .lock()
            .map_err(|_| anyhow::anyhow!("process supervisor poisoned"))?
            .send((cmd, tx))?;
        let child = rx
            .recv()?
            .map_err(|e| anyhow::anyhow!("starting {name}: {e}"))?;
        if let Ok(mut pids) = LIVE_PIDS.lock() {
            pids.push(child.id());
        }
        Ok(Process {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An error if the process has exited, with the end of its log.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            anyhow::bail!(
                "{} exited ({status}); last log lines:\n{}",
                self.name,
                self.log_tail(40)
            );
        }
        Ok(())
    }

    /// The last `lines` lines of the process's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Sends SIGTERM and waits up to `timeout` for the process to exit by
    /// itself, returning how it exited; an error if it ignored the signal
    /// (it is then killed).
    pub fn terminate(&mut self, timeout: Duration) -> anyhow::Result<std::process::ExitStatus> {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                if let Ok(mut pids) = LIVE_PIDS.lock() {
                    pids.retain(|&p| p != self.child.id());
                }
                return Ok(status);
            }
            if Instant::now() > deadline {
                self.kill();
                anyhow::bail!("{} ignored SIGTERM for {timeout:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Ok(mut pids) = LIVE_PIDS.lock() {
            pids.retain(|&p| p != self.child.id());
        }
    }

    /// Stops the process: SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Ok(mut pids) = LIVE_PIDS.lock() {
            pids.retain(|&p| p != self.child.id());
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(2));
    }
}
