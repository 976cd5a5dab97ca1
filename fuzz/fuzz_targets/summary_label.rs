//! The `cache.triton.image/summary` label: parsing never panics; what parses
//! round-trips.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &str| gkm_oci::fuzzing::summary_label(data));
