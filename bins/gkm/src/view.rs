//! `gkm view`: lay a writable view of a read-only cache tree into a
//! directory the workload writes (an init container's step).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use serde::Serialize;

/// Arguments of `gkm view`.
#[derive(clap::Args)]
pub struct Args {
    /// The read-only tree (an image volume's `io.triton.cache`, a claim).
    from: PathBuf,
    /// The directory to lay the view into (an `emptyDir`).
    into: PathBuf,
    /// The path the workload sees INTO at (its `TRITON_CACHE_DIR`);
    /// default INTO.
    #[arg(long, value_name = "PATH")]
    mount_path: Option<PathBuf>,
    /// Print what was laid as JSON.
    #[arg(long)]
    json: bool,
}

/// `gkm view --json`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Viewed {
    /// The tree the view shows.
    tree: PathBuf,
    /// The view's directory.
    into: PathBuf,
    /// Where the tree was built, if it holds group files.
    built_at: Option<PathBuf>,
    /// The path the view's group files name.
    mount_path: PathBuf,
    /// Directories made.
    dirs: u64,
    /// Files linked to the tree's.
    links: u64,
    /// Group files written for the mount path.
    groups: u64,
    /// How long it took.
    millis: u128,
}

/// Lays the view and says what it holds.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let stats = gkm_core::view::lay_view(&args.from, &args.into, args.mount_path.as_deref())?;
    let millis = started.elapsed().as_millis();
    if args.json {
        crate::output::print(&Viewed {
            tree: stats.tree,
            into: args.into,
            built_at: stats.built_at,
            mount_path: stats.mount_path,
            dirs: stats.dirs,
            links: stats.links,
            groups: stats.groups,
            millis,
        })?;
        return Ok(ExitCode::SUCCESS);
    }
    let built = match &stats.built_at {
        Some(built) if *built != stats.mount_path => format!(
            ", {} group files relocated from {} to {}",
            stats.groups,
            built.display(),
            stats.mount_path.display()
        ),
        Some(_) => format!(", built at {}", stats.mount_path.display()),
        None => ", no group files".to_string(),
    };
    println!(
        "Laid a view of {} into {}: {} directories, {} files linked{built} in {millis} ms",
        stats.tree.display(),
        args.into.display(),
        stats.dirs,
        stats.links,
    );
    Ok(ExitCode::SUCCESS)
}
