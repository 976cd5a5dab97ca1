//! The progress display: one bar on standard error while a long operation
//! runs, shown only when standard error is a terminal and `--json` is not
//! given. Log lines go through [`LogWriter`], which clears the bar while a
//! line is written so the two never interleave.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use gkm_oci::{Progress, Report};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Every bar is drawn through this, so log lines can suspend them all.
static BARS: LazyLock<MultiProgress> = LazyLock::new(|| {
    let target = if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr_with_hz(10)
    } else {
        ProgressDrawTarget::hidden()
    };
    MultiProgress::with_draw_target(target)
});

/// A step with a byte count: what, how far, how fast, how long left.
const BYTES: &str = "{spinner} {prefix}: {msg}\n  [{bar:30}] {bytes}/{total_bytes} \
    {binary_bytes_per_sec}, {eta} left";
/// A step without one.
const SPINNER: &str = "{spinner} {prefix}: {msg} ({elapsed})";

/// The style of `template` (one of the constants above, which parse).
fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
        .progress_chars("=> ")
}

/// The bar of one command; clears itself when finished or dropped.
pub struct Bar(ProgressBar);

impl Bar {
    /// A bar labelled `command`, or `None` when nothing is to be shown
    /// (`--json`, or standard error is not a terminal).
    pub fn start(command: &str, json: bool) -> Option<Arc<Bar>> {
        if json || !std::io::stderr().is_terminal() {
            return None;
        }
        // Styled before it is added: adding draws it.
        let bar = ProgressBar::no_length()
            .with_style(style(SPINNER))
            .with_prefix(command.to_string())
            .with_message("starting");
        let bar = BARS.add(bar);
        bar.enable_steady_tick(Duration::from_millis(100));
        Some(Arc::new(Bar(bar)))
    }

    /// Starts a step with no byte count (signing, verifying, syncing).
    pub fn spin(&self, name: &str) {
        self.step(name, None);
    }

    /// Removes the bar from the terminal.
    pub fn finish(&self) {
        self.0.finish_and_clear();
        let _ = BARS.clear();
    }
}

impl Report for Bar {
    fn step(&self, name: &str, total: Option<u64>) {
        self.0.set_message(name.to_string());
        self.0.set_length(total.unwrap_or(0));
        self.0.reset();
        self.0
            .set_style(style(if total.is_some() { BYTES } else { SPINNER }));
    }

    fn bytes(&self, done: u64) {
        self.0.set_position(done);
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The library's view of a bar.
pub fn hook(bar: &Option<Arc<Bar>>) -> Option<Progress> {
    bar.clone().map(|b| b as Progress)
}

/// Writes log lines to standard error with the bars cleared first and
/// redrawn after, for `tracing_subscriber`'s `with_writer`.
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        BARS.suspend(|| std::io::stderr().write(buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LogWriter
    }
}
