//! README's run commands: the one in its "Run it" block, executed as
//! README.md writes it (with `-- --dir DIR --exit-when-ready` appended), and
//! `cargo run -p gkm-local -- --dra`, with `--exit-when-ready`: gkm
//! installed by its chart onto the real node converges, and a pod there
//! reads the cache (it prints what README shows), or, with `--dra`, the
//! chart runs gkm's DRA kubelet plugin instead of the device plugin and a
//! pod whose claim template names the cache's DeviceClass runs with the
//! node's (simulated) T4 allocated to its claim.

use std::process::Command;
use std::sync::Mutex;

use gkm_local::dra::{DRIVER, T4_DEVICE, cache_class};
use sha2::{Digest as _, Sha256};

/// The fixture's kernel directory.
const KERNEL_DIR: &str = "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ";

/// Held for the whole of each stack's run: README's command builds and
/// relinks `target/debug/gkm-local` (`cargo build --bins`, then `cargo run -p
/// gkm-local`, each resolving features its own way), which another test of
/// this file must not start meanwhile.
static ONE_STACK_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `gkm-local --exit-when-ready` with `args`, in a directory of its
/// own; its standard output and error once it succeeded.
fn run_until_ready(args: &[&str]) -> anyhow::Result<(String, String)> {
    let _one = ONE_STACK_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let dir = gkm_testenv::temp_dir()?;
    let out = Command::new(env!("CARGO_BIN_EXE_gkm-local"))
        .arg("--dir")
        .arg(dir.path().join("local"))
        .args(args)
        .arg("--exit-when-ready")
        .output()?;
    outputs_of_success(&format!("gkm-local {args:?}"), &out)
}

/// Runs README.md's run command as it is written there, from the
/// repository root, with `-- --dir DIR --exit-when-ready` appended to its
/// last step (`cargo run -p gkm-local`); its standard output and error
/// once it succeeded.
fn run_readme_command_until_ready() -> anyhow::Result<(String, String)> {
    let _one = ONE_STACK_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let root = gkm_testenv::repo_root();
    let command = readme_run_command(&std::fs::read_to_string(root.join("README.md"))?)?;
    let dir = gkm_testenv::temp_dir()?;
    let local = dir.path().join("local");
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{command} -- --dir '{}' --exit-when-ready",
            local.display()
        ))
        .current_dir(&root)
        .output()?;
    outputs_of_success(&format!("README's run command `{command}`"), &out)
}

/// The command of README's "Run it" section: the one line of the first
/// `sh` block below that heading, which must end in a `cargo run` of
/// gkm-local taking no arguments yet (so arguments can be appended).
fn readme_run_command(readme: &str) -> anyhow::Result<String> {
    let block: Vec<&str> = readme
        .lines()
        .skip_while(|l| l.trim() != "## Run it")
        .skip_while(|l| l.trim() != "```sh")
        .skip(1)
        .take_while(|l| l.trim() != "```")
        .filter(|l| !l.trim().is_empty())
        .collect();
    let [command] = block[..] else {
        anyhow::bail!("README's \"Run it\" section has no one-line sh block: {block:?}");
    };
    anyhow::ensure!(
        command.trim_end().ends_with("cargo run -p gkm-local"),
        "README's run command does not end in `cargo run -p gkm-local`: {command}"
    );
    Ok(command.trim().to_string())
}

/// The standard output and error of `out`, which `what` produced; an
/// error with both when it failed.
fn outputs_of_success(what: &str, out: &std::process::Output) -> anyhow::Result<(String, String)> {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    anyhow::ensure!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    Ok((stdout, stderr))
}

/// Asserts that the `kubectl get pods -n gkm-system` gkm-local printed
/// lists exactly `components`, one pod each, Running on the real node.
fn assert_chart_pods_running(stdout: &str, components: &[&str]) {
    let pods: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("$ kubectl get pods -n gkm-system"))
        .skip(2)
        .take_while(|l| !l.is_empty())
        .collect();
    for component in components {
        let line = pods
            .iter()
            .find(|l| l.starts_with(&format!("{component}-")))
            .unwrap_or_else(|| panic!("no {component} pod in:\n{stdout}"));
        assert!(
            line.contains(" Running ") && line.contains(" real-sm75 "),
            "{line}"
        );
    }
    assert_eq!(pods.len(), components.len(), "{pods:?}");
}

#[test]
fn readmes_run_command_installs_gkm_with_its_chart_and_a_pod_reads_the_cache() -> anyhow::Result<()>
{
    let (stdout, stderr) = run_readme_command_until_ready()?;

    // The chart's four components, each one pod, Running on the real node.
    assert_chart_pods_running(&stdout, &gkm_local::chart::COMPONENTS);

    // All four nodes report; the cache is extracted on the two sm75 nodes.
    let cache = stdout
        .lines()
        .find(|l| l.contains("gkmcache.gkm.io/vector-add"))
        .unwrap_or_default();
    let columns: Vec<&str> = cache.split_whitespace().collect();
    assert_eq!(
        columns.get(2..8),
        Some(&["Extracted", "4", "0", "2", "0", "2"][..]),
        "{cache}"
    );

    // The reader pod on the real node printed the kernel's sha256.
    let kernel = std::fs::read(
        gkm_local::fixture("triton-vector-add-cuda-sm75")
            .join(KERNEL_DIR)
            .join("add_kernel.cubin"),
    )?;
    let want = format!(
        "{}  /root/.triton/cache/{KERNEL_DIR}/add_kernel.cubin",
        hex::encode(Sha256::digest(&kernel))
    );
    assert!(stdout.contains(&want), "no {want} in:\n{stdout}");
    assert!(stderr.contains("helm install gkm"), "{stderr}");
    Ok(())
}

#[test]
fn a_pod_claims_the_real_nodes_gpu_through_the_caches_device_class() -> anyhow::Result<()> {
    let (stdout, _) = run_until_ready(&["--dra"])?;

    // The chart's DRA components, each one pod, Running on the real node;
    // no device plugin.
    assert_chart_pods_running(&stdout, &gkm_local::chart::DRA_COMPONENTS);

    // The claim of the cache's class got the real node's T4 (the pod ran:
    // gkm-local waits for it to run before it reads the claim).
    let class = cache_class("default", "vector-add");
    let allocated =
        format!("(class {class}) allocated driver={DRIVER} pool=real-sm75 device={T4_DEVICE}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("claim default/vector-add-gpu-") && l.ends_with(&allocated)),
        "no claim allocated {allocated} in:\n{stdout}"
    );
    Ok(())
}

#[test]
fn readmes_run_command_is_read_from_its_run_it_block() {
    let readme = "# x\n\n## Run it\n\n```sh\nmake && cargo run -p gkm-local\n```\n";
    assert_eq!(
        readme_run_command(readme).unwrap(),
        "make && cargo run -p gkm-local"
    );
    let two_lines = "## Run it\n```sh\nmake\ncargo run -p gkm-local\n```\n";
    assert!(readme_run_command(two_lines).is_err());
    let with_args = "## Run it\n```sh\ncargo run -p gkm-local -- --dra\n```\n";
    assert!(readme_run_command(with_args).is_err());
    assert!(readme_run_command("no section").is_err());
}
