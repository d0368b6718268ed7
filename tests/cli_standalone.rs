//! The binary needs nothing from the source tree: copied alone into an empty folder and
//! run there (working directory included), `memcast demo` (bundled traces, default
//! model, plots) and `memcast eval` with the default model still work. What
//! `cargo install` or copying the binary to another machine gives.
//!
//! So that a path into the checkout compiled into the binary cannot be found either,
//! the copy runs with the checkout hidden: in a private mount namespace
//! (`unshare --user --map-root-user --mount`) with an empty tmpfs mounted over the
//! repository. Where the kernel refuses such namespaces the copy runs with the checkout
//! visible, and the test says so on stderr.

use std::path::{Path, PathBuf};
use std::process::Command;

/// An empty folder with only a copy of the built binary in it.
fn lone_copy() -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("memcast-standalone-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("memcast");
    std::fs::copy(env!("CARGO_BIN_EXE_memcast"), &bin).unwrap();
    (dir, bin)
}

/// Whether this machine lets an unprivileged process hide a directory (see the module
/// docs).
fn can_hide() -> bool {
    Command::new("unshare")
        .args(["-rm", "true"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `bin args` in `cwd`, with the repository hidden when `hide`.
fn command(bin: &Path, cwd: &Path, args: &[&str], hide: bool) -> Command {
    if !hide {
        let mut c = Command::new(bin);
        c.args(args);
        return c;
    }
    let repo = env!("CARGO_MANIFEST_DIR");
    let mut c = Command::new("unshare");
    c.args([
        "-rm",
        "sh",
        "-c",
        r#"mount -t tmpfs none "$0" && cd "$1" && shift && exec "$@""#,
    ])
    .args([repo, cwd.to_str().unwrap(), bin.to_str().unwrap()])
    .args(args);
    c
}

fn run(bin: &Path, cwd: &Path, args: &[&str], hide: bool) -> String {
    let o = command(bin, cwd, args, hide)
        .current_dir(cwd)
        // Nothing may come from the environment either.
        .env_remove("MEMCAST_ALLOC_CONF")
        .env_remove("MEMCAST_MODEL")
        .output()
        .expect("run the copied memcast");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "memcast {args:?} in {}: {err}",
        cwd.display()
    );
    assert!(!err.contains("panicked"), "{err}");
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn a_copied_binary_runs_demo_and_eval_from_an_empty_folder() {
    let (dir, bin) = lone_copy();
    let hide = can_hide();
    if !hide {
        eprintln!("unshare refused: the copy runs with the checkout visible");
    } else {
        // The hiding works: the repository looks empty from inside.
        let o = command(
            Path::new("/bin/ls"),
            &dir,
            &[env!("CARGO_MANIFEST_DIR")],
            true,
        )
        .output()
        .unwrap();
        assert!(o.status.success() && o.stdout.is_empty(), "{o:?}");
    }
    let out = run(&bin, &dir, &["demo", "--only", "resnet50_b64"], hide);
    assert!(out.contains("resnet50_b64_train"), "{out}");
    // The plots went to the working directory's `memcast-demo/`.
    let plots = std::fs::read_dir(dir.join("memcast-demo")).unwrap().count();
    assert!(plots > 0, "no plots written");
    // eval with the default model on a trace the user brings (here: a synthetic one the
    // binary itself writes, so that nothing is read from the source tree).
    let trace = dir.join("resnet.mctrace");
    run(
        &bin,
        &dir,
        &[
            "trace",
            "gen",
            "--family",
            "cnn",
            "--iterations",
            "4",
            "--output",
            trace.to_str().unwrap(),
        ],
        hide,
    );
    let out = run(
        &bin,
        &dir,
        &["eval", "--trace", trace.to_str().unwrap(), "--json"],
        hide,
    );
    let v: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert!(v["models"]["lstm"]["wape"].is_number(), "{v}");
    std::fs::remove_dir_all(&dir).ok();
}
