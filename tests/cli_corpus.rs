//! End-to-end tests of `memcast corpus`: the re-check of a corpus split against
//! PyTorch's own figures, on the repository's corpus.

mod common;

use common::{fails, ok, repo};

fn manifest() -> String {
    repo()
        .join("training-data/corpus/manifest.tsv")
        .to_string_lossy()
        .into_owned()
}

fn figures() -> Vec<serde_json::Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("training-data/corpus/pytorch_allocator_figures.jsonl");
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn corpus_checks_every_trace_of_a_split_against_pytorch() {
    let out = ok(&["corpus", &manifest(), "--split", "validation", "--json"]);
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (summary, traces) = rows.split_last().unwrap();
    assert_eq!(traces.len(), 7);
    assert_eq!(summary["summary"]["traces"], 7);
    for t in traces {
        let w = t["workload"].as_str().unwrap();
        for k in ["pytorch_native", "pytorch_expandable"] {
            assert!(t[k]["peak_reserved_bytes"].as_u64().unwrap() > 0, "{w} {k}");
        }
        // PyTorch's overhead is over the run's requested peak (memcast's definition),
        // read here from the figures file itself; its own figure is over allocated.
        for (k, a) in [
            ("pytorch_native", "pytorch-native"),
            ("pytorch_expandable", "pytorch-expandable-segments"),
        ] {
            let row = figures()
                .into_iter()
                .find(|r| r["name"] == w && r["allocator"] == a)
                .unwrap();
            let (reserved, requested, allocated) = (
                row["peak_reserved"].as_f64().unwrap(),
                row["peak_requested"].as_f64().unwrap(),
                row["peak_allocated"].as_f64().unwrap(),
            );
            let got = t[k]["reserved_overhead"].as_f64().unwrap();
            assert!(
                (got - (reserved / requested - 1.0)).abs() < 1e-12,
                "{w} {k}"
            );
            let own = t[k]["reserved_overhead_vs_allocated"].as_f64().unwrap();
            assert!(
                (own - (reserved / allocated - 1.0)).abs() < 1e-12,
                "{w} {k}"
            );
        }
        let overhead = t["memcast"]["reserved_overhead"].as_f64().unwrap();
        assert!((0.0..1.0).contains(&overhead), "{w}: {overhead}");
        let emu = t["pytorch_emulation"]["error_vs_native"].as_f64().unwrap();
        assert!(emu.abs() < 0.2, "{w}: emulation {emu}");
        assert_eq!(t["tiered"]["completed"], true, "{w}");
        assert_eq!(t["forecast"].is_object(), t["dynamic"] == true, "{w}");
        if t["dynamic"] == true {
            let p = &t["forecast"]["peak_rise"];
            let (lstm, best) = (
                p["lstm_wape"].as_f64().unwrap(),
                p["best_baseline_wape"].as_f64().unwrap(),
            );
            assert!(
                lstm > 0.0 && best > 0.0,
                "{w}: peak-rise WAPE {lstm} / {best}"
            );
            assert_eq!(
                p["models"][p["best_baseline"].as_str().unwrap()].as_f64(),
                Some(best)
            );
        }
    }
}

#[test]
fn corpus_names_a_bad_split_and_a_missing_manifest() {
    let err = fails(&["corpus", &manifest(), "--split", "holdout"]);
    assert!(err.contains("unknown split"), "{err}");
    let err = fails(&["corpus", "/nonexistent/manifest.tsv"]);
    assert!(err.contains("/nonexistent/manifest.tsv"), "{err}");
}

/// A corpus without PyTorch's figures still runs, and says which traces have none and
/// where it looked (a missing file named as missing), rather than leaving the columns
/// empty without a word.
#[test]
fn corpus_names_the_traces_it_has_no_pytorch_figures_for() {
    let trace = "gcn_fixed_200k.mctrace";
    let (dir, manifest) = common::scratch_corpus(
        "corpus-figures",
        trace,
        &format!("{trace}\tgcn_copy\tgcn\tstatic\ttest\ta copy\n"),
    );
    let run = || {
        let o = common::memcast(&["corpus", manifest.to_str().unwrap(), "--json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stderr).unwrap()
    };
    let err = run();
    assert!(
        err.contains("no PyTorch figures for 1 of 1 traces")
            && err.contains("gcn_copy")
            && err.contains("pytorch_allocator_figures.jsonl, which does not exist"),
        "{err}"
    );
    std::fs::write(dir.path().join("pytorch_allocator_figures.jsonl"), "").unwrap();
    let err = run();
    assert!(
        err.contains("no PyTorch figures for 1 of 1") && !err.contains("does not exist"),
        "{err}"
    );
}

/// A row naming a missing trace is an error naming the manifest's line (it was the
/// trace's load error alone, after a warning about its figures); a row whose file is
/// named for another workload is replayed with a warning, since PyTorch's figures are
/// matched by the workload column.
#[test]
fn corpus_names_the_manifest_line_of_a_missing_or_misfiled_trace() {
    let trace = "gcn_fixed_200k.mctrace";
    let (_dir, manifest) = common::scratch_corpus(
        "corpus-rows",
        trace,
        &format!("{trace}\tgcn_fixed_200k\tgcn\tstatic\ttest\tok\nnothere.mctrace\tnothere\tx\tstatic\ttest\tmissing\n"),
    );
    let m = manifest.to_str().unwrap();
    let err = fails(&["corpus", m]);
    assert!(
        err.contains("manifest.tsv line 3: the trace") && err.contains("nothere.mctrace"),
        "{err}"
    );
    std::fs::write(
        &manifest,
        format!(
            "{}{trace}\tgat_dyngraph\tgat\tstatic\ttest\tmisfiled\n",
            common::MANIFEST_HEADER
        ),
    )
    .unwrap();
    let o = common::memcast(&["corpus", m, "--json"]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("line 2: the file")
            && err.contains("is named for gcn_fixed_200k, the row for workload gat_dyngraph"),
        "{err}"
    );
}
