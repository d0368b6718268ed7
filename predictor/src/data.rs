//! Step series of traces and the training windows cut from them (no burn here: the
//! same arrays feed burn's tensors, the evaluation and the tests).

use memcast_trace::features::{featurize, StepConfig, StepRecord, CHANNELS};
use memcast_trace::Trace;

use crate::forecaster::peak_rise;
use crate::norm::NormStats;

/// The featurized steps of one trace with the forecasts needed for `horizon` steps.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub horizon: usize,
    pub records: Vec<StepRecord>,
    /// Ask nothing of the model before the first previous iteration exists (see
    /// `ModelConfig::correct_without_reference`). Default true.
    pub mask_no_reference: bool,
}

impl Series {
    pub fn from_trace(name: &str, trace: &Trace, step: StepConfig, horizon: usize) -> Self {
        Self {
            name: name.to_string(),
            horizon,
            records: featurize(trace, step, horizon),
            mask_no_reference: true,
        }
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Demand of step `t` per channel, in bytes.
    pub fn actual(&self, t: usize) -> [u64; CHANNELS] {
        self.records[t].step.values
    }

    /// The training residual for step `t` and horizon `h` (see [`crate::norm`]) in
    /// units of the scale, or `None` where the model is not asked (past the end, or
    /// while the iteration repeats exactly: the base forecast is used as is then).
    pub fn residual(&self, t: usize, h: usize) -> Option<[f64; CHANNELS]> {
        if !self.asked(t, h) {
            return None;
        }
        let r = &self.records[t];
        let y = self.records[t + h].step.values;
        let base = r.base[h - 1];
        let mut out = [0f64; CHANNELS];
        for c in 0..CHANNELS {
            // Clipped: one giant allocation must not dominate the squared loss.
            out[c] = ((y[c] as f64 - base[c]) / r.step.scale).clamp(-64.0, 64.0);
        }
        Some(out)
    }

    /// Whether the model is asked for step `t`'s forecast at horizon `h` (see
    /// [`Series::residual`]).
    fn asked(&self, t: usize, h: usize) -> bool {
        let r = &self.records[t];
        let no_ref = self.mask_no_reference && r.step.prev_iteration_steps == 0;
        !(r.step.repeat || no_ref || t + h >= self.records.len())
    }

    /// The horizon's peak rise of live bytes after step `t` (steps `t+1..=t+N`), bytes;
    /// `None` past the end.
    pub fn peak_rise_after(&self, t: usize) -> Option<f64> {
        let steps: Vec<[f64; CHANNELS]> = (t + 1..=t + self.horizon)
            .map(|k| self.records.get(k).map(|r| r.step.values.map(|v| v as f64)))
            .collect::<Option<_>>()?;
        peak_rise(&steps, f64::MAX)
    }

    /// The peak head's training residual for step `t`: the horizon's peak rise over the
    /// base forecast's, in units of the scale (clipped like [`Series::residual`]); `None`
    /// where the model is not asked (as [`Series::residual`] at horizon `N`).
    pub fn peak_residual(&self, t: usize) -> Option<f64> {
        if !self.asked(t, self.horizon) {
            return None;
        }
        let r = &self.records[t];
        let y = self.peak_rise_after(t)?;
        let base = peak_rise(&r.base, f64::MAX)?;
        Some(((y - base) / r.step.scale).clamp(-64.0, 64.0))
    }
}

/// One training window: `len` steps of `series` from `start` (shorter series padded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub series: usize,
    pub start: usize,
}

/// Windows with `stride`, covering every step of every series at least once.
pub fn windows(series: &[Series], window: usize, stride: usize) -> Vec<Window> {
    let mut out = Vec::new();
    for (i, s) in series.iter().enumerate() {
        if s.is_empty() {
            continue;
        }
        let last = s.len().saturating_sub(window);
        let mut start = 0;
        loop {
            out.push(Window { series: i, start });
            if start >= last {
                break;
            }
            start = (start + stride).min(last);
        }
    }
    out
}

/// A batch as flat row-major arrays: `x [B, W, F]`, `y [B, W, O]`, `mask [B, W, O]`, `O =
/// H*C`, plus 1 (the peak head's target, last) when `norm` has a peak target std.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub batch: usize,
    pub window: usize,
    pub x: Vec<f32>,
    pub y: Vec<f32>,
    pub mask: Vec<f32>,
}

/// Builds the batch for `wins`. Positions before `burn_in` and padding get mask 0.
pub fn make_batch(
    series: &[Series],
    wins: &[Window],
    window: usize,
    burn_in: usize,
    norm: &NormStats,
) -> Batch {
    let f = norm.feature_mean.len();
    let horizon = series.first().map_or(1, |s| s.horizon);
    let peak = norm.target_std.len() > CHANNELS;
    let o = horizon * CHANNELS + usize::from(peak);
    let b = wins.len();
    let mut batch = Batch {
        batch: b,
        window,
        x: vec![0.0; b * window * f],
        y: vec![0.0; b * window * o],
        mask: vec![0.0; b * window * o],
    };
    for (bi, w) in wins.iter().enumerate() {
        let s = &series[w.series];
        for k in 0..window {
            let t = w.start + k;
            if t >= s.len() {
                break;
            }
            let xo = (bi * window + k) * f;
            norm.normalize_into(&s.records[t].step.features, &mut batch.x[xo..xo + f]);
            if k < burn_in && w.start > 0 {
                // Windows at a series start have no history to burn in: train on all.
                continue;
            }
            for h in 1..=horizon {
                if let Some(res) = s.residual(t, h) {
                    let yo = (bi * window + k) * o + (h - 1) * CHANNELS;
                    for (c, r) in res.iter().enumerate() {
                        batch.y[yo + c] = (r / norm.target_std[c] as f64) as f32;
                        batch.mask[yo + c] = 1.0;
                    }
                }
            }
            if let Some(res) = s.peak_residual(t).filter(|_| peak) {
                let yo = (bi * window + k) * o + horizon * CHANNELS;
                batch.y[yo] = (res / norm.target_std[CHANNELS] as f64) as f32;
                batch.mask[yo] = 1.0;
            }
        }
    }
    batch
}

/// A small deterministic PRNG (xorshift64*): seeds the split, shuffling and init without
/// depending on any backend's generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// Splits series indices into (train, validation) by trace, deterministically.
pub fn split_by_trace(n: usize, val_fraction: f64, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let mut idx: Vec<usize> = (0..n).collect();
    Rng::new(seed).shuffle(&mut idx);
    let mut n_val = (n as f64 * val_fraction).round() as usize;
    if n >= 2 && val_fraction > 0.0 {
        n_val = n_val.clamp(1, n - 1);
    } else {
        n_val = 0;
    }
    let val = idx[..n_val].to_vec();
    let mut train = idx[n_val..].to_vec();
    train.sort_unstable();
    (train, val)
}

/// Expands files and directories (their `*.mctrace`, `*.pickle`, `*.pickle.xz` files,
/// sorted) into a list of trace files.
pub fn trace_files(inputs: &[std::path::PathBuf]) -> crate::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    for p in inputs {
        if p.is_dir() {
            let rd = std::fs::read_dir(p).map_err(crate::error::io(p))?;
            let mut v: Vec<_> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| {
                    let n = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
                    n.ends_with(".mctrace") || n.ends_with(".pickle") || n.ends_with(".pickle.xz")
                })
                .collect();
            v.sort();
            out.extend(v);
        } else {
            out.push(p.clone());
        }
    }
    // One file named twice (directly, or also through its folder) would count twice,
    // and could be its own validation trace.
    let key = |f: &std::path::PathBuf| std::fs::canonicalize(f).unwrap_or_else(|_| f.clone());
    let mut seen = std::collections::HashMap::new();
    for f in &out {
        if let Some(first) = seen.insert(key(f), f) {
            let also = if first == f {
                String::new()
            } else {
                format!(" (also as {})", first.display())
            };
            return Err(crate::PredictorError::Config(format!(
                "the trace {} is given twice{also}: give each trace once",
                f.display()
            )));
        }
    }
    Ok(out)
}

/// Loads a trace file and featurizes it.
pub fn load_series(
    path: &std::path::Path,
    step: StepConfig,
    horizon: usize,
) -> crate::Result<Series> {
    let trace = memcast_trace::io::load_trace(path)?;
    let name = memcast_trace::io::trace_name(path);
    Ok(Series::from_trace(&name, &trace, step, horizon))
}
