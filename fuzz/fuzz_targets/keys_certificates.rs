//! PEM/DER public and private keys, signing certificates and SCT lists:
//! reading them never panics; a key read prints back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gkm_oci::fuzzing::keys_certificates(data));
