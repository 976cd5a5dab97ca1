//! `gkm build`.

use std::process::ExitCode;

/// Arguments of `gkm build`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `gkm build`.
pub async fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("gkm build is not built yet")
}
