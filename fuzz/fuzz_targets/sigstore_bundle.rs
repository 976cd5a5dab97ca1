//! Sigstore bundles (DSSE envelopes, message signatures, certificates,
//! tlog entries): reading and checking one never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gkm_oci::fuzzing::sigstore_bundle(data));
