//! The bind verb's Kubernetes side: reserve in the index, write the device
//! assignment annotation, create the pod's Binding. Every step can be
//! repeated: a retried bind finds its reservation, the same annotation and
//! a pod already bound to the node, and succeeds.

use gkm_core::assignment::{self, Assignment};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::hold::Share;
use super::protocol::ExtenderBindingArgs;
use super::request::GpuRequest;
use super::server::Extender;
use super::{GPU_CORES, GPU_MEMORY};

/// Binds the pod of `args` to its node; the error is the message the
/// scheduler records.
pub(super) async fn bind(
    extender: &Extender,
    client: &kube::Client,
    args: &ExtenderBindingArgs,
) -> Result<(), String> {
    let (namespace, name, node) = (&args.pod_namespace, &args.pod_name, &args.node);
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = match extender.cached_pod(namespace, name) {
        Some(pod) if pod.metadata.uid.as_deref() == Some(&args.pod_uid) => pod.as_ref().clone(),
        _ => api
            .get(name)
            .await
            .map_err(|e| format!("gkm: reading pod {namespace}/{name}: {e}"))?,
    };
    if pod.metadata.uid.as_deref() != Some(&args.pod_uid) {
        return Err(format!(
            "gkm: pod {namespace}/{name} is not the pod {} being bound (it was replaced)",
            args.pod_uid
        ));
    }
    if let Some(bound) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
        return if bound == node {
            Ok(())
        } else {
            Err(format!(
                "gkm: pod {namespace}/{name} is already bound to {bound}"
            ))
        };
    }
    let request = GpuRequest::from_pod(&pod, &extender.read().config().whole_resources)
        .map_err(|e| format!("gkm: {e}"))?;
    let shares = extender
        .write()
        .reserve(&args.pod_uid, name, namespace, &request, node)
        .map_err(gkm_core::Refusal::into_reason)?;
    let written = write_assignment(&api, &pod, &request, &shares).await;
    let bound = match written {
        Ok(()) => create_binding(&api, &pod, node).await,
        Err(e) => Err(e),
    };
    if bound.is_err() {
        extender.write().release(&args.pod_uid);
    }
    bound
}

/// The assignment for `shares`: the shared resources the pod asks for, each
/// mapped to the chosen devices.
pub fn assignment_of(request: &GpuRequest, shares: &[Share]) -> Assignment {
    let devices: Vec<String> = shares.iter().map(|s| s.device.clone()).collect();
    let mut out = Assignment::new();
    if request.cores > 0 {
        out = out.with(GPU_CORES, devices.clone());
    }
    if request.memory > 0 {
        out = out.with(GPU_MEMORY, devices);
    }
    out
}

/// Writes the assignment annotation when the pod asks for shared GPUs and
/// does not carry it already.
async fn write_assignment(
    api: &Api<Pod>,
    pod: &Pod,
    request: &GpuRequest,
    shares: &[Share],
) -> Result<(), String> {
    if !request.is_shared() {
        return Ok(());
    }
    let value = assignment_of(request, shares).format();
    let current = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(assignment::ANNOTATION));
    if current == Some(&value) {
        return Ok(());
    }
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    // The uid makes the patch fail on a pod recreated under the same name.
    let patch = json!({"metadata": {
        "uid": pod.metadata.uid,
        "annotations": {assignment::ANNOTATION: value},
    }});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|e| format!("gkm: writing {} to the pod: {e}", assignment::ANNOTATION))
}

/// Creates the pod's Binding to `node`; a pod already bound there (an
/// earlier attempt that succeeded) counts as bound.
async fn create_binding(api: &Api<Pod>, pod: &Pod, node: &str) -> Result<(), String> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let binding = json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "uid": pod.metadata.uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    let created = api
        .create_subresource::<_, serde_json::Value>(
            "binding",
            name,
            &PostParams::default(),
            &binding,
        )
        .await;
    match created {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let current = api.get(name).await.map_err(|e| format!("gkm: {e}"))?;
            match current.spec.and_then(|s| s.node_name) {
                Some(bound) if bound == node => Ok(()),
                _ => Err(format!("gkm: binding to {node}: {}", status.message)),
            }
        }
        Err(e) => Err(format!("gkm: binding to {node}: {e}")),
    }
}
