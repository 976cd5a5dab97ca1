//! `gkm index`: assemble single-target images into one multi-target image.

use std::process::ExitCode;

use gkm_oci::{ImageRef, MultiTarget, assemble};

use crate::image_args::{EXIT_CODES_HELP, RegistryArgs, finish, parse_ref};
use crate::output;
use crate::progress::{Bar, hook};

/// Arguments of `gkm index`.
#[derive(clap::Args)]
#[command(after_help = EXIT_CODES_HELP)]
pub struct Args {
    /// The single-target cache images, one per variant, in the order a tie
    /// between variants is broken: `REGISTRY/REPO[:TAG|@DIGEST]` or
    /// `oci:PATH[:TAG]`.
    #[arg(value_parser = parse_ref, required = true)]
    images: Vec<ImageRef>,
    /// Where to write the index: `REGISTRY/REPO[:TAG]` or `oci:PATH[:TAG]`;
    /// each variant is copied into its repository, by digest.
    #[arg(short = 't', long = "tag", value_name = "REF", value_parser = parse_ref)]
    tag: ImageRef,
    /// The index's `org.opencontainers.image.title` annotation.
    #[arg(long)]
    title: Option<String>,
    /// Print the result as JSON (no progress display).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(crate) registry: RegistryArgs,
}

/// Runs `gkm index`; prints the index digest.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let options = args.registry.options()?;
    let bar = Bar::start("index", args.json);
    let result = assemble(
        &args.images,
        &args.tag,
        args.title.as_deref(),
        &options,
        hook(&bar),
    )
    .await;
    drop(bar);
    report(result, &args.tag, args.json)
}

/// Prints the multi-target image written under `tag` (as text or JSON), or
/// the error and its exit code: what `gkm index` and `gkm build` of several
/// caches end with.
pub(crate) fn report(
    result: gkm_oci::Result<MultiTarget>,
    tag: &ImageRef,
    json: bool,
) -> anyhow::Result<ExitCode> {
    match result {
        Ok(multi) => {
            output::Indexed::new(tag, &multi).print(json)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => finish(e),
    }
}
