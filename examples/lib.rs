//! Programs that embed gkm's crates; run one with
//! `cargo run -p gkm-examples --example NAME`.

// An example may unwrap: a panic is how a short program reports.
#![allow(clippy::unwrap_used, clippy::expect_used)]
