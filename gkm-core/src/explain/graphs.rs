//! Inductor's compiled graphs, as [`explain`](super::explain) compares
//! them: the output code Inductor writes for each graph it compiles
//! (`<xx>/c<hash>.py`), whose `call` asserts every input's size and
//! stride (`assert_size_stride(arg2_1, (4, 64), (64, 1))`). A graph
//! compiled again for other input shapes defines the same kernels with
//! other sizes, while its cache entries (the FX graph, the C++ kernels)
//! are keyed by hashes that name no shape: the output code is where the
//! shapes a miss was compiled for can be read.
//!
//! Each output code is a [`Keyed`] entry: filed under its path, named
//! `graph(<its kernels>)`, with a field `shape.<input>` per input (its
//! size as the code writes it), so graphs of the same kernels are compared
//! and a shape that differs is named.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::Keyed;
use crate::cache::CacheError;

/// The largest output code read; larger `.py` files are left out.
pub const MAX_OUTPUT_CODE_BYTES: u64 = 16 << 20;
/// The most output codes read from one tree.
pub const MAX_GRAPHS: usize = 10_000;
/// The prefix of a graph's input fields.
pub const SHAPE_FIELD: &str = "shape.";

/// The graphs of the tree at `root`: every `.py` file below it that is
/// Inductor output code ([`graph_of`]), at most [`MAX_GRAPHS`]. Symbolic
/// links are not followed.
pub fn graphs(root: &Path) -> Result<Vec<Keyed>, CacheError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CacheError::Io { path, source }
    };
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).map_err(io(&dir))? {
            let entry = entry.map_err(io(&dir))?;
            let path = entry.path();
            let kind = entry.file_type().map_err(io(&path))?;
            if kind.is_dir() {
                dirs.push(path);
                continue;
            }
            let is_code = path.extension().is_some_and(|e| e == "py");
            if !kind.is_file() || !is_code {
                continue;
            }
            if entry.metadata().map_err(io(&path))?.len() > MAX_OUTPUT_CODE_BYTES {
                continue;
            }
            let bytes = std::fs::read(&path).map_err(io(&path))?;
            let Some((name, fields)) = graph_of(&String::from_utf8_lossy(&bytes)) else {
                continue;
            };
            let key = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            out.push(Keyed { key, name, fields });
            if out.len() == MAX_GRAPHS {
                return Ok(out);
            }
        }
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

/// The graph `code` compiles, when it is Inductor output code (a `call`
/// asserting its inputs' sizes): its name, `graph(<kernels>)` (the kernels
/// it defines, `<name> = async_compile.…`, in order), and a
/// `shape.<input>` field per asserted input, its size as written.
///
/// ```
/// use gkm_core::explain::graph_of;
/// let code = "cpp_fused_relu_0 = async_compile.cpp_pybinding(['float*'], r'''...''')\n\
///     class Runner:\n    def call(self, args):\n        assert_size_stride(arg0_1, (4, 64), (64, 1))\n";
/// let (name, fields) = graph_of(code).unwrap();
/// assert_eq!(name, "graph(cpp_fused_relu_0)");
/// assert_eq!(fields["shape.arg0_1"], "(4, 64)");
/// assert!(graph_of("print('hello')").is_none());
/// ```
pub fn graph_of(code: &str) -> Option<(String, BTreeMap<String, Value>)> {
    let mut kernels = Vec::new();
    let mut fields = BTreeMap::new();
    for line in code.lines() {
        if let Some((name, rest)) = line.split_once(" = async_compile.")
            && !rest.is_empty()
            && !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            kernels.push(name.to_string());
        }
        if let Some((input, size)) = asserted_size(line) {
            fields.insert(format!("{SHAPE_FIELD}{input}"), Value::String(size));
        }
    }
    (!fields.is_empty()).then(|| (format!("graph({})", kernels.join(", ")), fields))
}

/// The input and its size of an `assert_size_stride(<input>, (<size>),
/// (<stride>))` line.
fn asserted_size(line: &str) -> Option<(String, String)> {
    let args = line.trim().strip_prefix("assert_size_stride(")?;
    let (input, rest) = args.split_once(',')?;
    let rest = rest.trim_start();
    if !rest.starts_with('(') {
        return None;
    }
    let end = rest.find(')')?;
    Some((input.trim().to_string(), rest[..=end].to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CODE: &str = "\
cpp_fused_gelu_0 = async_compile.cpp_pybinding(['float*'], r'''
extern \"C\" void kernel() {}
''')
cpp_fused_relu_1 = async_compile.cpp_pybinding(['float*'], r'''...''')
class Runner:
    def call(self, args):
        arg0_1, arg1_1 = args
        assert_size_stride(arg0_1, (128, 64), (64, 1))
        assert_size_stride(arg1_1, (SHAPE, 64), (64, 1))
";

    #[test]
    fn output_code_is_read_as_its_kernels_and_input_sizes() {
        let (name, fields) = graph_of(&CODE.replace("SHAPE", "4")).unwrap();
        assert_eq!(name, "graph(cpp_fused_gelu_0, cpp_fused_relu_1)");
        assert_eq!(fields["shape.arg0_1"], "(128, 64)");
        assert_eq!(fields["shape.arg1_1"], "(4, 64)");
        assert_eq!(fields.len(), 2);
    }

    #[test]
    fn the_graphs_of_a_tree_are_its_output_codes_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ab")).unwrap();
        std::fs::write(dir.path().join("ab/cab.py"), CODE.replace("SHAPE", "8")).unwrap();
        std::fs::write(dir.path().join("ab/helper.py"), "import os\n").unwrap();
        std::fs::write(dir.path().join("ab/cab.cpp"), CODE).unwrap();
        let found = graphs(dir.path()).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].key, "ab/cab.py");
        assert_eq!(found[0].fields["shape.arg1_1"], "(8, 64)");
    }
}
