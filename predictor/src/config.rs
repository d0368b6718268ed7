//! Model and training configuration, saved as `config.json` in every artifact.

use memcast_trace::features::{StepConfig, CHANNELS, FEATURES};
use serde::{Deserialize, Serialize};

use crate::error::{PredictorError, Result};

/// Most horizons any model may forecast: the online message sizes are fixed on it.
pub const MAX_HORIZON: usize = 8;

/// The network: a stacked LSTM over step features, a linear head that outputs, for
/// each of the next `horizon` steps, a normalised residual per demand channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelConfig {
    /// Input width: the featurizer's [`FEATURES`] (18), the only width `validate` accepts.
    pub features: usize,
    /// Demand channels forecast per step: [`CHANNELS`] (9), the only count `validate`
    /// accepts.
    pub channels: usize,
    /// LSTM hidden size. Default 32: one step + forecast costs 4*32*(18+32) + 32*45
    /// = 7.8k multiply-adds (gates, then a head of 5 horizons x 9 channels), well
    /// inside the 10 us budget of embedded inference.
    pub hidden: usize,
    /// Stacked LSTM layers. Default 1.
    pub layers: usize,
    /// Steps forecast ahead (N). Default 5.
    pub horizon: usize,
    /// Let the LSTM correct the base forecast before the run has a previous iteration
    /// to refer to. Default false: measured on the shared static traces, corrections in
    /// the first iteration (the only one without a reference) made WAPE 6-20% worse
    /// than seasonal naive, which is the last value there.
    pub correct_without_reference: bool,
    /// One more output: a residual for the horizon's peak rise of live bytes, the figure
    /// predictive mode grows and spills for (`Forecast::peak`), trained on that target
    /// itself instead of derived from the per-step channels. Default false: trained on
    /// the same traces as the default model it is level with the derived figure and
    /// with the base (docs/predictor.md, "The peak head").
    pub peak_head: bool,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            features: FEATURES,
            channels: CHANNELS,
            hidden: 32,
            layers: 1,
            horizon: 5,
            correct_without_reference: false,
            peak_head: false,
        }
    }
}

impl ModelConfig {
    /// Width of the head's output: `horizon * channels`, plus one with `peak_head`.
    pub fn outputs(&self) -> usize {
        self.horizon * self.channels + self.peak_outputs()
    }

    /// Normalised targets per channel row: `channels`, plus the peak with `peak_head`
    /// (the length of `NormStats::target_std`).
    pub fn targets(&self) -> usize {
        self.channels + self.peak_outputs()
    }

    /// 1 with `peak_head`, else 0.
    pub fn peak_outputs(&self) -> usize {
        usize::from(self.peak_head)
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |s: String| Err(PredictorError::Config(s));
        if self.features != FEATURES {
            return bad(format!(
                "features = {}, the featurizer produces {FEATURES}",
                self.features
            ));
        }
        if self.channels != CHANNELS {
            return bad(format!(
                "channels = {}, the featurizer produces {CHANNELS}",
                self.channels
            ));
        }
        if self.hidden == 0 || self.hidden > 4096 {
            return bad(format!("hidden = {} (1..=4096)", self.hidden));
        }
        if self.layers == 0 || self.layers > 8 {
            return bad(format!("layers = {} (1..=8)", self.layers));
        }
        if self.horizon == 0 || self.horizon > MAX_HORIZON {
            return bad(format!("horizon = {} (1..={MAX_HORIZON})", self.horizon));
        }
        Ok(())
    }
}

/// Training hyper-parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TrainConfig {
    /// Steps per training window (truncated back-propagation length). Default 32.
    pub window: usize,
    /// Window start stride, in steps. Default 8.
    pub stride: usize,
    /// First positions of each window that only warm the state up (no loss): inference
    /// carries state across the whole run, so the model must not rely on a zero state.
    /// Default 8.
    pub burn_in: usize,
    /// Adam learning rate. Default 3e-3.
    pub learning_rate: f64,
    /// Maximum epochs. Default 40.
    pub epochs: usize,
    /// Windows per batch. Default 64.
    pub batch: usize,
    /// Epochs without validation improvement before stopping. Default 6.
    pub patience: usize,
    /// Fraction of the traces (by trace, never by window) held out for validation.
    /// Default 0.2 (at least one trace when there are two or more).
    pub val_fraction: f64,
    /// Seed for initialisation, the validation split and shuffling. Default 42.
    pub seed: u64,
    /// Windows drawn per trace per epoch (0 = all). Default 96: long traces (generation:
    /// 7k steps) would otherwise drown the short training traces (200-500 steps).
    pub max_windows_per_trace: usize,
    /// Wall-clock budget in seconds: training stops after the epoch that crosses it
    /// (0 = none). Default 0.
    pub max_seconds: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            window: 32,
            stride: 8,
            burn_in: 8,
            learning_rate: 3e-3,
            epochs: 40,
            batch: 64,
            patience: 6,
            val_fraction: 0.2,
            seed: 42,
            max_windows_per_trace: 96,
            max_seconds: 0,
        }
    }
}

/// Largest learning rate accepted (Adam moves each weight by about this much per batch).
pub const MAX_LEARNING_RATE: f64 = 1.0;

impl TrainConfig {
    pub fn validate(&self) -> Result<()> {
        let bad = |s: String| Err(PredictorError::Config(s));
        if self.window < 2 || self.burn_in >= self.window {
            return bad(format!(
                "window = {}, burn_in = {}: need window >= 2 and burn_in < window",
                self.window, self.burn_in
            ));
        }
        for (name, v) in [
            ("stride", self.stride),
            ("batch", self.batch),
            ("epochs", self.epochs),
        ] {
            if v == 0 {
                return bad(format!("{name} is 0: it must be at least 1"));
            }
        }
        // Adam's step is about the learning rate itself: above 1 every weight moves by
        // more than its own scale each batch, which diverges (1e30 gave a WAPE of 1e29).
        if !(self.learning_rate > 0.0 && self.learning_rate <= MAX_LEARNING_RATE) {
            return bad(format!(
                "learning rate {} must be in (0, {MAX_LEARNING_RATE}] (default {})",
                self.learning_rate,
                TrainConfig::default().learning_rate
            ));
        }
        if !(0.0..1.0).contains(&self.val_fraction) {
            return bad(format!("val_fraction = {} (0..1)", self.val_fraction));
        }
        Ok(())
    }
}

/// Everything `config.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct ArtifactConfig {
    pub model: ModelConfig,
    pub train: TrainConfig,
    pub step: StepConfig,
}

impl ArtifactConfig {
    /// Checks what inference reads: the model's shape and how steps are cut (the
    /// training section only records how the model was trained).
    pub fn validate(&self) -> Result<()> {
        self.model.validate()?;
        if self.step.allocs_per_step == 0 {
            return Err(PredictorError::Config(
                "step.allocs_per_step = 0: a step needs at least one allocation".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each count that must be at least 1 is named when it is 0 (the error named all
    /// three together).
    #[test]
    fn a_zero_count_is_named() {
        for (name, set) in [
            ("stride", (|c| c.stride = 0) as fn(&mut TrainConfig)),
            ("batch", |c| c.batch = 0),
            ("epochs", |c| c.epochs = 0),
        ] {
            let mut c = TrainConfig::default();
            set(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(&format!("{name} is 0")), "{e}");
        }
        TrainConfig::default().validate().unwrap();
    }
}
