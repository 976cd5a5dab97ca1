//! The resident memory of gkm's daemons (the chart's pods on the real node,
//! the processes serving the simulated nodes), by daemon.

use std::collections::BTreeMap;

/// The daemons' process names (`/proc/<pid>/comm`, 15 bytes at most).
const DAEMONS: [&str; 5] = [
    "gkm-operator",
    "gkm-agent",
    "gkm-csi",
    "gkm-device-plug",
    "gkm-dra-plugin",
];

/// Per daemon (`<name>` or `<name> <node>`), its RSS in MiB; the newest
/// process of each when a restart left two.
pub fn daemons() -> BTreeMap<String, f64> {
    let mut found: BTreeMap<String, (u32, f64)> = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return BTreeMap::new();
    };
    for pid in entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
            continue;
        };
        let comm = comm.trim();
        if !DAEMONS.contains(&comm) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let node = cmdline
            .split(|&b| b == 0)
            .filter_map(|a| std::str::from_utf8(a).ok())
            .find_map(|a| a.strip_prefix("--node-name="))
            .map(str::to_string);
        let key = match node {
            Some(node) => format!("{comm} {node}"),
            None => comm.to_string(),
        };
        let Ok((rss, _)) = gkm_testenv::memory_mib(pid) else {
            continue;
        };
        let newer = found.get(&key).is_none_or(|(p, _)| pid > *p);
        if newer {
            found.insert(key, (pid, rss));
        }
    }
    found.into_iter().map(|(k, (_, rss))| (k, rss)).collect()
}

/// The daemons whose `end` RSS grew more than `growth` (a share) over
/// their `warm` RSS, in words.
pub fn grown(
    warm: &BTreeMap<String, f64>,
    end: &BTreeMap<String, f64>,
    growth: f64,
) -> Vec<String> {
    warm.iter()
        .filter_map(|(daemon, before)| {
            let after = end.get(daemon)?;
            (*after > before * (1.0 + growth)).then(|| {
                format!("{daemon}: {before:.1} MiB after warm-up, {after:.1} MiB at the end")
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_growth_beyond_the_share_counts() {
        let warm = BTreeMap::from([("a".to_string(), 100.0), ("b".to_string(), 100.0)]);
        let end = BTreeMap::from([("a".to_string(), 119.0), ("b".to_string(), 121.0)]);
        let grown = grown(&warm, &end, 0.20);
        assert_eq!(grown.len(), 1);
        assert!(grown[0].starts_with("b:"), "{grown:?}");
    }
}
