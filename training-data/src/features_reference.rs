//! A reference for the featurizer's tests, written from the definitions in
//! `features.rs`'s docs rather than from its code: one plain pass that cuts events into
//! steps, keeping every iteration's steps whole, then each feature computed from that
//! history by its definition. The featurizer keeps rolling state instead (the open
//! step, the current and previous iteration, running sums), so the two share no code.
//!
//! Not covered here: features 10 and 17 (the seasonal forecast and which base forecast
//! is in use), which `seasonal`'s and `base_forecast`'s own tests check.

use std::collections::HashMap;

use super::{size_class, Step, StepConfig, CHANNELS, CH_FREED, CH_PEAK, CH_TOTAL, NUM_CLASSES};
use crate::model::{EventKind, Trace};

/// One step as the definitions give it.
#[derive(Debug, Clone)]
struct RefStep {
    iteration: u32,
    pos: usize,
    values: [u64; CHANNELS],
    counts: [u32; NUM_CLASSES],
    allocs: u32,
    frees: u32,
    live: u64,
    peak: u64,
}

/// Steps by the definitions: a step closes on its N-th allocation; an iteration
/// boundary (with restarts) closes the open step if it saw an allocation or a free;
/// the open step at the end closes too. `CH_PEAK` = peak of live bytes in the step
/// minus live bytes when it opened.
fn cut(t: &Trace, cfg: StepConfig) -> (Vec<RefStep>, Vec<u64>) {
    let n = cfg.allocs_per_step.max(1);
    let mut sizes: HashMap<u64, u64> = t.static_blocks.iter().map(|b| (b.id, b.bytes)).collect();
    let mut live: u64 = sizes.values().sum();
    let mut out: Vec<RefStep> = Vec::new();
    // Live bytes when each iteration started.
    let mut iter_start_live = vec![live];
    let (mut iteration, mut pos) = (0u32, 0usize);
    let fresh = |live: u64, iteration, pos| RefStep {
        iteration,
        pos,
        values: [0; CHANNELS],
        counts: [0; NUM_CLASSES],
        allocs: 0,
        frees: 0,
        live,
        peak: live,
    };
    let mut open = fresh(live, 0, 0);
    let mut open_live0 = live;
    let mut any = false;
    let close = |open: &mut RefStep,
                 live: u64,
                 live0: &mut u64,
                 pos: &mut usize,
                 out: &mut Vec<RefStep>| {
        open.values[CH_PEAK] = open.peak - *live0;
        open.live = live;
        out.push(open.clone());
        *pos += 1;
        *open = fresh(live, open.iteration, *pos);
        *live0 = live;
    };
    for e in &t.events {
        match e.kind {
            EventKind::Alloc { id, bytes, .. } => {
                if let Some(old) = sizes.insert(id, bytes) {
                    live -= old;
                }
                live += bytes;
                any = true;
                open.peak = open.peak.max(live);
                open.values[size_class(bytes)] += bytes;
                open.counts[size_class(bytes)] += 1;
                open.values[CH_TOTAL] += bytes;
                open.allocs += 1;
                if open.allocs == n {
                    close(&mut open, live, &mut open_live0, &mut pos, &mut out);
                    any = false;
                }
            }
            EventKind::Free { id } => {
                let bytes = sizes.remove(&id).unwrap_or(0);
                live -= bytes;
                open.values[CH_FREED] += bytes;
                open.frees += 1;
                any = true;
            }
            EventKind::Access { .. } => {}
            EventKind::IterationBoundary if cfg.restart_at_iteration => {
                if any {
                    close(&mut open, live, &mut open_live0, &mut pos, &mut out);
                    any = false;
                }
                iteration += 1;
                pos = 0;
                open = fresh(live, iteration, 0);
                iter_start_live.push(live);
            }
            EventKind::IterationBoundary => {}
        }
    }
    if any {
        close(&mut open, live, &mut open_live0, &mut pos, &mut out);
    }
    (out, iter_start_live)
}

/// The features of step `k` of `steps` by their definitions (`S` = scale,
/// `l(x) = ln(1 + x / S)`); `None` for the two this reference leaves out.
fn features(steps: &[RefStep], k: usize, start_live: &[u64], n: u32) -> [Option<f64>; 18] {
    let s = &steps[k];
    let cur: Vec<&RefStep> = steps[..=k]
        .iter()
        .filter(|x| x.iteration == s.iteration)
        .collect();
    // The previous iteration: the last earlier one that has steps.
    let prev_it = steps[..k]
        .iter()
        .rev()
        .map(|x| x.iteration)
        .find(|&i| i < s.iteration);
    let prev: Vec<&RefStep> = match prev_it {
        Some(i) => steps.iter().filter(|x| x.iteration == i).collect(),
        None => Vec::new(),
    };
    let has_prev = !prev.is_empty();
    let total = |v: &[&RefStep]| v.iter().map(|x| x.values[CH_TOTAL]).sum::<u64>() as f64;
    let scale = if has_prev {
        total(&prev) / prev.len() as f64
    } else {
        total(&cur) / cur.len() as f64
    }
    .max(1.0);
    let l = |x: u64| (x as f64 / scale).ln_1p();
    let peak_of = |v: &[&RefStep], it: u32| {
        v.iter()
            .map(|x| x.peak)
            .max()
            .unwrap_or(0)
            .max(start_live[it as usize])
    };
    let live_ref = if has_prev {
        peak_of(&prev, prev[0].iteration)
    } else {
        peak_of(&cur, s.iteration)
    }
    .max(1) as f64;
    let p = s.pos;
    let ratio = if has_prev {
        let prev_so_far = total(&prev[..(p + 1).min(prev.len())]);
        if prev_so_far == 0.0 {
            1.0
        } else {
            (total(&cur) / prev_so_far).clamp(1.0 / 64.0, 64.0)
        }
    } else {
        1.0
    };
    let repeat = has_prev
        && cur
            .iter()
            .enumerate()
            .all(|(q, x)| q < prev.len() && x.values[..=CH_TOTAL] == prev[q].values[..=CH_TOTAL]);
    let mut f = [None; 18];
    f[0] = Some(l(s.values[CH_TOTAL]));
    for c in 0..NUM_CLASSES {
        f[1 + c] = Some(l(s.values[c]));
    }
    f[7] = Some(l(s.values[CH_FREED]));
    f[8] = Some((s.live as f64 / live_ref).min(16.0));
    f[9] = Some(if has_prev {
        (p as f64 / prev.len() as f64).min(4.0)
    } else {
        0.0
    });
    f[11] = Some(if has_prev && p < prev.len() {
        l(prev[p].values[CH_TOTAL])
    } else {
        0.0
    });
    f[12] = Some(ratio.ln());
    f[13] = Some(repeat as u8 as f64);
    f[14] = Some(has_prev as u8 as f64);
    f[15] = Some(s.allocs as f64 / n as f64);
    f[16] = Some(if p > 0 {
        l(cur[p - 1].values[CH_TOTAL])
    } else {
        0.0
    });
    f
}

/// Checks the featurizer's offline series of `t` against the reference; returns the
/// number of steps.
pub(super) fn check(t: &Trace, cfg: StepConfig, what: &str) -> usize {
    let got: Vec<Step> = super::steps(t, cfg);
    let (want, start_live) = cut(t, cfg);
    assert_eq!(got.len(), want.len(), "{what}: steps");
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        let at = format!("{what}: step {k}");
        assert_eq!(g.values, w.values, "{at}: channels");
        assert_eq!(g.class_counts, w.counts, "{at}: class counts");
        assert_eq!(
            (g.allocs, g.frees),
            (w.allocs, w.frees),
            "{at}: allocs, frees"
        );
        assert_eq!(
            (g.iteration, g.step_in_iteration as usize),
            (w.iteration, w.pos),
            "{at}: position"
        );
        assert_eq!(
            (g.live_bytes, g.peak_live_bytes),
            (w.live, w.peak),
            "{at}: live, peak"
        );
        let f = features(&want, k, &start_live, cfg.allocs_per_step.max(1));
        for (i, x) in f.iter().enumerate() {
            if let Some(x) = x {
                let y = g.features[i] as f64;
                assert!(
                    (x - y).abs() <= 1e-5 * x.abs().max(1.0),
                    "{at}: feature {i} ({}) is {y}, the reference says {x}",
                    super::FEATURE_NAMES[i]
                );
            }
        }
    }
    got.len()
}
