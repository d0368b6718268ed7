//! `memcast eval`: the LSTM against last value, moving average, seasonal naive and
//! seasonal rescaled on the same steps of each trace: on requested bytes per step, and
//! on the horizon's peak rise of live bytes (what predictive mode acts on).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use memcast_predictor::data::load_series;
use memcast_predictor::eval::{evaluate, EvalReport};

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// Artifact directory (or .safetensors file). Default: the shipped default model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Traces to evaluate on.
    #[arg(long, required = true, num_args = 1..)]
    pub trace: Vec<PathBuf>,
    /// One JSON object per trace: {"horizon", "models": {name: {wape, mae, under_rate}},
    /// "peak_rise": {name: {wape, mae, under_rate}}, ...}.
    #[arg(long)]
    pub json: bool,
}

/// Evaluates the model at `model` (default model if `None`) on one trace.
pub fn eval_one(model: &Option<PathBuf>, trace: &Path) -> Result<EvalReport> {
    let mut m = super::load_model(model)?;
    let cfg = m.weights().config.clone();
    let series = load_series(trace, cfg.step, cfg.model.horizon)
        .with_context(|| format!("loading {}", trace.display()))?;
    anyhow::ensure!(
        !series.is_empty(),
        "{}: the trace has no allocations, nothing to forecast",
        trace.display()
    );
    // A forecast at step t is scored against steps t+1..=t+H: with no more than H
    // steps, nothing is scored, and every WAPE would read 0 over nothing.
    anyhow::ensure!(
        series.len() > cfg.model.horizon,
        "{}: {} steps, but a forecast is scored against the {} steps after it: nothing to score (at least {} steps are needed; a step ends after {} allocations or at an iteration boundary)",
        trace.display(),
        series.len(),
        cfg.model.horizon,
        cfg.model.horizon + 1,
        cfg.step.allocs_per_step
    );
    Ok(evaluate(&series, Some(&mut m))?)
}

pub fn run(a: EvalArgs) -> Result<()> {
    for t in &a.trace {
        let busy = super::progress::Busy::new(format!("evaluating on {}", t.display()));
        let r = eval_one(&a.model, t)?;
        drop(busy);
        if a.json {
            let models: serde_json::Map<String, serde_json::Value> = r
                .models
                .iter()
                .map(|(k, m)| {
                    (
                        k.clone(),
                        serde_json::json!({"wape": m.wape, "mae": m.mae, "under_rate": m.under_rate,
                            "per_horizon": m.per_horizon}),
                    )
                })
                .collect();
            let (best, best_wape) = r.best_baseline();
            let lstm = r.models.get("lstm").map_or(f64::NAN, |m| m.wape);
            let (pbest, pbest_wape) = r.best_peak_baseline();
            let plstm = r.peak_rise.get("lstm").map_or(f64::NAN, |m| m.wape);
            out!(
                "{}",
                serde_json::json!({
                    "trace": r.trace, "steps": r.steps, "season": r.season,
                    "horizon": r.horizon, "models": models,
                    "best_baseline": best, "lstm_vs_best_baseline": lstm / best_wape,
                    "peak_rise": r.peak_rise, "peak_best_baseline": pbest,
                    "peak_lstm_vs_best_baseline": plstm / pbest_wape,
                })
            );
        } else {
            out!(
                "{} ({} steps, horizon {}, season {})",
                r.trace,
                r.steps,
                r.horizon,
                r.season
            );
            out!(
                "  {:<18} {:>8} {:>14} {:>10}",
                "model",
                "WAPE",
                "MAE (bytes)",
                "under"
            );
            let row = |k: &str, wape: f64, mae: f64, under: f64| {
                out!("  {k:<18} {wape:>8.4} {mae:>14.0} {under:>10.3}");
            };
            for (k, m) in &r.models {
                row(k, m.wape, m.mae, m.under_rate);
            }
            let (best, bw) = r.best_baseline();
            if let Some(l) = r.models.get("lstm") {
                out!("  lstm / best baseline ({best}) = {:.3}", l.wape / bw);
            }
            out!("  (requested bytes per step, horizons 1..{} averaged: WAPE = sum |actual - forecast| / sum actual; MAE = mean |actual - forecast|; under = under-forecast rate, the share of forecasts below the actual)", r.horizon);
            out!("  peak rise of live bytes over the horizon (what predictive mode grows and spills for):");
            for (k, m) in &r.peak_rise {
                row(k, m.wape, m.mae, m.under_rate);
            }
            let (pbest, pbw) = r.best_peak_baseline();
            if let Some(l) = r.peak_rise.get("lstm") {
                out!("  lstm / best baseline ({pbest}) = {:.3}", l.wape / pbw);
            }
        }
    }
    Ok(())
}
