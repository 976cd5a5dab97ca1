//! Layer tars: extraction never panics and never writes outside its
//! directory.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gkm_oci::fuzzing::tar_extract_bytes(data));
