//! Watching pods as a user would: their phase, their events, their logs.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams, LogParams};

/// Waits until the pod `name` satisfies `done`, returning it; on timeout the
/// error shows the pod's status and events.
pub async fn wait_for_pod(
    pods: &Api<Pod>,
    name: &str,
    timeout: Duration,
    done: impl Fn(&Pod) -> bool,
) -> anyhow::Result<Pod> {
    let done = &done;
    let waited = crate::eventually(&format!("pod {name} as expected"), timeout, || async move {
        Ok(pods.get_opt(name).await?.filter(|pod| done(pod)))
    })
    .await;
    let not_yet = match waited {
        Err(e) if e.is::<crate::TimedOut>() => e,
        other => return other,
    };
    let pod = pods.get_opt(name).await?;
    let status = pod
        .as_ref()
        .and_then(|p| p.status.as_ref())
        .map(|s| serde_json::to_string(s).unwrap_or_default())
        .unwrap_or_else(|| "no such pod".to_string());
    let namespace = pod
        .as_ref()
        .and_then(|p| p.metadata.namespace.clone())
        .unwrap_or_default();
    let events = pod_events(&kube::Client::from(pods.clone()), &namespace, name)
        .await
        .unwrap_or_default();
    anyhow::bail!(
        "{not_yet}; status: {status}; events:\n{}",
        events.join("\n")
    )
}

/// The events about pod `name`, each as `Reason: message`, oldest first.
pub async fn pod_events(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Vec<String>> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().fields(&format!(
        "involvedObject.kind=Pod,involvedObject.name={name}"
    ));
    let mut list = events.list(&params).await?.items;
    list.sort_by_key(|e| e.metadata.creation_timestamp.clone());
    Ok(list
        .into_iter()
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect())
}

/// The log of `container` in pod `name`, read through the apiserver (which
/// asks the kubelet), as `kubectl logs` does.
pub async fn pod_log(pods: &Api<Pod>, name: &str, container: &str) -> anyhow::Result<String> {
    let params = LogParams {
        container: Some(container.to_string()),
        ..LogParams::default()
    };
    Ok(pods.logs(name, &params).await?)
}

/// The log of `container` in pod `name` once the pod is Running and its log
/// holds `marker` (what a test's container prints when it has said all it
/// will say).
pub async fn running_pod_log(
    pods: &Api<Pod>,
    name: &str,
    container: &str,
    marker: &str,
    timeout: Duration,
) -> anyhow::Result<String> {
    let began = Instant::now();
    wait_for_pod(pods, name, timeout, |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
    .await?;
    let last = std::cell::RefCell::new(String::new());
    let last = &last;
    let what = format!("pod {name} printing {marker}");
    crate::eventually(
        &what,
        timeout.saturating_sub(began.elapsed()),
        || async move {
            let log = pod_log(pods, name, container).await.unwrap_or_default();
            if log.contains(marker) {
                return Ok(Some(log));
            }
            *last.borrow_mut() = log;
            Ok(None)
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}: {}", last.borrow()))
}
