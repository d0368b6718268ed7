//! The training loop: Adam on the masked L1 loss of normalised residuals, validation on
//! held-out traces (split by trace, never by window), early stopping on the validation
//! loss with the best weights kept, deterministic for a given seed.

use std::time::Instant;

use burn::module::AutodiffModule;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::config::ArtifactConfig;
use crate::data::{make_batch, split_by_trace, windows, Batch, Rng, Series, Window};
use crate::error::{PredictorError, Result};
use crate::norm::NormStats;
use crate::train::model::{init_weights, training_loss, LstmForecaster};
use crate::weights::Weights;

/// One epoch's outcome (also written to `metrics.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochReport {
    pub epoch: usize,
    pub train_loss: f64,
    /// Masked L1 loss on the validation traces (normalised units); NaN without them.
    pub val_loss: f64,
    pub seconds: f64,
}

/// What training produced.
#[derive(Debug, Clone)]
pub struct TrainOutcome {
    /// The best weights (lowest validation loss; the last epoch's without validation).
    pub weights: Weights,
    pub history: Vec<EpochReport>,
    pub best_epoch: usize,
    pub train_traces: Vec<String>,
    pub val_traces: Vec<String>,
    pub train_windows: usize,
    pub seconds: f64,
    pub stopped_early: bool,
    /// Which loss chose the best epoch and early stopping: `validation` or `training`
    /// (without validation traces).
    pub selected_on: &'static str,
    /// What the caller should show the user: traces not used, no validation.
    pub warnings: Vec<String>,
}

/// Progress callbacks (the CLI draws a bar; tests pass [`NoProgress`]).
pub trait Progress {
    fn start(&mut self, epochs: usize, batches_per_epoch: usize);
    fn batch(&mut self, epoch: usize, loss: f64);
    fn epoch(&mut self, report: &EpochReport);
}

pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&mut self, _: usize, _: usize) {}
    fn batch(&mut self, _: usize, _: f64) {}
    fn epoch(&mut self, _: &EpochReport) {}
}

fn tensors<B: burn::tensor::backend::Backend>(
    b: &Batch,
    outputs: usize,
    device: &B::Device,
) -> (Tensor<B, 3>, Tensor<B, 3>, Tensor<B, 3>) {
    let f = b.x.len() / (b.batch * b.window).max(1);
    let t = |v: &Vec<f32>, w: usize| {
        Tensor::from_data(TensorData::new(v.clone(), [b.batch, b.window, w]), device)
    };
    (t(&b.x, f), t(&b.y, outputs), t(&b.mask, outputs))
}

fn scalar<B: burn::tensor::backend::Backend>(t: Tensor<B, 1>) -> f64 {
    t.into_data()
        .convert::<f64>()
        .to_vec::<f64>()
        .ok()
        .and_then(|v| v.first().copied())
        .unwrap_or(f64::NAN)
}

/// Trains on `series` with backend `B` on `device`.
pub fn train<B: AutodiffBackend>(
    series: &[Series],
    config: &ArtifactConfig,
    device: &B::Device,
    progress: &mut dyn Progress,
) -> Result<TrainOutcome> {
    let tc = &config.train;
    tc.validate()?;
    config.model.validate()?;
    let nonempty: Vec<&Series> = series.iter().filter(|s| !s.is_empty()).collect();
    if nonempty.is_empty() {
        return Err(PredictorError::Empty(
            "no training trace has any step".into(),
        ));
    }
    if let Some(s) = nonempty.iter().find(|s| s.horizon != config.model.horizon) {
        return Err(PredictorError::Config(format!(
            "series {} was featurized for horizon {}, the model has {}",
            s.name, s.horizon, config.model.horizon
        )));
    }
    let mut warnings = Vec::new();
    let skipped: Vec<&str> = series
        .iter()
        .filter(|s| s.is_empty())
        .map(|s| s.name.as_str())
        .collect();
    if !skipped.is_empty() {
        warnings.push(format!(
            "{} of {} traces have no step (no allocation) and are not used: {}",
            skipped.len(),
            series.len(),
            skipped.join(", ")
        ));
    }
    let prepped: Vec<Series> = nonempty
        .iter()
        .map(|s| {
            let mut s = (*s).clone();
            s.mask_no_reference = !config.model.correct_without_reference;
            s
        })
        .collect();
    // Only traces with scored targets can validate: a static trace repeats its previous
    // iteration exactly, so the model is never asked anything on it (the base forecast
    // is used as is) and it would validate nothing. Such traces train (their inputs
    // still shape the state) but are never held out.
    let (scorable, unscored): (Vec<usize>, Vec<usize>) =
        (0..prepped.len()).partition(|&i| scored_targets(&prepped[i]) > 0);
    let total_scored: usize = scorable.iter().map(|&i| scored_targets(&prepped[i])).sum();
    if total_scored == 0 {
        return Err(PredictorError::Empty(format!(
            "nothing to learn: in {} traces ({} steps) no step has a target (every step \
             repeats its previous iteration exactly or has no previous iteration); \
             train on traces with at least two iterations that differ",
            prepped.len(),
            prepped.iter().map(Series::len).sum::<usize>()
        )));
    }
    let (si, vi) = split_by_trace(scorable.len(), tc.val_fraction, tc.seed);
    let mut ti: Vec<usize> = si.iter().map(|&k| scorable[k]).chain(unscored).collect();
    ti.sort_unstable();
    let vi: Vec<usize> = vi.iter().map(|&k| scorable[k]).collect();
    let train_s: Vec<Series> = ti.iter().map(|&i| prepped[i].clone()).collect();
    let val_s: Vec<Series> = vi.iter().map(|&i| prepped[i].clone()).collect();
    if val_s.is_empty() {
        warnings.push(format!(
            "no validation: {} of {} traces have targets to score (validation needs at least 2 and --val-fraction > 0); early stopping and the best epoch use the training loss",
            scorable.len(),
            prepped.len()
        ));
    }
    let norm = NormStats::compute(
        &train_s,
        config.model.features,
        config.model.channels,
        config.model.peak_head,
    )?;
    let start = Instant::now();
    let mut model: LstmForecaster<B> =
        LstmForecaster::from_weights(&init_weights(config, norm.clone(), tc.seed)?, device);
    let mut optim = AdamConfig::new()
        .with_grad_clipping(Some(burn::grad_clipping::GradientClippingConfig::Norm(1.0)))
        .init::<B, LstmForecaster<B>>();
    let outputs = config.model.outputs();
    let channel_outputs = config.model.horizon * config.model.channels;
    // A window longer than every trace would be padding past the data: its cost
    // grows with the window (the recurrence runs over every padded step), its
    // gradient does not. Windows are cut to the longest trace.
    let longest = train_s
        .iter()
        .chain(&val_s)
        .map(Series::len)
        .max()
        .unwrap_or(1);
    let (window, burn_in) = if tc.window > longest {
        warnings.push(format!(
            "window of {} steps is longer than the longest trace ({longest} steps): windows of {longest}",
            tc.window
        ));
        (longest, tc.burn_in.min(longest / 2))
    } else {
        (tc.window, tc.burn_in)
    };
    let all_wins: Vec<Window> = windows(&train_s, window, tc.stride);
    let mut by_series: Vec<Vec<Window>> = vec![Vec::new(); train_s.len()];
    for w in &all_wins {
        by_series[w.series].push(*w);
    }
    let cap = if tc.max_windows_per_trace == 0 {
        usize::MAX
    } else {
        tc.max_windows_per_trace
    };
    let per_epoch: usize = by_series.iter().map(|v| v.len().min(cap)).sum();
    if per_epoch < tc.batch {
        warnings.push(format!(
            "little data: {per_epoch} training windows of {} steps per epoch, fewer than one batch of {} ({} scored targets in all)",
            window, tc.batch, total_scored
        ));
    }
    let val_wins = windows(&val_s, window, window.saturating_sub(burn_in).max(1));
    let val_batches: Vec<Batch> = val_wins
        .chunks(tc.batch)
        .map(|c| make_batch(&val_s, c, window, burn_in, &norm))
        .collect();
    let mut rng = Rng::new(tc.seed ^ 0x5eed);
    let batches = per_epoch.div_ceil(tc.batch);
    progress.start(tc.epochs, batches);
    let mut history = Vec::new();
    let mut best: Option<(f64, usize, Weights)> = None;
    let mut since_best = 0;
    let mut stopped_early = false;
    for epoch in 1..=tc.epochs {
        let t0 = Instant::now();
        // Each trace contributes at most `cap` windows, drawn afresh every epoch.
        let mut wins: Vec<Window> = Vec::with_capacity(per_epoch);
        for v in by_series.iter_mut() {
            rng.shuffle(v);
            wins.extend_from_slice(&v[..v.len().min(cap)]);
        }
        rng.shuffle(&mut wins);
        let (mut sum, mut n) = (0.0, 0usize);
        for chunk in wins.chunks(tc.batch) {
            let b = make_batch(&train_s, chunk, window, burn_in, &norm);
            let (x, y, m) = tensors::<B>(&b, outputs, device);
            let loss = training_loss(model.forward(x), y, m, channel_outputs);
            let l = scalar(loss.clone().inner());
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(tc.learning_rate, model, grads);
            if !l.is_finite() {
                return Err(PredictorError::Train(format!(
                    "the training loss became {l} in epoch {epoch}: training diverged (try a smaller --lr)"
                )));
            }
            sum += l;
            n += 1;
            progress.batch(epoch, l);
        }
        let val_loss = if val_batches.is_empty() {
            f64::NAN
        } else {
            let inner = model.valid();
            let (mut vs, mut vn) = (0.0, 0.0);
            for b in &val_batches {
                let (x, y, m) = tensors::<B::InnerBackend>(b, outputs, device);
                let k: f64 = b.mask.iter().map(|&v| v as f64).sum();
                vs += scalar(training_loss(inner.forward(x), y, m, channel_outputs)) * k;
                vn += k;
            }
            if vn > 0.0 {
                vs / vn
            } else {
                f64::NAN
            }
        };
        if !val_batches.is_empty() && !val_loss.is_finite() {
            return Err(PredictorError::Train(format!(
                "the validation loss became {val_loss} in epoch {epoch}: training diverged (try a smaller --lr)"
            )));
        }
        let report = EpochReport {
            epoch,
            train_loss: sum / n.max(1) as f64,
            val_loss,
            seconds: t0.elapsed().as_secs_f64(),
        };
        progress.epoch(&report);
        history.push(report);
        let score = if val_loss.is_finite() {
            val_loss
        } else {
            sum / n.max(1) as f64
        };
        if best.as_ref().is_none_or(|b| score < b.0) {
            best = Some((score, epoch, model.to_weights(config, &norm)?));
            since_best = 0;
        } else {
            since_best += 1;
        }
        let over_time = tc.max_seconds > 0 && start.elapsed().as_secs() >= tc.max_seconds;
        if since_best >= tc.patience || over_time {
            stopped_early = epoch < tc.epochs;
            break;
        }
    }
    let (_, best_epoch, weights) =
        best.ok_or_else(|| PredictorError::Train("no epoch ran".into()))?;
    Ok(TrainOutcome {
        weights,
        history,
        best_epoch,
        train_traces: train_s.iter().map(|s| s.name.clone()).collect(),
        val_traces: val_s.iter().map(|s| s.name.clone()).collect(),
        train_windows: all_wins.len(),
        seconds: start.elapsed().as_secs_f64(),
        stopped_early,
        selected_on: if val_batches.is_empty() {
            "training"
        } else {
            "validation"
        },
        warnings,
    })
}

/// Targets the model is scored on in `s` (step and horizon pairs with a residual).
fn scored_targets(s: &Series) -> usize {
    (0..s.len())
        .map(|t| {
            (1..=s.horizon)
                .filter(|&h| s.residual(t, h).is_some())
                .count()
        })
        .sum()
}
