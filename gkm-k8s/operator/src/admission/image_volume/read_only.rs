//! The warning the `image-volume.gkm.io` webhook gives a pod whose
//! containers see a gkm cache image volume as the kubelet mounts it:
//! read-only. Pure.
//!
//! Workloads write into their cache: Triton makes `<cache>/<key>/` on a
//! miss and fails on a read-only file system; torch.compile takes lock files
//! even on a hit. A pod is steered to a writable view: an init container
//! running `gkm view` from the image volume into an `emptyDir`, which the
//! workload then uses as its cache, or a `csi.gkm.io` volume, whose
//! writable view the CSI driver makes. The pod is admitted either way
//! (a pod that only reads is right to mount the tree as it is).

use k8s_openapi::api::core::v1::{Container, Pod};

use super::decide::requests;

/// The warnings for `pod`: one for each gkm cache image volume a container
/// mounts with no init container laying a `gkm view` of it.
pub fn warnings(pod: &Pod) -> Vec<String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let mut out = Vec::new();
    for (index, cache) in requests(pod) {
        let Some(volume) = volumes.get(index).map(|v| v.name.as_str()) else {
            continue;
        };
        let viewed = init.iter().any(|c| mounts(c, volume) && lays_a_view(c));
        if viewed {
            continue;
        }
        for container in spec.containers.iter().filter(|c| mounts(c, volume)) {
            out.push(format!(
                "container {:?} mounts gkm cache {cache} (image volume {volume:?}), which the \
                 kubelet mounts read-only: Triton fails with a read-only file system on its first \
                 miss, torch.compile even on a hit. To write, add an init container running \
                 `gkm view <image volume mount> <emptyDir mount> --mount-path <cache path>` and \
                 use the emptyDir as the cache, or mount a csi.gkm.io volume",
                container.name
            ));
        }
    }
    out
}

/// Whether `container` mounts the volume `volume`.
fn mounts(container: &Container, volume: &str) -> bool {
    container
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.name == volume)
}

/// Whether `container` runs `gkm view`: the words of its command and
/// arguments hold `gkm view` (the program by any path), or it has no
/// command (the gkm image's entrypoint is gkm) and its arguments start
/// with `view`.
fn lays_a_view(container: &Container) -> bool {
    let command = container.command.as_deref().unwrap_or_default();
    let args = container.args.as_deref().unwrap_or_default();
    if command.is_empty() && args.first().is_some_and(|a| a == "view") {
        return true;
    }
    let words: Vec<&str> = command
        .iter()
        .chain(args)
        .flat_map(|w| w.split_whitespace())
        .collect();
    words
        .windows(2)
        .any(|w| (w[0] == "gkm" || w[0].ends_with("/gkm")) && w[1] == "view")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod(init: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": init,
                "containers": [
                    {"name": "server", "image": "x",
                     "volumeMounts": [{"name": "kernels", "mountPath": "/image"}]},
                    {"name": "sidecar", "image": "x"}],
                "volumes": [{"name": "scratch", "emptyDir": {}},
                            {"name": "kernels", "image": {"reference": "gkm.invalid/cache/vector-add"}}],
            },
        }))
        .expect("pod")
    }

    #[test]
    fn a_container_mounting_a_cache_image_volume_as_it_is_is_warned() {
        let warned = warnings(&pod(json!([])));
        assert_eq!(warned.len(), 1, "{warned:?}");
        for needle in [
            "container \"server\"",
            "gkm cache vector-add",
            "read-only",
            "gkm view",
            "csi.gkm.io",
        ] {
            assert!(warned[0].contains(needle), "{needle}: {}", warned[0]);
        }
        // An init container that mounts it but lays no view does not count.
        let other = json!([{"name": "ls", "image": "x", "command": ["ls", "/image"],
            "volumeMounts": [{"name": "kernels", "mountPath": "/image"}]}]);
        assert_eq!(warnings(&pod(other)).len(), 1);
    }

    #[test]
    fn a_pod_laying_a_gkm_view_of_the_volume_is_not_warned() {
        for init in [
            json!({"command": ["/usr/bin/gkm", "view", "/image/io.triton.cache", "/cache"]}),
            json!({"command": ["sh", "-c", "gkm view /image/io.triton.cache /cache"]}),
            json!({"args": ["view", "/image/io.triton.cache", "/cache"]}),
        ] {
            let mut container = json!({"name": "view", "image": "gkm",
                "volumeMounts": [{"name": "kernels", "mountPath": "/image"}]});
            for (k, v) in init.as_object().expect("object") {
                container[k] = v.clone();
            }
            assert!(warnings(&pod(json!([container]))).is_empty(), "{container}");
        }
    }
}
