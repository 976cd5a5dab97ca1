//! `gkm check`.

use std::process::ExitCode;

/// Arguments of `gkm check`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `gkm check`.
pub async fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("gkm check is not built yet")
}
