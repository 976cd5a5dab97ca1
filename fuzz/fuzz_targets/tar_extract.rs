//! Layer tars: extraction never panics and never writes outside its
//! directory.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(scratch) = tempfile::tempdir() {
        gkm_oci::fuzzing::tar_extraction(data, scratch.path());
    }
});
