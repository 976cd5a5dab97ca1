//! The EROFS superblock, checked before a node would mount a blob.
//!
//! A mounted EROFS image is parsed by the kernel, not by gkm: a crafted one
//! reaches the kernel's EROFS code with every byte. gkm narrows what gets
//! that far. The blob's digest and size come from the signed manifest (the
//! layer's [`super::ErofsLayer`]) and are checked while it is written; then
//! [`check`] reads its first [`HEAD_LEN`] bytes and refuses, naming why,
//! anything gkm's own writer ([`super::write`]) would not have produced:
//!
//! - no magic `0xE0F5E1E2` at offset 1024;
//! - a superblock checksum flag (`feature_compat` bit 0) unset, or a
//!   crc32c that does not match;
//! - a block size other than 4096 bytes (`blkszbits` 12);
//! - a superblock extended past its 128 bytes (`sb_extslots`);
//! - an incompatible feature outside [`ACCEPTED_INCOMPAT`] (the compression
//!   layout of lz4/lz4hc images: zero padding, compression configs and big
//!   physical clusters, tail packing), so chunked files, extra devices,
//!   fragments and deduplication, xattr prefixes and any feature the kernel
//!   adds later are refused;
//! - extra devices (a node mounts one file, never a device table);
//! - a block count that does not give the blob's size exactly, or a root
//!   inode or metadata start past the end of the image.
//!
//! The limits: this is a check of the superblock only. Inodes, directories
//! and compressed extents are parsed by the kernel as it reads them; a
//! crafted image that passes here still reaches that code. What keeps such
//! an image out is its digest: only a blob whose digest a signed manifest
//! names is ever mounted, so a hostile image must have been signed by a
//! signer the cluster trusts. The check keeps corruption and images that
//! were never gkm's away from the kernel, not a trusted signer's crafted one.

use crate::error::{Error, Result};

/// Where the superblock starts in the image.
pub const SUPERBLOCK_OFFSET: usize = 1024;
/// The EROFS magic number, little-endian at [`SUPERBLOCK_OFFSET`].
pub const MAGIC: u32 = 0xE0F5_E1E2;
/// How many bytes of the image [`check`] reads: the first block.
pub const HEAD_LEN: usize = 4096;
/// The only block size accepted, as a power of two (4096 bytes).
pub const BLOCK_SIZE_BITS: u8 = 12;

/// `feature_compat`: the superblock carries a crc32c checksum.
pub const COMPAT_SB_CHKSUM: u32 = 0x1;
/// `feature_incompat`: compressed data is zero-padded at the front
/// (every lz4 image mkfs.erofs writes).
pub const INCOMPAT_ZERO_PADDING: u32 = 0x1;
/// `feature_incompat`: per-algorithm compression configs and physical
/// clusters larger than one block.
pub const INCOMPAT_COMPR_CFGS: u32 = 0x2;
/// `feature_incompat`: compressed tails packed inline with their inode.
pub const INCOMPAT_ZTAILPACKING: u32 = 0x10;
/// The incompatible features a blob may use: those of lz4 and lz4hc
/// images. Everything else (chunked files 0x4, a device table or second
/// compressed header 0x8, fragments or deduplication 0x20, xattr prefixes
/// 0x40, and any bit defined later) is refused.
pub const ACCEPTED_INCOMPAT: u32 =
    INCOMPAT_ZERO_PADDING | INCOMPAT_COMPR_CFGS | INCOMPAT_ZTAILPACKING;

/// What [`check`] read from an accepted superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    /// Compatible feature bits.
    pub feature_compat: u32,
    /// Incompatible feature bits (a subset of [`ACCEPTED_INCOMPAT`]).
    pub feature_incompat: u32,
    /// Blocks in the image (of 4096 bytes).
    pub blocks: u32,
    /// Inodes in the image.
    pub inodes: u64,
    /// The filesystem UUID.
    pub uuid: [u8; 16],
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le64(b: &[u8], at: usize) -> u64 {
    (u64::from(le32(b, at + 4)) << 32) | u64::from(le32(b, at))
}

/// The superblock checksum: crc32c of the rest of the first block from the
/// superblock on, its checksum field taken as zero, without the final
/// inversion (the kernel's `crc32c(~0, ...)`).
pub fn checksum(head: &[u8]) -> Option<u32> {
    let sb = head.get(SUPERBLOCK_OFFSET..HEAD_LEN)?;
    let crc = crc32c::crc32c(&sb[..4]);
    let crc = crc32c::crc32c_append(crc, &[0; 4]);
    Some(!crc32c::crc32c_append(crc, &sb[8..]))
}

/// Checks the first bytes of an EROFS blob of `blob_size` bytes (at least
/// [`HEAD_LEN`] of them, or the whole blob if smaller) against what gkm
/// accepts before mounting (see the module documentation). Pure: reads
/// only `head`; never panics.
pub fn check(head: &[u8], blob_size: u64) -> Result<Superblock> {
    let refuse = |reason: String| Err(Error::format("EROFS blob", reason));
    if head.len() < HEAD_LEN {
        return refuse(format!(
            "{} bytes: an EROFS image holds at least its first block of {HEAD_LEN}",
            head.len()
        ));
    }
    let sb = &head[SUPERBLOCK_OFFSET..];
    let magic = le32(sb, 0);
    if magic != MAGIC {
        return refuse(format!(
            "magic {magic:#010x} at offset {SUPERBLOCK_OFFSET}: not an EROFS image \
             (expected {MAGIC:#010x})"
        ));
    }
    let feature_compat = le32(sb, 8);
    if feature_compat & COMPAT_SB_CHKSUM == 0 {
        return refuse("the superblock carries no checksum (feature_compat bit 0)".into());
    }
    let stored = le32(sb, 4);
    let computed = checksum(head).unwrap_or_default();
    if stored != computed {
        return refuse(format!(
            "superblock checksum {stored:#010x} does not match its contents ({computed:#010x})"
        ));
    }
    let blkszbits = sb[12];
    if blkszbits != BLOCK_SIZE_BITS {
        return refuse(format!(
            "block size 2^{blkszbits}: only 4096-byte blocks (2^{BLOCK_SIZE_BITS}) are accepted"
        ));
    }
    if sb[13] != 0 {
        return refuse(format!(
            "superblock extended by {} slots: not accepted",
            sb[13]
        ));
    }
    let feature_incompat = le32(sb, 80);
    let unknown = feature_incompat & !ACCEPTED_INCOMPAT;
    if unknown != 0 {
        return refuse(format!(
            "incompatible features {unknown:#x} not accepted (accepted: {ACCEPTED_INCOMPAT:#x})"
        ));
    }
    let extra_devices = le16(sb, 86);
    if extra_devices != 0 {
        return refuse(format!(
            "{extra_devices} extra devices: a blob is mounted alone"
        ));
    }
    let blocks = le32(sb, 36);
    let image_size = u64::from(blocks) << BLOCK_SIZE_BITS;
    if image_size != blob_size {
        return refuse(format!(
            "{blocks} blocks of 4096 bytes make {image_size} bytes, but the blob is {blob_size}"
        ));
    }
    let meta_blkaddr = le32(sb, 40);
    if meta_blkaddr >= blocks {
        return refuse(format!(
            "metadata starts at block {meta_blkaddr}, past the image's {blocks} blocks"
        ));
    }
    let root_nid = u64::from(le16(sb, 14));
    let root_at = (u64::from(meta_blkaddr) << BLOCK_SIZE_BITS) + root_nid * 32;
    if root_at + 32 > image_size {
        return refuse(format!(
            "root inode {root_nid} at byte {root_at}, past the image's {image_size} bytes"
        ));
    }
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&sb[48..64]);
    Ok(Superblock {
        feature_compat,
        feature_incompat,
        blocks,
        inodes: le64(sb, 16),
        uuid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A superblock as mkfs.erofs 1.5 writes it (`-zlz4hc`), for an image
    /// of `blocks` blocks, its checksum set.
    fn image(blocks: u32) -> Vec<u8> {
        let mut b = vec![0u8; HEAD_LEN];
        let sb = SUPERBLOCK_OFFSET;
        b[sb..sb + 4].copy_from_slice(&MAGIC.to_le_bytes());
        b[sb + 8..sb + 12].copy_from_slice(&3u32.to_le_bytes());
        b[sb + 12] = BLOCK_SIZE_BITS;
        b[sb + 14..sb + 16].copy_from_slice(&36u16.to_le_bytes());
        b[sb + 16..sb + 24].copy_from_slice(&11u64.to_le_bytes());
        b[sb + 36..sb + 40].copy_from_slice(&blocks.to_le_bytes());
        b[sb + 80..sb + 84].copy_from_slice(&INCOMPAT_ZERO_PADDING.to_le_bytes());
        reseal(&mut b);
        b
    }

    fn reseal(b: &mut [u8]) {
        let sum = checksum(b).unwrap();
        b[SUPERBLOCK_OFFSET + 4..SUPERBLOCK_OFFSET + 8].copy_from_slice(&sum.to_le_bytes());
    }

    fn refused(b: &[u8], size: u64) -> String {
        check(b, size).unwrap_err().to_string()
    }

    #[test]
    fn a_superblock_as_mkfs_erofs_writes_it_is_accepted() {
        let sb = check(&image(12), 12 * 4096).unwrap();
        assert_eq!((sb.blocks, sb.inodes), (12, 11));
        assert_eq!(sb.feature_incompat, INCOMPAT_ZERO_PADDING);
    }

    #[test]
    fn a_short_head_or_a_wrong_magic_is_refused() {
        assert!(refused(&image(12)[..1100], 1100).contains("at least its first block"));
        let mut b = image(12);
        b[SUPERBLOCK_OFFSET] ^= 1;
        assert!(refused(&b, 12 * 4096).contains("not an EROFS image"));
    }

    #[test]
    fn a_changed_byte_breaks_the_checksum() {
        let mut b = image(12);
        b[SUPERBLOCK_OFFSET + 100] = 7;
        assert!(
            refused(&b, 12 * 4096).contains("checksum"),
            "{}",
            refused(&b, 12 * 4096)
        );
    }

    #[test]
    fn unknown_features_block_sizes_and_devices_are_refused() {
        let cases: &[(usize, &[u8], &str)] = &[
            (12, &[9], "block size 2^9"),
            (13, &[1], "extended by 1 slots"),
            (80, &0x4u32.to_le_bytes(), "incompatible features 0x4"),
            (80, &0x100u32.to_le_bytes(), "incompatible features 0x100"),
            (86, &1u16.to_le_bytes(), "1 extra devices"),
            (8, &2u32.to_le_bytes(), "no checksum"),
        ];
        for (at, bytes, want) in cases {
            let mut b = image(12);
            b[SUPERBLOCK_OFFSET + at..SUPERBLOCK_OFFSET + at + bytes.len()].copy_from_slice(bytes);
            reseal(&mut b);
            let err = refused(&b, 12 * 4096);
            assert!(err.contains(want), "{want}: {err}");
        }
    }

    #[test]
    fn sizes_and_offsets_must_fit_the_blob() {
        assert!(refused(&image(12), 13 * 4096).contains("but the blob is"));
        let mut b = image(2);
        b[SUPERBLOCK_OFFSET + 14..SUPERBLOCK_OFFSET + 16].copy_from_slice(&300u16.to_le_bytes());
        reseal(&mut b);
        assert!(refused(&b, 2 * 4096).contains("root inode 300"));
        let mut b = image(2);
        b[SUPERBLOCK_OFFSET + 40..SUPERBLOCK_OFFSET + 44].copy_from_slice(&2u32.to_le_bytes());
        reseal(&mut b);
        assert!(refused(&b, 2 * 4096).contains("metadata starts at block 2"));
    }
}
