//! A corpus of recorded traces: a manifest that names each trace's workload, model
//! family, shapes and split, and PyTorch's own figures for the same runs.
//!
//! The manifest is a tab-separated file with a header line, the columns `file`,
//! `workload`, `family`, `shapes`, `split`, `description`; a row, tabs shown as `|`:
//!
//! ```text
//! test/vit_b16_b64_bf16_adamw.mctrace|vit_b16_b64_bf16_adamw|vit|static|test|ViT-B/16, ...
//! ```
//!
//! `file` is relative to the manifest's folder; `shapes` is `static` or `dynamic`;
//! `split` is `train`, `validation` or `test`, and every trace of a family is in the
//! same split. PyTorch's figures are read from `pytorch_allocator_figures.jsonl` beside
//! the manifest (the format of [`crate::bundled::PYTORCH_FIGURES_JSONL`]).
//!
//! The repository's corpus is `training-data/corpus/` (its manifest also lists the
//! bundled traces, all of the train split).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::bundled::PytorchFigures;
use crate::TraceError;

/// Which part of a corpus a trace belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Used to choose constants and to train shipped models.
    Train,
    /// Used to choose between candidates (a mechanism, early stopping).
    Validation,
    /// Never used to choose anything: only reported on.
    Test,
}

impl FromStr for Split {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "train" => Ok(Split::Train),
            "validation" => Ok(Split::Validation),
            "test" => Ok(Split::Test),
            _ => Err(format!("unknown split {s:?} (train, validation or test)")),
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Split::Train => "train",
            Split::Validation => "validation",
            Split::Test => "test",
        })
    }
}

/// One manifest row.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Entry {
    /// The trace file (the manifest's `file`, joined to the manifest's folder).
    pub path: PathBuf,
    /// The manifest line that lists it (1-based; line 1 is the header).
    pub line: usize,
    pub workload: String,
    pub family: String,
    /// Whether shapes change between iterations (`shapes` = `dynamic`).
    pub dynamic: bool,
    pub split: Split,
    pub description: String,
}

/// A loaded manifest and the PyTorch figures beside it.
#[derive(Debug, Clone)]
pub struct Corpus {
    pub entries: Vec<Entry>,
    pub figures: Vec<PytorchFigures>,
}

/// The file PyTorch's figures are read from, beside the manifest.
pub const FIGURES_FILE: &str = "pytorch_allocator_figures.jsonl";

const HEADER: [&str; 6] = [
    "file",
    "workload",
    "family",
    "shapes",
    "split",
    "description",
];

impl Corpus {
    /// Reads `manifest` and the figures file beside it (missing figures file: no figures).
    pub fn load(manifest: &Path) -> Result<Corpus, TraceError> {
        let text = crate::io::read_bounded_text(manifest, crate::limits::MAX_TEXT_FILE_BYTES)
            .map_err(|e| TraceError::io(manifest, e))?;
        let in_file = |err: TraceError| TraceError::InFile {
            path: manifest.to_path_buf(),
            err: Box::new(err),
        };
        let root = manifest.parent().unwrap_or(Path::new("."));
        let entries = parse_manifest(&text, root).map_err(in_file)?;
        let fig_path = root.join(FIGURES_FILE);
        let figures =
            match crate::io::read_bounded_text(&fig_path, crate::limits::MAX_TEXT_FILE_BYTES) {
                Ok(t) => parse_figures(&t).map_err(|err| TraceError::InFile {
                    path: fig_path.clone(),
                    err: Box::new(err),
                })?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(TraceError::io(fig_path, e)),
            };
        Ok(Corpus { entries, figures })
    }

    /// The entries of `split`, in manifest order.
    pub fn split(&self, split: Split) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(move |e| e.split == split)
    }

    /// The entry of `workload`, if the manifest lists it.
    pub fn entry(&self, workload: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.workload == workload)
    }

    /// PyTorch's figures for `workload` with `allocator` (`pytorch-native` or
    /// `pytorch-expandable-segments`).
    pub fn figures(&self, workload: &str, allocator: &str) -> Option<&PytorchFigures> {
        self.figures
            .iter()
            .find(|f| f.name == workload && f.allocator == allocator)
    }
}

/// Parses a manifest's text; `file` paths are joined to `root`. Line numbers in errors
/// count from 1.
pub fn parse_manifest(text: &str, root: &Path) -> Result<Vec<Entry>, TraceError> {
    let bad =
        |line: usize, what: String| TraceError::Param(format!("manifest line {line}: {what}"));
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, h)) if h.split('\t').collect::<Vec<_>>() == HEADER => {}
        _ => {
            return Err(bad(
                1,
                format!("the header must be the columns {}", HEADER.join(", ")),
            ))
        }
    }
    let mut out: Vec<Entry> = Vec::new();
    for (i, line) in lines {
        let n = i + 1;
        // A blank line is skipped; a row of empty fields is not blank.
        if line.trim().is_empty() && !line.contains('\t') {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        if cols.len() != HEADER.len() {
            return Err(bad(
                n,
                format!(
                    "{} tab-separated columns, expected {}",
                    cols.len(),
                    HEADER.len()
                ),
            ));
        }
        if let Some(k) = (0..3).find(|&k| cols[k].trim().is_empty()) {
            return Err(bad(n, format!("the {} column is empty", HEADER[k])));
        }
        let dynamic = match cols[3] {
            "static" => false,
            "dynamic" => true,
            s => return Err(bad(n, format!("shapes {s:?}: static or dynamic"))),
        };
        let split: Split = cols[4].parse().map_err(|e| bad(n, e))?;
        if let Some(other) = out.iter().find(|e| e.family == cols[2] && e.split != split) {
            return Err(bad(
                n,
                format!(
                    "family {} is in split {} here and in {} for {}: a family belongs to one split",
                    cols[2], split, other.split, other.workload
                ),
            ));
        }
        if out.iter().any(|e| e.workload == cols[1]) {
            return Err(bad(n, format!("workload {} listed twice", cols[1])));
        }
        let path = root.join(cols[0]);
        if let Some(other) = out.iter().find(|e| e.path == path) {
            return Err(bad(
                n,
                format!(
                    "file {} is workload {} already: one trace, one workload",
                    cols[0], other.workload
                ),
            ));
        }
        out.push(Entry {
            path,
            line: n,
            workload: cols[1].to_string(),
            family: cols[2].to_string(),
            dynamic,
            split,
            description: cols[5].to_string(),
        });
    }
    Ok(out)
}

/// Parses PyTorch figures (JSON Lines); blank lines are skipped.
pub fn parse_figures(text: &str) -> Result<Vec<PytorchFigures>, TraceError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| TraceError::Param(format!("figures line {}: {e}", i + 1)))
        })
        .collect()
}

/// Parses the iteration wall times `scripts/corpus/time_iterations.py` prints (JSON
/// Lines: `name`, `iteration_s`): each workload's times in seconds, in order. A line
/// with no times (a workload that failed: it has `error`) is skipped; blank lines too.
pub fn parse_iteration_times(
    text: &str,
) -> Result<std::collections::HashMap<String, Vec<f64>>, TraceError> {
    #[derive(serde::Deserialize)]
    struct Line {
        name: String,
        iteration_s: Option<Vec<f64>>,
    }
    let mut out = std::collections::HashMap::new();
    for (i, l) in text.lines().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(l)
            .map_err(|e| TraceError::Param(format!("iteration times line {}: {e}", i + 1)))?;
        if let Some(times) = line.iteration_s {
            out.insert(line.name, times);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "file\tworkload\tfamily\tshapes\tsplit\tdescription\n";

    #[test]
    fn parses_rows_and_joins_paths() {
        let t = format!("{HEAD}a/x.mctrace\tx\tvit\tstatic\ttest\tViT\nb.mctrace\ty\tgpt2\tdynamic\ttrain\tGPT\n");
        let e = parse_manifest(&t, Path::new("/c")).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].path, Path::new("/c/a/x.mctrace"));
        assert!(!e[0].dynamic && e[1].dynamic);
        assert_eq!((e[0].split, e[1].split), (Split::Test, Split::Train));
    }

    #[test]
    fn iteration_times_skip_failed_workloads_and_name_a_bad_line() {
        let t = "{\"name\": \"a\", \"iteration_s\": [0.5, 0.25]}\n\n{\"name\": \"b\", \"error\": \"OutOfMemoryError\"}\n";
        let times = parse_iteration_times(t).unwrap();
        assert_eq!(times.len(), 1);
        assert_eq!(times["a"], [0.5, 0.25]);
        let err =
            parse_iteration_times("{\"name\": \"a\", \"iteration_s\": [0.5]}\n{\"name\": 3}\n")
                .unwrap_err()
                .to_string();
        assert!(err.contains("iteration times line 2"), "{err}");
    }

    #[test]
    fn rejects_a_family_in_two_splits_and_names_the_line() {
        let t = format!("{HEAD}x\tx\tvit\tstatic\ttest\t-\ny\ty\tvit\tstatic\ttrain\t-\n");
        let err = parse_manifest(&t, Path::new(".")).unwrap_err().to_string();
        assert!(err.contains("line 3") && err.contains("one split"), "{err}");
    }

    #[test]
    fn rejects_bad_header_columns_and_values() {
        for (t, want) in [
            ("file\tworkload\n".to_string(), "header"),
            (
                format!("{HEAD}x\tx\tvit\tstatic\ttest\n"),
                "5 tab-separated",
            ),
            (format!("{HEAD}x\tx\tvit\tsometimes\ttest\t-\n"), "shapes"),
            (
                format!("{HEAD}x\tx\tvit\tstatic\tholdout\t-\n"),
                "unknown split",
            ),
            (
                format!("{HEAD}x\tx\tvit\tstatic\ttest\t-\nz\tx\tvit\tstatic\ttest\t-\n"),
                "twice",
            ),
            (
                format!("{HEAD}x\tx\tvit\tstatic\ttest\t-\nx\ty\tvit\tstatic\ttest\t-\n"),
                "line 3: file x is workload x already",
            ),
            (
                format!("{HEAD}x\t\tvit\tstatic\ttest\t-\n"),
                "the workload column is empty",
            ),
            (
                format!("{HEAD}\t\t\t\t\t\n"),
                "line 2: the file column is empty",
            ),
        ] {
            let err = parse_manifest(&t, Path::new(".")).unwrap_err().to_string();
            assert!(err.contains(want), "{want}: {err}");
        }
    }

    /// The repository's corpus: every listed file exists, the families' splits hold, and
    /// each trace has both of PyTorch's figures.
    #[test]
    fn repository_corpus_is_complete() {
        let m = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/manifest.tsv");
        let c = Corpus::load(&m).unwrap();
        assert!(c.entries.len() >= 48, "{} entries", c.entries.len());
        for e in &c.entries {
            assert!(e.path.is_file(), "{} missing", e.path.display());
            if e.path.starts_with(m.parent().unwrap().join("..")) {
                continue; // the bundled traces: their figures are the bundled ones
            }
            for a in ["pytorch-native", "pytorch-expandable-segments"] {
                assert!(c.figures(&e.workload, a).is_some(), "{} {a}", e.workload);
            }
        }
        for s in [Split::Train, Split::Validation, Split::Test] {
            assert!(c.split(s).count() >= 5, "{s}");
        }
    }

    /// The corpus recorded from the process's start: the same workloads in the same
    /// splits as the corpus, each with both figures, and each trace holds its start (no
    /// static blocks; it allocates before its first iteration boundary).
    #[test]
    fn repository_from_start_corpus_holds_each_process_from_its_start() {
        use crate::EventKind;
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
        let main = Corpus::load(&dir.join("manifest.tsv")).unwrap();
        let c = Corpus::load(&dir.join("from-start/manifest.tsv")).unwrap();
        assert_eq!(c.entries.len(), 50);
        for e in &c.entries {
            let m = main.entry(&e.workload).unwrap();
            assert_eq!((m.split, &m.family), (e.split, &e.family), "{}", e.workload);
            for a in ["pytorch-native", "pytorch-expandable-segments"] {
                assert!(c.figures(&e.workload, a).is_some(), "{} {a}", e.workload);
            }
            let t = crate::io::load_trace(&e.path).unwrap();
            t.validate().unwrap();
            assert!(t.static_blocks.is_empty(), "{}", e.workload);
            let first = t
                .events
                .iter()
                .position(|ev| matches!(ev.kind, EventKind::IterationBoundary))
                .unwrap();
            assert!(
                first > 0,
                "{}: nothing before the first boundary",
                e.workload
            );
        }
    }

    /// The test split recorded with `CUDA_LAUNCH_BLOCKING=1`, each workload alone on
    /// the GPU (`record.py --launch-blocking`), on the H200 (`launch-blocking/`) and,
    /// with the validation and train splits, on an H100 (`launch-blocking-h100/`): the
    /// same programs as the corpus's traces, allocation for allocation (the order of
    /// the static blocks, read from the final layout, and of frees that complete
    /// together may differ; Faster R-CNN's data-dependent proposals differ; on the H100
    /// six have other workspaces), with event times that follow the GPU's work: no
    /// iteration has one long wait at its end.
    #[test]
    fn repository_launch_blocking_corpus_holds_the_same_programs() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
        let main = Corpus::load(&dir.join("manifest.tsv")).unwrap();
        let c = Corpus::load(&dir.join("launch-blocking/manifest.tsv")).unwrap();
        assert_eq!(c.split(Split::Test).count(), 26);
        assert_eq!(c.entries.len(), 26);
        assert_eq!(same_programs(&main, &c, true), 0);
        // On the H100, 6 of the 50 differ: cuDNN and cuBLAS chose other kernels for
        // the two UNets, Conformer, RetinaNet, the multiscale ConvNeXt and the bf16
        // ResNet-50 (another workspace size, a workspace where the H200 had none).
        // Every workload of the three splits is there; the bundled traces are no
        // workloads' recordings.
        let c = Corpus::load(&dir.join("launch-blocking-h100/manifest.tsv")).unwrap();
        assert_eq!(c.split(Split::Test).count(), 26);
        assert_eq!(c.split(Split::Validation).count(), 7);
        assert_eq!(c.split(Split::Train).count(), 17);
        assert_eq!(c.entries.len(), 50);
        assert!(same_programs(&main, &c, false) <= 6);
    }

    /// Every trace of `c` is the program of the trace of the same workload in `main`
    /// (see above), with no long wait at its iterations' ends; off the H200 (where
    /// `main` was recorded), how many have other allocations.
    fn same_programs(main: &Corpus, c: &Corpus, on_h200: bool) -> usize {
        let mut differ = 0;
        use crate::{EventKind, Trace};
        // The static blocks' sizes, sorted; the allocations in order (bytes, stream);
        // per iteration, the sizes of the tensors freed, sorted (frees that complete
        // together may complete in another order: PyTorch frees a block used on a
        // second stream once that stream's events have completed).
        type Program = (Vec<u64>, Vec<(u64, u32)>, Vec<Vec<u64>>);
        let program = |t: &Trace| -> Program {
            let mut bytes: std::collections::HashMap<u64, u64> =
                t.static_blocks.iter().map(|b| (b.id, b.bytes)).collect();
            let mut statics: Vec<u64> = t.static_blocks.iter().map(|b| b.bytes).collect();
            statics.sort_unstable();
            let (mut allocs, mut frees) = (Vec::new(), vec![Vec::new()]);
            for e in &t.events {
                match e.kind {
                    EventKind::Alloc {
                        id,
                        bytes: b,
                        stream,
                    } => {
                        bytes.insert(id, b);
                        allocs.push((b, stream));
                    }
                    EventKind::Free { id } => frees.last_mut().unwrap().push(bytes[&id]),
                    EventKind::Access { .. } => {}
                    EventKind::IterationBoundary => frees.push(Vec::new()),
                }
            }
            for f in &mut frees {
                f.sort_unstable();
            }
            (statics, allocs, frees)
        };
        for e in &c.entries {
            let m = main.entry(&e.workload).unwrap();
            assert_eq!((m.split, &m.family), (e.split, &e.family), "{}", e.workload);
            assert!(c.figures(&e.workload, "pytorch-native").is_some());
            let t = crate::io::load_trace(&e.path).unwrap();
            t.validate().unwrap();
            let tm = crate::io::load_trace(&m.path).unwrap();
            let (a, b) = (program(&t), program(&tm));
            if e.workload == "fasterrcnn_mnv3_b8" {
                // Its proposals are data-dependent (non-deterministic kernels pick
                // them): the same static blocks and number of allocations; 28,490 of
                // the 31,825 allocations the same in place.
                assert_eq!((&a.0, a.1.len()), (&b.0, b.1.len()));
                let same = a.1.iter().zip(&b.1).filter(|(x, y)| x == y).count();
                assert!(same * 10 >= a.1.len() * 8, "{same}");
            } else if a != b {
                // Another GPU's libraries may pick other kernels, with other
                // workspaces: the same static blocks, allocations within 1%.
                assert!(!on_h200, "{}", e.workload);
                assert_eq!(a.0, b.0, "{}", e.workload);
                assert!(
                    a.1.len().abs_diff(b.1.len()) * 100 <= b.1.len(),
                    "{}",
                    e.workload
                );
                differ += 1;
            }
            // The longest stretch without an event, as a share of its iteration:
            // median over the iterations.
            let mut shares: Vec<f64> = crate::stats::iteration_waits(&t)
                .into_iter()
                .map(|(span, wait)| wait as f64 / span.max(1) as f64)
                .collect();
            shares.sort_by(f64::total_cmp);
            let median = shares[shares.len() / 2];
            assert!(median <= 0.15, "{}: {median:.2}", e.workload);
        }
        differ
    }

    /// The H100 recordings' iteration wall times, with nothing recorded, alone and
    /// with launch blocking (`scripts/corpus/time_iterations.py`): one line per
    /// workload of the three splits with one time per recorded iteration, so that
    /// `timeline::scale_iterations` takes each trace to its job's own pace; and launch
    /// blocking makes every iteration longer than the job's.
    #[test]
    fn repository_h100_timings_cover_its_recordings() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/launch-blocking-h100");
        let c = Corpus::load(&dir.join("manifest.tsv")).unwrap();
        let times = |file: &str| {
            parse_iteration_times(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap()
        };
        let (solo, lb) = (
            times("iteration-times.jsonl"),
            times("iteration-times-launch-blocking.jsonl"),
        );
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        for e in &c.entries {
            let t = crate::io::load_trace(&e.path).unwrap();
            let s = &solo[&e.workload];
            let us: Vec<u64> = s.iter().map(|x| (x * 1e6).round() as u64).collect();
            let scaled = crate::timeline::scale_iterations(&t, &us).unwrap();
            scaled.validate().unwrap();
            let l = &lb[&e.workload];
            assert_eq!(l.len(), s.len(), "{}", e.workload);
            assert!(median(l) > median(s), "{}: {l:?} against {s:?}", e.workload);
        }
    }
}
