//! Evaluation: the LSTM against simple forecasts on the same steps (no burn: the
//! embedded model is the one evaluated, and it matches burn's forward to 1e-4).
//!
//! Metrics per horizon `h` over every step `t` with `t + h` in the series, on the
//! headline channel (total requested bytes per step):
//! `WAPE = sum|y - yhat| / sum|y|`, `MAE = mean|y - yhat|` (bytes),
//! `under_rate = share of forecasts with yhat < y` (under-forecasting costs an allocator
//! a stall or an OOM; over-forecasting only idle reserve).
//!
//! And on what predictive mode consumes ([`EvalReport::peak_rise`]): the peak rise of
//! live bytes over the whole horizon after step `t`, `max(0, max_h (sum_{j<h} (r_j -
//! f_j) + p_h))` over steps `t+1..=t+H` (`forecaster::peak_rise`), the figure the
//! allocator grows for and the tiers spill ahead of. Each method's forecast of it is
//! the same function of its forecast steps (the LSTM's own head where the model has
//! one, `ModelConfig::peak_head`), scored over every `t` with `t + H` in the series.

use std::collections::BTreeMap;

use memcast_trace::features::{CHANNELS, CH_TOTAL};
use serde::{Deserialize, Serialize};

use crate::data::Series;
use crate::error::Result;
use crate::forecaster::peak_rise;
use crate::infer::{EmbeddedLstm, Forecast, StepInput};

/// The non-learned forecasters [`EvalReport::best_baseline`] chooses among.
pub const BASELINES: [&str; 4] = [
    "last_value",
    "moving_average",
    "seasonal_naive",
    "seasonal_rescaled",
];

/// Window of the moving-average baseline, in steps.
pub const MA_WINDOW: usize = 8;

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub wape: f64,
    pub mae: f64,
    pub under_rate: f64,
}

impl Metrics {
    /// The metrics of `(actual, forecast)` pairs (0 where there are none). O(pairs).
    pub fn of(pairs: impl IntoIterator<Item = (f64, f64)>) -> Self {
        let (mut abs, mut tot, mut under, mut k) = (0.0, 0.0, 0usize, 0usize);
        for (y, yhat) in pairs {
            abs += (y - yhat).abs();
            tot += y.abs();
            under += (yhat < y) as usize;
            k += 1;
        }
        Metrics {
            wape: if tot > 0.0 { abs / tot } else { 0.0 },
            mae: if k > 0 { abs / k as f64 } else { 0.0 },
            under_rate: if k > 0 { under as f64 / k as f64 } else { 0.0 },
        }
    }
}

/// One method's metrics: averaged over the horizon, and per horizon.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MethodReport {
    pub wape: f64,
    pub mae: f64,
    pub under_rate: f64,
    pub per_horizon: Vec<Metrics>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    pub trace: String,
    pub horizon: usize,
    pub steps: usize,
    /// Seasonal period used by `seasonal_naive`: `"iterations"` or `"acf:<lag>"`.
    pub season: String,
    pub models: BTreeMap<String, MethodReport>,
    /// Each method on the horizon's peak rise of live bytes (see the module docs).
    #[serde(default)]
    pub peak_rise: BTreeMap<String, Metrics>,
}

impl EvalReport {
    /// Best WAPE among the non-learned forecasters: last value, moving average,
    /// seasonal naive and seasonal rescaled (the featurizer's copy-and-rescale base,
    /// which the LSTM also sees as an input: it is the bar the model must clear).
    pub fn best_baseline(&self) -> (String, f64) {
        best_of(&self.models, |m| m.wape)
    }

    /// Best peak-rise WAPE among the same non-learned forecasters.
    pub fn best_peak_baseline(&self) -> (String, f64) {
        best_of(&self.peak_rise, |m| m.wape)
    }
}

/// The [`BASELINES`] entry of `models` with the lowest `wape`, and that WAPE
/// (`("none", inf)` without any).
fn best_of<M>(models: &BTreeMap<String, M>, wape: impl Fn(&M) -> f64) -> (String, f64) {
    BASELINES
        .iter()
        .filter_map(|k| models.get(*k).map(|m| (k.to_string(), wape(m))))
        .fold(("none".into(), f64::INFINITY), |a, b| {
            if b.1 < a.1 {
                b
            } else {
                a
            }
        })
}

/// Runs the model over the series from a fresh state; `out[t]` is the forecast made
/// right after step `t`.
pub fn run_model(series: &Series, model: &mut EmbeddedLstm) -> Result<Vec<Forecast>> {
    model.reset();
    let mut out = Vec::with_capacity(series.len());
    let mut f = Forecast::default();
    for r in &series.records {
        let mut input = StepInput {
            step_index: r.step.index,
            features: r.step.features,
            base: Default::default(),
            scale: r.step.scale,
            repeat: r.step.repeat,
        };
        for (h, b) in r.base.iter().enumerate().take(input.base.len()) {
            input.base[h] = *b;
        }
        model.forecast(&input, &mut f)?;
        out.push(f);
    }
    Ok(out)
}

/// Seasonal period by autocorrelation of `x` (lags 2..=len/2, at most 4096): the lag of
/// the highest autocorrelation, if it exceeds 0.3.
pub fn acf_period(x: &[f64]) -> Option<usize> {
    let n = x.len();
    let mean = x.iter().sum::<f64>() / n.max(1) as f64;
    let var: f64 = x.iter().map(|v| (v - mean).powi(2)).sum();
    if n < 8 || var <= 0.0 {
        return None;
    }
    let mut best = (0, 0.3);
    for lag in 2..=(n / 2).min(4096) {
        let r: f64 = (lag..n)
            .map(|i| (x[i] - mean) * (x[i - lag] - mean))
            .sum::<f64>()
            / var;
        if r > best.1 {
            best = (lag, r);
        }
    }
    (best.0 > 0).then_some(best.0)
}

/// The step seasonal naive copies for step `t + h` on a trace without iteration
/// markers: one autocorrelation period `p` back (whole periods past `t`), else step `t`
/// (the last value).
fn acf_source(t: usize, h: usize, period: Option<usize>) -> usize {
    match period {
        Some(p) => {
            let back = p * h.div_ceil(p);
            if t + h >= back {
                t + h - back
            } else {
                t
            }
        }
        None => t,
    }
}

/// A forecaster under evaluation: `f(t, h)` = forecast of step `t + h` made after `t`.
type Method<'a> = Box<dyn Fn(usize, usize) -> f64 + 'a>;

/// Evaluates baselines and, if given, the model, on the total-requested channel.
pub fn evaluate(series: &Series, model: Option<&mut EmbeddedLstm>) -> Result<EvalReport> {
    let n = series.len();
    let horizon = series.horizon;
    let y: Vec<f64> = (0..n).map(|t| series.actual(t)[CH_TOTAL] as f64).collect();
    let has_iterations = series
        .records
        .iter()
        .any(|r| r.step.prev_iteration_steps > 0);
    let period = if has_iterations { None } else { acf_period(&y) };
    let season = match (has_iterations, period) {
        (true, _) => "iterations".to_string(),
        (false, Some(p)) => format!("acf:{p}"),
        (false, None) => "none (last value)".to_string(),
    };
    let forecasts = match model {
        Some(m) => Some(run_model(series, m)?),
        None => None,
    };
    let mut methods: Vec<(&str, Method<'_>)> = vec![
        ("last_value", Box::new(|t, _| y[t])),
        (
            "moving_average",
            Box::new(|t, _| {
                let lo = (t + 1).saturating_sub(MA_WINDOW);
                y[lo..=t].iter().sum::<f64>() / (t + 1 - lo) as f64
            }),
        ),
        (
            "seasonal_naive",
            Box::new(|t, h| {
                if has_iterations {
                    series.records[t].seasonal[h - 1][CH_TOTAL] as f64
                } else {
                    y[acf_source(t, h, period)]
                }
            }),
        ),
        (
            "seasonal_rescaled",
            Box::new(|t, h| series.records[t].base[h - 1][CH_TOTAL]),
        ),
    ];
    if let Some(fc) = &forecasts {
        methods.push(("lstm", Box::new(move |t, h| fc[t].bytes[h - 1][CH_TOTAL])));
    }
    let mut models = BTreeMap::new();
    for (name, f) in &methods {
        let per_horizon: Vec<Metrics> = (1..=horizon)
            .map(|h| Metrics::of((0..n.saturating_sub(h)).map(|t| (y[t + h], f(t, h)))))
            .collect();
        let avg =
            |g: fn(&Metrics) -> f64| per_horizon.iter().map(g).sum::<f64>() / horizon.max(1) as f64;
        models.insert(
            name.to_string(),
            MethodReport {
                wape: avg(|m| m.wape),
                mae: avg(|m| m.mae),
                under_rate: avg(|m| m.under_rate),
                per_horizon,
            },
        );
    }
    let peak = evaluate_peak_rise(series, period, has_iterations, forecasts.as_deref());
    Ok(EvalReport {
        trace: series.name.clone(),
        horizon,
        steps: n,
        season,
        models,
        peak_rise: peak,
    })
}

/// A forecaster of the horizon's peak rise: `g(t)` = the peak rise over steps `t+1..=t+H`
/// forecast after step `t`.
type PeakMethod<'a> = Box<dyn Fn(usize) -> f64 + 'a>;

/// Every method on the horizon's peak rise (see the module docs). O(methods x n x H).
fn evaluate_peak_rise(
    series: &Series,
    period: Option<usize>,
    has_iterations: bool,
    forecasts: Option<&[Forecast]>,
) -> BTreeMap<String, Metrics> {
    let n = series.len();
    let horizon = series.horizon;
    let step = |t: usize| series.actual(t).map(|v| v as f64);
    let rise = |steps: &[[f64; CHANNELS]]| peak_rise(steps, f64::MAX).unwrap_or(0.0);
    let repeat = |b: [f64; CHANNELS]| rise(&vec![b; horizon]);
    let mut methods: Vec<(&str, PeakMethod<'_>)> = vec![
        ("last_value", Box::new(|t| repeat(step(t)))),
        (
            "moving_average",
            Box::new(|t| {
                let lo = (t + 1).saturating_sub(MA_WINDOW);
                let mut m = [0.0; CHANNELS];
                for k in lo..=t {
                    for (c, v) in step(k).iter().enumerate() {
                        m[c] += v / (t + 1 - lo) as f64;
                    }
                }
                repeat(m)
            }),
        ),
        (
            "seasonal_naive",
            Box::new(|t| {
                let steps: Vec<[f64; CHANNELS]> = (1..=horizon)
                    .map(|h| {
                        if has_iterations {
                            series.records[t].seasonal[h - 1].map(|v| v as f64)
                        } else {
                            step(acf_source(t, h, period))
                        }
                    })
                    .collect();
                rise(&steps)
            }),
        ),
        (
            "seasonal_rescaled",
            Box::new(|t| rise(&series.records[t].base)),
        ),
    ];
    if let Some(fc) = forecasts {
        methods.push((
            "lstm",
            Box::new(move |t| fc[t].horizon_peak_rise(f64::MAX).unwrap_or(0.0)),
        ));
    }
    let actual: Vec<f64> = (0..n.saturating_sub(horizon))
        .map(|t| rise(&(t + 1..=t + horizon).map(step).collect::<Vec<_>>()))
        .collect();
    methods
        .iter()
        .map(|(name, g)| {
            let pairs = actual.iter().enumerate().map(|(t, &y)| (y, g(t)));
            (name.to_string(), Metrics::of(pairs))
        })
        .collect()
}
