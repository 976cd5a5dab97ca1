//! Image references: parsing never panics; what parses prints to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &str| gkm_oci::fuzzing::image_reference(data));
