//! What earlier verifications learned about where a registry keeps
//! signatures, so the next verification there looks in that place first.
//!
//! Two things are remembered per registry host:
//!
//! - the format of the signature that proved a policy last: cosign v3
//!   writes sigstore bundles, cosign v2 the `.sig` tag, and one registry's
//!   images are usually signed by one of them. Looking in the other place
//!   first costs a request per image that finds nothing (a 404);
//! - where its referrers were found: the referrers API, or the
//!   `sha256-<hex>` tag-schema index that clients write to a registry
//!   without that API. A registry without the API answers it 404, and the
//!   fallback is a second request.
//!
//! Hints change only the order of the lookups, never the outcome: a
//! signature that is not where the hint says is still looked for in the
//! other place, and a verification that proves nothing has looked
//! everywhere.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use gkm_core::policy::Format;

use crate::registry::reference::ImageRef;

/// Where a registry's referrers were found last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReferrersAt {
    /// Its referrers API answered them.
    Api,
    /// The tag-schema index (`sha256-<hex>`) held them.
    TagSchema,
}

#[derive(Debug, Default)]
struct Learned {
    format: HashMap<String, Format>,
    referrers: HashMap<String, ReferrersAt>,
}

/// Where signatures were found before, per registry host (see the module
/// documentation). Shared by the verifications of a process; a new one
/// knows nothing, and looks as [`super::verify`] does.
#[derive(Debug, Default)]
pub struct SignatureHints {
    learned: Mutex<Learned>,
}

/// The registry host of `image`; `None` for a layout directory, which has
/// no requests to save.
fn host(image: &ImageRef) -> Option<String> {
    match image {
        ImageRef::Registry(r) => Some(r.resolve_registry().to_string()),
        ImageRef::Layout { .. } => None,
    }
}

impl SignatureHints {
    fn learned(&self) -> std::sync::MutexGuard<'_, Learned> {
        self.learned.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The format that proved a policy last on `image`'s registry.
    pub(crate) fn format(&self, image: &ImageRef) -> Option<Format> {
        let host = host(image)?;
        self.learned().format.get(&host).copied()
    }

    /// A signature of `format` proved a policy on `image`'s registry.
    pub(crate) fn proved(&self, image: &ImageRef, format: Format) {
        if let Some(host) = host(image) {
            self.learned().format.insert(host, format);
        }
    }

    /// Where `image`'s registry answered referrers last.
    pub(crate) fn referrers(&self, image: &ImageRef) -> Option<ReferrersAt> {
        let host = host(image)?;
        self.learned().referrers.get(&host).copied()
    }

    /// `image`'s registry answered referrers `at`.
    pub(crate) fn found_referrers(&self, image: &ImageRef, at: ReferrersAt) {
        if let Some(host) = host(image) {
            self.learned().referrers.insert(host, at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_are_per_registry_host_and_layouts_have_none() {
        let hints = SignatureHints::default();
        let a: ImageRef = "registry.a:5000/x/one:v1".parse().expect("ref");
        let a2: ImageRef = "registry.a:5000/y/two:v1".parse().expect("ref");
        let b: ImageRef = "registry.b/x/one:v1".parse().expect("ref");
        assert_eq!(hints.format(&a), None);
        hints.proved(&a, Format::SigstoreBundle);
        hints.found_referrers(&a, ReferrersAt::TagSchema);
        assert_eq!(hints.format(&a2), Some(Format::SigstoreBundle));
        assert_eq!(hints.referrers(&a2), Some(ReferrersAt::TagSchema));
        assert_eq!((hints.format(&b), hints.referrers(&b)), (None, None));
        let layout = ImageRef::Layout {
            path: "/tmp/layout".into(),
            selector: crate::registry::reference::Selector::Tag("v1".into()),
        };
        hints.proved(&layout, Format::CosignV2);
        assert_eq!(hints.format(&layout), None);
    }
}
