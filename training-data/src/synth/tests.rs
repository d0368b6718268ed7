//! Whole-pipeline tests of the synthetic traces.

use super::*;
use crate::model::EventKind;

/// Peak of live requested bytes over the events (static blocks excluded).
fn peak_live(t: &Trace) -> u64 {
    let mut sizes = HashMap::new();
    let (mut live, mut peak) = (0u64, 0u64);
    for e in &t.events {
        match e.kind {
            EventKind::Alloc { id, bytes, .. } => {
                sizes.insert(id, bytes);
                live += bytes;
                peak = peak.max(live);
            }
            EventKind::Free { id } => live -= sizes.remove(&id).unwrap_or(0),
            _ => {}
        }
    }
    peak
}

/// Allocation sizes of each iteration (between boundaries).
fn per_iteration(t: &Trace) -> Vec<Vec<u64>> {
    let mut out: Vec<Vec<u64>> = Vec::new();
    for e in &t.events {
        match e.kind {
            EventKind::IterationBoundary => out.push(Vec::new()),
            EventKind::Alloc { bytes, .. } => out.last_mut().expect("boundary first").push(bytes),
            _ => {}
        }
    }
    out.pop(); // after the final boundary: nothing
    out
}

fn small_gpt() -> SynthConfig {
    SynthConfig {
        batch: 2,
        seq: 64,
        width: 64,
        depth: 2,
        heads: 4,
        vocab: 1000,
        positions: 256,
        iterations: 3,
        ..SynthConfig::gpt2_small()
    }
}

#[test]
fn mlp_trains_and_repeats_exactly() {
    let cfg = SynthConfig {
        iterations: 3,
        ..SynthConfig::mlp()
    };
    let t = generate(&cfg).unwrap();
    t.validate().unwrap();
    assert_eq!(t.iterations(), 3);
    assert_eq!(t.boundaries(), 4);
    let it = per_iteration(&t);
    assert_eq!(it.len(), 3);
    assert!(it[0] == it[1] && it[1] == it[2], "static graphs repeat");
    // Static: 1024*4096 + 3*4096^2 + 4096*1000 weights, biases, x2 with momentum.
    let params = 1024 * 4096 + 3 * 4096 * 4096 + 4096 * 1000 + 4 * 4096 + 1000;
    assert_eq!(t.static_bytes(), 2 * 4 * params + (65 << 20));
}

#[test]
fn same_seed_same_trace_other_seed_other_schedule() {
    let cfg = SynthConfig {
        dynamic: Some(Dynamic {
            param: DynParam::Seq,
            values: vec![16, 32, 64, 128],
            in_order: false,
        }),
        iterations: 8,
        seed: 42,
        ..small_gpt()
    };
    let a = generate(&cfg).unwrap();
    let b = generate(&cfg).unwrap();
    assert_eq!(a, b);
    let c = generate(&SynthConfig { seed: 43, ..cfg }).unwrap();
    assert_ne!(a.events, c.events);
}

#[test]
fn dynamic_sequence_length_scales_each_iteration() {
    let cfg = SynthConfig {
        dynamic: Some(Dynamic {
            param: DynParam::Seq,
            values: vec![32, 128],
            in_order: false,
        }),
        iterations: 12,
        seed: 3,
        ..small_gpt()
    };
    let t = generate(&cfg).unwrap();
    let totals: Vec<u64> = per_iteration(&t).iter().map(|v| v.iter().sum()).collect();
    let (lo, hi) = (*totals.iter().min().unwrap(), *totals.iter().max().unwrap());
    // Same graph, 4x the tokens: activations scale ~4x (weights' casts do not).
    assert!(hi as f64 > 2.5 * lo as f64, "{totals:?}");
    let distinct: std::collections::HashSet<_> = totals.iter().collect();
    assert_eq!(distinct.len(), 2, "two shapes, two distinct iterations");
}

#[test]
fn dynamic_batch_and_image_size() {
    for (fam, param, values) in [
        (SynthConfig::mlp(), DynParam::Batch, vec![32, 64, 128]),
        (
            SynthConfig {
                batch: 2,
                depth: 18,
                ..SynthConfig::resnet50()
            },
            DynParam::Image,
            vec![64, 96, 128],
        ),
    ] {
        let t = generate(&SynthConfig {
            dynamic: Some(Dynamic {
                param,
                values,
                in_order: false,
            }),
            iterations: 10,
            seed: 1,
            ..fam
        })
        .unwrap();
        let totals: std::collections::HashSet<u64> =
            per_iteration(&t).iter().map(|v| v.iter().sum()).collect();
        assert_eq!(totals.len(), 3, "{param:?}: one total per drawn size");
    }
}

#[test]
fn inference_keeps_no_optimizer_state_and_peaks_lower() {
    let train = generate(&SynthConfig {
        iterations: 2,
        ..small_gpt()
    })
    .unwrap();
    let infer = generate(&SynthConfig {
        iterations: 2,
        mode: Mode::Infer,
        ..small_gpt()
    })
    .unwrap();
    // AdamW: params + exp_avg + exp_avg_sq; inference: params only.
    let ws: u64 = SynthConfig::gpt2_small().workspaces.iter().sum();
    assert_eq!(train.static_bytes() - ws, 3 * (infer.static_bytes() - ws));
    assert!(peak_live(&infer) * 2 < peak_live(&train));
    assert!(!infer.tensors.iter().any(|m| m.recompute_us.is_some()));
}

#[test]
fn generation_grows_the_kv_cache() {
    let cfg = SynthConfig {
        mode: Mode::Generate,
        iterations: 2,
        generation: GenSpec {
            batches: vec![2],
            prompts: vec![8],
            new_tokens: vec![5],
        },
        ..small_gpt()
    };
    let t = generate(&cfg).unwrap();
    assert_eq!(t.iterations(), 2);
    // Cache of layer 0's keys: [b, heads, len, d] bf16 = 2*4*len*16*2 bytes, len 8..=12.
    let caches: Vec<u64> = t
        .tensors
        .iter()
        .filter(|m| m.producer.as_deref() == Some("h.0.attn.cache_key"))
        .map(|m| m.size)
        .collect();
    let want: Vec<u64> = (8..=12).map(|l| 2 * 4 * l * 16 * 2).collect();
    assert_eq!(caches[..5], want[..]);
    assert_eq!(caches.len(), 10);
    // Each old cache dies once the next one is made from it: at most two per layer live.
    assert!(peak_live(&t) < 4 * t.static_bytes());
}

#[test]
fn tensor_meta_points_at_its_events() {
    let t = generate(&SynthConfig {
        iterations: 1,
        batch: 2,
        depth: 18,
        image: 64,
        ..SynthConfig::resnet50()
    })
    .unwrap();
    let mut recomputable = 0;
    for m in &t.tensors {
        assert!(m.producer.is_some(), "tensor {} has no producer", m.id);
        match (m.alloc_event, m.free_event) {
            (Some(a), Some(f)) => {
                assert!(a < f);
                assert!(matches!(t.events[a as usize].kind,
                    EventKind::Alloc { id, bytes, .. } if id == m.id && bytes == m.size));
                assert!(matches!(t.events[f as usize].kind, EventKind::Free { id } if id == m.id));
            }
            (None, None) => assert!(t.static_blocks.iter().any(|b| b.id == m.id)),
            other => panic!("tensor {} has interval {other:?}", m.id),
        }
        recomputable += usize::from(m.recompute_us.is_some());
    }
    let stem = t
        .tensors
        .iter()
        .find(|m| m.producer.as_deref() == Some("stem.conv"))
        .unwrap();
    assert!(
        stem.recompute_us.is_some(),
        "a saved conv output can be recomputed"
    );
    assert!(stem.consumers.iter().any(|c| c == "stem.bn.bwd"));
    assert!(recomputable > 20);
    // Reads and writes exist for every tensor made in the trace.
    let accesses = t
        .events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Access { .. }))
        .count();
    assert!(accesses > t.tensors.len());
}

#[test]
fn trace_peak_matches_liveness_peak() {
    let cfg = small_gpt();
    let mut ex = expand::Expander::new(cfg.cost, Some(cfg.optimizer), &cfg.workspaces);
    let g = cfg
        .build(
            IterShape {
                batch: 2,
                seq: 64,
                image: 224,
            },
            true,
        )
        .unwrap();
    ex.train_iteration(&g).unwrap();
    ex.p.boundary();
    let l = liveness::analyze(&ex.p).unwrap();
    let times = timeline::schedule(&ex.p, &cfg.cost);
    let t = liveness::emit(&ex.p, &l, &times, TraceMeta::default());
    t.validate().unwrap();
    assert_eq!(l.peak_live(&ex.p).0, peak_live(&t));
}

#[test]
fn bad_parameters_are_errors_not_panics() {
    let bad = [
        SynthConfig {
            depth: 7,
            ..SynthConfig::resnet50()
        },
        SynthConfig {
            mode: Mode::Generate,
            ..SynthConfig::mlp()
        },
        SynthConfig {
            batch: 0,
            ..SynthConfig::mlp()
        },
        SynthConfig {
            batch: 1 << 16,
            seq: 1 << 17,
            positions: 1 << 17,
            ..SynthConfig::gpt2_small()
        },
        SynthConfig {
            heads: 5,
            ..small_gpt()
        },
        SynthConfig {
            seq: 2048,
            ..SynthConfig::gpt2_small()
        },
        SynthConfig {
            iterations: 0,
            ..SynthConfig::mlp()
        },
        SynthConfig {
            dynamic: Some(Dynamic {
                param: DynParam::Batch,
                values: vec![],
                in_order: false,
            }),
            ..SynthConfig::mlp()
        },
    ];
    for cfg in bad {
        assert!(
            matches!(generate(&cfg), Err(TraceError::Param(_))),
            "{}",
            cfg.name()
        );
    }
}

#[test]
fn bf16_autocast_keeps_fp32_masters_and_halves_matmul_activations() {
    let fp32 = generate(&SynthConfig {
        precision: Precision::Fp32,
        ..small_gpt()
    })
    .unwrap();
    let bf16 = generate(&small_gpt()).unwrap();
    assert_eq!(
        fp32.static_bytes(),
        bf16.static_bytes(),
        "fp32 master weights"
    );
    let qkv = |t: &Trace| {
        t.tensors
            .iter()
            .find(|m| m.producer.as_deref() == Some("h.0.attn.c_attn"))
            .unwrap()
            .size
    };
    assert_eq!(qkv(&fp32), 2 * qkv(&bf16));
}

#[test]
fn unbound_external_is_an_error_not_a_panic() {
    let d = families::transformer::GptDims {
        depth: 1,
        width: 32,
        heads: 2,
        vocab: 100,
        positions: 64,
    };
    let g = families::transformer::build_decode(d, 1, 4, 1, None).unwrap();
    let mut ex = expand::Expander::new(CostModel::h200(), None, &[]);
    assert!(matches!(ex.forward(&g, &[]), Err(TraceError::Param(_))));
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn family() -> impl Strategy<Value = Family> {
        prop_oneof![
            Just(Family::Mlp),
            Just(Family::Cnn),
            Just(Family::Transformer),
            Just(Family::Bert),
            Just(Family::MobileNet)
        ]
    }

    fn mode() -> impl Strategy<Value = Mode> {
        prop_oneof![Just(Mode::Train), Just(Mode::Infer), Just(Mode::Generate)]
    }

    #[allow(clippy::too_many_arguments)]
    fn config(
        family: Family,
        mode: Mode,
        batch: u64,
        seq: u64,
        image: u64,
        width: u64,
        depth: u64,
        heads: u64,
        bf16: bool,
        iterations: usize,
        seed: u64,
        dynamic: Option<Vec<u64>>,
    ) -> SynthConfig {
        SynthConfig {
            family,
            mode,
            batch,
            seq,
            image,
            width,
            depth,
            heads,
            vocab: 97,
            positions: 64,
            classes: 10,
            in_features: 24,
            precision: if bf16 {
                Precision::Bf16Autocast
            } else {
                Precision::Fp32
            },
            optimizer: if seed.is_multiple_of(2) {
                Optimizer::AdamW
            } else {
                Optimizer::SgdMomentum
            },
            iterations,
            seed,
            // A shape the family has (generation draws its own shapes).
            dynamic: dynamic
                .filter(|_| mode != Mode::Generate)
                .map(|values| Dynamic {
                    param: match family {
                        Family::Cnn | Family::MobileNet => DynParam::Image,
                        Family::Transformer | Family::Bert => DynParam::Seq,
                        Family::Mlp => DynParam::Batch,
                    },
                    values,
                    in_order: false,
                }),
            generation: GenSpec {
                batches: vec![1, 2],
                prompts: vec![3, 5],
                new_tokens: vec![1, 4],
            },
            ..SynthConfig::mlp()
        }
    }

    fn check_trace(cfg: &SynthConfig, t: &Trace) -> Result<(), TestCaseError> {
        prop_assert!(t.validate().is_ok());
        prop_assert_eq!(t.iterations(), cfg.iterations);
        let allocs = t
            .events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Alloc { .. }))
            .count();
        prop_assert_eq!(t.tensors.len(), t.static_blocks.len() + allocs);
        prop_assert_eq!(&generate(cfg).unwrap(), t);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]

        /// Any configuration inside the documented ranges generates a valid trace,
        /// deterministically, with one `TensorMeta` per block and allocation.
        #[test]
        fn valid_configs_generate_valid_deterministic_traces(
            family in family(),
            train in any::<bool>(),
            batch in 1u64..4,
            seq in 1u64..24,
            image in 32u64..72,
            width in 1u64..12,
            depth in 1u64..3,
            bf16 in any::<bool>(),
            iterations in 1usize..3,
            seed in any::<u64>(),
            dynamic in proptest::option::of(proptest::collection::vec(32u64..64, 1..4)),
        ) {
            let (mode, depth) = match family {
                Family::Cnn => (Mode::Train, [18, 34, 50][depth as usize % 3]),
                Family::MobileNet => (if train { Mode::Train } else { Mode::Infer }, depth),
                Family::Transformer if !train => (Mode::Generate, depth),
                _ => (if train { Mode::Train } else { Mode::Infer }, depth),
            };
            // Widths that the heads divide; CNN widths are channels.
            let heads = 2;
            let width = width * 2 * if family == Family::Cnn { 4 } else { 1 };
            let cfg = config(family, mode, batch, seq, image, width, depth, heads, bf16,
                iterations, seed, dynamic);
            let t = generate(&cfg);
            prop_assert!(t.is_ok(), "{:?}: {:?}", cfg.name(), t.err());
            check_trace(&cfg, &t.unwrap())?;
        }

        /// Anything else: a valid trace or a parameter error, never a panic.
        #[test]
        fn any_small_config_is_a_trace_or_a_clean_error(
            family in family(),
            mode in mode(),
            batch in 0u64..4,
            seq in 0u64..80,
            image in 0u64..72,
            width in 0u64..24,
            depth in 0u64..60,
            heads in 0u64..5,
            bf16 in any::<bool>(),
            iterations in 0usize..3,
            seed in any::<u64>(),
            dynamic in proptest::option::of(proptest::collection::vec(0u64..80, 0..3)),
        ) {
            let cfg = config(family, mode, batch, seq, image, width, depth, heads, bf16,
                iterations, seed, dynamic);
            match generate(&cfg) {
                Ok(t) => check_trace(&cfg, &t)?,
                Err(e) => prop_assert!(matches!(e, TraceError::Param(_)), "{e}"),
            }
        }
    }
}
