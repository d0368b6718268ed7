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

/// What a child run of `memcast` did, measured.
pub struct Measured {
    /// The exit code, or `None` when a signal ended it.
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// The child's peak resident set size in KiB (`ru_maxrss` from `wait4`).
    pub max_rss_kib: u64,
}

/// Address space every measured child may map: a guard for the machine, so that a
/// broken build asking for gigabytes aborts (a test failure) instead of swapping.
pub const CHILD_ADDRESS_SPACE: u64 = 8 << 30;

/// Runs `memcast args` with `env` set, reaps it with `wait4` for its peak RSS, and caps
/// its address space at [`CHILD_ADDRESS_SPACE`]. With `close_stdout`, the read end of
/// its stdout is closed before it runs (what `| head -0` does): its first write fails.
pub fn measured(args: &[&str], env: &[(&str, &str)], close_stdout: bool) -> Measured {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memcast"));
    cmd.args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: CHILD_ADDRESS_SPACE,
                rlim_max: CHILD_ADDRESS_SPACE,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn memcast");
    let pid = child.id() as libc::pid_t;
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let out_reader = if close_stdout {
        drop(out);
        None
    } else {
        Some(std::thread::spawn(move || {
            let mut s = Vec::new();
            out.read_to_end(&mut s).ok();
            s
        }))
    };
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        err.read_to_end(&mut s).ok();
        s
    });
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    std::mem::forget(child); // reaped above
    let stdout = out_reader.map_or_else(Vec::new, |h| h.join().unwrap());
    let stderr = err_reader.join().unwrap();
    Measured {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        max_rss_kib: usage.ru_maxrss as u64,
    }
}

impl Measured {
    /// Requires a clean failure: exit code 1, or 2 for a usage error (never 101, the
    /// panic code, nor a signal),
    /// a message containing every one of `needles`, and no panic.
    pub fn clean_failure(&self, what: &str, needles: &[&str]) -> &Self {
        assert!(
            matches!((self.code, self.signal), (Some(1 | 2), None)),
            "{what}: expected exit 1 (2: a usage error), got {:?} / signal {:?}; stderr: {}",
            self.code,
            self.signal,
            self.stderr
        );
        assert!(!self.stderr.contains("panicked"), "{what}: {}", self.stderr);
        for n in needles {
            assert!(
                self.stderr.contains(n),
                "{what}: the message lacks {n:?}: {}",
                self.stderr
            );
        }
        self
    }

    /// Requires the peak RSS below `mib` MiB.
    pub fn rss_below(&self, what: &str, mib: u64) -> &Self {
        eprintln!("{what}: peak RSS {} KiB", self.max_rss_kib);
        assert!(
            self.max_rss_kib < mib << 10,
            "{what}: peak RSS {} KiB, over the {mib} MiB limit",
            self.max_rss_kib
        );
        self
    }
}

/// A scratch directory of its own for one test (removed at the end of the test).
pub fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("memcast-{name}-"))
        .tempdir()
        .unwrap()
}

/// A JSON trace document at `path`: one iteration, one 1 KiB tensor allocated at 1 us
/// and freed at `free_us`.
pub fn one_tensor_trace(path: &std::path::Path, free_us: u64) {
    let doc = format!(
        r#"{{"format": "memcast-trace", "version": 1, "trace": {{"meta": {{"name": "t", "source": "x", "description": ""}}, "static_blocks": [], "events": [{{"time_us": 0, "kind": "IterationBoundary"}}, {{"time_us": 1, "kind": {{"Alloc": {{"id": 1, "bytes": 1024, "stream": 0}}}}}}, {{"time_us": {free_us}, "kind": {{"Free": {{"id": 1}}}}}}]}}}}"#
    );
    std::fs::write(path, doc).unwrap();
}

/// The header of a corpus manifest.
pub const MANIFEST_HEADER: &str = "file\tworkload\tfamily\tshapes\tsplit\tdescription\n";

/// A scratch directory holding a copy of the test-split corpus trace `trace` and a
/// manifest of `rows` (after the header): the directory and the manifest's path.
pub fn scratch_corpus(name: &str, trace: &str, rows: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = scratch(name);
    std::fs::copy(
        repo().join("training-data/corpus/test").join(trace),
        dir.path().join(trace),
    )
    .unwrap();
    let manifest = dir.path().join("manifest.tsv");
    std::fs::write(&manifest, format!("{MANIFEST_HEADER}{rows}")).unwrap();
    (dir, manifest)
}

/// Every entry under `dir` with its length and modification time, sorted: what a test
/// compares before and after a command to see that nothing else was touched.
pub fn listing(dir: &std::path::Path) -> Vec<(PathBuf, u64, std::time::SystemTime, bool)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            (
                e.path(),
                m.len(),
                m.modified().unwrap(),
                m.file_type().is_symlink(),
            )
        })
        .collect();
    v.sort();
    v
}

/// A minimal PyTorch snapshot pickle (protocol 4): `events` as (action, addr, size,
/// time_us) in `device_traces[0]`, and one segment with `blocks` as (addr, requested
/// size, state).
pub fn snapshot_pickle(events: &[(&str, i64, i64, i64)], blocks: &[(i64, i64, &str)]) -> Vec<u8> {
    let mut o = vec![0x80, 4, b'}', b'('];
    pstr(&mut o, "device_traces");
    o.extend_from_slice(b"]]("); // outer list, inner list, MARK
    for (action, addr, size, t) in events {
        o.extend_from_slice(b"}(");
        for (k, v) in [
            ("addr", *addr),
            ("size", *size),
            ("stream", 0),
            ("time_us", *t),
        ] {
            pstr(&mut o, k);
            pint(&mut o, v);
        }
        pstr(&mut o, "action");
        pstr(&mut o, action);
        o.push(b'u');
    }
    o.extend_from_slice(b"ea");
    pstr(&mut o, "segments");
    o.extend_from_slice(b"](");
    o.extend_from_slice(&segment_pickle(blocks));
    o.extend_from_slice(b"eu.");
    o
}

/// One `segments` entry (a dict) of [`snapshot_pickle`].
pub fn segment_pickle(blocks: &[(i64, i64, &str)]) -> Vec<u8> {
    let mut o = b"}(".to_vec();
    pstr(&mut o, "device");
    pint(&mut o, 0);
    pstr(&mut o, "stream");
    pint(&mut o, 0);
    pstr(&mut o, "blocks");
    o.extend_from_slice(b"](");
    for (addr, req, state) in blocks {
        o.extend_from_slice(b"}(");
        pstr(&mut o, "address");
        pint(&mut o, *addr);
        pstr(&mut o, "requested_size");
        pint(&mut o, *req);
        pstr(&mut o, "state");
        pstr(&mut o, state);
        o.push(b'u');
    }
    o.extend_from_slice(b"eu");
    o
}

/// SHORT_BINUNICODE.
pub fn pstr(o: &mut Vec<u8>, x: &str) {
    o.push(0x8c);
    o.push(x.len() as u8);
    o.extend_from_slice(x.as_bytes());
}

/// LONG1 of 8 bytes.
pub fn pint(o: &mut Vec<u8>, x: i64) {
    o.push(0x8a);
    o.push(8);
    o.extend_from_slice(&x.to_le_bytes());
}

/// A native trace of `events` (written without validation: tests make bad ones too).
pub fn native_trace(events: Vec<memcast_trace::Event>) -> Vec<u8> {
    let t = memcast_trace::Trace {
        meta: memcast_trace::TraceMeta {
            name: "t".into(),
            source: "test".into(),
            description: String::new(),
        },
        events,
        ..Default::default()
    };
    memcast_trace::native::encode(&t, memcast_trace::native::WriteOptions::default()).unwrap()
}
