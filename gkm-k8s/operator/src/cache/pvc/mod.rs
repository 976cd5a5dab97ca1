//! PVC delivery, one of the cache controller's delivery modes: a
//! `GKMCache` or `ClusterGKMCache` with
//! `storageClassName` gets claims named like it, filled by Jobs that run
//! gkm's own extractor on the digest the operator verified.
//!
//! - `plan`: which claims, volumes and Jobs should exist (pure).
//! - `objects`: their server-side apply bodies (pure).
//! - `apply`: the glue that applies, prunes, observes and removes them.
//! - `watch`: the glue that watches what `apply` reads, and triggers the
//!   caches its changes concern; `facts` says what it keeps of each object
//!   in a [`gkm_k8s_runtime::watched_index`].
//! - `fill`: what a fill Job's container runs.
//! - `layout`: how a claim holds its trees so a refill switches atomically.
//!
//! The `gkm.io/pvc-mutation` pod webhook pointing pods at their node's
//! claim is in `crate::admission`.

mod apply;
mod facts;
mod fill;
mod layout;
pub mod objects;
pub mod plan;
mod status;
mod watch;

pub use apply::{
    ClaimsOutcome, FILLED_ANNOTATION, REFILLED_AT_ANNOTATION, ResolvedImage, reconcile_claims,
    remove_claims,
};
pub use fill::fill;
pub use objects::{FILL_HOSTS_ENV, PvcOptions};
pub use plan::{ImageVariants, PvcMode};
pub use watch::Watches;
