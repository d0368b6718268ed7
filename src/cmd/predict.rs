//! `memcast predict`: forecast against actual demand on one trace, printed and drawn.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use memcast_predictor::artifact;
use memcast_predictor::data::load_series;
use memcast_predictor::eval::run_model;
use memcast_trace::features::CH_TOTAL;
use plotters::prelude::*;

#[derive(clap::Args, Debug)]
pub struct PredictArgs {
    /// Artifact directory (default: the shipped default model).
    #[arg(long)]
    pub model: Option<PathBuf>,
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
    let dir = a.model.clone().unwrap_or_else(artifact::default_model_dir);
    let mut m =
        artifact::load_model(&dir).with_context(|| format!("loading model {}", dir.display()))?;
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
    println!(
        "step,iteration,actual_requested_bytes,forecast_h{}_bytes",
        a.h
    );
    let n = if a.limit == 0 {
        rows.len()
    } else {
        a.limit.min(rows.len())
    };
    for &(t, y, f) in &rows[..n] {
        println!("{t},{},{y:.0},{f:.0}", series.records[t].step.iteration);
    }
    if n < rows.len() {
        eprintln!("({} more rows; --limit 0 prints all)", rows.len() - n);
    }
    if let Some(p) = &a.plot {
        plot(&rows, &series.name, a.h, p)?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

fn plot(rows: &[(usize, f64, f64)], name: &str, h: usize, out: &Path) -> Result<()> {
    let ext = out
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("svg") => draw(
            rows,
            name,
            h,
            SVGBackend::new(out, (1200, 450)).into_drawing_area(),
        ),
        Some("png") => draw(
            rows,
            name,
            h,
            BitMapBackend::new(out, (1200, 450)).into_drawing_area(),
        ),
        _ => bail!("{}: the plot must end in .svg or .png", out.display()),
    }
    .with_context(|| format!("cannot draw {}", out.display()))
}

fn draw<DB: DrawingBackend>(
    rows: &[(usize, f64, f64)],
    name: &str,
    h: usize,
    root: DrawingArea<DB, plotters::coord::Shift>,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    const MIB: f64 = (1u64 << 20) as f64;
    root.fill(&WHITE)?;
    let x_max = rows.last().map_or(1, |r| r.0 + 1) as f64;
    let y_max = rows.iter().map(|r| r.1.max(r.2)).fold(1.0, f64::max) / MIB * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{name}: requested bytes per step, actual vs forecast (h = {h})"),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    chart.configure_mesh().x_desc("step").y_desc("MiB").draw()?;
    chart
        .draw_series(LineSeries::new(
            rows.iter().map(|r| (r.0 as f64, r.1 / MIB)),
            &BLACK,
        ))?
        .label("actual")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], BLACK));
    chart
        .draw_series(LineSeries::new(
            rows.iter().map(|r| (r.0 as f64, r.2 / MIB)),
            &RED,
        ))?
        .label("forecast")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], RED));
    chart.configure_series_labels().border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}
