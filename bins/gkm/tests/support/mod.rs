//! Helpers the CLI tests share: redacting what varies between runs.

#![allow(dead_code)]

use std::path::Path;

/// Replace the hex of `sha256:<hex>` digests and `sha256/<hex>` store paths
/// with `<digest>`, and `dir` with `[TMP]`.
pub fn redact(text: &str, dir: &Path) -> String {
    let text = text.replace(&dir.display().to_string(), "[TMP]");
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("sha256") {
        let prefix = 6 + rest[i + 6..].starts_with([':', '/']) as usize;
        out.push_str(&rest[..i + prefix]);
        let hex: String = rest[i + prefix..]
            .chars()
            .take_while(char::is_ascii_hexdigit)
            .collect();
        out.push_str(if hex.len() == 64 { "<digest>" } else { &hex });
        rest = &rest[i + prefix + hex.len()..];
    }
    out.push_str(rest);
    out
}

/// `stdout` must be exactly one JSON document (nothing before or after it);
/// returns it pretty-printed with digests, `dir` and the registry address
/// `registry` redacted, for a snapshot.
pub fn json_snapshot(stdout: &str, dir: &Path, registry: &str) -> String {
    let doc: serde_json::Value = serde_json::from_str(stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{stdout}"));
    let text = serde_json::to_string_pretty(&doc).expect("print JSON");
    redact(&text, dir).replace(registry, "[REGISTRY]")
}
