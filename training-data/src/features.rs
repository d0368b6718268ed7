//! The step featurizer: one implementation, used offline (from a [`Trace`]) and online
//! (fed event by event by the allocator), so a model sees the same series in training
//! and in production.
//!
//! # Step definition (and why)
//!
//! A *step* is a run of consecutive events that closes
//! - as soon as it holds [`StepConfig::allocs_per_step`] allocations (default 16), or
//! - at an iteration boundary, if it holds any event (the last step of an iteration is
//!   then shorter; `allocs < allocs_per_step` tells the model so).
//!
//! Steps count allocations, not time: the allocator acts per allocation, and wall time
//! varies with the GPU's speed while the allocation sequence does not. Steps *restart at
//! iteration boundaries* because training iterations repeat: on the shared static traces
//! every iteration makes the same allocations in the same order, so step `p` of
//! iteration `i` equals step `p` of iteration `i - 1` and a seasonal forecast is exact.
//! Fixed-size steps that straddle iterations drift in phase and break that (measured on
//! ResNet-152: seasonal-naive WAPE 0.15 instead of ~0). Frees and accesses join the open
//! step; a step with no event is never emitted.
//!
//! # Channels (the demand a forecaster predicts)
//!
//! [`CHANNELS`] values per step: requested bytes per buddy size class ([`NUM_CLASSES`]
//! coarse groups of power-of-two classes, [`size_class`]), the step's total requested
//! bytes, its freed bytes (with allocations, frees give the live-bytes trajectory
//! the allocator grows or releases segments for), and its peak rise: how far live bytes
//! rose within the step above their value when it opened. From these the peak of live
//! bytes over a horizon follows: `max_h (live + sum_{j<h} (requested_j - freed_j) +
//! rise_h)`, the figure that decides whether to grow (or spill) ahead of a peak.
//!
//! # Features (what a model reads), all scale-free
//!
//! Bytes are divided by the *scale* `S` = mean requested bytes per step of the previous
//! iteration (in the first iteration, of the steps so far), then `ln(1 + x)`: a model
//! trained on ResNet sees GPT-2 steps on the same footing. See [`FEATURE_NAMES`].
//! The copy-and-rescale features: the value at the same phase of the previous iteration,
//! the ratio of this iteration's demand so far to the previous one's at the same phase,
//! the phase itself, and whether this iteration has repeated the previous one exactly.
//!
//! Online cost: O(1) per event (a few adds), O(CHANNELS) per step; buffers for the
//! current and previous iteration grow to the longest iteration seen, then never again.

use crate::model::{EventKind, Trace};
use crate::Event;

/// Coarse size-class groups. A buddy allocator's classes are powers of two (a request
/// of `b` bytes takes class `2^ceil(log2 b)`); these group them: `<= 64 KiB`, `<= 1 MiB`,
/// `<= 8 MiB`, `<= 64 MiB`, `<= 512 MiB`, larger.
pub const NUM_CLASSES: usize = 6;
/// Largest buddy class exponent (log2 of bytes, inclusive) of the first groups.
pub const CLASS_LOG2_BOUNDS: [u32; NUM_CLASSES - 1] = [16, 20, 23, 26, 29];
/// Per-step demand values: `NUM_CLASSES` class bytes, total requested, freed, peak rise.
pub const CHANNELS: usize = NUM_CLASSES + 3;
/// Index of the total-requested-bytes channel.
pub const CH_TOTAL: usize = NUM_CLASSES;
/// Index of the freed-bytes channel.
pub const CH_FREED: usize = NUM_CLASSES + 1;
/// Index of the peak-rise channel: max of live bytes within the step minus live bytes
/// when the step opened (>= 0).
pub const CH_PEAK: usize = NUM_CLASSES + 2;
/// Width of [`Step::features`].
pub const FEATURES: usize = 18;

/// Index of the "has previous iteration" feature (1.0 or 0.0).
pub const F_HAS_PREV: usize = 14;

/// What each feature is (`S` = scale, `l(x) = ln(1 + x / S)`).
pub const FEATURE_NAMES: [&str; FEATURES] = [
    "l(requested)",
    "l(class0 <=64KiB)",
    "l(class1 <=1MiB)",
    "l(class2 <=8MiB)",
    "l(class3 <=64MiB)",
    "l(class4 <=512MiB)",
    "l(class5 >512MiB)",
    "l(freed)",
    "live / reference live (prev iteration peak)",
    "phase = step_in_iteration / prev_iteration_steps",
    "l(seasonal next step requested)",
    "l(seasonal same-phase requested)",
    "ln(ratio so far vs prev iteration)",
    "exact repeat of prev iteration so far",
    "has previous iteration",
    "allocs / allocs_per_step",
    "l(previous step requested)",
    "base forecast: last value 0, moving average 0.5, seasonal 1",
];

/// Which coarse class group a request of `bytes` falls in (power-of-two classes grouped).
#[inline]
pub fn size_class(bytes: u64) -> usize {
    // Round up to the buddy class (next power of two) first, as the allocator does.
    let log2 = 64 - bytes.max(1).saturating_sub(1).leading_zeros();
    CLASS_LOG2_BOUNDS
        .iter()
        .position(|&b| log2 <= b)
        .unwrap_or(NUM_CLASSES - 1)
}

/// How events are cut into steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StepConfig {
    /// Allocations per step (a step closes on its N-th allocation). Default 16: on the
    /// shared dynamic traces (leave-one-out) 16 beat 32 and 64 against the baselines
    /// (multi-scale 0.67x vs 0.73x vs 0.75x, generation 0.86x vs 1.17x vs 1.77x).
    pub allocs_per_step: u32,
    /// Close the open step at each iteration boundary. Default true (see module docs).
    pub restart_at_iteration: bool,
}

impl Default for StepConfig {
    fn default() -> Self {
        Self {
            allocs_per_step: 16,
            restart_at_iteration: true,
        }
    }
}

/// One step: raw demand, context, and the scale-free feature vector.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Step {
    /// Index of this step in the series.
    pub index: u64,
    /// Iteration number (0 before the first boundary, +1 at each boundary).
    pub iteration: u32,
    /// Position within the iteration (0-based).
    pub step_in_iteration: u32,
    pub start_time_us: u64,
    pub end_time_us: u64,
    pub allocs: u32,
    pub frees: u32,
    /// Allocation counts per class group.
    pub class_counts: [u32; NUM_CLASSES],
    /// Demand values; see [`CHANNELS`].
    pub values: [u64; CHANNELS],
    /// Live requested bytes (static blocks included) when the step closed.
    pub live_bytes: u64,
    /// Maximum of live requested bytes within the step.
    pub peak_live_bytes: u64,
    /// Steps in the previous iteration (0 if none).
    pub prev_iteration_steps: u32,
    /// The scale `S` features are relative to (bytes, >= 1).
    pub scale: f64,
    /// Requested bytes of this iteration so far / the previous one's at the same phase.
    /// 1.0 when there is no previous iteration.
    pub ratio: f64,
    /// This iteration has so far repeated the previous one exactly (requested channels).
    pub repeat: bool,
    pub features: [f32; FEATURES],
}

/// The event-by-event featurizer. Feed events with [`push`](Self::push); it returns a
/// [`Step`] when one closes. After a step, [`seasonal`](Self::seasonal) and
/// [`base_forecast`](Self::base_forecast) give the seasonal forecasts for that step.
///
/// Invariant: `cur.len() == step_in_iteration of the next step`,
/// `live == static_bytes + sum(alloc bytes) - sum(freed bytes)` over pushed events
/// `== sum(live_sizes)`, `open_allocs < allocs_per_step`,
/// `cur_requested == sum(cur[..][CH_TOTAL])` (see [`check_invariants`](Self::check_invariants)).
#[derive(Debug, Clone)]
pub struct StepFeaturizer {
    cfg: StepConfig,
    // Open step accumulators.
    open_allocs: u32,
    open_frees: u32,
    open_counts: [u32; NUM_CLASSES],
    open_values: [u64; CHANNELS],
    open_start: Option<u64>,
    open_end: u64,
    open_peak: u64,
    /// Live bytes when the open step opened (the last step's close).
    // Invariant: open_live0 <= open_peak.
    open_live0: u64,
    // Live bytes per tensor: needed to know what a free returns.
    // Invariant: holds exactly the live tensors' requested bytes.
    live_sizes: std::collections::HashMap<u64, u64>,
    live: u64,
    // Iteration state.
    iteration: u32,
    next_index: u64,
    /// Channels of the current iteration's closed steps.
    cur: Vec<[u64; CHANNELS]>,
    /// Channels of the previous iteration's steps (empty if none).
    prev: Vec<[u64; CHANNELS]>,
    cur_peak_live: u64,
    prev_peak_live: u64,
    /// Running sum of requested bytes in the current / previous iteration.
    cur_requested: u64,
    prev_requested: u64,
    cur_repeat: bool,
    /// The current / previous iteration holds setup ([`push_setup`](Self::push_setup),
    /// and so [`add_static`](Self::add_static)): memory live before the iterations (in
    /// the online path, all that came before the first boundary: building the model, a
    /// warm-up). Read only by `level_envelope`.
    cur_setup: bool,
    prev_setup: bool,
    last_ratio: f64,
    /// Recent absolute error (EWMA, in units of the scale) of each base candidate's
    /// next-step forecast of requested bytes, indexed by [`BaseKind`].
    err: [f64; 3],
    /// The candidates' forecasts of the next step's requested bytes, made at the last step.
    cand: Option<[Option<f64>; 3]>,
    base_kind: BaseKind,
}

impl StepFeaturizer {
    /// A featurizer with nothing live, cutting steps as `cfg` says. Blocks live before
    /// the first event are registered afterwards: [`add_static`](Self::add_static) (by
    /// tensor id, so that their frees are accounted) or [`push_setup`](Self::push_setup)
    /// (bytes only).
    pub fn new(cfg: StepConfig) -> Self {
        Self {
            cfg: StepConfig {
                allocs_per_step: cfg.allocs_per_step.max(1),
                ..cfg
            },
            open_allocs: 0,
            open_frees: 0,
            open_counts: [0; NUM_CLASSES],
            open_values: [0; CHANNELS],
            open_start: None,
            open_end: 0,
            open_peak: 0,
            open_live0: 0,
            live_sizes: std::collections::HashMap::new(),
            live: 0,
            iteration: 0,
            next_index: 0,
            cur: Vec::new(),
            prev: Vec::new(),
            cur_peak_live: 0,
            prev_peak_live: 0,
            cur_requested: 0,
            prev_requested: 0,
            cur_repeat: false,
            cur_setup: false,
            prev_setup: false,
            last_ratio: 1.0,
            err: [0.0; 3],
            cand: None,
            base_kind: BaseKind::LastValue,
        }
    }

    /// Registers a block live before the first event (a static block).
    pub fn add_static(&mut self, id: u64, bytes: u64) {
        if self.live_sizes.insert(id, bytes).is_none() {
            self.push_setup(bytes);
        }
    }

    /// Registers `bytes` of setup memory (live before the run's iterations, such as
    /// parameters and optimizer state) without a tensor id: counted in live bytes, in
    /// no step. What `add_static` does for the online path.
    pub fn push_setup(&mut self, bytes: u64) {
        self.cur_setup = true;
        self.live = self.live.saturating_add(bytes);
        self.open_peak = self.open_peak.max(self.live);
        if self.open_start.is_none() {
            // Before the step's first event: the step opens at this level.
            self.open_live0 = self.live;
        }
        self.cur_peak_live = self.cur_peak_live.max(self.live);
    }

    pub fn config(&self) -> StepConfig {
        self.cfg
    }

    /// Sets live bytes to `bytes` (the online path re-aligns to the allocator's own
    /// count after events were lost; a no-op when none were). The open step's peak
    /// keeps what it saw.
    pub fn set_live(&mut self, bytes: u64) {
        self.live = bytes;
        self.open_peak = self.open_peak.max(bytes);
        self.open_live0 = self.open_live0.min(self.open_peak);
        self.cur_peak_live = self.cur_peak_live.max(bytes);
    }

    /// Live requested bytes now (static blocks included).
    pub fn live_bytes(&self) -> u64 {
        self.live
    }

    /// Feeds one event. Returns the step it closed, if any. O(1) amortised; allocates
    /// only while the live-tensor map or the iteration buffers grow past their maximum.
    pub fn push(&mut self, e: &Event) -> Option<Step> {
        match e.kind {
            EventKind::Alloc { id, bytes, .. } => {
                if let Some(old) = self.live_sizes.insert(id, bytes) {
                    // A reused id (malformed input): treat as free + alloc.
                    self.live = self.live.saturating_sub(old);
                }
                self.push_alloc(bytes, e.time_us)
            }
            EventKind::Free { id } => {
                // Unknown ids (frees of blocks we never saw) count as a free of 0 bytes.
                let bytes = self.live_sizes.remove(&id).unwrap_or(0);
                self.push_free(bytes, e.time_us);
                None
            }
            EventKind::Access { .. } => None,
            EventKind::IterationBoundary => self.boundary(),
        }
    }

    /// An allocation of `bytes` at `time_us`, without a tensor id: the allocator's
    /// online path, which knows the size of what it frees. `push` calls it after its id
    /// bookkeeping, so the offline and the online series come from this one code path.
    /// O(1); returns the step it closed.
    #[inline]
    pub fn push_alloc(&mut self, bytes: u64, time_us: u64) -> Option<Step> {
        self.touch(time_us);
        self.live = self.live.saturating_add(bytes);
        self.open_peak = self.open_peak.max(self.live);
        let c = size_class(bytes);
        self.open_counts[c] += 1;
        self.open_values[c] = self.open_values[c].saturating_add(bytes);
        self.open_values[CH_TOTAL] = self.open_values[CH_TOTAL].saturating_add(bytes);
        self.open_allocs += 1;
        if self.open_allocs >= self.cfg.allocs_per_step {
            return Some(self.close());
        }
        None
    }

    /// A free of `bytes` at `time_us` (see [`push_alloc`](Self::push_alloc)). O(1).
    #[inline]
    pub fn push_free(&mut self, bytes: u64, time_us: u64) {
        self.touch(time_us);
        self.live = self.live.saturating_sub(bytes);
        self.open_values[CH_FREED] = self.open_values[CH_FREED].saturating_add(bytes);
        self.open_frees += 1;
    }

    /// An iteration boundary: closes the open step (if it holds an event) and starts
    /// the next iteration. Without restarts, boundaries are ignored: one long iteration
    /// (the straddling baseline the module docs argue against, kept for comparison).
    pub fn boundary(&mut self) -> Option<Step> {
        if !self.cfg.restart_at_iteration {
            return None;
        }
        let step = self.open_start.is_some().then(|| self.close());
        self.new_iteration();
        step
    }

    /// Checks the invariants in the type's docs (O(live tensors); tests call it).
    pub fn check_invariants(&self) -> Result<(), String> {
        let sum: u64 = self
            .live_sizes
            .values()
            .fold(0u64, |a, &b| a.saturating_add(b));
        if sum != self.live {
            return Err(format!("live {} != sum of live tensors {sum}", self.live));
        }
        if self.open_allocs >= self.cfg.allocs_per_step {
            return Err(format!("open step holds {} allocations", self.open_allocs));
        }
        if self.cur_requested != self.cur.iter().map(|v| v[CH_TOTAL]).sum::<u64>() {
            return Err("cur_requested differs from the current iteration's steps".into());
        }
        Ok(())
    }

    /// Closes the open step at the end of the events (a partial last step), if any.
    pub fn finish(&mut self) -> Option<Step> {
        self.open_start.is_some().then(|| self.close())
    }

    fn touch(&mut self, t: u64) {
        if self.open_start.is_none() {
            self.open_start = Some(t);
        }
        self.open_end = t;
    }

    fn new_iteration(&mut self) {
        if !self.cur.is_empty() {
            std::mem::swap(&mut self.prev, &mut self.cur);
            self.prev_peak_live = self.cur_peak_live;
            self.prev_requested = self.cur_requested;
            self.prev_setup = self.cur_setup;
        }
        self.cur_setup = false;
        self.cur.clear();
        self.cur_requested = 0;
        self.cur_peak_live = self.live;
        self.cur_repeat = !self.prev.is_empty();
        self.last_ratio = 1.0;
        // The next step is phase 0 of a new iteration: the same phase of the one just
        // ended is the best guess there is (and what seasonal naive uses).
        if self.cur_repeat {
            self.base_kind = BaseKind::Seasonal;
        }
        self.iteration += 1;
    }

    fn close(&mut self) -> Step {
        self.open_values[CH_PEAK] = self.open_peak.saturating_sub(self.open_live0);
        let values = self.open_values;
        let p = self.cur.len();
        self.cur.push(values);
        self.cur_requested = self.cur_requested.saturating_add(values[CH_TOTAL]);
        self.cur_peak_live = self.cur_peak_live.max(self.open_peak);
        let has_prev = !self.prev.is_empty();
        // Exact repeat so far: requested channels equal the previous iteration's.
        self.cur_repeat = self.cur_repeat
            && p < self.prev.len()
            && values[..=CH_TOTAL] == self.prev[p][..=CH_TOTAL];
        let scale = if has_prev {
            self.prev_requested as f64 / self.prev.len() as f64
        } else {
            self.cur_requested as f64 / self.cur.len() as f64
        }
        .max(1.0);
        // Score the candidates' forecasts of this step (made at the previous step).
        if let Some(cand) = self.cand {
            const ALPHA: f64 = 0.3;
            let y = values[CH_TOTAL] as f64;
            for (err, f) in self.err.iter_mut().zip(cand) {
                if let Some(f) = f {
                    *err = (1.0 - ALPHA) * *err + ALPHA * ((y - f) / scale).abs().min(64.0);
                }
            }
        }
        let ratio = if has_prev {
            let prev_so_far: u64 = self.prev[..(p + 1).min(self.prev.len())]
                .iter()
                .map(|v| v[CH_TOTAL])
                .sum();
            if prev_so_far == 0 {
                1.0
            } else {
                (self.cur_requested as f64 / prev_so_far as f64).clamp(1.0 / 64.0, 64.0)
            }
        } else {
            1.0
        };
        self.last_ratio = ratio;
        // The base: seasonal while repeating; otherwise the recently most accurate.
        // Without a previous iteration: the last value (what seasonal naive falls back to).
        let e = self.err;
        let mut kind = BaseKind::LastValue;
        if has_prev && e[BaseKind::MovingAverage as usize] < e[kind as usize] {
            kind = BaseKind::MovingAverage;
        }
        if has_prev && (self.cur_repeat || e[BaseKind::Seasonal as usize] <= e[kind as usize]) {
            kind = BaseKind::Seasonal;
        }
        self.base_kind = kind;
        let r = if self.cur_repeat { 1.0 } else { ratio };
        self.cand = Some([
            Some(values[CH_TOTAL] as f64),
            Some(self.moving_average()[CH_TOTAL]),
            has_prev.then(|| self.seasonal(1)[CH_TOTAL] as f64 * r),
        ]);
        let live_ref = if has_prev {
            self.prev_peak_live
        } else {
            self.cur_peak_live
        }
        .max(1) as f64;
        let l = |x: u64| ((x as f64 / scale).ln_1p()) as f32;
        let mut f = [0f32; FEATURES];
        f[0] = l(values[CH_TOTAL]);
        for c in 0..NUM_CLASSES {
            f[1 + c] = l(values[c]);
        }
        f[7] = l(values[CH_FREED]);
        f[8] = (self.live as f64 / live_ref).min(16.0) as f32;
        f[9] = if has_prev {
            (p as f64 / self.prev.len() as f64).min(4.0) as f32
        } else {
            0.0
        };
        f[10] = l(self.seasonal(1)[CH_TOTAL]);
        f[11] = if has_prev && p < self.prev.len() {
            l(self.prev[p][CH_TOTAL])
        } else {
            0.0
        };
        f[12] = ratio.ln() as f32;
        f[13] = self.cur_repeat as u8 as f32;
        f[14] = has_prev as u8 as f32;
        f[15] = self.open_allocs as f32 / self.cfg.allocs_per_step as f32;
        f[16] = if p > 0 {
            l(self.cur[p - 1][CH_TOTAL])
        } else {
            0.0
        };
        f[17] = kind as u8 as f32 / 2.0;
        let step = Step {
            index: self.next_index,
            iteration: self.iteration,
            step_in_iteration: p as u32,
            start_time_us: self.open_start.unwrap_or(self.open_end),
            end_time_us: self.open_end,
            allocs: self.open_allocs,
            frees: self.open_frees,
            class_counts: self.open_counts,
            values,
            live_bytes: self.live,
            peak_live_bytes: self.open_peak,
            prev_iteration_steps: self.prev.len() as u32,
            scale,
            ratio,
            repeat: self.cur_repeat,
            features: f,
        };
        self.next_index += 1;
        self.open_allocs = 0;
        self.open_frees = 0;
        self.open_counts = [0; NUM_CLASSES];
        self.open_values = [0; CHANNELS];
        self.open_start = None;
        self.open_peak = self.live;
        self.open_live0 = self.live;
        step
    }

    /// The previous iteration's peak of live bytes rescaled by this iteration's demand
    /// so far (its requested bytes over the previous iteration's at the same step, at
    /// least 1): the peak the copy-and-rescale base implies for this iteration, or
    /// `None` before an iteration has ended. Static memory is rescaled too, so it bounds
    /// a proportional rise from above. After a setup ([`push_setup`](Self::push_setup):
    /// the model built, a warm-up step, one-time allocations), which has no phases to
    /// rescale by: the setup's peak until this iteration's peak passes it, then `None`
    /// (the first iteration after a warm-up may well be larger: a larger batch). O(1).
    pub fn level_envelope(&self) -> Option<u64> {
        if self.prev.is_empty() {
            return None;
        }
        if self.prev_setup {
            return (self.cur_peak_live <= self.prev_peak_live).then_some(self.prev_peak_live);
        }
        let r = if self.cur_repeat {
            1.0
        } else {
            self.last_ratio.max(1.0)
        };
        Some((self.prev_peak_live as f64 * r).min(u64::MAX as f64) as u64)
    }

    /// Seasonal-naive forecast of the step `h >= 1` steps after the last closed one:
    /// the same phase of the previous iteration; past its end, the matching step of the
    /// current iteration (the next iteration starts as this one did); once the current
    /// iteration is longer than the previous one, and without a previous iteration:
    /// the last closed step (last value). O(1).
    pub fn seasonal(&self, h: usize) -> [u64; CHANNELS] {
        let Some(&last) = self.cur.last().or(self.prev.last()) else {
            return [0; CHANNELS];
        };
        if self.prev.is_empty() {
            return last;
        }
        // Phase of the target step. Right after a boundary `cur` is empty and the
        // next step is phase 0 of the new iteration.
        let q = self.cur.len() + h.max(1) - 1;
        let len = self.prev.len();
        if q < len {
            self.prev[q]
        } else if self.cur.len() > len {
            // This iteration has outlived the previous one (dynamic lengths: generation):
            // no phase to copy and no boundary to expect. Hold the last value rather
            // than predict the next iteration's start (a prefill) mid-iteration.
            last
        } else {
            let k = (q - len) % len;
            *self.cur.get(k).unwrap_or(&self.prev[k])
        }
    }

    /// The base forecast a model corrects: the seasonal forecast rescaled by this
    /// iteration's ratio so far (copy and rescale; exactly [`seasonal`](Self::seasonal)
    /// while the iteration repeats), or the last value when that has recently been
    /// more accurate, or the moving average (an EWMA of next-step errors picks among
    /// the three; iterations of generation workloads differ in length, so phases do
    /// not align and the copy misleads).
    pub fn base_forecast(&self, h: usize) -> [f64; CHANNELS] {
        match self.base_kind {
            BaseKind::LastValue => {
                let last = self
                    .cur
                    .last()
                    .or(self.prev.last())
                    .copied()
                    .unwrap_or([0; CHANNELS]);
                return last.map(|v| v as f64);
            }
            BaseKind::MovingAverage => return self.moving_average(),
            BaseKind::Seasonal => {}
        }
        let s = self.seasonal(h);
        let r = if self.cur_repeat {
            1.0
        } else {
            self.last_ratio
        };
        s.map(|v| v as f64 * r)
    }
}

/// Which simple forecast [`StepFeaturizer::base_forecast`] currently uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum BaseKind {
    LastValue = 0,
    /// Mean of the last [`MA_STEPS`] steps of the current iteration.
    MovingAverage = 1,
    /// Seasonal, rescaled by the iteration's ratio so far.
    Seasonal = 2,
}

/// Steps in the moving-average base candidate.
pub const MA_STEPS: usize = 8;

impl StepFeaturizer {
    /// Which base forecast is in use after the last step.
    pub fn base_kind(&self) -> BaseKind {
        self.base_kind
    }

    /// Mean of the last [`MA_STEPS`] closed steps of this iteration (the previous
    /// iteration's tail right after a boundary). O(MA_STEPS * CHANNELS).
    pub fn moving_average(&self) -> [f64; CHANNELS] {
        let src = if self.cur.is_empty() {
            &self.prev
        } else {
            &self.cur
        };
        let tail = &src[src.len().saturating_sub(MA_STEPS)..];
        let mut out = [0f64; CHANNELS];
        for v in tail {
            for (o, &x) in out.iter_mut().zip(v) {
                *o += x as f64;
            }
        }
        out.map(|x| x / tail.len().max(1) as f64)
    }
}

/// A step plus the seasonal and base forecasts for horizons `1..=horizon` taken right
/// after it closed (what the online path sees at that moment).
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    pub step: Step,
    /// `seasonal[h - 1]` = [`StepFeaturizer::seasonal`]`(h)`.
    pub seasonal: Vec<[u64; CHANNELS]>,
    /// `base[h - 1]` = [`StepFeaturizer::base_forecast`]`(h)`.
    pub base: Vec<[f64; CHANNELS]>,
}

/// Offline: the step series of a whole trace (static blocks registered first, the open
/// step closed at the end), with forecasts for horizons `1..=horizon`.
pub fn featurize(trace: &Trace, cfg: StepConfig, horizon: usize) -> Vec<StepRecord> {
    let mut f = StepFeaturizer::new(cfg);
    for b in &trace.static_blocks {
        f.add_static(b.id, b.bytes);
    }
    let mut out = Vec::new();
    let record = |f: &StepFeaturizer, step: Step| StepRecord {
        step,
        seasonal: (1..=horizon).map(|h| f.seasonal(h)).collect(),
        base: (1..=horizon).map(|h| f.base_forecast(h)).collect(),
    };
    for e in &trace.events {
        if let Some(s) = f.push(e) {
            out.push(record(&f, s));
        }
    }
    if let Some(s) = f.finish() {
        out.push(record(&f, s));
    }
    out
}

/// Offline, steps only.
pub fn steps(trace: &Trace, cfg: StepConfig) -> Vec<Step> {
    featurize(trace, cfg, 0)
        .into_iter()
        .map(|r| r.step)
        .collect()
}

#[cfg(test)]
#[path = "features_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "features_reference.rs"]
mod reference;
