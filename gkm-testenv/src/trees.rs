//! Directory trees in tests: copying one (as it is, or in a chosen order),
//! and reading one whole to compare.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Copies the tree `from` to `to`: directories, regular files, and
/// symbolic links as links (a filled claim serves its files through links).
pub fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Copies the tree `from` to `to` entry by entry in a fixed order: by path,
/// or with `reverse` the other way round, so that two copies of one tree are
/// created in different orders (and a directory lists its entries in
/// different orders where the filesystem keeps creation order). Parent
/// directories are created as needed. Files are written owner-writable,
/// keeping their exec bit, so a test may edit its copy of a read-only fixture.
pub fn copy_tree_in_order(from: &Path, to: &Path, reverse: bool) -> std::io::Result<()> {
    let mut entries = Vec::new();
    let mut stack = vec![from.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                stack.push(entry.path());
            }
            entries.push(entry.path());
        }
    }
    entries.sort();
    if reverse {
        entries.reverse();
    }
    std::fs::create_dir_all(to)?;
    for source in entries {
        let rel = source.strip_prefix(from).unwrap_or(&source);
        let target = to.join(rel);
        let meta = std::fs::symlink_metadata(&source)?;
        if meta.is_dir() {
            std::fs::create_dir_all(&target)?;
            continue;
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&source)?, &target)?;
        } else {
            std::fs::write(&target, std::fs::read(&source)?)?;
            let exec = meta.permissions().mode() & 0o111 != 0;
            let mode = if exec { 0o700 } else { 0o600 };
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))?;
        }
    }
    Ok(())
}

/// Every regular file below `root`, relative to it, with its bytes, sorted:
/// two trees holding the same files compare equal.
pub fn tree_files(root: &Path) -> std::io::Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
                let bytes = std::fs::read(&path)?;
                out.push((rel, bytes));
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ordered_copy_holds_the_same_files_either_way() {
        let from = crate::temp_dir().unwrap();
        std::fs::create_dir_all(from.path().join("a/b")).unwrap();
        std::fs::write(from.path().join("a/b/c.txt"), b"c").unwrap();
        std::fs::write(from.path().join("a.txt"), b"a").unwrap();
        std::fs::write(from.path().join("run.sh"), b"#!/bin/sh").unwrap();
        std::fs::set_permissions(
            from.path().join("run.sh"),
            std::fs::Permissions::from_mode(0o555),
        )
        .unwrap();
        let to = crate::temp_dir().unwrap();
        for (name, reverse) in [("forward", false), ("backward", true)] {
            let copy = to.path().join(name);
            copy_tree_in_order(from.path(), &copy, reverse).unwrap();
            assert_eq!(tree_files(&copy).unwrap(), tree_files(from.path()).unwrap());
            let mode = |p: &str| {
                std::fs::metadata(copy.join(p))
                    .unwrap()
                    .permissions()
                    .mode()
                    & 0o777
            };
            assert_eq!((mode("a.txt"), mode("run.sh")), (0o600, 0o700));
        }
    }
}
