//! OCI image manifests, indexes and configs: parsing never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gkm_oci::fuzzing::oci_json(data));
