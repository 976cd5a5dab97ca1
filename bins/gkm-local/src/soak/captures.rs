//! Captures in the workload: a `GKMCacheCapture` and a workload pod on the
//! real node that writes a real Triton cache into its capture volume and
//! ends; the operator then runs the capture Job, which pushes and signs the
//! tree, and the node releases the captured tree.
//!
//! What is checked of each ([`Check::CapturesEndWhole`]): it ends within
//! [`CAPTURE_WITHIN`] of its pod's creation or of the last fault since; a
//! `Complete` one names a digest that verifies with the tenant's key and
//! holds exactly what the pod wrote; a `Failed` one is a violation unless a
//! fault overlapped it (then it is counted by its reason: a workload or Job
//! pod killed by a fault is not captured, by design, since its tree may be
//! partial).

use std::path::Path;
use std::time::Instant;

use gkm_k8s_api::crd::{CapturePhase, GKMCacheCapture};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use super::invariants::{CAPTURE_WITHIN, Check};
use super::state::CaptureRun;
use super::trees;
use super::workload::{NAMESPACE, REAL_NODE, Workload};
use crate::{cosign, fixture};

/// The tenant's signing Secret the capture Jobs read.
const SIGNING_SECRET: &str = "soak-signing";
/// The fixture each capture's workload writes.
const WRITTEN: &str = "triton-vector-add-cuda-sm75";
/// The bound of each capture volume: 8 MiB.
const CAPTURE_MAX_BYTES: &str = "8388608";

impl Workload<'_> {
    /// Creates the signing Secret capture Jobs sign with, in the soak's
    /// namespace.
    pub async fn create_signing_secret(&self) -> anyhow::Result<()> {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": SIGNING_SECRET, "namespace": NAMESPACE},
            "stringData": {"cosign.key": std::fs::read_to_string(&self.key.private_key)?,
                           "cosign.password": cosign::PASSWORD},
        }))?;
        Api::<Secret>::namespaced(self.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &secret)
            .await?;
        Ok(())
    }

    /// Starts a capture: its `GKMCacheCapture`, then a workload pod writing
    /// the fixture [`WRITTEN`] into its capture volume.
    pub async fn start_capture(&self) -> anyhow::Result<()> {
        let name = self.shared.next_name("capture");
        let capture: GKMCacheCapture = serde_json::from_value(json!({
            "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheCapture",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"targetImage": format!("{}/soak/{name}:v1", self.registry),
                     "signing": {"secretName": SIGNING_SECRET},
                     "insecureRegistry": true, "maxBytes": CAPTURE_MAX_BYTES},
        }))?;
        let captures = Api::<GKMCacheCapture>::namespaced(self.client.clone(), NAMESPACE);
        captures.create(&PostParams::default(), &capture).await?;
        let written = fixture(WRITTEN).canonicalize()?;
        let pod = crate::once_pod(
            NAMESPACE,
            &name,
            REAL_NODE,
            json!(["/bin/sh", "-c", "cp -r /written/. /capture/"]),
            json!([{"name": "capture", "mountPath": "/capture"},
                   {"name": "written", "mountPath": "/written", "readOnly": true}]),
            json!([{"name": "capture", "csi": {"driver": "csi.gkm.io", "volumeAttributes": {
                        "csi.gkm.io/GKMCacheCapture": name,
                        "csi.gkm.io/captureMaxBytes": CAPTURE_MAX_BYTES}}},
                   {"name": "written", "hostPath": {"path": written, "type": "Directory"}}]),
        )?;
        let created = Instant::now();
        if let Err(e) = Api::<Pod>::namespaced(self.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &pod)
            .await
        {
            // No workload: the capture would wait for one until the end.
            let _ = captures.delete(&name, &DeleteParams::default()).await;
            return Err(e.into());
        }
        self.shared.add_capture(CaptureRun {
            name: name.clone(),
            created,
            ended: false,
        });
        self.shared.count("capture-started");
        eprintln!(
            "soak: {:>6.1}s capture {name} started",
            self.shared.elapsed_s()
        );
        Ok(())
    }

    /// Checks every capture not yet ended (see the module's doc); an
    /// apiserver that does not answer defers the check.
    pub async fn check_captures(&self) {
        let captures = Api::<GKMCacheCapture>::namespaced(self.client.clone(), NAMESPACE);
        for run in self.shared.open_captures() {
            let Ok(capture) = captures.get(&run.name).await else {
                continue;
            };
            let status = capture.status.unwrap_or_default();
            let outcome = match status.phase {
                CapturePhase::Complete => {
                    self.shared.count("capture-complete");
                    self.holds_what_was_written(&run.name, status.digest.as_deref())
                        .await
                        .map_err(|e| format!("capture {}: {e:#}", run.name))
                }
                CapturePhase::Failed => {
                    let reason = status.reason.unwrap_or_default();
                    if self.shared.any_fault_between(run.created, Instant::now()) {
                        self.shared
                            .count(&format!("capture-failed-under-fault-{reason}"));
                        Ok(())
                    } else {
                        Err(format!(
                            "capture {} Failed with no fault near: {reason}: {}",
                            run.name,
                            status.message.unwrap_or_default()
                        ))
                    }
                }
                phase => {
                    let since = self
                        .shared
                        .last_fault_end(|_| true)
                        .map_or(run.created, |end| end.max(run.created));
                    if since.elapsed() <= CAPTURE_WITHIN {
                        continue;
                    }
                    Err(format!(
                        "capture {} still {phase:?} {:.0}s after its pod or the last fault",
                        run.name,
                        since.elapsed().as_secs_f64()
                    ))
                }
            };
            self.shared.record(Check::CapturesEndWhole, outcome);
            self.shared.end_capture(&run.name);
            // Its workload pod is over: remove it (the capture's Job goes
            // with the capture at the end).
            let _ = Api::<Pod>::namespaced(self.client.clone(), NAMESPACE)
                .delete(&run.name, &DeleteParams::default().grace_period(0))
                .await;
        }
    }

    /// Whether the capture `name`'s image at `digest` verifies with the
    /// tenant's key and, extracted as the agent extracts, holds the fixture
    /// its pod wrote, byte for byte.
    async fn holds_what_was_written(&self, name: &str, digest: Option<&str>) -> anyhow::Result<()> {
        let digest = digest.ok_or_else(|| anyhow::anyhow!("Complete without a digest"))?;
        let pinned: gkm_oci::ImageRef =
            format!("{}/soak/{name}@{digest}", self.registry).parse()?;
        let registry = gkm_oci::RegistryOptions {
            insecure: true,
            ..gkm_oci::RegistryOptions::default()
        };
        let policy = gkm_core::policy::Policy::keys(vec![gkm_core::policy::PublicKey::from_pem(
            &self.key.public_pem,
        )?])?;
        gkm_oci::verify::verify(&pinned, &registry, &digest.parse()?, &policy).await?;
        let out = self.dir.join("captured").join(name);
        let _ = std::fs::remove_dir_all(&out);
        let repo = gkm_oci::Repo::open(&pinned, &registry)?;
        let image = gkm_oci::Image::fetch(&repo).await?;
        gkm_oci::extract_to_dir(&repo, &image, &out, &gkm_oci::UnpackOptions::default()).await?;
        let written = fixture(WRITTEN);
        same_tree(&written, &out)?;
        std::fs::remove_dir_all(&out)?;
        Ok(())
    }

    /// Waits until every capture ended (at most [`CAPTURE_WITHIN`] after
    /// the last fault), checking each, then deletes the captures, whose
    /// Jobs go with them.
    pub async fn end_captures(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + CAPTURE_WITHIN;
        while !self.shared.open_captures().is_empty() && Instant::now() < deadline {
            self.check_captures().await;
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        }
        self.check_captures().await;
        let captures = Api::<GKMCacheCapture>::namespaced(self.client.clone(), NAMESPACE);
        captures
            .delete_collection(&DeleteParams::background(), &Default::default())
            .await?;
        Ok(())
    }
}

/// Whether the trees `expected` and `got` hold the same files with the
/// same bytes.
fn same_tree(expected: &Path, got: &Path) -> anyhow::Result<()> {
    let paths = trees::verified_paths(expected)?;
    let found = trees::verified_paths(got)?;
    anyhow::ensure!(
        paths == found,
        "the image holds {found:?}, the pod wrote {paths:?}"
    );
    anyhow::ensure!(
        trees::fingerprint(expected, &paths)? == trees::fingerprint(got, &paths)?,
        "the image's files differ from what the pod wrote"
    );
    Ok(())
}
