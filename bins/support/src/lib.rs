//! What gkm's binaries share, so each `main.rs` stays flag parsing and wiring.

pub mod daemon_args;
#[cfg(feature = "node-args")]
pub mod node_args;
pub mod shutdown;

use std::process::ExitCode;
use std::time::Duration;

/// Logs to stderr, filtered by `GKM_LOG` (default `default_level`), as JSON
/// lines when `json` is set.
pub fn init_logging(json: bool, default_level: &str) {
    init_logging_to(json, default_level, std::io::stderr);
}

/// [`init_logging`] through `writer` (one that clears a progress display
/// before each line, say) instead of plain stderr.
pub fn init_logging_to<W>(json: bool, default_level: &str, writer: W)
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    let filter = tracing_subscriber::EnvFilter::try_from_env("GKM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Parses a duration flag made of whole units: `90s`, `5m`, `1h30m`, `250ms`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(gkm_bin_support::duration("1h30m"), Ok(Duration::from_secs(5400)));
/// assert!(gkm_bin_support::duration("soon").is_err());
/// // Too large for a duration: an error, not a panic.
/// assert!(gkm_bin_support::duration("9999999999999999h").is_err());
/// ```
pub fn duration(text: &str) -> Result<Duration, String> {
    gkm_core::duration::parse_duration(text)
        .ok_or_else(|| format!("{text:?} is not a duration like 30s, 5m or 1h30m"))
}

/// The exit code for a daemon's outcome: failure after logging the error
/// (and printing it, for those who read stderr rather than logs).
pub fn exit_code(program: &str, outcome: anyhow::Result<()>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("{program}: {e:#}");
            ExitCode::FAILURE
        }
    }
}
