//! `gkm push`.

use std::process::ExitCode;

use gkm_oci::{ImageRef, Repo, copy_image};

use crate::image_args::{EXIT_CODES_HELP, RegistryArgs, finish, parse_ref, progress};

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
    #[command(flatten)]
    registry: RegistryArgs,
}

/// Runs `gkm push`: copies the image byte for byte and prints its digest.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let options = args.registry.options()?;
    let src = Repo::open(&args.source, &options)?;
    let dst = Repo::create(&args.destination, &options)?;
    match copy_image(&src, &dst, progress("push")).await {
        Ok(digest) => {
            println!("{digest}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => finish(e),
    }
}
