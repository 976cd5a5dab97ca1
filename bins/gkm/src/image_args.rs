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

/// What a builder declares about a cache its tree does not state (`build`,
/// `capture`).
#[derive(clap::Args, Clone, Default)]
pub struct DeclaredArgs {
    /// Inductor and Mega-Cache: the torch version that compiled the cache
    /// (the tree does not state it), labelled `declared-torch-version`.
    #[arg(long, value_name = "VERSION")]
    torch_version: Option<String>,
    /// Inductor and Mega-Cache: the CPU ISA Inductor picked for the C++
    /// kernels (`amx_tile`, `avx512_vnni`, `avx512`, `avx2`, `asimd`,
    /// `neon`, `zvector`, `vsx`), labelled `declared-cpu-isa`.
    #[arg(long, value_name = "ISA")]
    cpu_isa: Option<String>,
    /// DeepGEMM: the directory of the `deep_gemm` package that compiled the
    /// cache (`python -c 'import deep_gemm, os;
    /// print(os.path.dirname(deep_gemm.__file__))'`), which every key
    /// names; each key is checked against it and the image labelled with
    /// it.
    #[arg(long, value_name = "DIR")]
    deepgemm_root: Option<String>,
    /// DeepGEMM: the CUDA_HOME it compiled with, which the keys of kernels
    /// NVRTC compiled name (default /usr/local/cuda).
    #[arg(long, value_name = "DIR")]
    cuda_home: Option<String>,
}

impl DeclaredArgs {
    /// What these flags declare.
    pub fn declared(&self) -> gkm_core::cache::Declared {
        gkm_core::cache::Declared {
            torch_version: self.torch_version.clone(),
            cpu_isa: self.cpu_isa.clone(),
            deepgemm_root: self.deepgemm_root.clone(),
            cuda_home: self.cuda_home.clone(),
        }
    }
}

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
