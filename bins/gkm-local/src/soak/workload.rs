//! The steady workload: caches applied, tags moved, a multi-target
//! variant changed, reader pods (read-only and writable CSI views) started
//! and deleted on the real node, captures run ([`super::captures`]), a
//! claim filled again by a Job as its cache's tag moves ([`super::claims`]). Each step is one seeded choice; a step the
//! cluster refuses (the apiserver is down) is counted and skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gkm_k8s_api::crd::GKMCache;
use gkm_oci::{BuildOptions, RegistryOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::rng::Rng;
use super::state::{CacheTruth, Reader, Shared};
use super::trees;
use crate::cosign::{self, CosignKey};
use crate::fixture;

/// The namespace of the soak's caches and pods.
pub const NAMESPACE: &str = "soak";
/// The tag every cache follows.
const TAG: &str = "live";
/// At most this many readers run at once.
const MAX_READERS: usize = 3;
/// At most this many captures are under way at once.
const MAX_CAPTURES: usize = 2;

/// A cache of the workload: its name, the fixtures of its targets (one for
/// a single-target image, several for a multi-target index), and the
/// nodes that hold it.
pub struct CacheSpec {
    /// The GKMCache's name.
    pub name: &'static str,
    /// Fixture names; the first is the real node's (sm75) when readers mount it.
    pub fixtures: &'static [&'static str],
    /// Whether reader pods on the real node mount it.
    pub read: bool,
    /// The nodes whose GPUs fit it (that hold it in their stores).
    pub nodes: &'static [&'static str],
    /// Delivered through a claim filled by a Job ([`super::claims`])
    /// instead of the nodes' stores.
    pub claim: bool,
}

/// The real node's name (a T4, like `node-sm75`).
pub const REAL_NODE: &str = "soak-real";

/// The caches: a single-target sm75 cache and a gfx90a one whose tags move,
/// a multi-target index whose variants change one at a time, and an sm75
/// cache delivered through a claim whose tag moves.
pub const CACHES: [CacheSpec; 4] = [
    CacheSpec {
        name: "sm75",
        fixtures: &["triton-vector-add-cuda-sm75"],
        read: true,
        nodes: &[REAL_NODE, "node-sm75"],
        claim: false,
    },
    CacheSpec {
        name: "gfx90a",
        fixtures: &["triton-vector-add-rocm-gfx90a"],
        read: false,
        nodes: &["node-gfx90a"],
        claim: false,
    },
    CacheSpec {
        name: "fleet",
        fixtures: &[
            "triton-vector-add-cuda-sm75",
            "triton-vector-add-rocm-gfx90a",
        ],
        read: true,
        nodes: &[REAL_NODE, "node-sm75", "node-gfx90a"],
        claim: false,
    },
    CacheSpec {
        name: super::claims::CLAIMED,
        fixtures: &["triton-vector-add-cuda-sm75"],
        read: false,
        nodes: &[],
        claim: true,
    },
];

/// What the workload needs of the stack.
pub struct Workload<'a> {
    /// An admin client.
    pub client: kube::Client,
    /// The registry pushes go to directly (never through the fault proxy).
    pub registry: String,
    /// Where gkm reads the registry (through the fault proxy).
    pub pull_addr: String,
    /// The signing key.
    pub key: &'a CosignKey,
    /// Scratch space: variant trees, reader logs.
    pub dir: PathBuf,
    /// Shared with the checks.
    pub shared: &'a Shared,
    /// Variants pushed per cache, per target.
    generation: std::cell::Cell<u64>,
}

impl<'a> Workload<'a> {
    /// A workload on `client`, pushing to `registry`, gkm pulling from `pull_addr`.
    pub fn new(
        client: kube::Client,
        registry: &str,
        pull_addr: &str,
        key: &'a CosignKey,
        dir: &Path,
        shared: &'a Shared,
    ) -> Workload<'a> {
        Workload {
            client,
            registry: registry.to_string(),
            pull_addr: pull_addr.to_string(),
            key,
            dir: dir.to_path_buf(),
            shared,
            generation: std::cell::Cell::new(0),
        }
    }

    /// Pushes every cache's first variant and applies the GKMCaches.
    pub async fn apply_caches(&self) -> anyhow::Result<()> {
        for spec in &CACHES {
            let variants: Vec<usize> = (0..spec.fixtures.len()).collect();
            self.push(spec, &variants).await?;
            let mut cache = json!({
                "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
                "metadata": {"name": spec.name, "namespace": NAMESPACE},
                "spec": {
                    "image": format!("{}/soak/{}:{TAG}", self.pull_addr, spec.name),
                    "signature": {"signers": [{"key": {"publicKey": self.key.public_pem}}]},
                },
            });
            if spec.claim {
                super::claims::deliver_through_a_claim(&mut cache["spec"]);
            }
            Api::<GKMCache>::namespaced(self.client.clone(), NAMESPACE)
                .patch(
                    spec.name,
                    &PatchParams::apply("gkm-soak").force(),
                    &Patch::Apply(&cache),
                )
                .await?;
        }
        Ok(())
    }

    /// Builds new variants of `spec`'s targets at `changed` (the others keep
    /// their last tree), pushes them to the cache's tag, signs the result
    /// and records what readers may now see.
    async fn push(&self, spec: &CacheSpec, changed: &[usize]) -> anyhow::Result<()> {
        let generation = self.generation.get() + 1;
        self.generation.set(generation);
        let mut dirs = Vec::new();
        for (target, fixture_name) in spec.fixtures.iter().enumerate() {
            let dir = self
                .dir
                .join("trees")
                .join(spec.name)
                .join(target.to_string());
            let current = dir.join("current");
            if changed.contains(&target) || !current.exists() {
                let fresh = dir.join(format!("g{generation}"));
                trees::write_variant(
                    &fixture(fixture_name),
                    &fresh,
                    &format!("{}-{target}-g{generation}", spec.name),
                )?;
                let _ = std::fs::remove_file(&current);
                std::os::unix::fs::symlink(&fresh, &current)?;
            }
            dirs.push(std::fs::canonicalize(&current)?);
        }
        // Readers may see this variant from the moment it is pushed.
        if spec.read {
            let paths = trees::verified_paths(&dirs[0])?;
            let fingerprint = trees::fingerprint(&dirs[0], &paths)?;
            let mut caches = self.shared.caches();
            let truth = caches
                .entry(spec.name.to_string())
                .or_insert_with(|| CacheTruth {
                    paths: paths.clone(),
                    ..CacheTruth::default()
                });
            truth.fingerprints.insert(fingerprint);
        }
        let repository = format!("{}/soak/{}", self.registry, spec.name);
        let options = RegistryOptions {
            insecure: true,
            ..RegistryOptions::default()
        };
        let image = format!("{repository}:{TAG}");
        let digest = if dirs.len() == 1 {
            gkm_oci::build(
                &dirs[0],
                &image.parse()?,
                &BuildOptions::default(),
                &options,
            )
            .await?
            .digest
            .to_string()
        } else {
            gkm_oci::build::build_multi(
                &dirs,
                &image.parse()?,
                &BuildOptions::default(),
                &options,
                None,
            )
            .await?
            .digest()
            .to_string()
        };
        cosign::sign(self.key, &format!("{repository}@{digest}"))?;
        // The real node's agent stores a claimed cache as well (its claim
        // is filled by a Job besides), so each of its moves is one more
        // change the node stores.
        let stored_by_real_node = spec.nodes.contains(&REAL_NODE) || spec.claim;
        let real_node_changed = stored_by_real_node && changed.contains(&0);
        let mut caches = self.shared.caches();
        let truth = caches.entry(spec.name.to_string()).or_default();
        truth.latest = digest;
        truth.changed_at = Some(Instant::now());
        truth.converged = false;
        truth.nodes = spec.nodes.iter().map(|n| n.to_string()).collect();
        truth.claim = spec.claim;
        drop(caches);
        if real_node_changed {
            self.shared.count("real-node-changes");
        }
        Ok(())
    }

    /// One seeded step.
    pub async fn step(&self, rng: &mut Rng) -> anyhow::Result<()> {
        let readers = self.shared.live_readers();
        let roll = rng.between(0, 99);
        if roll < 15 {
            self.shared.count("tag-moved");
            self.push(&CACHES[0], &[0]).await
        } else if roll < 20 {
            self.shared.count("claimed-tag-moved");
            self.push(&CACHES[3], &[0]).await
        } else if roll < 30 {
            self.shared.count("tag-moved");
            self.push(&CACHES[1], &[0]).await
        } else if roll < 45 {
            self.shared.count("variant-changed");
            let target = rng.between(0, 1) as usize;
            self.push(&CACHES[2], &[target]).await
        } else if roll < 53 && self.shared.open_captures().len() < MAX_CAPTURES {
            self.start_capture().await
        } else if roll < 75 && readers.len() < MAX_READERS {
            let cache = if rng.between(0, 1) == 0 {
                "sm75"
            } else {
                "fleet"
            };
            let writable = rng.between(0, 1) == 1;
            self.start_reader("reader", cache, writable)
                .await
                .map(|_| ())
        } else if let Some(oldest) = readers.first().filter(|_| readers.len() > 1) {
            self.delete_reader(oldest).await
        } else {
            Ok(())
        }
    }

    /// Starts a reader of `cache` named `<prefix>-<n>` on the real node
    /// and returns its name.
    pub async fn start_reader(
        &self,
        prefix: &str,
        cache: &str,
        writable: bool,
    ) -> anyhow::Result<String> {
        let (name, paths) = {
            let caches = self.shared.caches();
            let paths = caches
                .get(cache)
                .map(|t| t.paths.clone())
                .ok_or_else(|| anyhow::anyhow!("no cache {cache} to read"))?;
            (self.shared.next_name(prefix), paths)
        };
        let out = self.dir.join("reads").join(&name);
        std::fs::create_dir_all(&out)?;
        let mut volume = json!({"driver": "csi.gkm.io",
                                "volumeAttributes": {"csi.gkm.io/GKMCache": cache}});
        if !writable {
            volume["readOnly"] = json!(true);
        }
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"gkm-soak": "reader"}},
            "spec": {
                "nodeName": REAL_NODE,
                "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 0,
                "containers": [{
                    "name": "reader", "image": gkm_testenv::BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", trees::read_script(&paths, writable, 2)],
                    "volumeMounts": [
                        {"name": "cache", "mountPath": trees::MOUNT_PATH, "readOnly": !writable},
                        {"name": "out", "mountPath": "/out"},
                    ],
                }],
                "volumes": [
                    {"name": "cache", "csi": volume},
                    {"name": "out", "hostPath": {"path": out, "type": "Directory"}},
                ],
            }
        }))?;
        let created = Api::<Pod>::namespaced(self.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &pod)
            .await?;
        eprintln!(
            "soak: {:>6.1}s pod {name} ({}, {}) uid {}",
            self.shared.elapsed_s(),
            cache,
            if writable { "writable" } else { "read-only" },
            created.metadata.uid.unwrap_or_default()
        );
        self.shared.count(if writable {
            "writable-pod-started"
        } else {
            "read-only-pod-started"
        });
        self.shared.add_reader(Reader {
            name: name.clone(),
            cache: cache.to_string(),
            writable,
            log: out.join("reads.log"),
            created: Instant::now(),
            ..Reader::default()
        });
        Ok(name)
    }

    /// Deletes reader `name` at once (grace 0).
    pub async fn delete_reader(&self, name: &str) -> anyhow::Result<()> {
        let pods = Api::<Pod>::namespaced(self.client.clone(), NAMESPACE);
        match pods
            .delete(name, &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        self.shared.count("pod-deleted");
        eprintln!("soak: {:>6.1}s pod {name} deleted", self.shared.elapsed_s());
        self.shared.retire_reader(name);
        Ok(())
    }

    /// Deletes every reader and waits until their pods are gone.
    pub async fn delete_all_readers(&self, timeout: Duration) -> anyhow::Result<()> {
        for name in self.shared.live_readers() {
            self.delete_reader(&name).await?;
        }
        let pods = Api::<Pod>::namespaced(self.client.clone(), NAMESPACE);
        gkm_testenv::eventually("every reader pod gone", timeout, || {
            let pods = pods.clone();
            async move {
                Ok(pods
                    .list(&Default::default())
                    .await?
                    .items
                    .is_empty()
                    .then_some(()))
            }
        })
        .await
    }

    /// The nodes each cache should be held on, and every fingerprint readers
    /// may print, per cache (for reports).
    pub fn expected(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.shared
            .caches()
            .iter()
            .map(|(name, truth)| (name.clone(), truth.fingerprints.clone()))
            .collect()
    }
}
