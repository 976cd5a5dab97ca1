//! Sigstore `trusted_root.json`: parsing never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gkm_oci::fuzzing::trusted_root(data));
