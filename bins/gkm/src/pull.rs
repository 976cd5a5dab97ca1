//! `gkm pull`.

use std::path::PathBuf;
use std::process::ExitCode;

use gkm_oci::{ExtractPolicy, ImageRef, Repo, Store, copy_image};

use crate::image_args::{RegistryArgs, finish, parse_ref};
use crate::output;
use crate::progress::{Bar, hook};
use crate::push::print_copied;
use crate::variant::{self, VariantArgs};

/// Arguments of `gkm pull`.
#[derive(clap::Args)]
#[command(after_help = crate::image_args::EXIT_CODES_HELP)]
#[command(group(clap::ArgGroup::new("into").required(true).args(["destination", "store"])))]
// A copy takes the whole index: choosing a variant is for --store.
#[command(group(clap::ArgGroup::new("choice").multiple(true).args(["variant", "gpus"]).conflicts_with("destination")))]
pub struct Args {
    /// The image, usually in a registry.
    #[arg(value_parser = parse_ref)]
    image: ImageRef,
    /// Copy it into this OCI layout (`oci:PATH[:TAG]`).
    #[arg(value_parser = parse_ref)]
    destination: Option<ImageRef>,
    /// Or pull and extract it into the node store at DIR
    /// (`DIR/sha256/<hex>`); a stored digest is not fetched again. Of a
    /// multi-target image, the variant this node's GPUs get is stored.
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
    #[command(flatten)]
    variant: VariantArgs,
    /// Print the result as JSON (no progress display).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(crate) registry: RegistryArgs,
}

/// Runs `gkm pull`; prints the image digest (and, with --store, its path;
/// of a multi-target image, the stored variant's digest and path).
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let options = args.registry.options()?;
    let src = Repo::open(&args.image, &options)?;
    let bar = Bar::start("pull", args.json);
    if let Some(dest) = &args.destination {
        let dst = Repo::create(dest, &options)?;
        let result = copy_image(&src, &dst, hook(&bar)).await;
        drop(bar);
        return match result {
            Ok(digest) => {
                print_copied(args.json, &args.image, dest, &digest)?;
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => finish(e),
        };
    }
    let Some(root) = args.store else {
        anyhow::bail!("give a destination or --store")
    };
    let store = Store::open(&root)?;
    let policy = ExtractPolicy::default();
    let mut result = store.ensure(&src, &policy, hook(&bar)).await;
    let mut chosen = None;
    if let Err(gkm_oci::Error::MultiTarget { .. }) = result {
        let variant = match variant::choose(&src, &options, &args.variant).await? {
            Ok(variant) => variant,
            Err(code) => return Ok(code),
        };
        result = store.ensure(&variant.repo, &policy, hook(&bar)).await;
        chosen = Some(variant);
    }
    drop(bar);
    let stored = match result {
        Ok(stored) => stored,
        Err(e) => return finish(e),
    };
    if args.json {
        output::print(&output::Stored {
            image: args.image.to_string(),
            digest: stored.digest.to_string(),
            path: stored.path.display().to_string(),
            extracted: stored.extracted.is_some(),
            index_digest: chosen.as_ref().map(|c| c.index.to_string()),
            variant: chosen.as_ref().map(|c| c.position),
        })?;
    } else {
        if let Some(chosen) = &chosen {
            eprintln!("stored {chosen}");
        }
        println!("{} {}", stored.digest, stored.path.display());
    }
    Ok(ExitCode::SUCCESS)
}
