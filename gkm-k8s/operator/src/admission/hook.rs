//! What a webhook of the admission server implements ([`AdmissionHook`]),
//! and the largest reviews a hook reads.

use std::future::Future;
use std::pin::Pin;

use serde_json::Value;

/// The largest AdmissionReview about a pod: its `object` and `oldObject`
/// (an update's) are each at most the apiserver's 1.5 MiB object limit,
/// with room for the envelope.
pub const POD_REVIEW_MAX_BYTES: usize = 7 << 19;

/// The largest AdmissionReview about a Binding (a few hundred bytes in
/// practice).
pub const BINDING_REVIEW_MAX_BYTES: usize = 64 << 10;

/// What a webhook's review gives: the AdmissionReview answering it, or
/// what is wrong with the request (answered `400`).
pub(crate) type ReviewFuture<'a> = Pin<Box<dyn Future<Output = Result<Value, String>> + Send + 'a>>;

/// One webhook of the admission server.
pub(crate) trait AdmissionHook: Send + Sync {
    /// The path the apiserver posts its AdmissionReviews to.
    fn path(&self) -> &'static str;

    /// The largest AdmissionReview body it reads; a larger one is answered
    /// `413` unread.
    fn max_body_bytes(&self) -> usize {
        POD_REVIEW_MAX_BYTES
    }

    /// The AdmissionReview answering the one in `body`, or what is wrong
    /// with it.
    fn review<'a>(&'a self, body: &'a [u8]) -> ReviewFuture<'a>;
}
