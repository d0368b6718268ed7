//! `memcast train`: trains the forecaster on traces and writes an artifact directory.

use std::path::PathBuf;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use memcast_predictor::artifact;
use memcast_predictor::data::{load_series, trace_files, Series};
use memcast_predictor::train::{train_with, BackendKind, EpochReport, Progress};
use memcast_predictor::{ArtifactConfig, ModelConfig, TrainConfig};
use memcast_trace::features::StepConfig;

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// Trace files or directories (their *.mctrace, *.pickle, *.pickle.xz).
    #[arg(long, required = true, num_args = 1..)]
    pub traces: Vec<PathBuf>,
    /// Skip traces whose name contains this (repeatable; for leave-one-out).
    #[arg(long)]
    pub exclude: Vec<String>,
    /// Artifact directory to write.
    #[arg(short, long, default_value = "memcast-model")]
    pub output: PathBuf,
    /// ndarray (CPU) or cuda (needs the `cuda` feature and a GPU).
    #[arg(long, default_value = "ndarray")]
    pub backend: BackendKind,
    /// Most passes over the training windows (early stopping may end sooner).
    #[arg(long, default_value_t = TrainConfig::default().epochs)]
    pub epochs: usize,
    /// LSTM hidden units per layer.
    #[arg(long, default_value_t = ModelConfig::default().hidden)]
    pub hidden: usize,
    /// Stacked LSTM layers.
    #[arg(long, default_value_t = ModelConfig::default().layers)]
    pub layers: usize,
    /// Steps forecast ahead.
    #[arg(long, default_value_t = ModelConfig::default().horizon)]
    pub horizon: usize,
    /// Also train an output for the horizon's peak rise of live bytes (what predictive
    /// mode grows and spills for) on that target itself, instead of deriving it from
    /// the per-step forecasts.
    #[arg(long)]
    pub peak_head: bool,
    /// Steps per training window.
    #[arg(long, default_value_t = TrainConfig::default().window)]
    pub window: usize,
    /// Steps between the starts of consecutive training windows.
    #[arg(long, default_value_t = TrainConfig::default().stride)]
    pub stride: usize,
    /// Windows per gradient step.
    #[arg(long, default_value_t = TrainConfig::default().batch)]
    pub batch: usize,
    /// Adam learning rate, in (0, 1].
    #[arg(long, default_value_t = TrainConfig::default().learning_rate)]
    pub lr: f64,
    /// Stop after this many epochs without a better loss (validation loss, or the
    /// training loss without validation traces).
    #[arg(long, default_value_t = TrainConfig::default().patience)]
    pub patience: usize,
    /// Share of the traces held out for validation (whole traces, in [0, 1)); only
    /// traces with scored targets are held out.
    #[arg(long, default_value_t = TrainConfig::default().val_fraction)]
    pub val_fraction: f64,
    /// Seed of the split, the shuffling and the initial weights.
    #[arg(long, default_value_t = TrainConfig::default().seed)]
    pub seed: u64,
    /// Stop after the epoch that crosses this many seconds (0 = no limit).
    #[arg(long, default_value_t = 0)]
    pub max_seconds: u64,
    /// Windows drawn per trace per epoch (0 = all).
    #[arg(long, default_value_t = TrainConfig::default().max_windows_per_trace)]
    pub max_windows_per_trace: usize,
    /// Allocations per step (the featurizer's step length).
    #[arg(long, default_value_t = StepConfig::default().allocs_per_step)]
    pub step_allocs: u32,
}

/// Loads every trace (minus exclusions) as a series for `horizon`.
pub fn load_all(
    inputs: &[PathBuf],
    exclude: &[String],
    step: StepConfig,
    horizon: usize,
) -> Result<Vec<Series>> {
    if let Some(x) = exclude.iter().find(|x| x.is_empty()) {
        anyhow::bail!("--exclude {x:?} matches every trace name; give part of a name to leave out");
    }
    let files = trace_files(inputs)?;
    anyhow::ensure!(
        !files.is_empty(),
        "no trace files (*.mctrace, *.pickle, *.pickle.xz) in {}",
        inputs
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let found = files.len();
    let mut out = Vec::new();
    for f in files {
        let name = memcast_trace::io::trace_name(&f);
        if exclude.iter().any(|x| name.contains(x.as_str())) {
            continue;
        }
        out.push(
            load_series(&f, step, horizon).with_context(|| format!("loading {}", f.display()))?,
        );
    }
    anyhow::ensure!(
        !out.is_empty(),
        "all {found} trace files found were left out by --exclude {}",
        exclude.join(", ")
    );
    Ok(out)
}

/// One epoch's line: losses are the masked L1 loss of normalised residuals; `val loss -`
/// when there are no validation traces.
fn epoch_line(r: &EpochReport) -> String {
    let val = if r.val_loss.is_finite() {
        format!("{:.5}", r.val_loss)
    } else {
        "-".into()
    };
    format!(
        "epoch {:>3}  train loss {:.5}  val loss {val}  {:.1} s",
        r.epoch, r.train_loss, r.seconds
    )
}

struct Bar(ProgressBar);

impl Progress for Bar {
    fn start(&mut self, epochs: usize, batches: usize) {
        self.0.set_length((epochs * batches) as u64);
    }
    fn batch(&mut self, epoch: usize, loss: f64) {
        self.0.set_message(format!("epoch {epoch} loss {loss:.4}"));
        self.0.inc(1);
    }
    fn epoch(&mut self, r: &EpochReport) {
        self.0.println(epoch_line(r));
    }
}

pub fn run(a: TrainArgs) -> Result<()> {
    let config = ArtifactConfig {
        model: ModelConfig {
            hidden: a.hidden,
            layers: a.layers,
            horizon: a.horizon,
            peak_head: a.peak_head,
            ..ModelConfig::default()
        },
        train: TrainConfig {
            window: a.window,
            stride: a.stride,
            burn_in: TrainConfig::default().burn_in.min(a.window / 2),
            learning_rate: a.lr,
            epochs: a.epochs,
            batch: a.batch,
            patience: a.patience,
            val_fraction: a.val_fraction,
            seed: a.seed,
            max_seconds: a.max_seconds,
            max_windows_per_trace: a.max_windows_per_trace,
        },
        step: StepConfig {
            allocs_per_step: a.step_allocs,
            restart_at_iteration: true,
        },
    };
    config.model.validate()?;
    config.train.validate()?;
    anyhow::ensure!(a.step_allocs > 0, "--step-allocs must be at least 1");
    // Checked before loading and training: what would fail at the end fails now.
    memcast_predictor::train::backend::check_backend(a.backend)?;
    if a.output.exists() && !a.output.is_dir() {
        anyhow::bail!(
            "{}: exists and is not a folder (-o names the artifact folder to write)",
            a.output.display()
        );
    }
    let t0 = std::time::Instant::now();
    let series = load_all(&a.traces, &a.exclude, config.step, config.model.horizon)?;
    // Made now, once the traces loaded: a folder that cannot be made fails before the
    // training, not after it. One made here is removed again if the training fails
    // (only while empty: nothing else is ever removed).
    let made = !a.output.exists();
    memcast_trace::output::create_dir(&a.output)?;
    let unmade = || {
        if made {
            let _ = std::fs::remove_dir(&a.output);
        }
    };
    let steps: usize = series.iter().map(|s| s.len()).sum();
    eprintln!(
        "{} traces, {steps} steps (loaded and featurized in {:.1} s)",
        series.len(),
        t0.elapsed().as_secs_f64()
    );
    let pb = ProgressBar::new(0);
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    let mut bar = Bar(pb);
    let out = train_with(a.backend, &series, &config, &mut bar).inspect_err(|_| unmade())?;
    bar.0.finish_and_clear();
    for w in &out.warnings {
        eprintln!("warning: {w}");
    }
    for r in &out.history {
        if bar.0.is_hidden() {
            eprintln!("{}", epoch_line(r));
        }
    }
    artifact::save(&a.output, &out.weights)?;
    memcast_predictor::train::backend::save_burn_record(&out.weights, &a.output.join("model.mpk"))?;
    let metrics = serde_json::json!({
        "backend": a.backend,
        "train_traces": out.train_traces,
        "val_traces": out.val_traces,
        "train_windows": out.train_windows,
        "best_epoch": out.best_epoch,
        "stopped_early": out.stopped_early,
        "selected_on": out.selected_on,
        "warnings": out.warnings,
        "train_seconds": out.seconds,
        "seconds_per_epoch": out.seconds / out.history.len().max(1) as f64,
        "history": out.history,
    });
    artifact::write_json(&a.output.join(artifact::METRICS), &metrics)?;
    out!(
        "trained {} epochs (best {}) in {:.1} s on {:?}; wrote {}",
        out.history.len(),
        out.best_epoch,
        out.seconds,
        a.backend,
        a.output.display()
    );
    Ok(())
}
