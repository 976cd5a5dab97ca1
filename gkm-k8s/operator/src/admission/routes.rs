//! How the admission server dispatches a review: [`AdmissionRoutes::new`]
//! holds the one table of the webhooks, each an [`AdmissionHook`], and a
//! request goes to the hook serving its path. Adding a webhook is one
//! `impl AdmissionHook` and one line of that table.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use hyper::body::Bytes;
use kube::Client;

use super::hook::{AdmissionHook, POD_REVIEW_MAX_BYTES};
use super::review::answer_review;
use super::{image_volume, pvc_mutation, quota};
use gkm_k8s_runtime::endpoints::{ResponseFuture, Routes, text};

/// How many reviews one replica answers at once once their bodies are
/// read; one more is answered `503` (the apiserver counts it as the
/// webhook failing, and retries binds). Bodies being read take no permit,
/// so a caller holding slow connections cannot take them all; the bytes
/// those bodies hold are bounded instead, at this many pod-review bodies.
pub const MAX_REVIEWS_IN_FLIGHT: usize = 16;

/// How long a caller may take to send a review's body: the apiserver sends
/// one at once, and waits 5 to 10 s for the whole answer (the webhooks'
/// `timeoutSeconds`), so a body taking longer is never the apiserver's.
pub const REVIEW_BODY_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The operator's webhooks on one server, one certificate: each review
/// goes to the hook serving its path.
pub(crate) struct AdmissionRoutes {
    hooks: Vec<Box<dyn AdmissionHook>>,
}

impl AdmissionRoutes {
    /// The operator's webhooks, reading with `client`.
    pub(crate) fn new(client: Client, options: quota::QuotaOptions) -> AdmissionRoutes {
        let quota = Arc::new(quota::QuotaRoutes::new(client.clone(), options));
        AdmissionRoutes {
            hooks: vec![
                Box::new(pvc_mutation::MutationRoutes::new(client.clone())),
                Box::new(image_volume::ImageVolumeRoutes::new(client)),
                Box::new(quota::PodQuota(quota.clone())),
                Box::new(quota::BindingQuota(quota)),
            ],
        }
    }

    /// The hook serving `path`.
    fn hook(&self, path: &str) -> Option<&dyn AdmissionHook> {
        self.hooks
            .iter()
            .find(|hook| hook.path() == path)
            .map(|hook| &**hook)
    }
}

impl Routes for AdmissionRoutes {
    fn serves(&self, path: &str) -> bool {
        self.hook(path).is_some()
    }

    fn max_body_bytes(&self) -> usize {
        POD_REVIEW_MAX_BYTES
    }

    fn max_body_bytes_of(&self, path: &str) -> usize {
        self.hook(path)
            .map_or(POD_REVIEW_MAX_BYTES, |hook| hook.max_body_bytes())
    }

    fn max_in_flight(&self) -> Option<usize> {
        Some(MAX_REVIEWS_IN_FLIGHT)
    }

    fn body_read_timeout(&self) -> Duration {
        REVIEW_BODY_READ_TIMEOUT
    }

    fn respond<'a>(&'a self, method: &'a Method, path: &'a str, body: Bytes) -> ResponseFuture<'a> {
        match self.hook(path) {
            Some(hook) => answer_review(method, async move { hook.review(&body).await }),
            None => {
                Box::pin(
                    async move { text(StatusCode::NOT_FOUND, format!("no webhook at {path}\n")) },
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::hook::BINDING_REVIEW_MAX_BYTES;

    #[tokio::test]
    async fn each_webhook_is_served_at_its_own_path_with_its_body_limit() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        let client = Client::try_from(config).expect("a client");
        let routes = AdmissionRoutes::new(client, quota::QuotaOptions::default());
        let mut paths: Vec<_> = routes.hooks.iter().map(|hook| hook.path()).collect();
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), routes.hooks.len(), "two hooks share a path");
        for (path, limit) in [
            (pvc_mutation::MUTATE_PATH, POD_REVIEW_MAX_BYTES),
            (image_volume::IMAGE_VOLUME_PATH, POD_REVIEW_MAX_BYTES),
            (quota::QUOTA_PATH, POD_REVIEW_MAX_BYTES),
            (quota::QUOTA_BINDING_PATH, BINDING_REVIEW_MAX_BYTES),
        ] {
            assert!(routes.serves(path), "{path}");
            assert_eq!(routes.max_body_bytes_of(path), limit, "{path}");
        }
        assert!(!routes.serves("/metrics"));
        assert_eq!(routes.max_body_bytes(), POD_REVIEW_MAX_BYTES);
        assert_eq!(routes.max_in_flight(), Some(MAX_REVIEWS_IN_FLIGHT));
    }
}
