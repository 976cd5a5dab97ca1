//! Programs that embed gkm's crates; run one with
//! `cargo run -p gkm-examples --example NAME`.
