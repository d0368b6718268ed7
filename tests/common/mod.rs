//! Helpers shared by the end-to-end CLI tests: run the built `memcast` binary, expect
//! success or a clean failure (non-zero exit, a message, no panic), find bundled traces.

#![allow(dead_code)] // each test file uses a subset

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn memcast(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memcast"))
        .args(args)
        .output()
        .expect("run memcast")
}

/// Runs `memcast args`, requires success, returns stdout.
pub fn ok(args: &[&str]) -> String {
    let o = memcast(args);
    assert!(
        o.status.success(),
        "memcast {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Runs `memcast args`, requires a non-zero exit without a panic, returns stderr.
pub fn fails(args: &[&str]) -> String {
    let o = memcast(args);
    assert!(!o.status.success(), "memcast {args:?} should fail");
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(!err.contains("panicked"), "{err}");
    err
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Path of a bundled trace, `training-data/traces/<name>.mctrace`.
pub fn bundled(name: &str) -> String {
    repo()
        .join("training-data/traces")
        .join(format!("{name}.mctrace"))
        .display()
        .to_string()
}

/// A path in a per-process scratch directory.
pub fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("memcast-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}
