//! CSI `NodePublishVolume` requests built from structured input (volume
//! attributes and the kubelet's pod info): checking one never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gkm_k8s_csi::fuzzing::csi_publish(data));
