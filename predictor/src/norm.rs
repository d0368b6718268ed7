//! Normalisation statistics, saved with the model (`norm.json` and inside the
//! safetensors file) so that inference normalises exactly as training did.
//!
//! Inputs: `x_norm = (x - feature_mean) / feature_std` per feature.
//! Targets: the residual of a step's demand over the featurizer's base forecast, in units
//! of the step scale, divided by `target_std` per channel:
//! `y_norm[h][c] = (actual[t + h][c] - base[t][h][c]) / scale[t] / target_std[c]`;
//! with a peak head, one more: `(rise(actual[t+1..=t+N]) - rise(base[t])) / scale[t] /
//! target_std[C]`, `rise` the horizon's peak rise of live bytes ([`Series::peak_residual`]).
//!
//! [`Series::peak_residual`]: crate::data::Series::peak_residual

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::data::Series;
use crate::error::{io, PredictorError, Result};

/// Per-feature mean/std and per-channel target std.
///
/// Invariant: `feature_std[i] > 0`, `target_std[c] > 0`, all finite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NormStats {
    pub feature_mean: Vec<f32>,
    pub feature_std: Vec<f32>,
    pub target_std: Vec<f32>,
}

/// Smallest std kept: constant features (e.g. a class no training trace uses) must not
/// blow up when an unseen workload does use them.
const MIN_STD: f64 = 1e-2;

impl NormStats {
    /// Statistics over the training series (non-repeat, in-range targets only);
    /// `peak`: one more target std, of the horizon's peak rise.
    pub fn compute(
        series: &[Series],
        features: usize,
        channels: usize,
        peak: bool,
    ) -> Result<Self> {
        let mut n = 0f64;
        let mut sum = vec![0f64; features];
        let mut sq = vec![0f64; features];
        let targets = channels + usize::from(peak);
        let mut tn = vec![0f64; targets];
        let mut tsq = vec![0f64; targets];
        for s in series {
            for r in &s.records {
                n += 1.0;
                for (i, &v) in r.step.features.iter().enumerate().take(features) {
                    sum[i] += v as f64;
                    sq[i] += (v as f64) * (v as f64);
                }
            }
            for t in 0..s.records.len() {
                for h in 1..=s.horizon {
                    if let Some(res) = s.residual(t, h) {
                        for c in 0..channels {
                            tn[c] += 1.0;
                            tsq[c] += res[c] * res[c];
                        }
                    }
                }
                if let Some(res) = s.peak_residual(t).filter(|_| peak) {
                    tn[channels] += 1.0;
                    tsq[channels] += res * res;
                }
            }
        }
        if n == 0.0 {
            return Err(PredictorError::Empty(
                "the training traces give no steps".into(),
            ));
        }
        let feature_mean: Vec<f32> = sum.iter().map(|s| (s / n) as f32).collect();
        let feature_std = sum
            .iter()
            .zip(&sq)
            .map(|(s, q)| ((q / n - (s / n).powi(2)).max(0.0).sqrt().max(MIN_STD)) as f32)
            .collect();
        let target_std = tsq
            .iter()
            .zip(&tn)
            .map(|(q, k)| {
                if *k == 0.0 {
                    1.0
                } else {
                    (q / k).sqrt().max(MIN_STD) as f32
                }
            })
            .collect();
        let s = Self {
            feature_mean,
            feature_std,
            target_std,
        };
        s.check_invariants()?;
        Ok(s)
    }

    pub fn check_invariants(&self) -> Result<()> {
        let pos = |v: &[f32]| v.iter().all(|x| x.is_finite() && *x > 0.0);
        if !pos(&self.feature_std) || !pos(&self.target_std) {
            return Err(PredictorError::Norm(
                "the standard deviations must be finite and > 0".into(),
            ));
        }
        if !self.feature_mean.iter().all(|x| x.is_finite()) {
            return Err(PredictorError::Norm(
                "the feature means must be finite".into(),
            ));
        }
        if self.feature_mean.len() != self.feature_std.len() {
            return Err(PredictorError::Norm(
                "feature_mean and feature_std differ in length".into(),
            ));
        }
        Ok(())
    }

    /// Normalises one feature vector into `out`. O(F).
    #[inline]
    pub fn normalize_into(&self, x: &[f32], out: &mut [f32]) {
        for (i, o) in out.iter_mut().enumerate() {
            *o = (x[i] - self.feature_mean[i]) / self.feature_std[i];
        }
    }

    pub fn load(path: &Path) -> Result<Self> {
        let text =
            memcast_trace::io::read_bounded_text(path, memcast_trace::limits::MAX_TEXT_FILE_BYTES)
                .map_err(io(path))?;
        let s: Self = serde_json::from_str(&text).map_err(|err| PredictorError::Json {
            path: path.into(),
            err,
        })?;
        s.check_invariants()?;
        Ok(s)
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("plain struct serialises");
        Ok(memcast_trace::output::write_bytes(path, text.as_bytes())?)
    }
}
