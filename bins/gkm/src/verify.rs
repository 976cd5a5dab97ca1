//! `gkm verify`.

use std::process::ExitCode;

/// Arguments of `gkm verify`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `gkm verify`.
pub async fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("gkm verify is not built yet")
}
