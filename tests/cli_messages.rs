//! Silent nonsense made loud, and messages a user can act on: one budget syntax, settings
//! that cannot apply, training on too little data, options checked before long work,
//! terms defined where printed, a help line for every option.

mod common;

use common::*;

fn fails_with(args: &[&str], needles: &[&str]) -> String {
    let m = measured(args, &[], false);
    m.clean_failure(&format!("{args:?}"), needles);
    m.stderr
}

#[test]
fn one_budget_syntax_everywhere() {
    let t = bundled("resnet50_b64_train");
    // A number with a point is a share, at most 100%: 1.5 is not 2 bytes.
    fails_with(
        &["replay", &t, "--budget", "1.5"],
        &["budget \"1.5\"", "at most 100%"],
    );
    fails_with(
        &["demo", "--no-plots", "--budget", "1.5"],
        &["at most 100%"],
    );
    // Beyond 2^64 bytes is refused, not saturated.
    fails_with(&["replay", &t, "--budget", "1e30"], &["2^64"]);
    fails_with(&["replay", &t, "--budget", "20000P"], &["2^64"]);
    // The demo takes shares (it replays traces of different sizes), and says so.
    fails_with(&["demo", "--no-plots", "--budget", "8G"], &["not bytes"]);
    let out = ok(&[
        "demo",
        "--no-plots",
        "--only",
        "resnet50_b64",
        "--budget",
        "60%",
    ]);
    assert!(out.contains("budget of 60%"), "{out}");
    let out = ok(&["replay", &t, "--budget", "0.6"]);
    assert!(out.contains("(60% of peak"), "{out}");
}

#[test]
fn settings_that_cannot_apply_are_errors() {
    let t = bundled("resnet50_b64_train");
    let m = measured(
        &["demo", "--no-plots", "--only", "resnet50_b64"],
        &[("MEMCAST_ALLOC_CONF", "bogus:1")],
        false,
    );
    m.clean_failure(
        "bogus key",
        &["MEMCAST_ALLOC_CONF", "unknown key \"bogus\"", "min_block"],
    );
    fails_with(
        &[
            "replay",
            &t,
            "--policy",
            "pytorch",
            "--conf",
            "min_block:512",
        ],
        &["--conf"],
    );
    fails_with(
        &["replay", &t, "--no-prefetch"],
        &["--no-prefetch", "--budget"],
    );
    // The environment's allocator settings cannot apply to the PyTorch emulation: the
    // replay runs, and says so; it does not read them, so a bad one is no error there.
    for conf in ["min_block:512", "predictiv:true"] {
        let m = measured(
            &["replay", &t, "--policy", "pytorch"],
            &[("MEMCAST_ALLOC_CONF", conf)],
            false,
        );
        assert_eq!(m.code, Some(0), "{conf}: {}", m.stderr);
        assert!(
            m.stderr.contains("MEMCAST_ALLOC_CONF is ignored"),
            "{}",
            m.stderr
        );
    }
    // Where memcast's allocator runs, the bad one is an error.
    let m = measured(
        &["replay", &t, "--compare", "pytorch,memcast"],
        &[("MEMCAST_ALLOC_CONF", "predictiv:true")],
        false,
    );
    m.clean_failure("a bad key", &["unknown key \"predictiv\""]);
    let g = |extra: &[&str]| {
        let d = scratch("gen-apply");
        let o = d.path().join("g.mctrace").display().to_string();
        let mut a = vec!["trace", "gen", "-o", &o];
        a.extend_from_slice(extra);
        let m = measured(&a, &[], false);
        assert!(
            !std::path::Path::new(&o).exists(),
            "{extra:?} wrote a trace"
        );
        m
    };
    g(&[
        "--family",
        "transformer",
        "--dynamic",
        "image",
        "--values",
        "64,128",
    ])
    .clean_failure(
        "dynamic image",
        &["dynamic image does not apply to the transformer"],
    );
    g(&["--family", "cnn", "--seq", "128"]).clean_failure("--seq on cnn", &["--seq applies"]);
    g(&["--family", "mlp", "--gen-batches", "1"])
        .clean_failure("--gen-batches", &["--mode generate"]);
    g(&["--family", "mobilenet", "--depth", "4"])
        .clean_failure("--depth on mobilenet", &["--depth applies"]);
    for opt in ["--batch", "--seq"] {
        g(&["--family", "transformer", "--mode", "generate", opt, "8"])
            .clean_failure(opt, &[opt, "does not apply to --mode generate"]);
    }
    fails_with(
        &["trace", "import", &t, "-o", "x.mctrace", "--zstd", "100"],
        &["0..=22"],
    );
}

#[test]
fn a_snapshot_without_markers_says_so() {
    let d = scratch("markers");
    let f = d.path().join("s.pickle");
    std::fs::write(
        &f,
        snapshot_pickle(
            &[
                ("alloc", 0x100, 4096, 10),
                ("free_completed", 0x100, 4096, 20),
            ],
            &[],
        ),
    )
    .unwrap();
    let f = f.display().to_string();
    let m = measured(&["trace", "stats", &f, "--marker-bytes", "512"], &[], false);
    assert_eq!(m.code, Some(0), "{}", m.stderr);
    assert!(
        m.stderr.contains("no iteration marker") && m.stderr.contains("512 B"),
        "{}",
        m.stderr
    );
    // No colour codes when stderr is not a terminal (a log warning: time going back).
    let back = d.path().join("back.pickle");
    std::fs::write(
        &back,
        snapshot_pickle(
            &[
                ("alloc", 0x100, 4096, 10),
                ("alloc", 0x200, 4096, 30),
                ("free_completed", 0x100, 4096, 20),
            ],
            &[],
        ),
    )
    .unwrap();
    let m = measured(
        &[
            "trace",
            "stats",
            &back.display().to_string(),
            "--no-markers",
        ],
        &[],
        false,
    );
    assert!(m.stderr.contains("went backwards"), "{}", m.stderr);
    assert!(!m.stderr.contains('\x1b'), "colour codes: {:?}", m.stderr);
}

#[test]
fn messages_name_the_cause() {
    let t = bundled("resnet50_b64_train");
    fails_with(
        &["replay", &t, "--conf", "min_block:1T"],
        &["min_block", "larger than segment_granule"],
    );
    fails_with(&["replay", &t, "--conf", "max_request:1"], &["max_request"]);
    fails_with(&["replay", &t, "--conf", "min_block:1e308"], &["2^64"]);
    fails_with(
        &["replay", &t, "--conf", "min_block:4Q"],
        &["unknown unit \"Q\""],
    );
    let d = scratch("messages");
    let plot = d.path().join("no/such/dir/x.png").display().to_string();
    let e = fails_with(&["trace", "plot", &t, "-o", &plot], &["does not exist"]);
    assert!(!e.contains("Error(") && !e.contains("Os {"), "{e}");
    fails_with(
        &["--log", "[[[", "trace", "stats", &t],
        &["--log \"[[[\": not a log filter"],
    );
    let bad = d.path().join("bad.safetensors");
    std::fs::write(&bad, b"abc").unwrap();
    let e = fails_with(
        &["eval", "--model", &bad.display().to_string(), "--trace", &t],
        &["shorter than a safetensors header"],
    );
    assert!(
        !e.contains("MetadataIncompleteBuffer") && !e.contains("HeaderTooLarge"),
        "{e}"
    );
    let traces = repo().join("training-data/traces").display().to_string();
    fails_with(
        &["train", "--traces", &traces, "--exclude", ""],
        &["matches every trace name"],
    );
    // An empty name in --compare's list is named as one, not as a missing value.
    for list in ["memcast,,naive", "memcast,", ",memcast", ""] {
        let e = fails_with(
            &["replay", &t, "--compare", list],
            &["--compare: an empty policy name", "try '--help'"],
        );
        assert!(!e.contains("a value is required"), "{list}: {e}");
    }
    fails_with(
        &["replay", &t, "--compare", "memcast,foo"],
        &[
            "invalid value 'foo'",
            "possible values: memcast, predictive",
        ],
    );
}

#[test]
fn long_work_checks_what_it_can_first() {
    let t = bundled("resnet50_b64_train");
    // The plot is checked before the model and the trace are read.
    let m = measured(
        &["predict", "--trace", "missing.mctrace", "--plot", "x.pdf"],
        &[],
        false,
    );
    m.clean_failure("pdf plot", &[".svg or .png"]);
    let m = measured(&["predict", "--trace", &t, "--plot", "x.pdf"], &[], false);
    m.clean_failure("pdf plot", &[".svg or .png"]);
    assert!(
        m.stdout.is_empty(),
        "rows printed before the error: {}",
        m.stdout
    );
    let d = scratch("early");
    let file = d.path().join("a_file");
    std::fs::write(&file, b"keep").unwrap();
    let traces = repo().join("training-data/traces").display().to_string();
    let f = file.display().to_string();
    let m = measured(&["train", "--traces", &traces, "-o", &f], &[], false);
    m.clean_failure("train -o file", &["is not a folder"]);
    assert!(
        !m.stderr.contains("steps (loaded"),
        "loaded first: {}",
        m.stderr
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
    #[cfg(not(feature = "cuda"))]
    {
        let m = measured(
            &["train", "--traces", &traces, "--backend", "cuda"],
            &[],
            false,
        );
        m.clean_failure("train cuda", &["cuda"]);
        assert!(
            !m.stderr.contains("steps (loaded"),
            "loaded first: {}",
            m.stderr
        );
    }
}

#[test]
fn training_on_too_little_or_diverging_data_is_loud() {
    let d = scratch("train");
    let one = d.path().join("one.mctrace").display().to_string();
    ok(&[
        "trace",
        "gen",
        "--family",
        "mlp",
        "--iterations",
        "1",
        "-o",
        &one,
    ]);
    let out = d.path().join("m").display().to_string();
    fails_with(
        &["train", "--traces", &one, "-o", &out],
        &["nothing to learn"],
    );
    assert!(!std::path::Path::new(&out).exists());
    let dynamic = bundled("bert_dynseq_b16_train");
    fails_with(
        &["train", "--traces", &dynamic, "--lr", "1e30", "-o", &out],
        &["learning rate"],
    );
    // One trace with targets and one static: no validation is possible, and it says so.
    let stat = bundled("resnet50_b64_train");
    let m = measured(
        &[
            "train",
            "--traces",
            &dynamic,
            &stat,
            "--epochs",
            "2",
            "--max-windows-per-trace",
            "2",
            "-o",
            &out,
        ],
        &[],
        false,
    );
    assert_eq!(m.code, Some(0), "{}", m.stderr);
    assert!(m.stderr.contains("warning: no validation"), "{}", m.stderr);
    assert!(
        m.stderr.contains("val loss -") && !m.stderr.contains("NaN"),
        "{}",
        m.stderr
    );
    let metrics: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{out}/metrics.json")).unwrap())
            .unwrap();
    assert_eq!(metrics["selected_on"], "training");
    let n = metrics["train_traces"].as_array().unwrap().len()
        + metrics["val_traces"].as_array().unwrap().len();
    assert_eq!(n, 2, "every trace accounted for: {metrics}");
}

#[test]
fn time_off_the_simulated_device_says_it_is_not_modelled() {
    let t = bundled("resnet50_b64_train");
    let out = ok(&["replay", &t, "--device", "host"]);
    assert!(out.contains("not modelled"), "{out}");
    let out = ok(&["replay", &t, "--device", "host", "--budget", "60%"]);
    assert!(
        out.contains("not modelled") && !out.contains("stall  "),
        "{out}"
    );
    let d = scratch("empty");
    let e = d.path().join("e.mctrace");
    std::fs::write(&e, native_trace(vec![])).unwrap();
    fails_with(
        &["replay", &e.display().to_string(), "--budget", "1G"],
        &["allocates nothing"],
    );
}

#[test]
fn terms_are_defined_where_printed() {
    let t = bundled("resnet50_b64_train");
    let out = ok(&["replay", &t]);
    assert!(
        out.contains("(peak reserved / peak requested - 1)"),
        "{out}"
    );
    assert!(
        out.contains("(1 - largest free block / free bytes)"),
        "{out}"
    );
    let out = ok(&["eval", "--trace", &t]);
    assert!(
        out.contains("WAPE = ") && out.contains("under-forecast rate"),
        "{out}"
    );
    let out = ok(&["demo", "--no-plots", "--only", "resnet50_b64"]);
    for term in [
        "pt-emul. = ",
        "pt-real / pt-expd. = ",
        "iters = ",
        "pred. = ",
        "frag. = ",
    ] {
        assert!(out.contains(term), "{term}: {out}");
    }
}

/// Every option and argument of every command has a help line, and `--device` means the
/// replay backend wherever it appears (the snapshot's CUDA index is `--cuda-device`).
#[test]
fn every_option_has_a_help_line() {
    let commands: &[&[&str]] = &[
        &["trace", "import"],
        &["trace", "stats"],
        &["trace", "gen"],
        &["trace", "features"],
        &["trace", "export"],
        &["trace", "plot"],
        &["replay"],
        &["demo"],
        &["train"],
        &["eval"],
        &["export"],
        &["predict"],
    ];
    for c in commands {
        let help = ok(&[*c, &["--help"]].concat());
        let lines: Vec<&str> = help.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let t = l.trim_start();
            let indent = l.len() - t.len();
            let is_item = (t.starts_with('-') || t.starts_with('<')) && (2..=6).contains(&indent);
            if !is_item {
                continue;
            }
            // The short layout puts the description after two spaces on the same line,
            // the long one on the next line, indented deeper.
            // Only the bracketed notes ([default: ..], [env: ..]) are no description.
            let text = |d: &str| {
                let mut depth = 0;
                d.chars()
                    .filter(|&c| {
                        depth += (c == '[') as i32;
                        let keep = depth == 0;
                        depth -= (c == ']') as i32;
                        keep && c != ']'
                    })
                    .any(|c| c.is_alphanumeric())
            };
            let same_line = t.split_once("  ").is_some_and(|(_, d)| text(d));
            let next = lines.get(i + 1).copied().unwrap_or("");
            let below = next.len() - next.trim_start().len() > indent && text(next);
            let described = same_line || below;
            assert!(described, "{c:?}: no help for {t:?}\n{help}");
        }
        if help.contains("--device <") {
            assert!(c == &["replay"], "{c:?} has a --device: {help}");
        }
    }
    assert!(ok(&["trace", "stats", "--help"]).contains("--cuda-device"));
}
