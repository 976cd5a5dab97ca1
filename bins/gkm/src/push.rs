//! `gkm push`.

use std::process::ExitCode;

/// Arguments of `gkm push`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `gkm push`.
pub async fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("gkm push is not built yet")
}
