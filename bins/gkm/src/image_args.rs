//! The flags and exit codes shared by the image commands
//! (`build`, `push`, `pull`, `inspect`, `check`, `extract`, `sign`, `verify`).
//!
//! Exit codes: 0 success; 1 error (I/O, registry, not found, bad input);
//! 2 usage; 3 the cache fits none of the GPUs (`check`; `extract` and
//! `pull --store` of a multi-target image); 4 the image was
//! refused as unsafe (extraction policy or digest mismatch).

use std::io::Read;
use std::process::ExitCode;

use anyhow::Context;
use gkm_oci::mirrors::HostsConfig;
use gkm_oci::{Credentials, ImageRef, RegistryOptions};

/// The exit codes, for `--help`.
pub const EXIT_CODES_HELP: &str = "Exit codes: 0 success, 1 error, 2 usage, \
    3 the cache fits none of the GPUs (check, extract, pull --store), 4 the image was refused as unsafe \
    (extraction policy or digest mismatch).";

/// Exit code: the cache fits none of the GPUs.
pub const EXIT_INCOMPATIBLE: u8 = 3;
/// Exit code: the image was refused as unsafe.
pub const EXIT_REJECTED: u8 = 4;

/// Registry flags.
#[derive(clap::Args, Clone, Default)]
pub struct RegistryArgs {
    /// Speak plain HTTP to the registry instead of HTTPS.
    #[arg(long)]
    pub insecure: bool,
    /// Registry user name; the password is read from standard input
    /// (--password-stdin). Without it, ~/.docker/config.json
    /// ($DOCKER_CONFIG/config.json) is used.
    #[arg(long, requires = "password_stdin")]
    pub username: Option<String>,
    /// Read the registry password from standard input.
    #[arg(long, requires = "username")]
    pub password_stdin: bool,
    /// Read through registry mirrors: a directory of containerd-style
    /// host files (DIR/REGISTRY/hosts.toml, such as /etc/containerd/certs.d).
    /// Content read from a mirror is checked against its digest.
    #[arg(long, value_name = "DIR")]
    pub registry_config_dir: Option<std::path::PathBuf>,
}

impl RegistryArgs {
    /// The registry options these flags ask for.
    pub fn options(&self) -> anyhow::Result<RegistryOptions> {
        let credentials = match &self.username {
            Some(username) => {
                let mut password = String::new();
                std::io::stdin()
                    .read_to_string(&mut password)
                    .context("reading the password from standard input")?;
                let password = password.trim_end_matches(['\n', '\r']).to_string();
                Credentials::Basic {
                    username: username.clone(),
                    password,
                }
            }
            None => Credentials::DockerConfig,
        };
        let hosts = self
            .registry_config_dir
            .clone()
            .map_or(HostsConfig::None, HostsConfig::Dir);
        Ok(RegistryOptions {
            insecure: self.insecure,
            credentials,
            hosts,
        })
    }
}

/// Parse an image reference flag.
pub fn parse_ref(s: &str) -> Result<ImageRef, String> {
    s.parse::<ImageRef>().map_err(|e| e.to_string())
}

/// Report an error: refusals get their own exit code, the rest go to main
/// (exit code 1).
pub fn finish(err: gkm_oci::Error) -> anyhow::Result<ExitCode> {
    match err {
        gkm_oci::Error::Rejected(_) | gkm_oci::Error::DigestMismatch { .. } => {
            eprintln!("gkm: rejected: {err}");
            Ok(ExitCode::from(EXIT_REJECTED))
        }
        other => Err(other.into()),
    }
}

/// The multi-target image `repo` names (after [`gkm_oci::Image::fetch`]
/// said it is one), its variants' targets complete.
pub async fn multi_target(
    repo: &gkm_oci::Repo,
    registry: &RegistryOptions,
) -> Result<gkm_oci::MultiTarget, gkm_oci::Error> {
    let raw = repo.fetch_manifest().await?;
    let mut multi = gkm_oci::MultiTarget::parse(&raw)?.ok_or_else(|| gkm_oci::Error::Format {
        what: repo.image().to_string(),
        reason: "no longer a multi-target image (its tag moved)".into(),
    })?;
    multi.complete(repo.image(), registry).await?;
    Ok(multi)
}
