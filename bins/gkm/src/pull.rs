//! `gkm pull`.

use std::path::PathBuf;
use std::process::ExitCode;

use gkm_oci::{ExtractPolicy, ImageRef, Repo, Store, copy_image};

use crate::image_args::{RegistryArgs, finish, parse_ref, progress};

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
    #[command(flatten)]
    registry: RegistryArgs,
}

/// Runs `gkm pull`; prints the image digest (and, with --store, its path).
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let options = args.registry.options()?;
    let src = Repo::open(&args.image, &options)?;
    if let Some(dest) = &args.destination {
        let dst = Repo::create(dest, &options)?;
        return match copy_image(&src, &dst, progress("pull")).await {
            Ok(digest) => {
                println!("{digest}");
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => finish(e),
        };
    }
    let Some(root) = args.store else {
        anyhow::bail!("give a destination or --store")
    };
    let store = Store::open(&root)?;
    match store
        .ensure(&src, &ExtractPolicy::default(), progress("pull"))
        .await
    {
        Ok(stored) => {
            println!("{} {}", stored.digest, stored.path.display());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => finish(e),
    }
}
