//! `gkm extract` (also the PVC fill job's command).

use std::path::PathBuf;
use std::process::ExitCode;

use gkm_oci::{
    ExtractPolicy, FreeSpaceReserve, Image, ImageRef, Repo, UnpackOptions, extract_to_dir,
};

use crate::image_args::{RegistryArgs, finish, parse_ref};
use crate::output;
use crate::progress::{Bar, hook};
use crate::variant::{self, VariantArgs};

/// Arguments of `gkm extract`.
#[derive(clap::Args)]
#[command(after_help = crate::image_args::EXIT_CODES_HELP)]
pub struct Args {
    /// The image: `REGISTRY/REPO[:TAG|@DIGEST]` or `oci:PATH[:TAG]`.
    #[arg(value_parser = parse_ref)]
    image: ImageRef,
    /// The directory to fill with the cache tree; must be missing or empty.
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    output: PathBuf,
    /// Do not flush the tree to disk before moving it into place.
    #[arg(long)]
    no_sync: bool,
    /// Accept hard links to extracted files and relative symbolic links that
    /// stay in the tree (refused by default).
    #[arg(long)]
    allow_links: bool,
    /// Refuse setuid/setgid/sticky bits instead of dropping them.
    #[arg(long)]
    reject_special_bits: bool,
    /// Largest single file, in bytes.
    #[arg(long, value_name = "BYTES")]
    max_entry_size: Option<u64>,
    /// Largest total of file sizes, in bytes.
    #[arg(long, value_name = "BYTES")]
    max_total_size: Option<u64>,
    /// Most entries.
    #[arg(long, value_name = "N")]
    max_entries: Option<u64>,
    /// Largest ratio of uncompressed to compressed size.
    #[arg(long, value_name = "N")]
    max_compression_ratio: Option<u64>,
    /// Most bytes the tree may take on disk (file data in whole 4 KiB
    /// blocks, one block per directory); extraction stops, keeping nothing,
    /// before it would take more. No cap by default.
    #[arg(long, value_name = "BYTES")]
    byte_budget: Option<u64>,
    /// Space to keep free on the output's filesystem: a percentage of it,
    /// bytes (with an optional KiB, MiB, GiB or TiB suffix) or both, as in
    /// 10%+1GiB (0 for none); extraction stops, keeping nothing, before
    /// less is free. None by default; on a node's own disk, 12% keeps the
    /// kubelet's default hard eviction threshold (nodefs.available<10%)
    /// plus a 2% margin free, as gkm's agent does.
    #[arg(long, value_name = "PERCENT|BYTES", value_parser = <FreeSpaceReserve as std::str::FromStr>::from_str,
          default_value_t = FreeSpaceReserve::default())]
    keep_free: FreeSpaceReserve,
    #[command(flatten)]
    variant: VariantArgs,
    /// Print the result as JSON (no progress display).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(crate) registry: RegistryArgs,
}

/// Runs `gkm extract`; prints the image digest.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let d = ExtractPolicy::default();
    let policy = ExtractPolicy {
        max_entry_size: args.max_entry_size.unwrap_or(d.max_entry_size),
        max_total_size: args.max_total_size.unwrap_or(d.max_total_size),
        max_entries: args.max_entries.unwrap_or(d.max_entries),
        max_compression_ratio: args
            .max_compression_ratio
            .unwrap_or(d.max_compression_ratio),
        byte_budget: args.byte_budget,
        free_space_reserve: args.keep_free,
        allow_in_tree_links: args.allow_links,
        reject_special_bits: args.reject_special_bits,
        ..d
    };
    let registry = args.registry.options()?;
    let mut repo = Repo::open(&args.image, &registry)?;
    let bar = Bar::start("extract", args.json);
    if let Some(bar) = &bar {
        bar.spin(&format!("fetching the manifest of {}", args.image));
    }
    let image = match Image::fetch(&repo).await {
        Ok(i) => i,
        Err(gkm_oci::Error::MultiTarget { .. }) => {
            let chosen = match variant::choose(&repo, &registry, &args.variant).await? {
                Ok(chosen) => chosen,
                Err(code) => return Ok(code),
            };
            eprintln!("{chosen}");
            repo = chosen.repo;
            match Image::fetch(&repo).await {
                Ok(i) => i,
                Err(e) => return finish(e),
            }
        }
        Err(e) => return finish(e),
    };
    let options = UnpackOptions {
        policy,
        no_sync: args.no_sync,
        progress: hook(&bar),
    };
    let result = extract_to_dir(&repo, &image, &args.output, &options).await;
    drop(options);
    drop(bar);
    match result {
        Ok(stats) if args.json => {
            output::print(&output::Extracted {
                image: args.image.to_string(),
                digest: image.digest.to_string(),
                output: args.output.display().to_string(),
                files: stats.files,
                bytes: stats.bytes,
                entries: stats.entries,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Ok(stats) => {
            eprintln!(
                "extracted {} to {}: {} files, {} bytes",
                args.image,
                args.output.display(),
                stats.files,
                stats.bytes
            );
            println!("{}", image.digest);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => finish(e),
    }
}
