//! `gkm sign`.

use std::process::ExitCode;

/// Arguments of `gkm sign`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `gkm sign`.
pub async fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("gkm sign is not built yet")
}
