//! End-to-end tests of the `memcast` binary's trace commands and the demo.

mod common;

use std::path::Path;

use common::{bundled, fails, ok, repo, tmp};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn stats_json_has_the_documented_keys() {
    let out = ok(&["trace", "stats", &bundled("resnet50_b64_train"), "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    for k in [
        "events",
        "allocs",
        "frees",
        "static_blocks",
        "static_bytes",
        "peak_live_bytes",
        "peak_requested_bytes",
        "iterations",
        "distinct_sizes",
        "duration_us",
    ] {
        assert!(v.get(k).is_some_and(|x| x.is_u64()), "missing {k}: {v}");
    }
    assert_eq!(v["allocs"], 5488);
    assert_eq!(v["iterations"], 8);
}

/// The recorded PyTorch snapshot of `resnet50_b64_train`, shipped xz-compressed (33 KB)
/// as test data.
fn snapshot() -> std::path::PathBuf {
    repo().join("training-data/tests/data/resnet50_b64_train.snapshot.pickle.xz")
}

#[test]
fn import_from_pickle_matches_the_bundled_copy() {
    let pickle = snapshot();
    let out = tmp("resnet.mctrace");
    ok(&["trace", "import", s(&pickle), "-o", s(&out)]);
    let a = ok(&["trace", "stats", s(&out), "--json"]);
    let b = ok(&["trace", "stats", &bundled("resnet50_b64_train"), "--json"]);
    assert_eq!(a, b);
}

#[test]
fn export_csv_and_jsonl() {
    let csv = tmp("mob.csv");
    ok(&[
        "trace",
        "export",
        &bundled("mobilenet_v3_b128_train"),
        "--format",
        "csv",
        "-o",
        s(&csv),
    ]);
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("index,time_us,kind,id,bytes,stream"));
    let allocs = text.lines().filter(|l| l.contains(",alloc,")).count();
    assert_eq!(allocs, 5584);
    let jl = tmp("mob.jsonl");
    ok(&[
        "trace",
        "export",
        &bundled("mobilenet_v3_b128_train"),
        "--format",
        "jsonl",
        "-o",
        s(&jl),
    ]);
    let text = std::fs::read_to_string(&jl).unwrap();
    for l in text.lines().take(1000) {
        let _: serde_json::Value = serde_json::from_str(l).unwrap();
    }
}

#[test]
fn features_csv_has_one_row_per_step() {
    let out = tmp("feat.csv");
    let msg = ok(&[
        "trace",
        "features",
        &bundled("resnet50_b64_train"),
        "-o",
        s(&out),
    ]);
    let n: usize = msg
        .split(": ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text.lines().count(), n + 1);
    assert!(n > 100);
}

#[test]
fn plot_writes_svg_and_png() {
    let svg = tmp("r.svg");
    ok(&[
        "trace",
        "plot",
        &bundled("resnet50_b64_train"),
        "-o",
        s(&svg),
    ]);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && (text.contains("<polyline") || text.contains("<path")));
    let png = tmp("r.png");
    ok(&[
        "trace",
        "plot",
        &bundled("gpt2_generate_dynamic"),
        "-o",
        s(&png),
    ]);
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let e = fails(&[
        "trace",
        "plot",
        &bundled("resnet50_b64_train"),
        "-o",
        "x.gif",
    ]);
    assert!(e.contains(".svg or .png"), "{e}");
}

#[test]
fn bad_input_is_a_clear_error_not_a_panic() {
    let e = fails(&["trace", "stats", "/nonexistent/trace.pickle"]);
    assert!(e.contains("/nonexistent/trace.pickle"), "{e}");
    // A truncated pickle names the byte offset.
    let cut = tmp("cut.pickle");
    let d = memcast_trace::io::read_maybe_xz(&snapshot()).unwrap();
    std::fs::write(&cut, &d[..d.len() / 2]).unwrap();
    let e = fails(&["trace", "stats", s(&cut)]);
    assert!(e.contains("offset") && e.contains("cut.pickle"), "{e}");
    // A damaged native file says so.
    let bad = tmp("bad.mctrace");
    let mut d = std::fs::read(bundled("resnet50_b64_train")).unwrap();
    let n = d.len();
    d[n - 3] ^= 0xff;
    std::fs::write(&bad, d).unwrap();
    let e = fails(&["trace", "stats", s(&bad)]);
    assert!(
        e.contains("bad.mctrace") && (e.contains("damaged") || e.contains("checksum")),
        "{e}"
    );
}

#[test]
fn demo_runs_on_bundled_data() {
    // Plots into a scratch folder: the test writes nothing into the checkout.
    let plots = tmp("demo-plots");
    let out = ok(&["demo", "--out", plots.to_str().unwrap()]);
    for name in ["resnet50_b64_train", "gpt2_generate_dynamic"] {
        assert!(out.contains(name), "{out}");
    }
    assert!(std::fs::read_dir(&plots).unwrap().count() >= 8);
}

#[test]
fn gen_is_deterministic_and_rejects_bad_parameters() {
    let args = |out: &Path| {
        vec![
            "trace".to_string(),
            "gen".into(),
            "--family".into(),
            "transformer".into(),
            "--depth".into(),
            "2".into(),
            "--dynamic".into(),
            "seq".into(),
            "--values".into(),
            "128,256".into(),
            "--iterations".into(),
            "4".into(),
            "--seed".into(),
            "3".into(),
            "-o".into(),
            out.display().to_string(),
        ]
    };
    let (a, b) = (tmp("gen_a.mctrace"), tmp("gen_b.mctrace"));
    for p in [&a, &b] {
        let v = args(p);
        ok(&v.iter().map(String::as_str).collect::<Vec<_>>());
    }
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let st: serde_json::Value =
        serde_json::from_str(ok(&["trace", "stats", s(&a), "--json"]).trim()).unwrap();
    assert_eq!(st["iterations"], 4);
    assert!(st["accesses"].as_u64().unwrap() > 0);
    let e = fails(&[
        "trace",
        "gen",
        "--family",
        "cnn",
        "--depth",
        "7",
        "-o",
        s(&tmp("bad.mctrace")),
    ]);
    assert!(e.contains("ResNet depth 7"), "{e}");
}
