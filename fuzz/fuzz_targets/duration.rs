//! Duration flags and `resolveInterval`: parsing never panics; what parses
//! prints back to the same duration.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &str| gkm_oci::fuzzing::duration(data));
