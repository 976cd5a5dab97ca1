//! `gkm view`: lay a writable view of a read-only cache tree into a
//! directory the workload writes (an init container's step).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

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
}

/// Lays the view and says what it holds.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let stats = gkm_core::view::lay_view(&args.from, &args.into, args.mount_path.as_deref())?;
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
        "Laid a view of {} into {}: {} directories, {} files linked{built} in {} ms",
        stats.tree.display(),
        args.into.display(),
        stats.dirs,
        stats.links,
        started.elapsed().as_millis()
    );
    Ok(ExitCode::SUCCESS)
}
