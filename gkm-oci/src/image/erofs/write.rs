//! Writing a layer's EROFS twin with erofs-utils' `mkfs.erofs`,
//! deterministically: the same layer gives the same bytes.
//!
//! The tree comes from the tar layer itself: the layer is unpacked (by
//! gkm's hardened extractor, so its modes are the layer's 0644/0755 and it
//! holds only files and directories) into a staging directory, and
//! `mkfs.erofs` makes the image of that directory with everything else
//! fixed: timestamps 0 (`-T0`, as in the tar), every file owned by root
//! (`--all-root`), no extended attributes (`-x-1`), lz4hc in 64 KiB
//! physical clusters with packed tails, and a UUID taken from
//! the layer's `diff_id` (two different twins mounted side by side never
//! share a UUID, which overlayfs checks). mkfs.erofs orders directory
//! entries by name whatever order the staging directory lists them in.
//! The bytes are reproducible for one version of erofs-utils; CI pins it
//! (`hack/ci/components.sh`, Debian's `erofs-utils`).

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};
use crate::image::erofs::superblock::{self, HEAD_LEN};
use crate::image::erofs::{ErofsCompression, ErofsLayer};
use crate::image::labels::Compression;
use crate::image::layer::DIR_MODE;
use crate::store::extract::{ExtractPolicy, Mapping, extract_tar};
use gkm_core::digest::{Digest, HashingWriter};

/// The environment variable naming the `mkfs.erofs` to run (default: the
/// one on `PATH`).
pub const MKFS_ENV: &str = "GKM_MKFS_EROFS";

/// How to write EROFS twins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErofsWriter {
    /// The `mkfs.erofs` program.
    pub program: PathBuf,
    /// How files are compressed.
    pub compression: ErofsCompression,
}

impl Default for ErofsWriter {
    /// `mkfs.erofs` from [`MKFS_ENV`], else from `PATH`; lz4hc.
    fn default() -> Self {
        let program = std::env::var_os(MKFS_ENV)
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| OsString::from("mkfs.erofs"));
        ErofsWriter {
            program: PathBuf::from(program),
            compression: ErofsCompression::Lz4hc,
        }
    }
}

/// The UUID of the twin of the layer whose uncompressed digest is
/// `diff_id`: its first 16 bytes, marked as an RFC 9562 version 8 UUID.
pub fn uuid_of(diff_id: &Digest) -> String {
    let mut b = [0u8; 16];
    // A digest's hex is 64 valid digits: this never falls back.
    if let Some(bytes) = diff_id.hex().get(..32).and_then(|h| hex::decode(h).ok()) {
        b.copy_from_slice(&bytes);
    }
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The `mkfs.erofs` arguments that make `image` from `tree`.
pub fn mkfs_args(
    compression: ErofsCompression,
    diff_id: &Digest,
    image: &Path,
    tree: &Path,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "--quiet".into(),
        "-x-1".into(),
        "-T0".into(),
        "--all-root".into(),
        format!("-U{}", uuid_of(diff_id)).into(),
    ];
    if compression == ErofsCompression::Lz4hc {
        // 64 KiB physical clusters and tails packed into their inodes: about
        // a fifth smaller than 4 KiB clusters on a Triton-like tree (Linux
        // 5.17 and later read both).
        args.extend(["-zlz4hc".into(), "-C65536".into(), "-Eztailpacking".into()]);
    }
    args.push(image.into());
    args.push(tree.into());
    args
}

/// Writes the EROFS twin of the layer blob `layer` (compressed with
/// `compression`, uncompressed digest `diff_id`) to `out`, unpacking it
/// into `staging` first (a path that must not exist; removed afterwards,
/// as is `out` when this fails). The twin passes
/// [`superblock::check`], as a node will check it.
pub fn write_twin(
    writer: &ErofsWriter,
    layer: &Path,
    compression: Compression,
    diff_id: &Digest,
    staging: &Path,
    out: &Path,
) -> Result<ErofsLayer> {
    let result = stage_and_make(writer, layer, compression, diff_id, staging, out);
    let _ = fs::remove_dir_all(staging);
    if result.is_err() {
        let _ = fs::remove_file(out);
    }
    result
}

fn stage_and_make(
    writer: &ErofsWriter,
    layer: &Path,
    compression: Compression,
    diff_id: &Digest,
    staging: &Path,
    out: &Path,
) -> Result<ErofsLayer> {
    fs::create_dir(staging).map_err(|e| Error::io(staging, e))?;
    fs::set_permissions(staging, fs::Permissions::from_mode(DIR_MODE))
        .map_err(|e| Error::io(staging, e))?;
    let file = File::open(layer).map_err(|e| Error::io(layer, e))?;
    let reader = BufReader::with_capacity(1 << 20, file);
    let decoded: Box<dyn Read> = match compression {
        Compression::Zstd => Box::new(zstd::Decoder::new(reader).map_err(|e| Error::io(layer, e))?),
        Compression::Gzip => Box::new(flate2::read::GzDecoder::new(reader)),
        Compression::None => Box::new(reader),
    };
    let policy = ExtractPolicy {
        free_space_reserve: crate::store::disk::FreeSpaceReserve::NONE,
        ..ExtractPolicy::default()
    };
    extract_tar(decoded, staging, Mapping::Layer, &policy)?;
    run_mkfs(writer, diff_id, staging, out)?;
    let (digest, size, head) = digest_file(out)?;
    superblock::check(&head, size)
        .map_err(|e| Error::format(format!("EROFS image {} written", out.display()), e))?;
    Ok(ErofsLayer {
        digest,
        size,
        compression: writer.compression,
    })
}

fn run_mkfs(writer: &ErofsWriter, diff_id: &Digest, tree: &Path, out: &Path) -> Result<()> {
    let program = &writer.program;
    let output = Command::new(program)
        .args(mkfs_args(writer.compression, diff_id, out, tree))
        .env("LC_ALL", "C")
        .output()
        .map_err(|e| {
            let e = if e.kind() == io::ErrorKind::NotFound {
                io::Error::new(
                    e.kind(),
                    format!(
                        "not found: an EROFS layer is written by erofs-utils' mkfs.erofs; \
                         install it (Debian: `apt-get install erofs-utils`; in this \
                         repository `hack/ci/components.sh debian`) or name it in {MKFS_ENV}"
                    ),
                )
            } else {
                e
            };
            Error::io(program, e)
        })?;
    if !output.status.success() {
        let said = format!(
            "{} {}",
            String::from_utf8_lossy(&output.stderr).trim(),
            String::from_utf8_lossy(&output.stdout).trim()
        );
        return Err(Error::io(
            program,
            io::Error::other(format!(
                "{} making {}: {}",
                output.status,
                out.display(),
                said.trim()
            )),
        ));
    }
    Ok(())
}

/// The digest and size of the file at `path`, and its first [`HEAD_LEN`]
/// bytes.
fn digest_file(path: &Path) -> Result<(Digest, u64, Vec<u8>)> {
    let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut head = Vec::with_capacity(HEAD_LEN);
    (&mut file)
        .take(HEAD_LEN as u64)
        .read_to_end(&mut head)
        .map_err(|e| Error::io(path, e))?;
    let mut hashing = HashingWriter::new(io::sink());
    io::copy(&mut head.as_slice(), &mut hashing).map_err(|e| Error::io(path, e))?;
    io::copy(&mut file, &mut hashing).map_err(|e| Error::io(path, e))?;
    let (_, digest, size) = hashing.finish();
    Ok((digest, size, head))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uuid_is_the_diff_id_s_first_bytes_as_a_version_8_uuid() {
        let d: Digest = "sha256:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
            .parse()
            .unwrap();
        assert_eq!(uuid_of(&d), "00112233-4455-8677-8899-aabbccddeeff");
    }
}
