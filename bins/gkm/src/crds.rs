//! `gkm crds`: print gkm's CustomResourceDefinitions.

use std::process::ExitCode;

/// Arguments of `gkm crds`.
#[derive(clap::Args)]
pub struct Args {}

/// Prints every CRD as one multi-document YAML stream.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    print!("{}", gkm_k8s::crd::crds_yaml()?);
    Ok(ExitCode::SUCCESS)
}
