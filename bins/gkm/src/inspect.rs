//! `gkm inspect`.

use std::process::ExitCode;

/// Arguments of `gkm inspect`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `gkm inspect`.
pub async fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("gkm inspect is not built yet")
}
