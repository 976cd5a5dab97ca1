//! `manifest.json`: parsing never panics; what parses round-trips.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gkm_oci::fuzzing::manifest_json(data));
