//! Why gkm refuses what someone asked of it, in words for them.

use std::fmt;

/// Why gkm refuses a request (a pod on a node, a pod in a namespace), as
/// a sentence for the person who made it: it ends up in a pod's events or
/// an admission denial, so it names what stands in the way.
///
/// ```
/// use gkm_core::Refusal;
/// let refusal = Refusal::new("gkm: 0 of 2 nvidia.com/gpu free, the pod asks 1");
/// assert_eq!(refusal.to_string(), "gkm: 0 of 2 nvidia.com/gpu free, the pod asks 1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(String);

impl Refusal {
    /// A refusal for `reason`.
    pub fn new(reason: impl Into<String>) -> Self {
        Refusal(reason.into())
    }

    /// The reason, as it is shown.
    pub fn reason(&self) -> &str {
        &self.0
    }

    /// The reason, owned.
    pub fn into_reason(self) -> String {
        self.0
    }
}

impl From<String> for Refusal {
    fn from(reason: String) -> Self {
        Refusal(reason)
    }
}

impl From<&str> for Refusal {
    fn from(reason: &str) -> Self {
        Refusal(reason.to_string())
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refusal {}
