//! EROFS blobs' first block: the superblock check a blob passes before a
//! node would mount it never panics, and accepts only what it promises.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gkm_oci::fuzzing::erofs_superblock(data));
