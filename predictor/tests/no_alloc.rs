//! Steady state allocates nothing: the featurizer per event, the embedded LSTM per step.
//! A counting global allocator counts this thread's allocations only.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use memcast_predictor::norm::NormStats;
use memcast_predictor::weights::{LayerWeights, Weights};
use memcast_predictor::{ArtifactConfig, EmbeddedLstm, Forecast, StepInput};
use memcast_trace::features::{StepConfig, StepFeaturizer, CHANNELS, FEATURES};
use ndarray::{Array1, Array2};

struct Counting;

thread_local! {
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's contract for `alloc`, passed on unchanged.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `System` (every allocation here does), with `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        // SAFETY: as for `dealloc`; the caller's contract for `realloc` otherwise.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn count() -> u64 {
    COUNT.with(|c| c.get())
}

#[test]
fn steady_state_does_not_allocate() {
    let config = ArtifactConfig::default();
    let m = &config.model;
    let g = 4 * m.hidden;
    let w = Weights {
        config: config.clone(),
        layers: vec![LayerWeights {
            w_ih: Array2::from_elem((m.features, g), 0.01),
            w_hh: Array2::from_elem((m.hidden, g), 0.01),
            bias: Array1::zeros(g),
        }],
        head_w: Array2::from_elem((m.hidden, m.outputs()), 0.01),
        head_b: Array1::zeros(m.outputs()),
        norm: NormStats {
            feature_mean: vec![0.0; FEATURES],
            feature_std: vec![1.0; FEATURES],
            target_std: vec![1.0; CHANNELS],
        },
    };
    let mut model = EmbeddedLstm::new(w).unwrap();
    // Six identical iterations: the first ones size every buffer, the last is measured.
    let trace = common::trace(6, 400, |_| 1);
    let boundaries: Vec<usize> = trace
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e.kind, memcast_trace::EventKind::IterationBoundary))
        .map(|(i, _)| i)
        .collect();
    let measured_from = boundaries[boundaries.len() - 2];
    let mut f = StepFeaturizer::new(StepConfig::default());
    let mut out = Forecast::default();
    let mut steps = 0;
    let mut before = 0;
    for (i, e) in trace.events.iter().enumerate() {
        if i == measured_from {
            before = count();
            steps = 0;
        }
        if let Some(step) = f.push(e) {
            let input = StepInput::new(&step, &f);
            model.forecast(&input, &mut out).unwrap();
            steps += 1;
        }
    }
    assert!(steps > 10);
    assert_eq!(
        count() - before,
        0,
        "allocations in the last iteration ({steps} steps)"
    );
}
