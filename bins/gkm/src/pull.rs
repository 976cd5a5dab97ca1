//! `gkm pull`.

use std::process::ExitCode;

/// Arguments of `gkm pull`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `gkm pull`.
pub async fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("gkm pull is not built yet")
}
