//! `gkm verify`.
//!
//! Exit codes: 0 verified; 4 refused (the reason is printed); 1 error
//! (registry unreachable, unreadable key or trusted root).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use gkm_core::policy::{Identity, Mode, Policy, PublicKey, Signer, SubjectMatch, TrustedRoot};
use gkm_oci::verify::{VerifyError, verify};
use gkm_oci::{ImageRef, Repo};

use crate::image_args::{EXIT_REJECTED, RegistryArgs, finish, parse_ref};
use crate::progress::Bar;

/// Arguments of `gkm verify`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("signer").required(true).multiple(true).args(["key", "certificate_identity", "certificate_identity_regexp"])))]
pub struct Args {
    /// The image: `REGISTRY/REPO[:TAG|@DIGEST]` or `oci:PATH[:TAG]`; a tag
    /// is resolved to its digest, whose signatures are verified.
    #[arg(value_parser = parse_ref)]
    image: ImageRef,
    /// A PEM public key whose signature is accepted (repeatable).
    #[arg(long)]
    key: Vec<PathBuf>,
    /// The keyless certificate subject (email or URI) accepted.
    #[arg(
        long,
        requires = "certificate_oidc_issuer",
        conflicts_with = "certificate_identity_regexp"
    )]
    certificate_identity: Option<String>,
    /// A regular expression the whole keyless certificate subject must match.
    #[arg(long, requires = "certificate_oidc_issuer")]
    certificate_identity_regexp: Option<String>,
    /// The OIDC issuer the keyless certificate must name.
    #[arg(long)]
    certificate_oidc_issuer: Option<String>,
    /// The `trusted_root.json` with the certificate authorities for keyless
    /// signatures (never fetched from the internet).
    #[arg(long)]
    trusted_root: Option<PathBuf>,
    /// Accept keyless signatures without a verified transparency-log entry
    /// (refused by default: nothing then shows when they were made).
    #[arg(long)]
    allow_unlogged_keyless: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(crate) registry: RegistryArgs,
}

fn policy(args: &Args) -> anyhow::Result<Policy> {
    let mut signers = Vec::new();
    for path in &args.key {
        let pem =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        signers.push(Signer::Key(
            PublicKey::from_pem(&pem).with_context(|| format!("{}", path.display()))?,
        ));
    }
    let subject = match (
        &args.certificate_identity,
        &args.certificate_identity_regexp,
    ) {
        (Some(exact), _) => Some(SubjectMatch::Exact(exact.clone())),
        (None, Some(pattern)) => Some(SubjectMatch::regexp(pattern)?),
        (None, None) => None,
    };
    if let (Some(subject), Some(issuer)) = (subject, &args.certificate_oidc_issuer) {
        signers.push(Signer::Keyless(Identity::new(issuer, subject)?));
    }
    let trusted_root = match &args.trusted_root {
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            Some(TrustedRoot::from_json(&bytes).with_context(|| format!("{}", path.display()))?)
        }
        None => None,
    };
    let policy = Policy::new(Mode::Enforce, signers, trusted_root, false)?;
    Ok(if args.allow_unlogged_keyless {
        policy.allowing_unlogged_keyless()
    } else {
        policy
    })
}

/// Runs `gkm verify`.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let policy = policy(&args)?;
    let options = args.registry.options()?;
    let bar = Bar::start("verify", args.json);
    if let Some(bar) = &bar {
        bar.spin(&format!("resolving {}", args.image));
    }
    let digest = match Repo::open(&args.image, &options)?.fetch_manifest().await {
        Ok(m) => m.digest,
        Err(e) => return finish(e),
    };
    if let Some(bar) = &bar {
        bar.spin(&format!("verifying the signatures of {digest}"));
    }
    let outcome = verify(&args.image, &options, &digest, &policy).await;
    drop(bar);
    match outcome {
        Ok(verified) => {
            if args.json {
                let doc = serde_json::json!({"image": args.image.to_string(), "verified": true, "result": verified});
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                println!("Verified {}: {verified}", args.image);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(VerifyError::Rejected(why)) => {
            if args.json {
                let doc = serde_json::json!({
                    "image": args.image.to_string(),
                    "digest": digest,
                    "verified": false,
                    "rejection": why,
                    "message": why.to_string(),
                });
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                eprintln!("gkm: rejected {} ({digest}): {why}", args.image);
            }
            Ok(ExitCode::from(EXIT_REJECTED))
        }
        Err(VerifyError::Image(e)) => Err(e.into()),
        Err(e) => Err(e.into()),
    }
}
