//! `memcast trace ...`: import, inspect, generate, featurize, export and plot traces.

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::{Subcommand, ValueEnum};
use memcast_trace::export::{write_text, TextFormat};
use memcast_trace::io::load_trace_with;
use memcast_trace::native::{save_with, WriteOptions};
use memcast_trace::snapshot::{SnapshotOptions, DEFAULT_MARKER_BYTES};
use memcast_trace::stats::{human_bytes, TraceStats};
use memcast_trace::Trace;

#[derive(Subcommand)]
pub enum TraceCommand {
    /// Convert a PyTorch snapshot pickle (optionally .xz), a JSON trace document or a native trace to native.
    Import {
        /// Trace file: a PyTorch snapshot pickle (optionally .xz), a native trace or a JSON trace document.
        file: PathBuf,
        /// Native trace to write (.mctrace).
        #[arg(short, long)]
        output: PathBuf,
        #[command(flatten)]
        import: ImportArgs,
        /// zstd level for the output, 1..=22 (0 = uncompressed).
        #[arg(long, default_value_t = 9, value_parser = clap::value_parser!(i32).range(0..=22))]
        zstd: i32,
    },
    /// Print summary statistics of a trace.
    Stats {
        /// Trace file: a PyTorch snapshot pickle (optionally .xz), a native trace or a JSON trace document.
        file: PathBuf,
        #[command(flatten)]
        import: ImportArgs,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Generate a synthetic trace from a computation graph.
    Gen(Box<super::gen::GenArgs>),
    /// Write the step features of a trace as CSV (the predictor's input).
    Features {
        /// Trace file: a PyTorch snapshot pickle (optionally .xz), a native trace or a JSON trace document.
        file: PathBuf,
        /// CSV file to write.
        #[arg(short, long)]
        output: PathBuf,
        #[command(flatten)]
        import: ImportArgs,
        /// Allocation events per step (steps also end at iteration boundaries).
        #[arg(long, default_value_t = memcast_trace::features::StepConfig::default().allocs_per_step)]
        step_allocs: u32,
    },
    /// Export a trace as text (CSV or JSON Lines) for people and other tools.
    Export {
        /// Trace file: a PyTorch snapshot pickle (optionally .xz), a native trace or a JSON trace document.
        file: PathBuf,
        /// Text format.
        #[arg(long, value_enum)]
        format: ExportFormat,
        /// Text file to write.
        #[arg(short, long)]
        output: PathBuf,
        #[command(flatten)]
        import: ImportArgs,
    },
    /// Plot live and static bytes over time with iteration boundaries (SVG or PNG).
    Plot {
        /// Trace file: a PyTorch snapshot pickle (optionally .xz), a native trace or a JSON trace document.
        file: PathBuf,
        /// Output file; the extension (.svg or .png) picks the format.
        #[arg(short, long)]
        output: PathBuf,
        #[command(flatten)]
        import: ImportArgs,
    },
}

/// Options for reading PyTorch snapshots (ignored for native traces).
#[derive(clap::Args, Clone)]
pub struct ImportArgs {
    /// Allocation size (bytes) that marks an iteration boundary in PyTorch snapshots.
    #[arg(long, default_value_t = DEFAULT_MARKER_BYTES)]
    pub marker_bytes: u64,
    /// Do not treat marker allocations as iteration boundaries.
    #[arg(long, conflicts_with = "marker_bytes")]
    pub no_markers: bool,
    /// Which CUDA device's events to read from a snapshot (its index in
    /// `device_traces`).
    #[arg(long, default_value_t = 0)]
    pub cuda_device: usize,
}

impl ImportArgs {
    pub fn options(&self) -> SnapshotOptions {
        SnapshotOptions {
            device: self.cuda_device,
            iteration_marker_bytes: (!self.no_markers).then_some(self.marker_bytes),
            ..Default::default()
        }
    }

    pub fn load(&self, path: &Path) -> Result<Trace> {
        // The error names the file (and where in it) already.
        let t = load_trace_with(path, &self.options())?;
        let set =
            self.no_markers || self.marker_bytes != DEFAULT_MARKER_BYTES || self.cuda_device != 0;
        // Only where one was given: the file is read twice.
        if set {
            let data = memcast_trace::io::read_maybe_xz(path)?;
            if memcast_trace::io::detect(&data) != Some(memcast_trace::io::Format::PytorchSnapshot)
            {
                eprintln!(
                    "warning: {}: not a PyTorch snapshot, so --marker-bytes, --no-markers and --cuda-device (which read snapshots) are ignored",
                    path.display()
                );
            }
        }
        let snapshot = t.meta.source == "pytorch-snapshot";
        if snapshot && !self.no_markers && t.boundaries() == 0 {
            eprintln!(
                "warning: {}: no iteration marker (an alloc of exactly {} B freed at once) in the snapshot, so it has no iteration boundaries; --marker-bytes sets the size, --no-markers reads it without",
                path.display(),
                self.marker_bytes
            );
        }
        Ok(t)
    }
}

#[derive(ValueEnum, Clone, Copy)]
pub enum ExportFormat {
    /// One header line, then `index,time_us,kind,id,bytes,stream` rows.
    Csv,
    /// One JSON object per line.
    Jsonl,
}

pub fn run(c: TraceCommand) -> Result<()> {
    match c {
        TraceCommand::Import {
            file,
            output,
            import,
            zstd,
        } => {
            memcast_trace::output::check_not_input(&output, &file, "the trace")?;
            let t = import.load(&file)?;
            let opts = WriteOptions {
                zstd_level: (zstd > 0).then_some(zstd),
            };
            save_with(&t, &output, opts)?;
            let size = std::fs::metadata(&output).map(|m| m.len()).unwrap_or(0);
            out!(
                "{}: {} events, {} static blocks -> {} ({})",
                file.display(),
                t.events.len(),
                t.static_blocks.len(),
                output.display(),
                human_bytes(size)
            );
        }
        TraceCommand::Stats { file, import, json } => {
            let t = import.load(&file)?;
            let s = TraceStats::compute(&t)?;
            if json {
                out!("{}", serde_json::to_string(&s)?);
            } else {
                print_stats(&s);
            }
        }
        TraceCommand::Gen(args) => super::gen::run(*args)?,
        TraceCommand::Features {
            file,
            output,
            import,
            step_allocs,
        } => {
            memcast_trace::output::check_not_input(&output, &file, "the trace")?;
            let t = import.load(&file)?;
            let n = super::features_csv::write(&t, step_allocs, &output)?;
            out!("{}: {n} steps -> {}", file.display(), output.display());
        }
        TraceCommand::Export {
            file,
            format,
            output,
            import,
        } => {
            memcast_trace::output::check_not_input(&output, &file, "the trace")?;
            let t = import.load(&file)?;
            let format = match format {
                ExportFormat::Csv => TextFormat::Csv,
                ExportFormat::Jsonl => TextFormat::JsonLines,
            };
            memcast_trace::output::write_with(&output, |w| write_text(&t, format, w))?;
        }
        TraceCommand::Plot {
            file,
            output,
            import,
        } => {
            memcast_trace::output::check_not_input(&output, &file, "the trace")?;
            let t = import.load(&file)?;
            super::plot::plot_trace(&t, &output)?;
            out!("{}", output.display());
        }
    }
    Ok(())
}

fn print_stats(s: &TraceStats) {
    let rows: [(&str, String); 13] = [
        ("events", s.events.to_string()),
        ("allocs / frees", format!("{} / {}", s.allocs, s.frees)),
        ("accesses", s.accesses.to_string()),
        ("iterations", s.iterations.to_string()),
        (
            "static blocks",
            format!("{} ({})", s.static_blocks, human_bytes(s.static_bytes)),
        ),
        ("peak live (trace)", human_bytes(s.peak_live_bytes)),
        (
            "peak requested",
            format!(
                "{} ({} B)",
                human_bytes(s.peak_requested_bytes),
                s.peak_requested_bytes
            ),
        ),
        ("distinct sizes", s.distinct_sizes.to_string()),
        ("streams", s.streams.to_string()),
        ("duration", format!("{:.3} s", s.duration_us as f64 / 1e6)),
        (
            "iteration (median)",
            if s.iteration_us == 0 {
                "-".into()
            } else {
                format!(
                    "{:.1} ms, longest wait {:.1} ms ({:.0}%)",
                    s.iteration_us as f64 / 1e3,
                    s.longest_wait_us as f64 / 1e3,
                    100.0 * s.longest_wait_us as f64 / s.iteration_us as f64
                )
            },
        ),
        ("live at end", s.live_at_end.to_string()),
        ("total requested", human_bytes(s.total_requested_bytes)),
    ];
    out!("{}", s.name);
    for (k, v) in rows {
        out!("  {k:<20} {v}");
    }
}
