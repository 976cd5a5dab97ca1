//! How every controller of the operator runs its reconciles: each one
//! contained (a panic fails that object's reconcile, not the controller),
//! counted and timed in [`Metrics`] under its [`ControllerKind`], and
//! retried after a failure as [`error_policy`] says.
//!
//! A controller builds its `kube` [`Controller`] (what it watches, what
//! triggers it) and hands it here with its reconcile.

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Resource;
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use serde::de::DeserializeOwned;
use tracing::{debug, error, info, warn};

use crate::error::{Error, Result};
use crate::metrics::{ControllerKind, Metrics};

/// How long a reconcile waiting for nodes waits before looking again.
const WAITING_RETRY: Duration = Duration::from_secs(2);
/// How long a reconcile that panicked waits: retrying at once would only
/// panic again.
const PANICKED_RETRY: Duration = Duration::from_secs(300);
/// How long any other failed reconcile waits.
const FAILED_RETRY: Duration = Duration::from_secs(10);

/// When a reconcile of `object` that failed with `error` runs again.
pub(crate) fn error_policy<K>(object: &K, error: &Error) -> Action
where
    K: Resource,
    K::DynamicType: Default,
{
    let object = ObjectRef::from_obj(object);
    match error {
        Error::WaitingForNodes(_) => Action::requeue(WAITING_RETRY),
        Error::Panicked(why) => {
            error!(%object, %why, "reconcile panicked");
            Action::requeue(PANICKED_RETRY)
        }
        other => {
            warn!(%object, error = %other, "reconcile failed");
            Action::requeue(FAILED_RETRY)
        }
    }
}

/// Runs `controller` with `reconcile` until the process is asked to stop
/// (the controller's own `shutdown_on_signal`), recording each reconcile in
/// `metrics` as `kind`'s.
pub(crate) async fn run<K, C, F, Fut>(
    controller: Controller<K>,
    kind: ControllerKind,
    metrics: Arc<Metrics>,
    ctx: Arc<C>,
    mut reconcile: F,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Debug + Default + Unpin,
    C: Send + Sync + 'static,
    F: FnMut(Arc<K>, Arc<C>) -> Fut,
    Fut: Future<Output = Result<Action>> + Send + 'static,
{
    controller
        .run(
            move |object, ctx| {
                let work = reconcile(object, ctx);
                let metrics = metrics.clone();
                async move {
                    let began = Instant::now();
                    let outcome = gkm_k8s_runtime::tasks::contained(work).await;
                    metrics.reconciled(kind, began.elapsed(), outcome.as_ref().err());
                    outcome
                }
            },
            |object, error, _| error_policy(object.as_ref(), error),
            ctx,
        )
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => info!(%object, "reconciled"),
                Err(e) => debug!(error = %e, "reconcile"),
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::ObjectMeta;
    use kube::runtime::controller::Action;

    #[tokio::test]
    async fn a_panicking_reconcile_is_an_error_not_the_end() {
        let outcome: Result<Action> = gkm_k8s_runtime::tasks::contained(async {
            let values: Vec<u64> = Vec::new();
            if values.is_empty() {
                panic!("reconcile met an impossible object");
            }
            Ok(Action::await_change())
        })
        .await;
        let err = outcome.expect_err("a panic is an error");
        assert!(err.to_string().contains("impossible object"), "{err}");
        let fine: Result<Action> =
            gkm_k8s_runtime::tasks::contained(async { Ok(Action::await_change()) }).await;
        assert!(fine.is_ok());
    }

    #[test]
    fn failures_back_off_by_kind() {
        let object = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("a".into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        let cases = [
            (Error::WaitingForNodes("n1".into()), WAITING_RETRY),
            (Error::Panicked("boom".into()), PANICKED_RETRY),
            (Error::InvalidSpec("bad".into()), FAILED_RETRY),
        ];
        for (error, wait) in cases {
            assert_eq!(
                error_policy(&object, &error),
                Action::requeue(wait),
                "{error}"
            );
        }
    }
}
