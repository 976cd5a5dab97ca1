//! Which variant of a multi-target image the commands that take one image
//! onto this machine (`gkm extract`, `gkm pull --store`) take: the one this
//! machine's GPUs get (or those of a simulated inventory), or one named by
//! digest. The choice itself is [`gkm_oci::MultiTarget::choose`]'s.

use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use gkm_oci::{Digest, MultiTarget, RegistryOptions, Repo};

use crate::image_args::{EXIT_INCOMPATIBLE, finish, multi_target};

/// The flags choosing the variant of a multi-target image.
#[derive(clap::Args, Clone, Default)]
pub struct VariantArgs {
    /// Of a multi-target image, take this variant (its manifest digest)
    /// instead of the one this node's GPUs get.
    #[arg(long, value_name = "DIGEST")]
    pub variant: Option<Digest>,
    /// Of a multi-target image, take the variant the GPUs of this
    /// simulated inventory file get (YAML or JSON, as `gkm gpus --json`
    /// prints) instead of this node's.
    #[arg(long, value_name = "FILE", conflicts_with = "variant")]
    pub gpus: Option<PathBuf>,
}

/// The variant taken of a multi-target image.
pub struct Chosen {
    /// The variant's repository, pinned to its digest.
    pub repo: Repo,
    /// The index digest (what is signed).
    pub index: Digest,
    /// The variant's position in the index.
    pub position: usize,
    /// The variant's manifest digest.
    pub digest: Digest,
    /// Why this variant: the choice's reason, or that it was named.
    pub reason: String,
}

impl fmt::Display for Chosen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "variant {} {}: {}",
            self.position, self.digest, self.reason
        )
    }
}

/// The variant to take of the multi-target image `repo` names (after
/// [`gkm_oci::Image::fetch`] said it is one): `args.variant` when given (it
/// must be listed), else the one the GPUs get (this node's, or those of the
/// `args.gpus` inventory file).
///
/// `Ok(Err(code))` is the exit code to end with at once: when no variant
/// fits the GPUs (each variant and why is said on standard error), or when
/// reading the index was refused.
pub async fn choose(
    repo: &Repo,
    registry: &RegistryOptions,
    args: &VariantArgs,
) -> anyhow::Result<Result<Chosen, ExitCode>> {
    let multi = match multi_target(repo, registry).await {
        Ok(multi) => multi,
        Err(e) => return finish(e).map(Err),
    };
    let (position, reason) = match &args.variant {
        Some(wanted) => {
            let position = multi
                .variants
                .iter()
                .position(|v| &v.digest == wanted)
                .with_context(|| {
                    format!(
                        "--variant {wanted}: not a variant of index {}; its variants: {}",
                        multi.digest(),
                        listed(&multi).join(", ")
                    )
                })?;
            (position, "named with --variant".to_string())
        }
        None => {
            let opts = gkm_gpu::DiscoveryOptions {
                simulate: args.gpus.clone(),
                ..Default::default()
            };
            let inventory = tokio::task::spawn_blocking(move || gkm_gpu::discover(&opts))
                .await
                .context("GPU discovery stopped")??;
            let choice = multi.choose(&inventory.gpus, &Default::default());
            let Some(position) = choice.chosen else {
                eprintln!("gkm: incompatible: {choice}");
                eprintln!("variants of index {}:", multi.digest());
                for line in listed(&multi) {
                    eprintln!("  {line}");
                }
                return Ok(Err(ExitCode::from(EXIT_INCOMPATIBLE)));
            };
            (position, choice.to_string())
        }
    };
    let digest = multi.variants[position].digest.clone();
    Ok(Ok(Chosen {
        repo: Repo::open(&repo.image().with_digest(&digest), registry)?,
        index: multi.digest().clone(),
        position,
        digest,
        reason,
    }))
}

/// Each variant of `multi`: its position, digest and targets.
fn listed(multi: &MultiTarget) -> Vec<String> {
    multi
        .variants
        .iter()
        .enumerate()
        .map(|(v, variant)| format!("variant {v} {} ({})", variant.digest, variant.summary()))
        .collect()
}
