//! Side-by-side speed of the importer and the native loader (see docs/trace-format.md):
//! `cargo run --release -p memcast-trace --example import_bench -- FILE.pickle [OUT.mctrace]`
//! Prints seconds and events/s for: pickle import (and Python's `pickle.load` of the same
//! file, run in the same process tree as the peer), native load (zstd and raw).

use std::path::PathBuf;
use std::time::Instant;

use memcast_trace::native::{self, WriteOptions};
use memcast_trace::snapshot::{import_snapshot, SnapshotOptions};

fn best_of<T>(n: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut best = f64::MAX;
    let mut out = None;
    for _ in 0..n {
        let t = Instant::now();
        let v = f();
        best = best.min(t.elapsed().as_secs_f64());
        out = Some(v);
    }
    (best, out.expect("n >= 1"))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1).map(PathBuf::from) else {
        eprintln!("usage: import_bench FILE.pickle");
        std::process::exit(2);
    };
    let data = std::fs::read(&path).expect("read");
    if std::env::var_os("PARSE_ONLY").is_some() {
        parse_only(&data);
        return;
    }
    // Timed like Python's `pickle.load(open(f, 'rb'))`: reading the file included.
    let (t_import, trace) = best_of(3, || {
        let data = std::fs::read(&path).expect("read");
        import_snapshot(&data, &SnapshotOptions::default()).expect("import")
    });
    let n = trace.events.len() as f64;
    // The peer, in the same run: Python's C unpickler on the same file (best of 3).
    let py = std::process::Command::new("python3")
        .args([
            "-c",
            "import pickle,sys,time\nb=9e9\nfor _ in range(3):\n t=time.perf_counter(); pickle.load(open(sys.argv[1],'rb')); b=min(b,time.perf_counter()-t)\nprint(b)",
        ])
        .arg(&path)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok());
    match py {
        Some(p) => println!(
            "python pickle.load: {p:.3} s; memcast import is {:.2}x faster",
            p / t_import
        ),
        None => println!("python pickle.load: python3 not available"),
    }
    println!(
        "pickle import: {t_import:.3} s ({:.2} M events/s, {} events)",
        n / t_import / 1e6,
        trace.events.len()
    );
    for (label, level) in [("zstd-9", Some(9)), ("raw", None)] {
        let bytes = native::encode(&trace, WriteOptions { zstd_level: level }).expect("encode");
        let (t_load, back) = best_of(5, || native::decode(&bytes).expect("decode"));
        assert_eq!(back.events.len(), trace.events.len());
        println!(
            "native load ({label}, {} bytes): {t_load:.4} s ({:.1} M events/s)",
            bytes.len(),
            n / t_load / 1e6
        );
    }
}

fn parse_only(data: &[u8]) -> f64 {
    let t = Instant::now();
    let v = memcast_trace::pickle::parse(data).expect("parse");
    let p = t.elapsed().as_secs_f64();
    let t2 = Instant::now();
    drop(v);
    eprintln!("parse {p:.3} s, drop {:.3} s", t2.elapsed().as_secs_f64());
    p
}
