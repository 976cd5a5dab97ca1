//! `gkm crds`: print gkm's CustomResourceDefinitions.

use std::process::ExitCode;

/// Arguments of `gkm crds`.
#[derive(clap::Args)]
pub struct Args {
    /// Print a JSON array of the CRDs instead of a YAML stream.
    #[arg(long)]
    json: bool,
}

/// Prints every CRD as one multi-document YAML stream, or with `--json` as
/// one JSON array.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.json {
        crate::output::print(&gkm_k8s_api::crd::crds())?;
    } else {
        print!("{}", gkm_k8s_api::crd::crds_yaml()?);
    }
    Ok(ExitCode::SUCCESS)
}
