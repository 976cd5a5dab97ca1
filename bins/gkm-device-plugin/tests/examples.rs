//! The resource names in `examples/device-plugin/` are the names the plugin
//! gives the example node's GPUs, so the examples work as written.

use std::collections::BTreeSet;

use gkm_gpu::pci_ids::PciIds;
use gkm_k8s_device_plugin::node_tree::NodeTree;
use gkm_k8s_device_plugin::resources::{ScanInputs, scan};
use serde_yaml::Value;

/// Every value under a `deviceName` or `resourceName` key, and every
/// resource key under `limits`.
fn names(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Mapping(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    (Some("deviceName" | "resourceName"), Value::String(s)) => {
                        out.insert(s.clone());
                    }
                    (Some("limits"), Value::Mapping(limits)) => {
                        out.extend(limits.keys().filter_map(|k| k.as_str().map(String::from)));
                    }
                    _ => names(v, out),
                }
            }
        }
        Value::Sequence(items) => items.iter().for_each(|v| names(v, out)),
        _ => {}
    }
}

#[test]
fn the_examples_request_resources_the_plugin_offers() {
    let dir = gkm_testenv::repo_root().join("examples/device-plugin");
    let mut requested = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).expect("examples/device-plugin") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read");
        let doc: Value = serde_yaml::from_str(&text).expect("YAML");
        names(&doc, &mut requested);
    }
    assert_eq!(
        requested.iter().map(String::as_str).collect::<Vec<_>>(),
        [
            "nvidia.com/GH100_H100_SXM5_80GB",
            "nvidia.com/GRID_T4-2Q",
            "nvidia.com/gpu"
        ]
    );

    let work = tempfile::tempdir().expect("tempdir");
    let tree = NodeTree::new(work.path()).expect("tree");
    tree.example().expect("example node");
    // A GPU on the nvidia driver, for nvidia.com/gpu.
    tree.pci(
        &gkm_k8s_device_plugin::node_tree::Pci::gpu("0000:6e:00.0", 0x10de, 0x2330)
            .driver("nvidia"),
    )
    .expect("gpu");
    let snapshot = scan(tree.paths(), &PciIds::bundled(), &ScanInputs::default()).expect("scan");
    for name in &requested {
        assert!(
            snapshot.resources.contains_key(name),
            "{name} is not offered; the plugin offers {:?}",
            snapshot.resources.keys().collect::<Vec<_>>()
        );
    }
}
