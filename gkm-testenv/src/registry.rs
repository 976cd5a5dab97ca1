//! A real OCI registry: the Distribution registry from Debian's `docker-registry`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::binaries::{Component, find_binary};
use crate::ports::free_port;
use crate::process::{Process, remove_at_exit};

/// A Distribution registry serving plain HTTP on a free loopback port, with a
/// filesystem store in a temporary directory; stopped when dropped.
///
/// It has no OCI referrers API, so clients use the `sha256-<hex>` tag fallback.
pub struct Registry {
    process: Process,
    addr: String,
    root: PathBuf,
    _tempdir: Option<tempfile::TempDir>,
}

static SHARED: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
static SHARED_INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Registry {
    /// Starts a registry of its own.
    pub fn start() -> anyhow::Result<Registry> {
        let tempdir = crate::temp_dir()?;
        let root = tempdir.path().to_path_buf();
        Self::start_in(&root, Some(tempdir))
    }

    /// The registry shared by every test of this test binary. Tests should
    /// use repository names of their own.
    pub fn shared() -> anyhow::Result<&'static Registry> {
        if let Some(registry) = SHARED.get() {
            return Ok(registry);
        }
        let _guard = SHARED_INIT
            .lock()
            .map_err(|_| anyhow::anyhow!("registry init poisoned"))?;
        if let Some(registry) = SHARED.get() {
            return Ok(registry);
        }
        let dir = crate::temp_dir()?.keep();
        remove_at_exit(&dir);
        let registry = Self::start_in(&dir, None)?;
        Ok(SHARED.get_or_init(|| registry))
    }

    /// Starts a registry storing its blobs under `root`, which must exist.
    pub fn start_in_dir(root: &Path) -> anyhow::Result<Registry> {
        Self::start_in(root, None)
    }

    /// Starts a registry of its own that answers only requests carrying
    /// HTTP basic credentials `username`/`password` (the registry's
    /// `htpasswd` authentication; every other request gets 401).
    pub fn start_with_basic_auth(username: &str, password: &str) -> anyhow::Result<Registry> {
        let tempdir = crate::temp_dir()?;
        let root = tempdir.path().to_path_buf();
        let hash = bcrypt::hash(password, bcrypt::DEFAULT_COST)?;
        let htpasswd = root.join("htpasswd");
        std::fs::write(&htpasswd, format!("{username}:{hash}\n"))?;
        let auth = format!(
            "auth:\n  htpasswd:\n    realm: gkm-test\n    path: {}\n",
            htpasswd.display()
        );
        Self::start_with(&root, Some(tempdir), &auth, false)
    }

    fn start_in(root: &Path, tempdir: Option<tempfile::TempDir>) -> anyhow::Result<Registry> {
        Self::start_with(root, tempdir, "", false)
    }

    /// Starts a registry of its own that logs every request it answers
    /// (its access log), for tests that check which registry was asked
    /// for what ([`Registry::gets_since`], [`Registry::requests`]).
    pub fn start_logging_requests() -> anyhow::Result<Registry> {
        let tempdir = crate::temp_dir()?;
        let root = tempdir.path().to_path_buf();
        Self::start_with(&root, Some(tempdir), "", true)
    }

    /// How many requests it has answered (its access log's lines); empty
    /// unless started with [`Registry::start_logging_requests`].
    pub fn answered(&self) -> anyhow::Result<usize> {
        Ok(self.request_lines()?.len())
    }

    /// The GET request lines (`GET /v2/… HTTP/1.1`) of its access log
    /// after the first `since` requests ([`Registry::answered`]) whose path
    /// contains `needle`, for tests that check which registry was asked
    /// for what.
    pub fn gets_since(&self, since: usize, needle: &str) -> anyhow::Result<Vec<String>> {
        Ok(self
            .request_lines()?
            .into_iter()
            .skip(since)
            .filter(|r| r.starts_with("GET ") && r.contains(needle))
            .collect())
    }

    /// The request lines of its access log, in order.
    fn request_lines(&self) -> anyhow::Result<Vec<String>> {
        let log = std::fs::read_to_string(self.root.join("registry.log"))?;
        Ok(log
            .lines()
            .filter(|line| line.contains(" HTTP/1."))
            .filter_map(|line| line.split('"').nth(1))
            .map(str::to_string)
            .collect())
    }

    /// The registry's own record of repository `repo` (`team/name`): absent
    /// when nothing was ever pushed to it (not even an upload begun).
    pub fn repository_dir(&self, repo: &str) -> PathBuf {
        self.root
            .join("data/docker/registry/v2/repositories")
            .join(repo)
    }

    /// Where the registry keeps the bytes of blob `digest`
    /// (`sha256:<hex>`), for tests that make it serve other bytes.
    pub fn blob_data_path(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.root
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2.min(hex.len())])
            .join(hex)
            .join("data")
    }

    /// Starts the registry with `extra` appended to its configuration, and
    /// its access log on when `access_log`.
    fn start_with(
        root: &Path,
        tempdir: Option<tempfile::TempDir>,
        extra: &str,
        access_log: bool,
    ) -> anyhow::Result<Registry> {
        let binary = find_binary(Component::Registry)?;
        let port = free_port()?;
        let addr = format!("127.0.0.1:{port}");
        let config = root.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: {}\nstorage:\n  \
                 filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: \
                 {addr}\n{extra}",
                !access_log,
                root.join("data").display()
            ),
        )?;
        let mut cmd = Command::new(binary);
        cmd.arg("serve").arg(&config);
        let mut process = Process::spawn("registry", cmd, &root.join("registry.log"))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            process.check_running()?;
            if registry_answers(&addr) {
                break;
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "registry on {addr} did not answer /v2/ within 20s:\n{}",
                    process.log_tail(20)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Registry {
            process,
            addr,
            root: root.to_path_buf(),
            _tempdir: tempdir,
        })
    }

    /// `127.0.0.1:PORT`, the host part of image references.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The directory holding its config, data and log.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The registry process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The requests it served so far, in order, as `METHOD PATH` (`GET
    /// /v2/repo/manifests/sha256:…`): from its access log, so only a
    /// registry started by [`Registry::start_logging_requests`] has any.
    pub fn requests(&self) -> anyhow::Result<Vec<String>> {
        let log = std::fs::read_to_string(self.root.join("registry.log"))?;
        Ok(log.lines().filter_map(request_of).collect())
    }
}

/// The request of an access log line (`… "GET /v2/… HTTP/1.1" 200 …`), as
/// `METHOD PATH`; `None` for other lines.
fn request_of(line: &str) -> Option<String> {
    let request = line.split('"').nth(1)?;
    let mut parts = request.split(' ');
    let (method, path) = (parts.next()?, parts.next()?);
    let method_ok = matches!(method, "GET" | "HEAD" | "PUT" | "POST" | "PATCH" | "DELETE");
    (method_ok && path.starts_with("/v2/")).then(|| format!("{method} {path}"))
}

/// Whether `GET /v2/` answers 200 or 401 (a bare HTTP/1.0 request, no client needed).
fn registry_answers(addr: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /v2/ HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    // 401 is the answer of a registry that wants credentials: it is up.
    ["200", "401"].iter().any(|code| {
        response.starts_with(&format!("HTTP/1.0 {code}"))
            || response.starts_with(&format!("HTTP/1.1 {code}"))
    })
}
