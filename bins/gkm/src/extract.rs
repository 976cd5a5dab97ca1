//! `gkm extract`.

use std::process::ExitCode;

/// Arguments of `gkm extract`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `gkm extract`.
pub async fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("gkm extract is not built yet")
}
