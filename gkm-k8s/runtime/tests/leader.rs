//! Leader election on a real kube-apiserver: one leader among candidates,
//! take-over within the lease duration when the leader dies, a fast hand-over
//! when it stops cleanly, and cancellation of the work when the lease is lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gkm_k8s_runtime::leader::{LeaderElector, LeaseConfig, Outcome};
use gkm_testenv::ControlPlane;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};

const LEASE: &str = "gkm-operator";
/// Short enough to keep the tests quick: 3 s lease, 2 s renew deadline,
/// 400 ms retry period.
const DURATION: Duration = Duration::from_secs(3);

async fn setup(namespace: &str) -> anyhow::Result<kube::Client> {
    let plane = ControlPlane::shared().await?;
    plane.ensure_namespace(namespace).await?;
    plane.client().await
}

fn config(namespace: &str, identity: &str) -> LeaseConfig {
    LeaseConfig::new(namespace, LEASE, identity).with_lease_duration(DURATION)
}

async fn holder(client: &kube::Client, namespace: &str) -> anyhow::Result<Option<String>> {
    let lease = Api::<Lease>::namespaced(client.clone(), namespace)
        .get(LEASE)
        .await?;
    Ok(lease.spec.and_then(|s| s.holder_identity))
}

/// Waits until `candidate`'s flag is set, up to `limit`; returns how long it took.
async fn until_leading(flag: &AtomicBool, limit: Duration) -> Option<Duration> {
    let began = Instant::now();
    gkm_testenv::until("leading", limit, || flag.load(Ordering::Acquire))
        .await
        .ok()?;
    Some(began.elapsed())
}

#[tokio::test]
async fn one_leader_and_takeover_within_the_lease_duration() -> anyhow::Result<()> {
    let ns = "leader-takeover";
    let client = setup(ns).await?;

    let a = LeaderElector::new(client.clone(), config(ns, "candidate-a"));
    let b = LeaderElector::new(client.clone(), config(ns, "candidate-b"));
    let (a_leads, b_leads) = (a.leading(), b.leading());
    let a_task = tokio::spawn(a.run(std::future::pending(), std::future::pending::<()>()));
    let b_task = tokio::spawn(b.run(std::future::pending(), std::future::pending::<()>()));

    gkm_testenv::until("a leader", Duration::from_secs(10), || {
        a_leads.load(Ordering::Acquire) || b_leads.load(Ordering::Acquire)
    })
    .await?;

    // For two whole lease durations, exactly one leads and the lease says so.
    let first = if a_leads.load(Ordering::Acquire) {
        "candidate-a"
    } else {
        "candidate-b"
    };
    let watch_until = Instant::now() + DURATION * 2;
    while Instant::now() < watch_until {
        assert!(
            a_leads.load(Ordering::Acquire) != b_leads.load(Ordering::Acquire),
            "exactly one candidate leads"
        );
        assert_eq!(holder(&client, ns).await?.as_deref(), Some(first));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The leader dies without releasing (its task is aborted): the other takes
    // over once the lease runs out, and not before the lease's duration.
    let (dead, survivor, survivor_leads) = if first == "candidate-a" {
        (a_task, b_task, b_leads)
    } else {
        (b_task, a_task, a_leads)
    };
    let killed = Instant::now();
    dead.abort();
    let took = until_leading(&survivor_leads, DURATION * 3)
        .await
        .ok_or_else(|| anyhow::anyhow!("no take-over within {:?}", DURATION * 3))?;
    let took = took.max(killed.elapsed());
    // Within the lease duration, plus one retry period and a request's time.
    assert!(
        took <= DURATION + DURATION * 2 / 15 + Duration::from_millis(1500),
        "take-over took {took:?}"
    );
    // The survivor had last seen the lease renewed at most one retry period
    // before the kill, so it waited for most of the duration.
    assert!(
        took >= DURATION - DURATION * 2 / 15 - Duration::from_millis(500),
        "take-over after only {took:?}"
    );
    let second = if first == "candidate-a" {
        "candidate-b"
    } else {
        "candidate-a"
    };
    assert_eq!(holder(&client, ns).await?.as_deref(), Some(second));
    let lease = Api::<Lease>::namespaced(client.clone(), ns)
        .get(LEASE)
        .await?;
    assert_eq!(lease.spec.and_then(|s| s.lease_transitions), Some(1));
    survivor.abort();
    Ok(())
}

#[tokio::test]
async fn a_clean_stop_hands_over_at_once_and_a_standby_stops_on_shutdown() -> anyhow::Result<()> {
    let ns = "leader-handover";
    let client = setup(ns).await?;

    // A leader whose work finishes after a moment releases the lease.
    let (finish, finished) = tokio::sync::oneshot::channel::<()>();
    let leader = LeaderElector::new(client.clone(), config(ns, "leader"));
    let leader_leads = leader.leading();
    let leader_task = tokio::spawn(leader.run(std::future::pending(), async {
        finished.await.ok();
        "done"
    }));
    until_leading(&leader_leads, Duration::from_secs(10))
        .await
        .ok_or_else(|| anyhow::anyhow!("the first candidate never led"))?;

    let standby = LeaderElector::new(client.clone(), config(ns, "standby"));
    let standby_leads = standby.leading();
    let standby_task =
        tokio::spawn(standby.run(std::future::pending(), std::future::pending::<()>()));
    tokio::time::sleep(DURATION / 2).await;
    assert!(
        !standby_leads.load(Ordering::Acquire),
        "the standby waits while the lease is held"
    );

    let stopped = Instant::now();
    finish.send(()).ok();
    assert_eq!(leader_task.await?, Outcome::Completed("done"));
    assert!(!leader_leads.load(Ordering::Acquire));
    let took = until_leading(&standby_leads, DURATION)
        .await
        .ok_or_else(|| {
            anyhow::anyhow!("the standby did not take a released lease within {DURATION:?}")
        })?;
    let took = took.max(stopped.elapsed());
    assert!(
        took < DURATION / 2 + Duration::from_millis(500),
        "hand-over after a release took {took:?}"
    );
    assert_eq!(holder(&client, ns).await?.as_deref(), Some("standby"));

    // A third candidate asked to shut down while standing by never runs its work.
    let ran = Arc::new(AtomicBool::new(false));
    let third = LeaderElector::new(client.clone(), config(ns, "third"));
    let ran_in_work = ran.clone();
    let outcome = third
        .run(tokio::time::sleep(DURATION / 2), async move {
            ran_in_work.store(true, Ordering::Release)
        })
        .await;
    assert_eq!(outcome, Outcome::ShutDown);
    assert!(!ran.load(Ordering::Acquire));
    assert_eq!(holder(&client, ns).await?.as_deref(), Some("standby"));
    standby_task.abort();
    Ok(())
}

/// Set when dropped: shows that the leader's work was cancelled.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

#[tokio::test]
async fn losing_the_lease_cancels_the_work() -> anyhow::Result<()> {
    let ns = "leader-lost";
    let client = setup(ns).await?;
    let elector = LeaderElector::new(client.clone(), config(ns, "leader"));
    let leads = elector.leading();
    let cancelled = Arc::new(AtomicBool::new(false));
    let guard = DropFlag(cancelled.clone());
    let task = tokio::spawn(elector.run(std::future::pending(), async move {
        let _guard = guard;
        std::future::pending::<()>().await
    }));
    until_leading(&leads, Duration::from_secs(10))
        .await
        .ok_or_else(|| anyhow::anyhow!("never led"))?;

    // Another writer takes the lease over (as a candidate with a skewed view
    // might); the leader must notice at its next renewal and stop its work.
    let api: Api<Lease> = Api::namespaced(client.clone(), ns);
    let mut lease = api.get(LEASE).await?;
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = Some("intruder".into());
    }
    api.replace(LEASE, &PostParams::default(), &lease).await?;

    let outcome = tokio::time::timeout(DURATION, task).await??;
    assert_eq!(
        outcome,
        Outcome::LeadershipLost {
            holder: Some("intruder".into())
        }
    );
    assert!(cancelled.load(Ordering::Acquire), "the work was dropped");
    assert!(!leads.load(Ordering::Acquire));
    assert_eq!(
        holder(&client, ns).await?.as_deref(),
        Some("intruder"),
        "a lost lease is not released"
    );
    Ok(())
}
