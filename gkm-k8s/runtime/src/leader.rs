//! Leader election on a `coordination.k8s.io/v1` Lease, so that only one
//! operator replica runs the controllers.
//!
//! The lease is read and written the way client-go's `leaderelection` does
//! (`holderIdentity`, `leaseDurationSeconds`, `acquireTime`, `renewTime`,
//! `leaseTransitions`), so other tools show and respect it:
//!
//! - a candidate takes the lease when it has no holder, or when its record has
//!   not changed for `leaseDurationSeconds` as measured by the candidate's own
//!   clock (so clock skew between nodes does not matter);
//! - every write is a compare-and-swap on `resourceVersion`, so two candidates
//!   never both succeed;
//! - the leader renews every `retry_period` and gives up leading when it has
//!   not renewed for `renew_deadline` (shorter than the lease duration, so it
//!   stops before anyone else may take over) or sees another holder;
//! - a leader that stops cleanly releases the lease, so a standby takes over
//!   at its next try instead of waiting out the lease.
//!
//! The lease needs `get`, `create` and `update` on `leases` in its namespace.
//!
//! Why not a crate: `kube-lease-manager` (0.13, on kube 5) is the maintained
//! candidate, and its semantics differ where it matters here. It decides that
//! a lease expired from the holder's `renewTime` read against the local
//! clock, so clock skew between nodes must stay under its `grace`; and while
//! the API server cannot be reached its watch loop retries without telling
//! the caller, so a partitioned leader goes on believing it leads after its
//! lease has run out. This module keeps
//! client-go's rules (expiry timed by the candidate's own observation, a
//! renew deadline shorter than the lease) and runs the controllers inside
//! [`LeaderElector::run`], so losing the lease stops them.
//!
//! ```no_run
//! # async fn example(client: kube::Client) {
//! use gkm_k8s_runtime::leader::{LeaseConfig, LeaderElector, Outcome};
//!
//! let config = LeaseConfig::new("gkm-system", "gkm-operator", "pod-a");
//! let elector = LeaderElector::new(client, config);
//! let shutdown = async { tokio::signal::ctrl_c().await.ok(); };
//! match elector.run(shutdown, async { /* the controllers */ }).await {
//!     Outcome::Completed(()) | Outcome::ShutDown => {}
//!     Outcome::LeadershipLost { holder } => eprintln!("lost the lease to {holder:?}"),
//! }
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use tracing::{debug, info, warn};

use kube::Result;

/// Which lease to hold, as whom, and how fast to move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The lease's namespace.
    pub namespace: String,
    /// The lease's name.
    pub name: String,
    /// This candidate's identity, unique among the candidates (the pod name).
    pub identity: String,
    /// How long a lease not renewed stays valid for the other candidates.
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal; shorter
    /// than `lease_duration`.
    pub renew_deadline: Duration,
    /// How often candidates try to take the lease and the leader renews it.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// Lease `namespace/name` for `identity`, with client-go's default timing:
    /// 15 s lease, 10 s renew deadline, 2 s retry period.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        LeaseConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// The same lease with timing scaled to `lease_duration`: a renew deadline
    /// of two thirds of it and a retry period of two fifteenths, the ratios of
    /// client-go's defaults. Durations under 3 s are raised to 3 s.
    pub fn with_lease_duration(mut self, lease_duration: Duration) -> Self {
        let lease_duration = lease_duration.max(Duration::from_secs(3));
        self.lease_duration = lease_duration;
        self.renew_deadline = lease_duration * 2 / 3;
        self.retry_period = lease_duration * 2 / 15;
        self
    }
}

/// How [`LeaderElector::run`] ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome<T> {
    /// This candidate led and the work finished; the lease was released.
    Completed(T),
    /// Shutdown was asked for before this candidate became leader; the work
    /// never started.
    ShutDown,
    /// The lease was lost while leading (another holder took it, or it could
    /// not be renewed within the renew deadline); the work was cancelled.
    LeadershipLost {
        /// The holder seen last, when another candidate took the lease.
        holder: Option<String>,
    },
}

/// One try to take or renew the lease.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    /// This candidate holds the lease now.
    Leading,
    /// Another candidate holds a valid lease.
    HeldBy(String),
    /// Another writer came first; try again.
    Conflict,
}

/// The lease record as last seen, and when this candidate saw it change.
struct Observed {
    spec: LeaseSpec,
    at: Instant,
}

/// A candidate for the lease.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    observed: Option<Observed>,
    leading: Arc<AtomicBool>,
}

impl LeaderElector {
    /// A candidate for the lease `config` names.
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: None,
            leading: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A flag that is set while this candidate leads (for a metric).
    pub fn leading(&self) -> Arc<AtomicBool> {
        self.leading.clone()
    }

    /// Waits until this candidate holds the lease, trying every retry period;
    /// apiserver errors are logged and retried.
    pub async fn acquire(&mut self) {
        let mut last_holder = None;
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Leading) => {
                    info!(lease = %self.config.name, identity = %self.config.identity, "became leader");
                    self.leading.store(true, Ordering::Release);
                    return;
                }
                Ok(Attempt::HeldBy(holder)) => {
                    if last_holder.as_ref() != Some(&holder) {
                        info!(lease = %self.config.name, %holder, "standing by: another replica leads");
                        last_holder = Some(holder);
                    }
                }
                Ok(Attempt::Conflict) => {
                    debug!(lease = %self.config.name, "lease changed concurrently")
                }
                Err(e) => warn!(lease = %self.config.name, error = %e, "taking the lease"),
            }
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    /// Renews the lease every retry period while leading; returns when the
    /// lease is lost: another holder took it, or no renewal succeeded within
    /// the renew deadline. Returns the other holder when one was seen.
    pub async fn hold(&mut self) -> Option<String> {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            let left = self.config.renew_deadline.saturating_sub(renewed.elapsed());
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(Attempt::Leading)) => renewed = Instant::now(),
                Ok(Ok(Attempt::HeldBy(holder))) => {
                    warn!(lease = %self.config.name, %holder, "lost the lease to another replica");
                    self.leading.store(false, Ordering::Release);
                    return Some(holder);
                }
                Ok(Ok(Attempt::Conflict)) => {
                    debug!(lease = %self.config.name, "lease changed concurrently")
                }
                Ok(Err(e)) => warn!(lease = %self.config.name, error = %e, "renewing the lease"),
                Err(_) => {}
            }
            if renewed.elapsed() >= self.config.renew_deadline {
                warn!(
                    lease = %self.config.name,
                    deadline = ?self.config.renew_deadline,
                    "could not renew the lease within the renew deadline"
                );
                self.leading.store(false, Ordering::Release);
                return None;
            }
        }
    }

    /// Gives the lease up if this candidate holds it: no holder, a 1 s
    /// duration, so the next candidate takes it at its next try.
    pub async fn release(&mut self) -> Result<()> {
        self.leading.store(false, Ordering::Release);
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        let now = MicroTime(Timestamp::now());
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.acquire_time = Some(now.clone());
        spec.renew_time = Some(now);
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                info!(lease = %self.config.name, "released the lease");
                Ok(())
            }
            // Someone else wrote it first: it is not ours to release any more.
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Waits for the lease (or `shutdown`), then runs `work` while holding it.
    ///
    /// `work` is only polled once this candidate leads, and is dropped
    /// (cancelled) as soon as the lease is lost. `shutdown` is only watched
    /// while waiting for the lease: once leading, `work` is expected to stop
    /// on its own when the process is asked to; the lease is released after
    /// it finishes.
    pub async fn run<T>(
        mut self,
        shutdown: impl Future<Output = ()>,
        work: impl Future<Output = T>,
    ) -> Outcome<T> {
        tokio::select! {
            () = shutdown => return Outcome::ShutDown,
            () = self.acquire() => {}
        }
        let outcome = tokio::select! {
            output = work => Outcome::Completed(output),
            holder = self.hold() => Outcome::LeadershipLost { holder },
        };
        if let Outcome::Completed(_) = outcome
            && let Err(e) = self.release().await
        {
            warn!(lease = %self.config.name, error = %e, "releasing the lease; the next leader waits for it to expire");
        }
        outcome
    }

    async fn try_acquire_or_renew(&mut self) -> Result<Attempt> {
        let now = MicroTime(Timestamp::now());
        let duration_seconds =
            i32::try_from(self.config.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            let spec = LeaseSpec {
                holder_identity: Some(self.config.identity.clone()),
                lease_duration_seconds: Some(duration_seconds),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            };
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec.clone()),
            };
            let written = self.api.create(&PostParams::default(), &lease).await;
            return self.settle(written.map(drop), spec);
        };

        let current = lease.spec.clone().unwrap_or_default();
        if self.observed.as_ref().is_none_or(|o| o.spec != current) {
            self.observed = Some(Observed {
                spec: current.clone(),
                at: Instant::now(),
            });
        }
        let holder = current.holder_identity.clone().filter(|h| !h.is_empty());
        let ours = holder.as_deref() == Some(self.config.identity.as_str());
        if let Some(holder) = holder.as_ref().filter(|_| !ours) {
            let valid_for = Duration::from_secs(
                current
                    .lease_duration_seconds
                    .unwrap_or(duration_seconds)
                    .max(0) as u64,
            );
            let seen = self.observed.as_ref().map_or_else(Instant::now, |o| o.at);
            if seen.elapsed() < valid_for {
                return Ok(Attempt::HeldBy(holder.clone()));
            }
            info!(lease = %self.config.name, %holder, "the lease expired; taking it over");
        }

        let mut spec = current.clone();
        spec.holder_identity = Some(self.config.identity.clone());
        spec.lease_duration_seconds = Some(duration_seconds);
        spec.renew_time = Some(now.clone());
        if !ours {
            spec.acquire_time = Some(now);
            spec.lease_transitions = Some(current.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        lease.spec = Some(spec.clone());
        let written = self
            .api
            .replace(&lease.name_any(), &PostParams::default(), &lease)
            .await;
        self.settle(written.map(drop), spec)
    }

    /// The outcome of writing the lease `spec`: leading, and the spec
    /// observed now, when the write went through; a conflict when another
    /// candidate wrote first.
    fn settle(&mut self, written: kube::Result<()>, spec: LeaseSpec) -> Result<Attempt> {
        match written {
            Ok(()) => {
                self.observed = Some(Observed {
                    spec,
                    at: Instant::now(),
                });
                Ok(Attempt::Leading)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Conflict),
            Err(e) => Err(e),
        }
    }
}
