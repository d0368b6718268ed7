//! Hostile and careless input through the CLI: small files that claim or expand to a lot,
//! and a reader that closes stdout. Every case must end with a clean error (exit 1, a
//! message naming the limit or the cause) or a quiet exit, never a panic (101) or a
//! signal, and within a stated peak RSS of the child (read with `wait4`). The files are
//! made here, small.
//!
//! The RSS limits: `memcast trace stats` on a bundled trace peaks at about 10 MiB here;
//! an input refused by a limit must stay below 64 MiB (a 1 MiB floor plus 1024 times a
//! compressed file of at most 40 KiB, plus the binary), and `trace gen` stopped by
//! `MAX_SYNTH_EVENTS` (10 M events, about 200 bytes each while generating) below 3 GiB.

mod common;

use common::*;
use memcast_trace::{Event, EventKind};

/// Peak RSS an input refused by a limit may reach (see the module docs).
const REFUSED_RSS_MIB: u64 = 64;

/// Runs `memcast args`: a clean failure whose message holds every one of `needles`,
/// within [`REFUSED_RSS_MIB`].
fn refused(args: &[&str], what: &str, needles: &[&str]) {
    measured(args, &[], false)
        .clean_failure(what, needles)
        .rss_below(what, REFUSED_RSS_MIB);
}

fn write(dir: &std::path::Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p.display().to_string()
}

/// A native trace header (version 1, zstd flag) around `body`.
fn native_with_zstd_body(body: &[u8]) -> Vec<u8> {
    let mut o = b"MEMCAST\0".to_vec();
    o.extend_from_slice(&1u16.to_le_bytes());
    o.extend_from_slice(&1u16.to_le_bytes());
    o.extend_from_slice(&0u32.to_le_bytes());
    o.extend_from_slice(&(body.len() as u64).to_le_bytes());
    o.extend_from_slice(body);
    o
}

/// A zstd frame of `mib` MiB of zeros, with or without the content size in its header.
fn zstd_zeros(mib: usize, declare_size: bool) -> Vec<u8> {
    use std::io::Write;
    let mut e = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
    e.include_contentsize(declare_size).unwrap();
    if declare_size {
        e.set_pledged_src_size(Some((mib as u64) << 20)).unwrap();
    }
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..mib {
        e.write_all(&chunk).unwrap();
    }
    e.finish().unwrap()
}

/// An xz stream of `prefix` then `mib` MiB of zeros.
fn xz_zeros(prefix: &[u8], mib: usize) -> Vec<u8> {
    use std::io::Write;
    let mut e = liblzma::write::XzEncoder::new(Vec::new(), 1);
    e.write_all(prefix).unwrap();
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..mib {
        e.write_all(&chunk).unwrap();
    }
    e.finish().unwrap()
}

#[test]
fn a_snapshot_listing_one_segment_many_times_is_refused_quickly() {
    // One segment of 1,000 active blocks, memoised, then listed 30,000 times by memo
    // references (2 bytes each): 133 KB that would describe 30 million static blocks.
    let blocks: Vec<(i64, i64, &str)> = (0..1000)
        .map(|k| (0x1000 * k, 512, "active_allocated"))
        .collect();
    let mut o = vec![0x80, 4, b'}', b'('];
    pstr(&mut o, "device_traces");
    o.extend_from_slice(b"]](ea");
    pstr(&mut o, "segments");
    o.extend_from_slice(b"](");
    o.extend_from_slice(&segment_pickle(&blocks));
    o.push(0x94); // MEMOIZE: memo key 0
    for _ in 0..30_000 {
        o.extend_from_slice(b"h\x00"); // BINGET 0
    }
    o.extend_from_slice(b"eu.");
    let d = scratch("shared-segment");
    let f = write(d.path(), "shared.pickle", &o);
    refused(
        &["trace", "stats", &f],
        "shared segment",
        &["shared.pickle", "segments[1]", "same object"],
    );
    // The same blocks listed once each are fine: 1,000 static blocks.
    let mut o = vec![0x80, 4, b'}', b'('];
    pstr(&mut o, "device_traces");
    o.extend_from_slice(b"]](ea");
    pstr(&mut o, "segments");
    o.extend_from_slice(b"](");
    o.extend_from_slice(&segment_pickle(&blocks));
    o.extend_from_slice(b"eu.");
    let f = write(d.path(), "once.pickle", &o);
    let s = ok(&["trace", "stats", &f, "--json", "--no-markers"]);
    assert!(s.contains("\"static_blocks\":1000"), "{s}");
}

#[test]
fn a_shared_block_is_refused_too() {
    let mut seg = b"}(".to_vec();
    pstr(&mut seg, "device");
    pint(&mut seg, 0);
    pstr(&mut seg, "blocks");
    seg.extend_from_slice(b"](}(");
    pstr(&mut seg, "address");
    pint(&mut seg, 0x100);
    pstr(&mut seg, "size");
    pint(&mut seg, 512);
    pstr(&mut seg, "state");
    pstr(&mut seg, "active_allocated");
    seg.extend_from_slice(b"u\x94"); // the block dict, memoised as key 0
    for _ in 0..5000 {
        seg.extend_from_slice(b"h\x00");
    }
    seg.extend_from_slice(b"eu");
    let mut o = vec![0x80, 4, b'}', b'('];
    pstr(&mut o, "device_traces");
    o.extend_from_slice(b"]](ea");
    pstr(&mut o, "segments");
    o.extend_from_slice(b"](");
    o.extend_from_slice(&seg);
    o.extend_from_slice(b"eu.");
    let d = scratch("shared-block");
    let f = write(d.path(), "b.pickle", &o);
    refused(
        &["trace", "stats", &f],
        "shared block",
        &["segments[0].blocks[1]", "same object"],
    );
}

#[test]
fn sparse_memo_keys_cannot_ask_for_a_huge_memo_table() {
    // 255 LONG_BINPUTs, each 16 M keys beyond the last: 1.8 KB asking for 32 GB.
    let mut o = vec![0x80, 4, b']', b'('];
    for k in 0..255u32 {
        o.extend_from_slice(b"K\x01r");
        o.extend_from_slice(&((k + 1) * (1 << 24) - 1).to_le_bytes());
    }
    o.extend_from_slice(b"e.");
    let d = scratch("memo");
    let f = write(d.path(), "memo.pickle", &o);
    refused(
        &["trace", "stats", &f],
        "sparse memo",
        &["memo key 16777215", "byte offset 6"],
    );
}

#[test]
fn a_zstd_bomb_in_a_native_trace_stops_at_the_ratio_limit() {
    let d = scratch("zstd");
    // 256 MiB of zeros in about 8 KB, the size declared in the frame: refused before
    // decompressing anything.
    let f = write(
        d.path(),
        "declared.mctrace",
        &native_with_zstd_body(&zstd_zeros(256, true)),
    );
    refused(
        &["trace", "stats", &f],
        "declared zstd bomb",
        &["declares 268435456 bytes", "MAX_ZSTD_RATIO"],
    );
    // The same without a declared size: decompression stops at the limit.
    let f = write(
        d.path(),
        "undeclared.mctrace",
        &native_with_zstd_body(&zstd_zeros(256, false)),
    );
    refused(
        &["replay", &f],
        "undeclared zstd bomb",
        &["expands to more than", "MAX_ZSTD_RATIO"],
    );
}

#[test]
fn an_xz_bomb_is_named_as_xz_and_stops_early() {
    let d = scratch("xz");
    // Zeros are neither a pickle nor a trace: refused after 8 decompressed bytes.
    let f = write(d.path(), "zeros.pickle.xz", &xz_zeros(b"", 64));
    refused(
        &["trace", "stats", &f],
        "xz of zeros",
        &["zeros.pickle.xz", "xz stream holds neither"],
    );
    // A pickle's first bytes, then zeros: decompression stops at the ratio limit.
    let f = write(d.path(), "padded.pickle.xz", &xz_zeros(b"\x80\x04", 64));
    refused(
        &["eval", "--trace", &f],
        "padded xz",
        &["padded.pickle.xz", "MAX_XZ_RATIO"],
    );
}

#[test]
fn generation_stops_at_the_event_limit_with_the_iterations_that_fit() {
    let d = scratch("gen");
    let out = d.path().join("g.mctrace");
    let o = out.display().to_string();
    let args = [
        "trace",
        "gen",
        "--family",
        "transformer",
        "--mode",
        "generate",
    ];
    let m = measured(
        &[&args[..], &["--iterations", "100", "-o", &o]].concat(),
        &[],
        false,
    );
    m.clean_failure("gen 100 requests", &["MAX_SYNTH_EVENTS", "ask for at most"])
        .rss_below("gen 100 requests", 3 << 10);
    assert!(!out.exists(), "nothing written on an error");
}

#[test]
fn empty_damaged_and_inconsistent_files_are_named_errors_everywhere() {
    let d = scratch("bad");
    let empty = write(d.path(), "empty.mctrace", b"");
    let mut v0 = native_trace(vec![]);
    v0[8] = 0;
    let v0 = write(d.path(), "v0.mctrace", &v0);
    // A free of a tensor that was never allocated, at event 1.
    let bad = write(
        d.path(),
        "bad.mctrace",
        &native_trace(vec![
            Event {
                time_us: 0,
                kind: EventKind::Alloc {
                    id: 1,
                    bytes: 4096,
                    stream: 0,
                },
            },
            Event {
                time_us: 1,
                kind: EventKind::Free { id: 7 },
            },
        ]),
    );
    // Sizes no device holds: one near u64::MAX (whose rounding would wrap), and two of
    // 0.75 PiB live at once (whose sum passes the limit at event 1).
    let alloc = |id: u64, bytes: u64| Event {
        time_us: id,
        kind: EventKind::Alloc {
            id,
            bytes,
            stream: 0,
        },
    };
    let huge = write(
        d.path(),
        "huge.mctrace",
        &native_trace(vec![alloc(0, u64::MAX - 511)]),
    );
    let sum = write(
        d.path(),
        "sum.mctrace",
        &native_trace(vec![alloc(0, 3 << 48), alloc(1, 3 << 48)]),
    );
    let out = d.path().join("out").display().to_string();
    for (file, needles) in [
        (
            &huge,
            &[
                "huge.mctrace",
                "event 0",
                "an allocation of",
                "MAX_TRACE_BYTES",
            ][..],
        ),
        (
            &sum,
            &[
                "sum.mctrace",
                "event 1",
                "live tensors of",
                "MAX_TRACE_BYTES",
            ][..],
        ),
        (&empty, &["empty.mctrace", "empty (0 bytes)"][..]),
        (&v0, &["v0.mctrace", "format version 0", "damaged"][..]),
        (
            &bad,
            &[
                "bad.mctrace",
                "event 1",
                "free of tensor 7, which is not live",
            ][..],
        ),
    ] {
        let svg = format!("{out}.svg");
        let csv = format!("{out}.csv");
        for args in [
            vec!["trace", "stats", file],
            vec!["replay", file],
            vec!["trace", "features", file, "-o", &csv],
            vec!["trace", "plot", file, "-o", &svg],
            vec!["eval", "--trace", file],
            vec!["predict", "--trace", file],
        ] {
            refused(&args, &format!("{args:?}"), needles);
        }
    }
    assert_eq!(
        std::fs::read_dir(d.path()).unwrap().count(),
        5,
        "no output written"
    );
}

/// Every command that prints, its stdout closed before it writes: a quiet exit 0.
#[test]
fn a_closed_stdout_is_a_quiet_exit_for_every_command_that_prints() {
    let t = bundled("resnet50_b64_train");
    let corpus = repo()
        .join("training-data/corpus/manifest.tsv")
        .display()
        .to_string();
    let dynamic = bundled("bert_dynseq_b16_train");
    let d = scratch("pipe");
    let p = |n: &str| d.path().join(n).display().to_string();
    let (imp, feat, gen, plot, model, exp) = (
        p("i.mctrace"),
        p("f.csv"),
        p("g.mctrace"),
        p("p.svg"),
        p("model"),
        p("w.safetensors"),
    );
    let cases: Vec<Vec<&str>> = vec![
        vec!["--help"],
        vec!["--version"],
        vec!["replay", "--help"],
        vec!["demo", "--no-plots", "--only", "resnet50_b64"],
        vec!["demo", "--no-plots", "--only", "resnet50_b64", "--json"],
        vec!["replay", &t],
        vec!["replay", &t, "--json"],
        vec!["replay", &t, "--compare", "memcast,pytorch"],
        vec!["replay", &t, "--budget", "60%"],
        vec!["eval", "--trace", &t],
        vec!["eval", "--trace", &t, "--json"],
        vec!["corpus", &corpus, "--split", "validation"],
        vec!["corpus", &corpus, "--split", "validation", "--json"],
        vec!["predict", "--trace", &t],
        vec!["trace", "stats", &t],
        vec!["trace", "stats", &t, "--json"],
        vec!["trace", "import", &t, "-o", &imp],
        vec!["trace", "features", &t, "-o", &feat],
        vec!["trace", "plot", &t, "-o", &plot],
        vec![
            "trace",
            "gen",
            "--family",
            "mlp",
            "--iterations",
            "2",
            "-o",
            &gen,
            "--print-config",
        ],
        vec![
            "train",
            "--traces",
            &dynamic,
            "--epochs",
            "1",
            "--max-windows-per-trace",
            "2",
            "-o",
            &model,
        ],
    ];
    for args in &cases {
        let m = measured(args, &[], true);
        assert_eq!(
            (m.code, m.signal),
            (Some(0), None),
            "{args:?} with stdout closed: {}",
            m.stderr
        );
        assert!(
            !m.stderr.contains("panicked") && !m.stderr.contains("Broken pipe"),
            "{args:?}: {}",
            m.stderr
        );
    }
    let args = [
        "export",
        "--model",
        &model,
        "--format",
        "safetensors",
        "-o",
        &exp,
    ];
    let m = measured(&args, &[], true);
    assert_eq!((m.code, m.signal), (Some(0), None), "{}", m.stderr);
    assert!(
        std::path::Path::new(&exp).exists(),
        "the file is written before the line"
    );
}
