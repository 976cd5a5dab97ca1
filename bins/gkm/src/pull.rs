//! `gkm pull`.

use std::path::PathBuf;
use std::process::ExitCode;

use gkm_oci::{ExtractPolicy, ImageRef, Repo, Store, copy_image};

use crate::image_args::{RegistryArgs, finish, parse_ref};
use crate::output;
use crate::progress::{Bar, hook};
use crate::push::print_copied;

/// Arguments of `gkm pull`.
#[derive(clap::Args)]
#[command(after_help = crate::image_args::EXIT_CODES_HELP)]
#[command(group(clap::ArgGroup::new("into").required(true).args(["destination", "store"])))]
pub struct Args {
    /// The image, usually in a registry.
    #[arg(value_parser = parse_ref)]
    image: ImageRef,
    /// Copy it into this OCI layout (`oci:PATH[:TAG]`).
    #[arg(value_parser = parse_ref)]
    destination: Option<ImageRef>,
    /// Or pull and extract it into the node store at DIR
    /// (`DIR/sha256/<hex>`); a stored digest is not fetched again.
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
    /// Print the result as JSON (no progress display).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(crate) registry: RegistryArgs,
}

/// Runs `gkm pull`; prints the image digest (and, with --store, its path).
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
    let result = store
        .ensure(&src, &ExtractPolicy::default(), hook(&bar))
        .await;
    drop(bar);
    match result {
        Ok(stored) if args.json => {
            output::print(&output::Stored {
                image: args.image.to_string(),
                digest: stored.digest.to_string(),
                path: stored.path.display().to_string(),
                extracted: stored.extracted.is_some(),
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Ok(stored) => {
            println!("{} {}", stored.digest, stored.path.display());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => finish(e),
    }
}
