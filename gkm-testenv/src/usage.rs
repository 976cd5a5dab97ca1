//! What a running process has used so far, read from `/proc`: CPU time and
//! memory, for benchmarks that report them.

use anyhow::Context;

/// The CPU time `pid` used so far (user and system), in seconds.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name: state is the first, utime the 12th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| -> anyhow::Result<f64> {
        let field = fields
            .get(i)
            .with_context(|| format!("/proc/{pid}/stat: too short"))?;
        Ok(field.parse::<f64>()?)
    };
    // Linux counts in USER_HZ, 100 per second.
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// VmRSS and VmHWM (its peak) of `pid`, in MiB.
pub fn memory_mib(pid: u32) -> anyhow::Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<f64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        let kib: f64 = line
            .trim_start_matches(name)
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()?;
        Ok(kib / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_used_cpu_and_memory() {
        let pid = std::process::id();
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(50) {
            std::hint::black_box(0u64);
        }
        assert!(cpu_seconds(pid).unwrap() > 0.0);
        let (rss, peak) = memory_mib(pid).unwrap();
        assert!(rss > 0.0 && peak >= rss, "{rss} {peak}");
    }

    #[test]
    fn a_process_that_is_gone_is_an_error_naming_its_file() {
        // Beyond the kernel's pid_max (at most 2^22).
        let e = cpu_seconds(u32::MAX).unwrap_err();
        assert!(format!("{e:#}").contains("/proc/4294967295/stat"), "{e:#}");
    }
}
