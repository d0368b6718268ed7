//! Careless input through `memcast replay`: budgets at the edges of what can be counted
//! or held, a policy named twice, predictive mode switched on through the settings, a
//! model path, snapshot options on a native trace, tensors of zero bytes, a setup that
//! fails under a budget. Each either works as the docs say or fails with a message that
//! names the cause; none panics.

mod common;

use common::*;

fn fails_with(args: &[&str], env: &[(&str, &str)], needles: &[&str]) -> String {
    let m = measured(args, env, false);
    m.clean_failure(&format!("{args:?}"), needles);
    m.stderr
}

fn json(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(args)).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

#[test]
fn budgets_at_the_edges_are_refused_by_name_or_replayed() {
    let t = bundled("resnet50_b64_train");
    // Between 2^62 and 2^64 bytes: countable, but beyond any device's address range
    // (a segment of it would overflow its offsets: this panicked).
    for b in ["16383P", "8193P", "9223372036854775809"] {
        fails_with(&["replay", &t, "--budget", b], &[], &["2^62", b]);
    }
    // 2^64 - 1 is a count of bytes, not "2^64 or more".
    let e = fails_with(
        &["replay", &t, "--budget", "18446744073709551615"],
        &[],
        &["2^62"],
    );
    assert!(!e.contains("2^64 bytes or more"), "{e}");
    // 2^62 itself is the largest budget, and replays.
    let r = json(&["replay", &t, "--budget", "4096P", "--json"]);
    assert_eq!(r["completed"], true, "{r}");
    // Below one segment nothing fits: said so, not "short by 1 byte" of a budget that
    // holds the request.
    fails_with(
        &["replay", &t, "--budget", "1.5M"],
        &[],
        &["1.50 MiB", "less than one segment", "segment_granule"],
    );
    // A smaller `segment_granule` does not go below the device's page (2 MiB).
    fails_with(
        &[
            "replay",
            &t,
            "--budget",
            "1.5M",
            "--conf",
            "segment_granule:1M",
        ],
        &[],
        &["less than one segment", "2.00 MiB"],
    );
    // Commands that take shares only do not suggest bytes for a share above 100%.
    let e = fails_with(&["demo", "--no-plots", "--budget", "150%"], &[], &["150%"]);
    assert!(!e.contains("written in bytes"), "{e}");
}

#[test]
fn a_setup_that_fails_under_a_budget_is_setup_not_stall() {
    // The static blocks (32 MiB among them) do not fit in 2 MiB.
    let t = bundled("resnet50_b64_train");
    let m = measured(&["replay", &t, "--budget", "2M", "--json"], &[], false);
    m.clean_failure("setup out of memory", &["setup (static blocks)"]);
    let r: serde_json::Value = serde_json::from_str(&m.stdout).unwrap();
    assert_eq!(r["completed"], false);
    assert!(r["setup_us"].as_f64().unwrap() > 0.0, "{r}");
    assert_eq!(r["stall_us"].as_f64().unwrap(), 0.0, "{r}");
    // Nothing read back: the table says there is no hit rate to give.
    let m = measured(&["replay", &t, "--budget", "2M"], &[], false);
    assert!(
        m.stdout.contains("prefetch hit rate  - (no spilled tensor"),
        "{}",
        m.stdout
    );
}

#[test]
fn a_policy_named_twice_is_refused() {
    let t = bundled("resnet50_b64_train");
    fails_with(
        &[
            "replay",
            &t,
            "--compare",
            "memcast,pytorch,memcast",
            "--json",
        ],
        &[],
        &["memcast twice"],
    );
}

#[test]
fn predictive_mode_from_the_settings_replays_as_the_predictive_policy() {
    // Forecasts inline and in step, as under --policy predictive: the same forecasts
    // used and advice followed, run after run (with the forecast thread they were
    // 41, 78, 3 and no advice).
    let t = bundled("gpt2_generate_dynamic");
    let p = json(&["replay", &t, "--policy", "predictive", "--json"]);
    for _ in 0..2 {
        let m = json(&[
            "replay",
            &t,
            "--policy",
            "memcast",
            "--conf",
            "predictive:true",
            "--json",
        ]);
        for k in ["forecasts_used", "advice_applied"] {
            assert_eq!(m["extra"][k], p["extra"][k], "{k}");
        }
        assert!(p["extra"]["advice_applied"].as_u64().unwrap() > 0);
        assert_eq!(m["ahead_device_calls"], p["ahead_device_calls"]);
        assert_eq!(m["reserved_overhead"], p["reserved_overhead"]);
    }
}

#[test]
fn a_model_that_does_not_load_is_a_setup_error_naming_it_once() {
    let t = bundled("resnet50_b64_train");
    let e = fails_with(
        &[
            "replay",
            &t,
            "--policy",
            "predictive",
            "--model",
            "/nonexistent-model",
        ],
        &[],
        &["setup", "model /nonexistent-model: No such file"],
    );
    assert!(!e.contains("event 0"), "{e}");
    assert_eq!(e.matches("/nonexistent-model").count(), 1, "{e}");
}

#[test]
fn snapshot_options_on_a_native_trace_are_said_to_be_ignored() {
    let t = bundled("resnet50_b64_train");
    let m = measured(&["replay", &t, "--cuda-device", "3"], &[], false);
    assert_eq!(m.code, Some(0), "{}", m.stderr);
    assert!(m.stderr.contains("not a PyTorch snapshot"), "{}", m.stderr);
    // --no-markers and --marker-bytes contradict each other.
    fails_with(
        &["replay", &t, "--no-markers", "--marker-bytes", "5"],
        &[],
        &["cannot be used with"],
    );
}

#[test]
fn zero_byte_tensors_hold_no_memory_with_or_without_a_budget() {
    use memcast_trace::{Event, EventKind};
    let d = scratch("zero");
    let alloc = |time_us, id, bytes| Event {
        time_us,
        kind: EventKind::Alloc {
            id,
            bytes,
            stream: 0,
        },
    };
    let free = |time_us, id| Event {
        time_us,
        kind: EventKind::Free { id },
    };
    let write = |name: &str, events| {
        let p = d.path().join(name);
        std::fs::write(&p, native_trace(events)).unwrap();
        p.display().to_string()
    };
    let only = write("only.mctrace", vec![alloc(0, 1, 0), free(1, 1)]);
    // Under a budget: it allocates nothing, which is refused as such.
    fails_with(
        &["replay", &only, "--budget", "1G"],
        &[],
        &["allocates nothing"],
    );
    // A zero-byte tensor beside others: every policy replays it, as the tiers do.
    let mixed = write(
        "mixed.mctrace",
        vec![alloc(0, 1, 0), alloc(1, 2, 1 << 20), free(2, 1), free(3, 2)],
    );
    let r = json(&[
        "replay",
        &mixed,
        "--compare",
        "memcast,predictive,pytorch,naive",
        "--json",
    ]);
    for p in ["memcast", "predictive", "pytorch", "naive"] {
        assert_eq!(r[p]["allocs"], 2, "{p}: {r}");
        assert_eq!(r[p]["peak_requested_bytes"], 1 << 20, "{p}: {r}");
    }
    let r = json(&["replay", &mixed, "--budget", "1G", "--json"]);
    assert_eq!(r["completed"], true, "{r}");
}

/// Outputs that cannot be made fail before the work: `train` makes its artifact folder
/// once its traces load, before training (a folder it could not make failed after the
/// training), and refuses a trace given twice before making it; `demo --only` matching
/// no bundled trace names them and makes no output folder.
#[test]
fn outputs_fail_before_the_work_and_no_match_names_the_choices() {
    let t = bundled("bert_dynseq_b16_train");
    let e = fails(&[
        "train",
        "--traces",
        &t,
        "--epochs",
        "1",
        "-o",
        "/proc/nonexistent/m",
    ]);
    assert!(e.contains("/proc/nonexistent/m"), "{e}");
    assert!(!e.contains("steps (loaded"), "went on to train: {e}");
    let d = common::scratch("train-twice");
    let out = d.path().join("m");
    let folder = common::repo().join("training-data/traces");
    let e = fails(&[
        "train",
        "--traces",
        &t,
        &folder.display().to_string(),
        "-o",
        &out.display().to_string(),
    ]);
    assert!(
        e.contains("bert_dynseq_b16_train.mctrace is given twice"),
        "{e}"
    );
    assert!(!out.exists());
    let d = common::scratch("demo-only");
    let out = d.path().join("demo");
    let e = fails(&["demo", "--only", "zzz", "--out", &out.display().to_string()]);
    assert!(
        e.contains("--only \"zzz\"") && e.contains("resnet50_b64_train"),
        "{e}"
    );
    assert!(!out.exists());
}

/// A budget that holds the trace's peak is replayed (nothing spills) with a warning that
/// says so: 5 TiB for a 10 GiB trace printed a peak reserved of 5 TiB without a word.
#[test]
fn a_budget_above_the_peak_is_named_in_a_warning() {
    let t = bundled("bert_dynseq_b16_train");
    let o = common::memcast(&["replay", &t, "--budget", "5T", "--json"]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("holds the trace's peak of requested bytes") && err.contains("5.00 TiB"),
        "{err}"
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["spills"], 0);
    let o = common::memcast(&["replay", &t, "--budget", "60%", "--json"]);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("holds the trace's peak"));
}

/// `--real-time` on a trace that spans longer than a few seconds says how long before
/// it starts waiting (it slept without a word; this trace spans over a day).
#[test]
fn a_long_real_time_replay_says_its_span_first() {
    use std::io::BufRead;
    let d = common::scratch("real-time");
    let t = d.path().join("long.json");
    common::one_tensor_trace(&t, 100_000_000_000);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_memcast"))
        .args(["replay", "--real-time", &t.display().to_string()])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The first line of stderr, or nothing within 30 s (a silent wait).
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(err).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(std::time::Duration::from_secs(30));
    child.kill().unwrap();
    child.wait().unwrap();
    let line = line.expect("a line on stderr before the wait");
    assert!(line.contains("the trace spans 100000 s"), "{line}");
}

/// Page release on fixed segments changes nothing, and says so (it was accepted
/// without a word), also under a budget, whose replays use fixed segments.
#[test]
fn page_release_without_growable_segments_is_named() {
    let t = bundled("bert_dynseq_b16_train");
    for args in [
        &["--conf", "page_release:peak,growable_segments:false"][..],
        &["--conf", "page_release:peak", "--budget", "60%"][..],
    ] {
        let mut a = vec!["replay", &t, "--json"];
        a.extend_from_slice(args);
        let o = common::memcast(&a);
        assert!(o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("page_release applies to growable segments"),
            "{args:?}: {err}"
        );
    }
    let o = common::memcast(&["replay", &t, "--conf", "page_release:peak", "--json"]);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("page_release applies"));
}
