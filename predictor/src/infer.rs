//! Embedded inference: a plain-Rust incremental LSTM (no burn) that takes one step at a
//! time with its state carried and returns the N-step forecast.
//!
//! Cost per step: `4H (F + H) + H O` multiply-adds plus `5H` transcendental functions;
//! with the default (F 18, H 32, O 40) about 7.7k multiply-adds. No allocation after
//! construction: every buffer is sized once.

use memcast_trace::features::{Step, StepFeaturizer, CHANNELS, FEATURES, F_HAS_PREV};

use crate::config::MAX_HORIZON;
use crate::error::{PredictorError, Result};
use crate::weights::Weights;

/// What the allocator sends per step: features, the featurizer's base forecasts and
/// the step's scale. Fixed size (no heap), so it can cross a bounded queue cheaply.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepInput {
    pub step_index: u64,
    pub features: [f32; FEATURES],
    /// `base[h - 1]`: base forecast for horizon `h` (bytes per channel).
    pub base: [[f64; CHANNELS]; MAX_HORIZON],
    pub scale: f64,
    /// While the iteration repeats the previous one exactly, the forecast is the base.
    pub repeat: bool,
}

impl StepInput {
    /// Taken right after `f.push` returned `step`. O(MAX_HORIZON * CHANNELS).
    pub fn new(step: &Step, f: &StepFeaturizer) -> Self {
        let mut base = [[0.0; CHANNELS]; MAX_HORIZON];
        for (h, b) in base.iter_mut().enumerate() {
            *b = f.base_forecast(h + 1);
        }
        Self {
            step_index: step.index,
            features: step.features,
            base,
            scale: step.scale,
            repeat: step.repeat,
        }
    }
}

/// A forecast of the demand of the next `horizon` steps, in bytes per channel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Forecast {
    /// The step after which it was made.
    pub step_index: u64,
    /// Live requested bytes when that step closed (the base of the trajectory
    /// `live + sum (requested - freed)` the policies read).
    pub live_bytes: u64,
    /// The forecast has a basis: the run has a previous iteration to copy from (or
    /// the forecaster knows the future). Before that, seasonal forecasts are the last
    /// value, a guess that policies should not grow memory on.
    pub reference: bool,
    /// How far recent forecasts of this run came true: `sum min(realized, forecast) /
    /// sum forecast` of the peak rise, over the forecasts whose horizon has passed,
    /// each sum with halving weights (0 until one has). Policies scale what they do by
    /// it.
    pub trust: f64,
    /// The largest peak rise of live bytes this run has shown over one horizon so far
    /// (bytes), the setup before the first boundary left out: a forecast rise beyond it
    /// is a bet on something never seen.
    pub seen_rise: u64,
    /// The peak of live bytes the copy-and-rescale base implies for this iteration
    /// (`StepFeaturizer::level_envelope`; `u64::MAX` where there is none, as after a
    /// setup once this iteration has passed its peak): a forecast level above it is a
    /// bet on a peak no earlier iteration, rescaled, reached.
    pub level_envelope: u64,
    pub horizon: usize,
    /// `bytes[h - 1][c]`: channel `c` (see `memcast_trace::features::CHANNELS`) of the
    /// `h`-th next step. Entries past `horizon` are 0.
    pub bytes: [[f64; CHANNELS]; MAX_HORIZON],
    /// The forecaster's own forecast of the horizon's peak rise of live bytes (bytes),
    /// where it has one (a model with `ModelConfig::peak_head`); `None`: derived from
    /// `bytes`. Read it through [`Forecast::horizon_peak_rise`].
    pub peak: Option<f64>,
}

impl Forecast {
    /// The forecast peak rise of live bytes over the horizon, clamped to `[0, cap]`:
    /// the forecaster's own figure (`peak`) where it has one, else
    /// `forecaster::peak_rise` of the forecast steps. `None` if any value of the
    /// forecast is not finite (a forecast to ignore whole). O(horizon).
    pub fn horizon_peak_rise(&self, cap: f64) -> Option<f64> {
        let n = self.horizon.min(self.bytes.len());
        let derived = crate::forecaster::peak_rise(&self.bytes[..n], cap)?;
        match self.peak {
            None => Some(derived),
            Some(p) if p.is_finite() => Some(p.clamp(0.0, cap)),
            Some(_) => None,
        }
    }
}

impl Default for Forecast {
    fn default() -> Self {
        Self {
            step_index: 0,
            live_bytes: 0,
            reference: false,
            trust: 0.0,
            seen_rise: 0,
            level_envelope: u64::MAX,
            horizon: 0,
            bytes: [[0.0; CHANNELS]; MAX_HORIZON],
            peak: None,
        }
    }
}

/// The incremental LSTM with its state.
///
/// Invariant: `h.len() == c.len() == layers * hidden`, `gates.len() == 4 * hidden`,
/// `out.len() == horizon * channels`, `x.len() == features`.
#[derive(Debug, Clone)]
pub struct EmbeddedLstm {
    w: Weights,
    hidden: usize,
    h: Vec<f32>,
    c: Vec<f32>,
    gates: Vec<f32>,
    x: Vec<f32>,
    out: Vec<f32>,
}

#[inline]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl EmbeddedLstm {
    pub fn new(w: Weights) -> Result<Self> {
        w.check_invariants()?;
        let m = &w.config.model;
        let hidden = m.hidden;
        Ok(Self {
            hidden,
            h: vec![0.0; m.layers * hidden],
            c: vec![0.0; m.layers * hidden],
            gates: vec![0.0; 4 * hidden],
            x: vec![0.0; m.features],
            out: vec![0.0; m.outputs()],
            w,
        })
    }

    pub fn weights(&self) -> &Weights {
        &self.w
    }

    /// Zeroes the state (start of a new run).
    pub fn reset(&mut self) {
        self.h.fill(0.0);
        self.c.fill(0.0);
    }

    /// One step on raw featurizer output: checks width and finiteness, normalises, and
    /// returns the normalised outputs (`[horizon * channels]`). Errors leave the state
    /// unchanged.
    pub fn step(&mut self, features: &[f32]) -> Result<&[f32]> {
        let expected = self.x.len();
        if features.len() != expected {
            return Err(PredictorError::FeatureWidth {
                expected,
                got: features.len(),
            });
        }
        if let Some((index, &value)) = features.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(PredictorError::NonFinite { index, value });
        }
        let mut x = std::mem::take(&mut self.x);
        self.w.norm.normalize_into(features, &mut x);
        self.step_normalized(&x);
        self.x = x;
        Ok(&self.out)
    }

    /// One step on an already normalised input (what burn's forward sees). Panics only
    /// if `x.len()` differs from the feature width (callers check; tests use it).
    pub fn step_normalized(&mut self, x: &[f32]) -> &[f32] {
        let hd = self.hidden;
        for (l, layer) in self.w.layers.iter().enumerate() {
            let g = &mut self.gates;
            g.copy_from_slice(layer.bias.as_slice().expect("contiguous"));
            // Input of this layer: x for layer 0, the previous layer's new h otherwise.
            let (below, here) = self.h.split_at_mut(l * hd);
            let input: &[f32] = if l == 0 { x } else { &below[(l - 1) * hd..] };
            // g += input W_ih: row-wise axpy over contiguous rows (vectorises).
            axpy_rows(g, input, layer.w_ih.as_slice().expect("contiguous"));
            let h = &mut here[..hd];
            axpy_rows(g, h, layer.w_hh.as_slice().expect("contiguous"));
            let c = &mut self.c[l * hd..(l + 1) * hd];
            for j in 0..hd {
                let i = sigmoid(g[j]);
                let f = sigmoid(g[hd + j]);
                let gg = g[2 * hd + j].tanh();
                let o = sigmoid(g[3 * hd + j]);
                c[j] = f * c[j] + i * gg;
                h[j] = o * c[j].tanh();
            }
        }
        let top = &self.h[(self.w.layers.len() - 1) * hd..];
        self.out
            .copy_from_slice(self.w.head_b.as_slice().expect("contiguous"));
        axpy_rows(
            &mut self.out,
            top,
            self.w.head_w.as_slice().expect("contiguous"),
        );
        &self.out
    }

    /// One step from the featurizer's [`StepInput`]: runs the LSTM and composes the
    /// forecast `bytes[h][c] = max(0, base[h][c] + scale * target_std[c] * out[h][c])`,
    /// or exactly `base` while the iteration repeats, and before the run has a previous
    /// iteration unless `correct_without_reference`. With a peak head, likewise `peak =
    /// max(0, rise(base) + scale * target_std[C] * out[N*C])` (`None` where the base is
    /// used as is: the peak then follows from `bytes`).
    pub fn forecast(&mut self, input: &StepInput, out: &mut Forecast) -> Result<()> {
        let horizon = self.w.config.model.horizon;
        let base_only = input.repeat
            || (!self.w.config.model.correct_without_reference && input.features[F_HAS_PREV] < 0.5);
        self.step(&input.features)?;
        out.step_index = input.step_index;
        out.horizon = horizon;
        for h in 0..MAX_HORIZON {
            for c in 0..CHANNELS {
                out.bytes[h][c] = if h >= horizon {
                    0.0
                } else if base_only {
                    input.base[h][c]
                } else {
                    let r = self.out[h * CHANNELS + c] as f64 * self.w.norm.target_std[c] as f64;
                    (input.base[h][c] + input.scale * r).max(0.0)
                };
            }
        }
        out.peak = None;
        if self.w.config.model.peak_head && !base_only {
            let k = horizon * CHANNELS;
            let r = self.out[k] as f64 * self.w.norm.target_std[CHANNELS] as f64;
            // `input.base` is finite (the featurizer's), so is its rise.
            let base = crate::forecaster::peak_rise(&input.base[..horizon], f64::MAX);
            out.peak = base.map(|b| (b + input.scale * r).max(0.0));
        }
        Ok(())
    }
}

/// `acc += v M` for row-major `M: [v.len(), acc.len()]`.
#[inline]
fn axpy_rows(acc: &mut [f32], v: &[f32], m: &[f32]) {
    let n = acc.len();
    for (k, &vk) in v.iter().enumerate() {
        let row = &m[k * n..(k + 1) * n];
        for (a, &r) in acc.iter_mut().zip(row) {
            *a += vk * r;
        }
    }
}
