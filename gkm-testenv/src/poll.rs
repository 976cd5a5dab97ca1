//! Waiting for something to become true: the one polling loop of the tests.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often [`eventually`] asks again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Asks `probe` every [`POLL_INTERVAL`] until it returns `Some`, and returns
/// that value; fails naming `what` once `timeout` has passed. An error from
/// `probe` ends the wait at once: it is a failure, not a "not yet".
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
            anyhow::bail!("{what}: not after {timeout:?}");
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
    }
}
