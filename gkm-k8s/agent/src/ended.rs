//! Collecting the outcomes of tasks that run off the agent's pass (summary
//! reads, extractions): each sends its outcome on a channel before it
//! finishes and wakes the agent, so the pass it wakes finds it.

use std::collections::HashMap;
use std::hash::Hash;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;

/// The outcomes of the tasks of `running` that ended, each taken out of
/// `running`. A task that finished without sending one panicked: it ends
/// with `lost` as its error.
pub(crate) fn take_ended<K, T>(
    running: &mut HashMap<K, JoinHandle<()>>,
    outcomes: &mut UnboundedReceiver<(K, Result<T, String>)>,
    lost: &str,
) -> Vec<(K, Result<T, String>)>
where
    K: Clone + Eq + Hash,
{
    // Once the tasks finished now are listed, the channel holds all of
    // their outcomes.
    let finished: Vec<K> = running
        .iter()
        .filter(|(_, task)| task.is_finished())
        .map(|(key, _)| key.clone())
        .collect();
    let mut ended = Vec::new();
    while let Ok(outcome) = outcomes.try_recv() {
        ended.push(outcome);
    }
    let silent: Vec<K> = finished
        .into_iter()
        .filter(|key| !ended.iter().any(|(k, _)| k == key))
        .collect();
    ended.extend(silent.into_iter().map(|key| (key, Err(lost.to_string()))));
    for (key, _) in &ended {
        running.remove(key);
    }
    ended
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_ends_without_an_outcome_is_lost_and_every_ended_one_leaves() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut running = HashMap::new();
        let sender = tx.clone();
        running.insert(
            "answers",
            tokio::spawn(async move {
                let _ = sender.send(("answers", Ok(1)));
            }),
        );
        running.insert("panics", tokio::spawn(async {}));
        running.insert("runs", tokio::spawn(std::future::pending::<()>()));
        while !running["answers"].is_finished() || !running["panics"].is_finished() {
            tokio::task::yield_now().await;
        }
        let mut ended = take_ended(&mut running, &mut rx, "lost");
        ended.sort_by_key(|(k, _)| *k);
        assert_eq!(
            ended,
            vec![("answers", Ok(1)), ("panics", Err("lost".to_string()))]
        );
        assert_eq!(running.keys().collect::<Vec<_>>(), [&"runs"]);
        running["runs"].abort();
    }
}
