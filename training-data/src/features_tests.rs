use super::*;
use crate::model::{Event, EventKind, StaticBlock, Trace};

fn ev(t: u64, kind: EventKind) -> Event {
    Event { time_us: t, kind }
}

/// A trace of `iters` iterations; iteration `i` allocates `n` tensors whose sizes are
/// `base_sizes[j] * scale(i)`, freeing each a few events later.
fn periodic(iters: usize, n: usize, scale: impl Fn(usize) -> u64) -> Trace {
    let mut events = Vec::new();
    let mut t = 0;
    let mut id = 100;
    for i in 0..iters {
        events.push(ev(t, EventKind::IterationBoundary));
        let mut live = Vec::new();
        for j in 0..n {
            t += 1;
            let bytes = (512 + 1000 * (j as u64 % 7) * (j as u64 % 3 + 1)) * scale(i);
            events.push(ev(
                t,
                EventKind::Alloc {
                    id,
                    bytes,
                    stream: 0,
                },
            ));
            live.push(id);
            id += 1;
            if live.len() > 3 {
                t += 1;
                events.push(ev(t, EventKind::Free { id: live.remove(0) }));
            }
        }
        for l in live {
            t += 1;
            events.push(ev(t, EventKind::Free { id: l }));
        }
    }
    events.push(ev(t + 1, EventKind::IterationBoundary));
    Trace {
        static_blocks: vec![StaticBlock {
            id: 1,
            bytes: 1 << 20,
            stream: 0,
        }],
        events,
        ..Default::default()
    }
}

fn cfg(k: u32) -> StepConfig {
    StepConfig {
        allocs_per_step: k,
        restart_at_iteration: true,
    }
}

#[test]
fn size_classes_group_powers_of_two() {
    assert_eq!(size_class(0), 0);
    assert_eq!(size_class(1), 0);
    assert_eq!(size_class(65_536), 0);
    assert_eq!(size_class(65_537), 1);
    assert_eq!(size_class(1 << 20), 1);
    assert_eq!(size_class((1 << 20) + 1), 2);
    assert_eq!(size_class(7_341_568), 2);
    assert_eq!(size_class(1 << 29), 4);
    assert_eq!(size_class((1 << 29) + 1), 5);
    assert_eq!(size_class(u64::MAX), 5);
}

#[test]
fn steps_restart_at_boundaries_and_seasonal_is_exact_on_repeats() {
    let trace = periodic(4, 50, |_| 1);
    let recs = featurize(&trace, cfg(16), 3);
    // 50 allocs per iteration -> steps of 16,16,16,2 (+ trailing frees in the last).
    let per_iter: Vec<u32> = recs
        .iter()
        .filter(|r| r.step.iteration == 2)
        .map(|r| r.step.allocs)
        .collect();
    assert_eq!(per_iter, vec![16, 16, 16, 2]);
    for r in &recs {
        assert!(r.step.step_in_iteration < 4);
    }
    // From the second iteration on every step repeats, and seasonal forecasts are exact.
    for (i, r) in recs.iter().enumerate() {
        if r.step.iteration >= 2 {
            assert!(r.step.repeat, "step {i} should repeat");
            assert_eq!(r.step.ratio, 1.0);
            for h in 1..=3 {
                if let Some(next) = recs.get(i + h) {
                    assert_eq!(r.seasonal[h - 1], next.step.values, "step {i} h {h}");
                    assert_eq!(r.base[h - 1], next.step.values.map(|v| v as f64));
                }
            }
        } else {
            assert!(!r.step.repeat);
        }
    }
}

#[test]
fn straddling_steps_are_not_periodic() {
    // Without restarts, 50 allocs per iteration do not divide into 16-alloc steps.
    let trace = periodic(4, 50, |_| 1);
    let straddle = steps(
        &trace,
        StepConfig {
            allocs_per_step: 16,
            restart_at_iteration: false,
        },
    );
    let aligned = steps(&trace, cfg(16));
    assert!(straddle.iter().all(|s| s.prev_iteration_steps == 0));
    assert_ne!(straddle.len(), aligned.len());
}

#[test]
fn rescaled_iteration_gives_ratio_and_base() {
    let trace = periodic(3, 64, |i| if i == 2 { 2 } else { 1 });
    let recs = featurize(&trace, cfg(16), 2);
    let it2: Vec<&StepRecord> = recs.iter().filter(|r| r.step.iteration == 3).collect();
    assert!(!it2.is_empty());
    for r in &it2 {
        assert!(!r.step.repeat);
        assert!((r.step.ratio - 2.0).abs() < 1e-9, "ratio {}", r.step.ratio);
        assert!((r.step.features[12] - 2f32.ln()).abs() < 1e-6);
    }
    // The base forecast of the first step's successor is twice the seasonal one.
    let r = it2[0];
    assert_eq!(r.base[0][CH_TOTAL], 2.0 * r.seasonal[0][CH_TOTAL] as f64);
}

#[test]
fn features_are_scale_free() {
    // Same workload at 8x the bytes: all features but the class split are identical.
    let a = steps(&periodic(3, 40, |_| 1), cfg(8));
    let b = steps(&periodic(3, 40, |_| 8), cfg(8));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        for k in [0, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17] {
            assert!((x.features[k] - y.features[k]).abs() < 1e-5, "feature {k}");
        }
        assert!(x.features.iter().all(|v| v.is_finite()));
    }
}

/// Pseudo-random events over every kind, sizes over every class group, a static block
/// freed on the way, a reused id.
fn random_trace(seed: u64, n: u64) -> Trace {
    let mut seed = seed | 1;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut events = Vec::new();
    let mut live: Vec<u64> = vec![1];
    for t in 0..n {
        let r = rnd() % 100;
        let kind = if r < 3 {
            EventKind::IterationBoundary
        } else if r < 50 || live.is_empty() {
            live.push(t + 10);
            EventKind::Alloc {
                id: t + 10,
                bytes: 1 + rnd() % (1 << (rnd() % 34)),
                stream: 0,
            }
        } else if r < 90 {
            EventKind::Free {
                id: live.swap_remove((rnd() as usize) % live.len()),
            }
        } else {
            EventKind::Access {
                id: live[0],
                write: false,
            }
        };
        events.push(ev(t, kind));
    }
    Trace {
        static_blocks: vec![StaticBlock {
            id: 1,
            bytes: 12345,
            stream: 0,
        }],
        events,
        ..Default::default()
    }
}

#[test]
fn empty_trace_gives_no_steps() {
    assert!(steps(&Trace::default(), StepConfig::default()).is_empty());
    let only_boundaries = Trace {
        events: vec![
            ev(0, EventKind::IterationBoundary),
            ev(1, EventKind::IterationBoundary),
        ],
        ..Default::default()
    };
    assert!(steps(&only_boundaries, StepConfig::default()).is_empty());
}

#[test]
fn steps_and_features_equal_the_reference_on_random_traces() {
    for (seed, n, cfg) in [
        (
            0x9e37_79b9_7f4a_7c15,
            5000,
            StepConfig {
                allocs_per_step: 7,
                restart_at_iteration: true,
            },
        ),
        (
            77,
            3000,
            StepConfig {
                allocs_per_step: 16,
                restart_at_iteration: true,
            },
        ),
        (
            5,
            3000,
            StepConfig {
                allocs_per_step: 5,
                restart_at_iteration: false,
            },
        ),
    ] {
        let t = random_trace(seed, n);
        super::reference::check(&t, cfg, &format!("random {seed}"));
    }
}

#[test]
fn steps_and_features_equal_the_reference_on_bundled_real_traces() {
    for b in crate::bundled::ALL {
        let t = b.load().unwrap();
        let n = super::reference::check(&t, StepConfig::default(), b.name);
        assert!(n > 100, "{}: only {n} steps", b.name);
    }
}

#[test]
fn the_level_envelope_is_the_last_peak_rescaled_by_this_iterations_demand() {
    // Iterations of 16 allocations of `b` (one step each) freed at its end.
    let iteration = |f: &mut StepFeaturizer, b: u64, steps: usize| {
        f.boundary();
        for _ in 0..steps * 16 {
            f.push_alloc(b, 0);
        }
        for _ in 0..steps * 16 {
            f.push_free(b, 0);
        }
    };
    let mut f = StepFeaturizer::new(StepConfig::default());
    assert_eq!(f.level_envelope(), None);
    iteration(&mut f, 100, 2);
    // One step of the next iteration, at the same size: the last peak, 3,200 bytes.
    f.boundary();
    for _ in 0..16 {
        f.push_alloc(100, 0);
    }
    assert_eq!(f.level_envelope(), Some(3200));
    // Then twice the size: requested so far 4,800 against 3,200 at the same step.
    for _ in 0..16 {
        f.push_alloc(200, 0);
    }
    assert_eq!(f.level_envelope(), Some(4800));
}

#[test]
fn after_a_setup_the_level_envelope_is_its_peak_until_passed() {
    // Setup: 10,000 bytes registered, then freed (the frees of a warm-up open a step,
    // which the first boundary closes: the setup's one step, peak 10,000 bytes).
    let mut f = StepFeaturizer::new(StepConfig::default());
    f.push_setup(10_000);
    f.push_free(10_000, 0);
    f.boundary();
    // Below the setup's peak, the setup's peak bounds the level.
    for _ in 0..16 {
        f.push_alloc(500, 0);
    }
    assert_eq!(f.level_envelope(), Some(10_000));
    // Past it (24,000 bytes live): nothing from the setup bounds this iteration.
    for _ in 0..16 {
        f.push_alloc(1_000, 0);
    }
    assert_eq!(f.level_envelope(), None);
    for (b, n) in [(500, 16), (1_000, 16)] {
        for _ in 0..n {
            f.push_free(b, 0);
        }
    }
    // The next iteration is bounded by that one's peak, rescaled as usual.
    f.boundary();
    for _ in 0..16 {
        f.push_alloc(500, 0);
    }
    assert_eq!(f.level_envelope(), Some(24_000));
}
