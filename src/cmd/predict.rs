//! `memcast predict`: forecast against actual demand on one trace, printed and drawn.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use memcast_predictor::data::load_series;
use memcast_predictor::eval::run_model;
use memcast_trace::features::CH_TOTAL;

#[derive(clap::Args, Debug)]
pub struct PredictArgs {
    /// Artifact directory (default: the shipped default model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Trace to forecast (PyTorch snapshot pickle, optionally .xz, or native).
    #[arg(long)]
    pub trace: PathBuf,
    /// Which horizon to show: the forecast made `h` steps before each step.
    #[arg(long, default_value_t = 1)]
    pub h: usize,
    /// Rows to print (0 = all).
    #[arg(long, default_value_t = 40)]
    pub limit: usize,
    /// Draw actual vs forecast to an .svg or .png file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

pub fn run(a: PredictArgs) -> Result<()> {
    if let Some(p) = &a.plot {
        // Checked before the work: a plot it cannot write fails now, not after.
        super::chart::check_plot_path(p)?;
    }
    let mut m = super::load_model(&a.model)?;
    let cfg = m.weights().config.clone();
    anyhow::ensure!(
        (1..=cfg.model.horizon).contains(&a.h),
        "--h must be in 1..={}",
        cfg.model.horizon
    );
    let series = load_series(&a.trace, cfg.step, cfg.model.horizon)
        .with_context(|| format!("loading {}", a.trace.display()))?;
    anyhow::ensure!(
        !series.is_empty(),
        "{}: no allocations to forecast",
        a.trace.display()
    );
    let fc = run_model(&series, &mut m)?;
    // rows: (step, actual, forecast made h steps earlier)
    let rows: Vec<(usize, f64, f64)> = (a.h..series.len())
        .map(|t| {
            (
                t,
                series.actual(t)[CH_TOTAL] as f64,
                fc[t - a.h].bytes[a.h - 1][CH_TOTAL],
            )
        })
        .collect();
    // The plot first: it is the part that can fail, and a reader that closes stdout
    // early must not lose it.
    if let Some(p) = &a.plot {
        plot(&rows, &series.name, a.h, p)?;
        eprintln!("wrote {}", p.display());
    }
    out!(
        "step,iteration,actual_requested_bytes,forecast_h{}_bytes",
        a.h
    );
    let n = if a.limit == 0 {
        rows.len()
    } else {
        a.limit.min(rows.len())
    };
    for &(t, y, f) in &rows[..n] {
        out!("{t},{},{y:.0},{f:.0}", series.records[t].step.iteration);
    }
    if n < rows.len() {
        eprintln!("({} more rows; --limit 0 prints all)", rows.len() - n);
    }
    Ok(())
}

fn plot(rows: &[(usize, f64, f64)], name: &str, h: usize, out: &Path) -> Result<()> {
    const MIB: f64 = (1u64 << 20) as f64;
    let line = |name, color, f: fn(&(usize, f64, f64)) -> f64| super::chart::Line {
        name,
        color,
        points: rows.iter().map(|r| (r.0 as f64, f(r) / MIB)).collect(),
    };
    super::chart::line_chart(
        out,
        &format!("{name}: requested bytes per step, actual vs forecast (h = {h})"),
        "step",
        "MiB",
        &[
            line("actual", plotters::style::BLACK, |r| r.1),
            line("forecast", plotters::style::RED, |r| r.2),
        ],
    )
}
