//! Directory trees in tests: copying one, and reading one whole to compare.

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
