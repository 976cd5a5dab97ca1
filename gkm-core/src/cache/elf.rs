//! Whether a compiled library a tool left in its cache is whole: a torn
//! one (empty, truncated) is loaded and fails rather than being built
//! again, so the kinds that file libraries refuse it.

use std::path::Path;

use super::CacheError;
use super::files::{read_head, torn};

/// Why a file of `len` bytes starting with `head` (at least its first 64
/// bytes, or all of it) is not a whole ELF file: its header, and the
/// section header table it points to, within the file. `None` when it is.
pub(crate) fn not_whole(head: &[u8], len: u64) -> Option<String> {
    if len == 0 {
        return Some("that is empty".into());
    }
    if !head.starts_with(b"\x7fELF") {
        return Some("that is not an ELF file".into());
    }
    // ELF64: e_shoff at 0x28 (8 bytes), e_shentsize at 0x3a and e_shnum at
    // 0x3c (2 bytes each), in the byte order e_ident[EI_DATA] names (2: big
    // endian). A 32-bit library is taken as whole.
    let truncated = || Some("that is truncated: shorter than its ELF headers say".to_string());
    let (Some(class), Some(data)) = (head.get(4), head.get(5)) else {
        return truncated();
    };
    if *class != 2 {
        return None;
    }
    let big = *data == 2;
    let field = |at: usize, width: usize| -> Option<u64> {
        let raw = head.get(at..at + width)?;
        Some(raw.iter().enumerate().fold(0u64, |acc, (i, b)| {
            let shift = if big { 8 * (width - 1 - i) } else { 8 * i };
            acc | (u64::from(*b) << shift)
        }))
    };
    let (Some(shoff), Some(shentsize), Some(shnum)) =
        (field(0x28, 8), field(0x3a, 2), field(0x3c, 2))
    else {
        return truncated();
    };
    let end = shentsize
        .checked_mul(shnum)
        .and_then(|n| n.checked_add(shoff));
    match end {
        Some(end) if end <= len => None,
        _ => truncated(),
    }
}

/// The first `limit` bytes of the ELF file at `path` when it is whole
/// ([`not_whole`]); a torn one is refused naming it, as `what` (`a module
/// library`, `a kernel cubin`).
pub(crate) fn whole_head(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>, CacheError> {
    let len = std::fs::metadata(path)
        .map_err(|source| CacheError::Io {
            path: path.to_path_buf(),
            source,
        })?
        .len();
    let head = read_head(path, limit)?;
    match not_whole(&head, len) {
        Some(why) => Err(torn(path, format!("{what} {why}"))),
        None => Ok(head),
    }
}

/// The major version of the CUDA runtime a library links
/// (`libcudart.so.12`: `12`), from its dynamic string table in `head`.
pub(crate) fn cudart_major(head: &[u8]) -> Option<String> {
    const NEEDLE: &[u8] = b"libcudart.so.";
    let at = head.windows(NEEDLE.len()).position(|w| w == NEEDLE)? + NEEDLE.len();
    let digits: String = head[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .map(|b| char::from(*b))
        .collect();
    (!digits.is_empty()).then_some(digits)
}

/// `e_machine` of a CUDA cubin (`EM_CUDA`).
const EM_CUDA: u16 = 190;

/// The SM number a CUDA cubin was compiled for (`90` for `sm_90a`), from
/// the ELF header of a whole 64-bit little-endian cubin (`head`: at least
/// its first 64 bytes): `e_flags` holds it in its low byte under the
/// cubin ELF ABI version 7 (`EI_ABIVERSION`, CUDA 12.8 and before:
/// `0x5a0d5a` for sm_90a) and in its second byte under version 8 (CUDA
/// 12.9 on, and sm_100 and later: `0x900640a` for sm_100a). The feature
/// suffix (`a`, `f`) is not read: ptxas 13.0 writes the same flags for
/// sm_100, sm_100a and sm_100f. Why it is not one is the error.
pub(crate) fn cubin_sm(head: &[u8]) -> Result<u32, String> {
    let (Some(machine), Some(flags)) = (head.get(18..20), head.get(0x30..0x34)) else {
        return Err("that is shorter than an ELF header".into());
    };
    if head.get(4..6) != Some(&[2, 1]) {
        return Err("that is not a 64-bit little-endian ELF file".into());
    }
    let machine = u16::from_le_bytes([machine[0], machine[1]]);
    if machine != EM_CUDA {
        return Err(format!(
            "that is an ELF file for machine {machine}, not a CUDA cubin"
        ));
    }
    let flags = u32::from_le_bytes([flags[0], flags[1], flags[2], flags[3]]);
    match head.get(8) {
        Some(7) => Ok(flags & 0xff),
        Some(8) => Ok((flags >> 8) & 0xff),
        abi => Err(format!(
            "that is a cubin of ELF ABI version {}, which gkm does not read (7 or 8)",
            abi.copied().unwrap_or_default()
        )),
    }
}

/// `e_machine` of AMD GPU code objects (`EM_AMDGPU`).
const EM_AMDGPU: u16 = 224;

/// The SM numbers of every CUDA cubin in `bytes`, ascending and each once:
/// `bytes` itself when it is a cubin, and the cubins a host library or
/// fatbin embeds (an uncompressed fatbin keeps each whole, an ELF header
/// where it starts). Why one it holds cannot be read is the error, and a
/// ROCm code object is one: gkm reads no AMD GPU code in a library.
pub(crate) fn embedded_cubin_sms(bytes: &[u8]) -> Result<Vec<u32>, String> {
    let mut sms = Vec::new();
    let mut at = 0;
    while let Some(found) = bytes[at..].windows(4).position(|w| w == b"\x7fELF") {
        let start = at + found;
        let head = &bytes[start..];
        let machine = head.get(18..20).map(|m| u16::from_le_bytes([m[0], m[1]]));
        if machine == Some(EM_CUDA) {
            sms.push(cubin_sm(head)?);
        } else if machine == Some(EM_AMDGPU) && head.get(4..6) == Some(&[2, 1]) {
            return Err("that holds ROCm code, whose architecture gkm does not read".into());
        }
        at = start + 4;
    }
    sms.sort_unstable();
    sms.dedup();
    Ok(sms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cubin_names_its_sm_in_the_byte_its_abi_version_says() {
        let header = |abi: u8, flags: u32| {
            let mut h = vec![0u8; 0x40];
            h[..6].copy_from_slice(b"\x7fELF\x02\x01");
            h[8] = abi;
            h[18..20].copy_from_slice(&EM_CUDA.to_le_bytes());
            h[0x30..0x34].copy_from_slice(&flags.to_le_bytes());
            h
        };
        assert_eq!(cubin_sm(&header(7, 0x5a0d5a)), Ok(90));
        assert_eq!(cubin_sm(&header(7, 0x4b054b)), Ok(75));
        assert_eq!(cubin_sm(&header(8, 0x900640a)), Ok(100));
        assert_eq!(cubin_sm(&header(8, 0x900780a)), Ok(120));
        assert!(
            cubin_sm(&header(9, 0))
                .unwrap_err()
                .contains("ABI version 9")
        );
        let mut x86 = header(7, 0);
        x86[18] = 62;
        assert!(cubin_sm(&x86).unwrap_err().contains("machine 62"));
        assert!(cubin_sm(b"\x7fELF").is_err());
    }

    #[test]
    fn a_library_that_is_not_a_whole_elf_file_is_torn() {
        assert!(not_whole(b"", 0).unwrap().contains("empty"));
        assert!(not_whole(b"#!/bin/sh", 9).unwrap().contains("not an ELF"));
        let mut header = vec![0u8; 0x40];
        header[..4].copy_from_slice(b"\x7fELF");
        header[4] = 2;
        header[5] = 1;
        // Section headers at 0x40, one of 0x40 bytes: past the end.
        header[0x28] = 0x40;
        header[0x3a] = 0x40;
        header[0x3c] = 1;
        assert!(
            not_whole(&header, header.len() as u64)
                .unwrap()
                .contains("truncated")
        );
        header.extend([0u8; 0x40]);
        assert_eq!(not_whole(&header, header.len() as u64), None);
        assert!(
            not_whole(&header[..0x30], 0x30)
                .unwrap()
                .contains("truncated")
        );
    }
}
