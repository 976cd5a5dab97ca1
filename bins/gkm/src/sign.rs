//! `gkm sign`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use gkm_oci::sign::{SignFormat, SigningKey, sign};
use gkm_oci::{ImageRef, Repo};

use crate::image_args::{RegistryArgs, finish, parse_ref};
use crate::output;
use crate::progress::Bar;

/// The signature format to write.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default)]
pub enum FormatArg {
    /// cosign v2: the `sha256-<hex>.sig` tag.
    V2,
    /// A sigstore bundle attached as an OCI 1.1 referrer (cosign v3).
    #[default]
    V3,
}

/// The signing key flags (`gkm sign`, `gkm capture`).
#[derive(clap::Args)]
pub struct KeyArgs {
    /// The private key: cosign's encrypted key (`cosign generate-key-pair`)
    /// or an unencrypted PKCS#8 PEM (ECDSA P-256/P-384, Ed25519, RSA).
    #[arg(long)]
    key: PathBuf,
    /// The password of an encrypted key.
    #[arg(
        long,
        env = "COSIGN_PASSWORD",
        hide_env_values = true,
        default_value = ""
    )]
    password: String,
}

impl KeyArgs {
    /// Reads and decrypts the key.
    pub fn load(&self) -> anyhow::Result<SigningKey> {
        let pem = std::fs::read_to_string(&self.key)
            .with_context(|| format!("reading {}", self.key.display()))?;
        SigningKey::from_pem(&pem, self.password.as_bytes())
            .with_context(|| format!("reading the private key {}", self.key.display()))
    }
}

impl FormatArg {
    /// The library's format.
    pub fn format(self) -> SignFormat {
        match self {
            FormatArg::V2 => SignFormat::CosignV2,
            FormatArg::V3 => SignFormat::Bundle,
        }
    }
}

/// Arguments of `gkm sign`.
#[derive(clap::Args)]
pub struct Args {
    /// The image: `REGISTRY/REPO[:TAG|@DIGEST]` or `oci:PATH[:TAG]`; a tag
    /// is resolved to its digest, which is what gets signed.
    #[arg(value_parser = parse_ref)]
    image: ImageRef,
    #[command(flatten)]
    key: KeyArgs,
    /// The signature format.
    #[arg(long, value_enum, default_value_t)]
    format: FormatArg,
    /// Print the result as JSON (no progress display).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(crate) registry: RegistryArgs,
}

/// Runs `gkm sign`.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let key = args.key.load()?;
    let options = args.registry.options()?;
    let bar = Bar::start("sign", args.json);
    if let Some(bar) = &bar {
        bar.spin(&format!("resolving {}", args.image));
    }
    let digest = match Repo::open(&args.image, &options)?.fetch_manifest().await {
        Ok(m) => m.digest,
        Err(e) => return finish(e),
    };
    let format = args.format.format();
    let format_name = match args.format {
        FormatArg::V2 => "v2",
        FormatArg::V3 => "v3",
    };
    if let Some(bar) = &bar {
        bar.spin(&format!("signing {digest}"));
    }
    let signed = sign(&args.image, &options, &digest, &key, format).await;
    drop(bar);
    let signed = signed?;
    let public = key.public_key();
    if args.json {
        output::print(&output::Signed {
            image: args.image.to_string(),
            digest: signed.digest.to_string(),
            format: format_name.into(),
            algorithm: public.algorithm().to_string(),
            fingerprint: public.fingerprint().to_string(),
            signature: signed.location,
        })?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "Signed {} with {} key {}",
        signed.digest,
        public.algorithm(),
        public.fingerprint()
    );
    println!("Signature: {}", signed.location);
    Ok(ExitCode::SUCCESS)
}
