//! Container images for real nodes, written by the harness as OCI archives
//! (no registry on the internet is reachable) and imported into a node's
//! containerd with `ctr images import`.
//!
//! [`TestImage::busybox`] holds Debian's static busybox with its common
//! applets linked into `/bin`; [`TestImage::with_binary`] adds a dynamically
//! linked program with the shared libraries `ldd` names, for images of
//! gkm's own binaries.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::json;
use sha2::{Digest, Sha256};

/// Where Debian's `busybox-static` installs busybox.
pub const BUSYBOX: &str = "/bin/busybox";

/// The busybox applets linked into `/bin`.
const APPLETS: &[&str] = &[
    "sh",
    "ls",
    "cat",
    "echo",
    "sleep",
    "sha256sum",
    "find",
    "env",
    "test",
    "[",
    "grep",
    "wc",
    "head",
    "tail",
    "stat",
    "readlink",
    "true",
    "false",
    "mkdir",
    "mount",
    "ps",
    "id",
    "sort",
    "touch",
    "rm",
    "cp",
    "tr",
    "cut",
    "xargs",
    "printf",
    "date",
    "df",
    "du",
];

/// One entry of an image's single layer.
#[derive(Debug, Clone)]
enum Entry {
    Dir(u32),
    File { contents: Vec<u8>, mode: u32 },
    Symlink(String),
}

/// A single-layer image under one or more names.
#[derive(Debug, Clone)]
pub struct TestImage {
    names: Vec<String>,
    entries: BTreeMap<String, Entry>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    env: Vec<String>,
    user: Option<String>,
}

impl TestImage {
    /// An empty image named `names` (`registry/repository:tag`).
    pub fn new(names: &[&str]) -> TestImage {
        let mut image = TestImage {
            names: names.iter().map(|n| n.to_string()).collect(),
            entries: BTreeMap::new(),
            entrypoint: Vec::new(),
            cmd: Vec::new(),
            env: vec!["PATH=/bin:/usr/bin:/usr/local/bin".to_string()],
            user: None,
        };
        for dir in [
            "bin", "dev", "etc", "proc", "sys", "usr", "usr/bin", "var", "run",
        ] {
            image.entries.insert(dir.to_string(), Entry::Dir(0o755));
        }
        image.entries.insert("tmp".to_string(), Entry::Dir(0o1777));
        image = image.with_contents(
            "etc/passwd",
            b"root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n".to_vec(),
            0o644,
        );
        image.with_contents(
            "etc/group",
            b"root:x:0:\nnogroup:x:65534:\n".to_vec(),
            0o644,
        )
    }

    /// Static busybox with its applets in `/bin`, running `sleep` by default
    /// (so the same image serves as the pod sandbox's pause image).
    pub fn busybox(names: &[&str]) -> anyhow::Result<TestImage> {
        let busybox = std::fs::read(BUSYBOX).with_context(|| {
            format!("reading {BUSYBOX}: install Debian's busybox-static with `hack/ci/components.sh debian`")
        })?;
        let mut image = TestImage::new(names).with_contents("bin/busybox", busybox, 0o755);
        for applet in APPLETS {
            image.entries.insert(
                format!("bin/{applet}"),
                Entry::Symlink("busybox".to_string()),
            );
        }
        image.cmd = vec!["/bin/sleep".into(), "2147483647".into()];
        Ok(image)
    }

    /// Adds a file with `contents` at `path` (relative to `/`).
    pub fn with_contents(mut self, path: &str, contents: Vec<u8>, mode: u32) -> TestImage {
        let path = path.trim_start_matches('/').to_string();
        self.add_parents(&path);
        self.entries.insert(path, Entry::File { contents, mode });
        self
    }

    /// Adds the host file `host` at `path`, with its mode.
    pub fn with_file(self, path: &str, host: &Path) -> anyhow::Result<TestImage> {
        use std::os::unix::fs::PermissionsExt;
        let contents =
            std::fs::read(host).with_context(|| format!("reading {}", host.display()))?;
        let mode = std::fs::metadata(host)?.permissions().mode() & 0o7777;
        Ok(self.with_contents(path, contents, mode))
    }

    /// Adds the program `host` at `path` with every shared library `ldd`
    /// lists for it, at their host paths.
    pub fn with_binary(mut self, path: &str, host: &Path) -> anyhow::Result<TestImage> {
        self = self.with_file(path, host)?;
        for lib in shared_libraries(host)? {
            let target = std::fs::canonicalize(&lib)?;
            let in_image = lib.display().to_string();
            if target != lib {
                let resolved = target.display().to_string();
                self = self.with_file(&resolved, &target)?;
                self.add_parents(in_image.trim_start_matches('/'));
                self.entries.insert(
                    in_image.trim_start_matches('/').to_string(),
                    Entry::Symlink(resolved),
                );
            } else {
                self = self.with_file(&in_image, &lib)?;
            }
        }
        Ok(self)
    }

    /// Sets the entrypoint.
    pub fn with_entrypoint(mut self, entrypoint: &[&str]) -> TestImage {
        self.entrypoint = entrypoint.iter().map(|s| s.to_string()).collect();
        self.cmd.clear();
        self
    }

    /// Sets the user the image runs as (`uid[:gid]`).
    pub fn with_user(mut self, user: &str) -> TestImage {
        self.user = Some(user.to_string());
        self
    }

    fn add_parents(&mut self, path: &str) {
        let mut parent = Path::new(path).parent();
        while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
            self.entries
                .entry(dir.display().to_string())
                .or_insert(Entry::Dir(0o755));
            parent = dir.parent();
        }
    }

    /// The image's names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Writes the image as an OCI archive (a tar of an OCI image layout) at
    /// `path`, each name recorded as `io.containerd.image.name`.
    pub fn write_archive(&self, path: &Path) -> anyhow::Result<()> {
        let layer = self.layer()?;
        let layer_digest = sha256(&layer);
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        let mut config = json!({
            "architecture": arch,
            "os": "linux",
            "config": {"Env": self.env},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        });
        if !self.entrypoint.is_empty() {
            config["config"]["Entrypoint"] = json!(self.entrypoint);
        }
        if !self.cmd.is_empty() {
            config["config"]["Cmd"] = json!(self.cmd);
        }
        if let Some(user) = &self.user {
            config["config"]["User"] = json!(user);
        }
        let config = serde_json::to_vec(&config)?;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": sha256(&config),
                "size": config.len(),
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": layer.len(),
            }],
        }))?;
        let manifests: Vec<_> = self
            .names
            .iter()
            .map(|name| {
                json!({
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": sha256(&manifest),
                    "size": manifest.len(),
                    "platform": {"architecture": arch, "os": "linux"},
                    "annotations": {"io.containerd.image.name": name},
                })
            })
            .collect();
        let index = serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": manifests}))?;

        let file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut archive = tar::Builder::new(file);
        append(
            &mut archive,
            "oci-layout",
            br#"{"imageLayoutVersion":"1.0.0"}"#,
            0o644,
        )?;
        append(&mut archive, "index.json", &index, 0o644)?;
        for blob in [&layer, &config, &manifest] {
            let name = format!("blobs/sha256/{}", &sha256(blob)["sha256:".len()..]);
            append(&mut archive, &name, blob, 0o644)?;
        }
        archive.into_inner()?;
        Ok(())
    }

    /// The layer: a deterministic tar of the entries.
    fn layer(&self) -> anyhow::Result<Vec<u8>> {
        let mut layer = tar::Builder::new(Vec::new());
        for (path, entry) in &self.entries {
            let mut header = tar::Header::new_gnu();
            header.set_mtime(0);
            header.set_uid(0);
            header.set_gid(0);
            match entry {
                Entry::Dir(mode) => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(*mode);
                    header.set_size(0);
                    layer.append_data(&mut header, format!("{path}/"), std::io::empty())?;
                }
                Entry::File { contents, mode } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_size(contents.len() as u64);
                    layer.append_data(&mut header, path, contents.as_slice())?;
                }
                Entry::Symlink(target) => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    layer.append_link(&mut header, path, target)?;
                }
            }
        }
        Ok(layer.into_inner()?)
    }
}

fn append(
    archive: &mut tar::Builder<std::fs::File>,
    name: &str,
    data: &[u8],
    mode: u32,
) -> anyhow::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_mode(mode);
    header.set_size(data.len() as u64);
    header.set_mtime(0);
    archive.append_data(&mut header, name, data)?;
    Ok(())
}

fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// The shared libraries `ldd` lists for `program` (absolute paths,
/// the dynamic loader included); none for a static program.
fn shared_libraries(program: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(program)
        .output()
        .with_context(|| "running ldd (Debian package libc-bin)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        if text.contains("not a dynamic executable")
            || String::from_utf8_lossy(&out.stderr).contains("not a dynamic executable")
        {
            return Ok(Vec::new());
        }
        bail!(
            "ldd {} failed: {}",
            program.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x…)"
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}
