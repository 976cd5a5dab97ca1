//! Progress of long operations (build, push, pull, extract).
//!
//! The library never prints. Each long operation takes an optional
//! [`Progress`] and tells it which step it is in and how many bytes of that
//! step are done; the caller decides what to show (a terminal bar, a log
//! line, nothing).

use std::sync::Arc;

/// Receives the progress of a long operation. Both methods default to doing
/// nothing, so a receiver implements only what it shows.
///
/// Calls come from whichever thread does the work (often a blocking
/// thread), many times a second: implementations must be cheap.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use gkm_oci::progress::{Progress, Report};
///
/// #[derive(Default)]
/// struct Bytes(AtomicU64);
/// impl Report for Bytes {
///     fn bytes(&self, done: u64) {
///         self.0.store(done, Ordering::Relaxed);
///     }
/// }
/// let seen = Arc::new(Bytes::default());
/// let progress: Progress = seen.clone();
/// progress.step("extracting", Some(10));
/// progress.bytes(4);
/// assert_eq!(seen.0.load(Ordering::Relaxed), 4);
/// ```
pub trait Report: Send + Sync {
    /// A new step begins: `name` says what it does ("fetching and
    /// extracting the layer"), `total` is the bytes it will handle when
    /// known (`None` for steps without a byte count, such as syncing).
    fn step(&self, name: &str, total: Option<u64>) {
        let _ = (name, total);
    }

    /// `done` bytes of the current step are finished: a running total that
    /// starts again at 0 with each step.
    fn bytes(&self, done: u64) {
        let _ = done;
    }
}

/// A progress receiver as the long operations take it (`None` for none).
pub type Progress = Arc<dyn Report>;

/// Tell `progress`, when there is one, that step `name` begins.
pub(crate) fn step(progress: Option<&Progress>, name: &str, total: Option<u64>) {
    if let Some(p) = progress {
        p.step(name, total);
    }
}
