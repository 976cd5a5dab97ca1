//! Waiting for something to become true: the one polling loop of the tests.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often [`eventually`] asks again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// What [`eventually`] fails with when `timeout` passes: a caller that adds
/// what it saw last (a log tail, a status) tells it from an error of the
/// probe with `err.is::<TimedOut>()`.
#[derive(Debug)]
pub struct TimedOut {
    /// What was waited for.
    pub what: String,
    /// How long.
    pub timeout: Duration,
}

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: not after {:?}", self.what, self.timeout)
    }
}

impl std::error::Error for TimedOut {}

/// Asks `probe` every [`POLL_INTERVAL`] until it returns `Some`, and returns
/// that value; fails with [`TimedOut`], naming `what`, once `timeout` has
/// passed. An error from `probe` ends the wait at once: it is a failure, not
/// a "not yet".
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await? {
            return Ok(value);
        }
        if Instant::now() > deadline {
            return Err(TimedOut {
                what: what.to_string(),
                timeout,
            }
            .into());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// [`eventually`] for a plain condition: waits until `check` holds.
pub async fn until(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    eventually(what, timeout, || {
        let done = check();
        async move { Ok(done.then_some(())) }
    })
    .await
}

/// Asks `probe` every [`POLL_INTERVAL`] until its answer is `done`, or until
/// `timeout` has passed, and returns the last answer either way: for a test
/// that asserts on what things settled to rather than failing on the wait.
/// An error from `probe` ends the wait at once.
pub async fn settle<T, F, Fut>(
    timeout: Duration,
    mut probe: F,
    done: impl Fn(&T) -> bool,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let last = std::cell::RefCell::new(None);
    let (last_seen, done) = (&last, &done);
    let waited = eventually("a settled answer", timeout, || {
        let answer = probe();
        async move {
            let answer = answer.await?;
            if done(&answer) {
                return Ok(Some(answer));
            }
            *last_seen.borrow_mut() = Some(answer);
            Ok(None)
        }
    })
    .await;
    match waited {
        Err(e) if e.is::<TimedOut>() => last.into_inner().ok_or(e),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_first_value_and_names_what_it_waited_for() {
        let mut asked = 0;
        let got = eventually("a third ask", Duration::from_secs(5), || {
            asked += 1;
            let now = asked;
            async move { Ok((now == 3).then_some(now)) }
        })
        .await
        .unwrap();
        assert_eq!(got, 3);
        let err = until("never", Duration::from_millis(10), || false)
            .await
            .unwrap_err();
        assert!(err.to_string().starts_with("never: not after"), "{err}");
        assert!(err.is::<TimedOut>());
        let failed = eventually("a failing probe", Duration::from_secs(5), || async {
            anyhow::bail!("broken") as anyhow::Result<Option<()>>
        })
        .await
        .unwrap_err();
        assert!(!failed.is::<TimedOut>(), "{failed}");
    }

    #[tokio::test]
    async fn settle_returns_the_last_answer_when_time_is_up() {
        let mut asked = 0;
        let mut ask = || {
            asked += 1;
            let now = asked;
            async move { Ok(now) }
        };
        assert_eq!(
            settle(Duration::from_secs(5), &mut ask, |n| *n == 2)
                .await
                .unwrap(),
            2
        );
        let last = settle(Duration::from_millis(10), &mut ask, |_| false)
            .await
            .unwrap();
        assert!(last > 2, "{last}");
    }
}
