//! `gkm --help`, each command's `--help` and the completion scripts, as a
//! user sees them.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

const COMMANDS: [&str; 16] = [
    "build",
    "index",
    "push",
    "capture",
    "pull",
    "inspect",
    "check",
    "extract",
    "explain",
    "sign",
    "verify",
    "view",
    "gpus",
    "crds",
    "caches",
    "completions",
];

fn gkm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gkm"))
        .args(args)
        .env_remove("COSIGN_PASSWORD")
        .env("COLUMNS", "100")
        .output()
        .expect("run gkm")
}

fn stdout(args: &[&str]) -> String {
    let out = gkm(args);
    assert!(
        out.status.success(),
        "gkm {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn help_of_gkm_and_every_command() {
    let top = stdout(&["--help"]);
    for command in COMMANDS {
        assert!(top.contains(command), "gkm --help lacks {command}:\n{top}");
    }
    insta::assert_snapshot!("help", top);
    for command in COMMANDS {
        insta::assert_snapshot!(format!("help-{command}"), stdout(&[command, "--help"]));
    }
}

#[test]
fn every_command_but_completions_takes_json() {
    for command in COMMANDS.iter().filter(|c| **c != "completions") {
        let help = stdout(&[command, "--help"]);
        assert!(
            help.contains("--json"),
            "gkm {command} has no --json:\n{help}"
        );
    }
}

#[test]
fn completions_name_every_command() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = stdout(&["completions", shell]);
        for command in COMMANDS {
            assert!(
                script.contains(command),
                "{shell} completions lack {command}"
            );
        }
        assert!(
            script.contains("insecure"),
            "{shell} completions lack flags"
        );
    }
    let out = gkm(&["completions", "tcsh"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}
