//! Triton and vLLM cache trees built from structured input: scanning never
//! panics; what scans round-trips through `manifest.json`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gkm_oci::fuzzing::cache_scan(data));
