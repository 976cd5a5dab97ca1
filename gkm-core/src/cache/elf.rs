//! Whether a compiled library a tool left in its cache is whole: a torn
//! one (empty, truncated) is loaded and fails rather than being built
//! again, so the kinds that file libraries refuse it.

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

#[cfg(test)]
mod tests {
    use super::*;

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
