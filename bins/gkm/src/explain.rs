//! `gkm explain`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use gkm_core::explain::{Explanation, explain_trees};
use gkm_oci::{ExtractPolicy, Image, ImageRef, Repo, UnpackOptions, extract_to_dir};

use crate::image_args::{RegistryArgs, finish};

/// Exit code: the workload's tree holds entries the cache lacks.
pub const EXIT_MISSED: u8 = 5;

/// Arguments of `gkm explain`.
#[derive(clap::Args)]
#[command(after_help = "Exit codes: 0 nothing missed, 1 error, 2 usage, \
    4 the image was refused as unsafe (extraction policy or digest mismatch), \
    5 the workload's tree holds entries the cache lacks.")]
pub struct Args {
    /// The tree the workload wrote: its cache directory, or a writable
    /// view's upper.
    tree: PathBuf,
    /// The delivered cache: an image (`REGISTRY/REPO[:TAG|@DIGEST]`,
    /// `oci:PATH[:TAG]`) or a cache directory.
    cache: String,
    /// Print the explanation as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(crate) registry: RegistryArgs,
}

/// Runs `gkm explain`: for each entry of the tree that the cache lacks,
/// the nearest cached entry of the same kernel and what differs in its key.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let local = !args.cache.starts_with(gkm_oci::reference::LAYOUT_PREFIX)
        && Path::new(&args.cache).is_dir();
    // The extracted image's directory lives until the explanation is made.
    let (delivered, _extracted) = if local {
        (PathBuf::from(&args.cache), None)
    } else {
        match extract(&args.cache, &args.registry).await? {
            Ok((dir, out)) => (out, Some(dir)),
            Err(code) => return Ok(code),
        }
    };
    let tree = args.tree.clone();
    let explanation =
        tokio::task::spawn_blocking(move || explain_trees(&delivered, &tree)).await??;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&explanation)?);
    } else {
        print_text(&explanation, &args.tree, &args.cache);
    }
    Ok(if explanation.misses.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_MISSED)
    })
}

/// Pulls the image `reference` names and extracts its cache into a
/// temporary directory: the directory and the cache's path in it, or the
/// exit code of a refused image.
async fn extract(
    reference: &str,
    registry: &RegistryArgs,
) -> anyhow::Result<Result<(tempfile::TempDir, PathBuf), ExitCode>> {
    let image: ImageRef = reference.parse()?;
    let registry = registry.options()?;
    let repo = Repo::open(&image, &registry)?;
    let fetched = match Image::fetch(&repo).await {
        Ok(fetched) => fetched,
        Err(e) => return finish(e).map(Err),
    };
    let dir = tempfile::tempdir().context("making a directory to extract the image in")?;
    let out = dir.path().join("cache");
    let options = UnpackOptions {
        policy: ExtractPolicy::default(),
        no_sync: true,
        progress: None,
    };
    match extract_to_dir(&repo, &fetched, &out, &options).await {
        Ok(_) => Ok(Ok((dir, out))),
        Err(e) => finish(e).map(Err),
    }
}

/// The explanation as text: a line per miss, its differences below it.
fn print_text(explanation: &Explanation, tree: &Path, cache: &str) {
    println!(
        "{}: {} entries, {} delivered by {cache}, {} missed",
        tree.display(),
        explanation.entries,
        explanation.delivered,
        explanation.misses.len()
    );
    for miss in &explanation.misses {
        println!("{} ({}): {}", miss.kernel, miss.key, miss.advice);
        if let Some(nearest) = &miss.nearest {
            for d in &nearest.differences {
                println!(
                    "  {}: {} here, {} in the cache ({})",
                    d.field, d.workload, d.delivered, nearest.key
                );
            }
        }
    }
}
