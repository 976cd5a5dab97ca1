//! `gkm push`.

use std::process::ExitCode;

use gkm_oci::{ImageRef, Repo, copy_image};

use crate::image_args::{EXIT_CODES_HELP, RegistryArgs, finish, parse_ref};
use crate::output;
use crate::progress::{Bar, hook};

/// Arguments of `gkm push`.
#[derive(clap::Args)]
#[command(after_help = EXIT_CODES_HELP)]
pub struct Args {
    /// The image to send, usually an OCI layout (`oci:PATH[:TAG]`).
    #[arg(value_parser = parse_ref)]
    source: ImageRef,
    /// Where to send it, usually a registry (`REGISTRY/REPO[:TAG]`).
    #[arg(value_parser = parse_ref)]
    destination: ImageRef,
    /// Print the result as JSON (no progress display).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(crate) registry: RegistryArgs,
}

/// Runs `gkm push`: copies the image byte for byte and prints its digest.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let options = args.registry.options()?;
    let src = Repo::open(&args.source, &options)?;
    let dst = Repo::create(&args.destination, &options)?;
    let bar = Bar::start("push", args.json);
    let result = copy_image(&src, &dst, hook(&bar)).await;
    drop(bar);
    match result {
        Ok(digest) => {
            print_copied(args.json, &args.source, &args.destination, &digest)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => finish(e),
    }
}

/// Prints the outcome of a copy: the digest, or with `json` the whole
/// [`output::Copied`] document.
pub fn print_copied(
    json: bool,
    source: &ImageRef,
    destination: &ImageRef,
    digest: &gkm_oci::Digest,
) -> anyhow::Result<()> {
    if json {
        output::print(&output::Copied {
            source: source.to_string(),
            destination: destination.to_string(),
            digest: digest.to_string(),
        })
    } else {
        println!("{digest}");
        Ok(())
    }
}
