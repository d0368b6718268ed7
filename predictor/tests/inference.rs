//! Embedded inference without burn: weight files, bad input, the forecast service.

mod common;

use memcast_predictor::data::Series;
use memcast_predictor::eval::{evaluate, run_model};
use memcast_predictor::norm::NormStats;
use memcast_predictor::weights::{LayerWeights, Weights};
use memcast_predictor::{ArtifactConfig, EmbeddedLstm, ForecastService, PredictorError};
use memcast_trace::features::{StepConfig, CH_TOTAL, FEATURES};
use ndarray::{Array1, Array2};

/// Deterministic small random weights for `config`.
pub fn weights(config: &ArtifactConfig, seed: u64) -> Weights {
    let mut s = seed | 1;
    let mut r = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * 0.3
    };
    let m = &config.model;
    let g = 4 * m.hidden;
    let layers = (0..m.layers)
        .map(|l| {
            let input = if l == 0 { m.features } else { m.hidden };
            LayerWeights {
                w_ih: Array2::from_shape_fn((input, g), |_| r()),
                w_hh: Array2::from_shape_fn((m.hidden, g), |_| r()),
                bias: Array1::from_shape_fn(g, |_| r()),
            }
        })
        .collect();
    Weights {
        config: config.clone(),
        layers,
        head_w: Array2::from_shape_fn((m.hidden, m.outputs()), |_| r()),
        head_b: Array1::from_shape_fn(m.outputs(), |_| r()),
        norm: NormStats {
            feature_mean: vec![0.1; m.features],
            feature_std: vec![1.5; m.features],
            target_std: vec![0.5; m.targets()],
        },
    }
}

#[test]
fn safetensors_roundtrip_and_bad_files() {
    let cfg = ArtifactConfig::default();
    let w = weights(&cfg, 7);
    let bytes = w.to_safetensors().unwrap();
    assert_eq!(Weights::from_safetensors(&bytes, None).unwrap(), w);
    assert_eq!(Weights::from_safetensors(&bytes, Some(&cfg)).unwrap(), w);
    // Truncated, random, empty.
    for bad in [&bytes[..bytes.len() / 2], &[7u8; 100][..], &[][..]] {
        assert!(matches!(
            Weights::from_safetensors(bad, None),
            Err(PredictorError::Weights { .. })
        ));
    }
    // Each damage named as what it is.
    let said = |bad: &[u8]| {
        Weights::from_safetensors(bad, None)
            .unwrap_err()
            .to_string()
    };
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut appended = bytes.clone();
    appended.extend_from_slice(&[0; 16]);
    let mut lying = bytes.clone();
    // The header's first offset pair made to point past the data.
    let text = String::from_utf8(bytes[8..8 + header].to_vec()).unwrap();
    let at = text
        .find("\"data_offsets\":[0,")
        .expect("a tensor at offset 0");
    let n = text[at..].find(']').unwrap();
    let patched = format!(
        "{}\"data_offsets\":[0,9]{}",
        &text[..at],
        &text[at + n + 1..]
    );
    let patched = format!("{patched:<header$}");
    lying[8..8 + header].copy_from_slice(patched.as_bytes());
    for (bad, needle) in [
        (&bytes[..5], "shorter than a safetensors header"),
        (&bytes[..8 + header / 2], "runs past the end of the file"),
        (&appended[..], "bytes appended"),
        (&bytes[..bytes.len() - 4], "do not end where the file ends"),
        (&lying[..], "disagree"),
    ] {
        let e = said(bad);
        assert!(e.contains(needle), "{needle}: {e}");
        assert!(!e.contains("Invalid") && !e.contains("Metadata"), "{e}");
    }
    // A config that does not match the weights.
    let mut other = cfg.clone();
    other.model.hidden = 16;
    let e = Weights::from_safetensors(&bytes, Some(&other)).unwrap_err();
    assert!(matches!(e, PredictorError::Mismatch(_)), "{e}");
    assert!(e.to_string().contains("shape"), "{e}");
    let mut other = cfg.clone();
    other.model.horizon = 3;
    assert!(Weights::from_safetensors(&bytes, Some(&other)).is_err());
    // A config no step can be cut by.
    let mut other = cfg.clone();
    other.step.allocs_per_step = 0;
    let e = Weights::from_safetensors(&bytes, Some(&other)).unwrap_err();
    assert!(e.to_string().contains("allocs_per_step = 0"), "{e}");
    // A missing file names the path.
    let e = Weights::load(std::path::Path::new("/nonexistent/x.safetensors"), None).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/x.safetensors"));
    // NaN weights are refused, naming the tensor, and in a file the file too.
    let mut nan = w.clone();
    nan.head_b[0] = f32::NAN;
    let e = EmbeddedLstm::new(nan.clone()).unwrap_err().to_string();
    assert!(e.contains("tensor head.bias holds NaN or infinity"), "{e}");
    let dir = std::env::temp_dir().join(format!("memcast-nan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("nan.safetensors");
    std::fs::write(&f, nan.to_safetensors().unwrap()).unwrap();
    let e = Weights::load(&f, None).unwrap_err().to_string();
    assert!(
        e.contains("nan.safetensors: corrupt weights: tensor head.bias holds NaN"),
        "{e}"
    );
    // burn's record is not read, and the error says what to give instead.
    let mpk = std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../training-data/models/default/model.mpk"
    ));
    let e = memcast_predictor::artifact::load_weights(mpk)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("a burn record") && e.contains("model.safetensors"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_features_are_errors_and_leave_state_alone() {
    let mut m = EmbeddedLstm::new(weights(&ArtifactConfig::default(), 3)).unwrap();
    let x = [0.5f32; FEATURES];
    let first = m.step(&x).unwrap().to_vec();
    m.reset();
    assert!(matches!(
        m.step(&x[..5]),
        Err(PredictorError::FeatureWidth {
            expected: FEATURES,
            got: 5
        })
    ));
    let mut bad = x;
    bad[3] = f32::NAN;
    assert!(matches!(
        m.step(&bad),
        Err(PredictorError::NonFinite { index: 3, .. })
    ));
    bad[3] = f32::INFINITY;
    assert!(m.step(&bad).is_err());
    // The rejected steps did not touch the state.
    assert_eq!(m.step(&x).unwrap(), &first[..]);
}

#[test]
fn static_trace_forecast_equals_seasonal_naive() {
    // While iterations repeat exactly, the model's forecast is the seasonal one.
    let t = common::trace(5, 100, |_| 1);
    let s = Series::from_trace(
        "static",
        &t,
        StepConfig {
            allocs_per_step: 16,
            ..Default::default()
        },
        5,
    );
    let mut m = EmbeddedLstm::new(weights(&ArtifactConfig::default(), 11)).unwrap();
    let r = evaluate(&s, Some(&mut m)).unwrap();
    let sn = &r.models["seasonal_naive"];
    let lstm = &r.models["lstm"];
    // Only the first iteration (no previous one) can differ.
    let fc = run_model(&s, &mut m).unwrap();
    for (t, rec) in s.records.iter().enumerate() {
        if rec.step.repeat {
            for h in 1..=5 {
                assert_eq!(
                    fc[t].bytes[h - 1][CH_TOTAL],
                    rec.seasonal[h - 1][CH_TOTAL] as f64
                );
            }
        }
    }
    assert!(sn.wape > 0.0 && lstm.wape.is_finite());
}

#[test]
fn service_publishes_and_never_blocks() {
    use memcast_predictor::forecaster::{encode_alloc, encode_free, LstmForecaster, BOUNDARY};
    use memcast_predictor::service::CHUNK;
    use memcast_predictor::{Engine, EventChunk};
    let cfg = ArtifactConfig::default();
    let w = weights(&cfg, 5);
    let engine = |w: &memcast_predictor::Weights| {
        Engine::new(
            StepConfig::default(),
            Box::new(LstmForecaster::new(EmbeddedLstm::new(w.clone()).unwrap())),
        )
    };
    let t = common::trace(3, 80, common::dyn_scale(9));
    let mut sizes = std::collections::HashMap::new();
    let codes: Vec<memcast_predictor::forecaster::Code> = t
        .events
        .iter()
        .filter_map(|e| match e.kind {
            memcast_trace::EventKind::Alloc { id, bytes, .. } => {
                sizes.insert(id, bytes);
                Some(encode_alloc(bytes))
            }
            memcast_trace::EventKind::Free { id } => Some(encode_free(sizes[&id])),
            memcast_trace::EventKind::IterationBoundary => Some(BOUNDARY),
            _ => None,
        })
        .collect();
    // Each chunk carries the live bytes at its start, as the allocator's does.
    let mut live = 0u64;
    let chunks: Vec<EventChunk> = codes
        .chunks(CHUNK)
        .map(|c| {
            let mut ch = EventChunk {
                live,
                len: c.len(),
                ..Default::default()
            };
            ch.events[..c.len()].copy_from_slice(c);
            for &e in c {
                if e == BOUNDARY {
                    continue;
                }
                let b = memcast_predictor::forecaster::bucket_bytes(e);
                if e & (1 << 31) == 0 {
                    live += b;
                } else {
                    live -= b;
                }
            }
            ch
        })
        .collect();
    let mut svc = ForecastService::start(engine(&w), 1, 0).unwrap();
    assert!(svc.latest().is_none());
    // Submit a burst far larger than the queue: some are dropped, none blocks.
    for c in &chunks {
        svc.submit(c);
    }
    let stats = svc.shutdown();
    assert_eq!(stats.submitted, chunks.len() as u64);
    assert_eq!(stats.submitted, stats.dropped + stats.processed);
    assert!(
        stats.dropped > 0,
        "a queue of one never overflowed: {stats:?}"
    );

    // One at a time, waiting for each: every chunk is processed, and the published
    // forecasts equal the same engine run directly on the same events.
    let mut svc = ForecastService::start(engine(&w), 2, 0).unwrap();
    let mut direct = engine(&w);
    for c in &chunks {
        let mut want = None;
        direct.set_live(c.live);
        direct.feed(c.as_slice(), |f| want = Some(*f));
        let before = svc.stats().processed;
        assert!(svc.submit(c));
        while svc.stats().processed == before {
            std::thread::yield_now();
        }
        if let Some(want) = want {
            assert_eq!(svc.latest(), Some(want));
        }
    }
    let stats = svc.shutdown();
    assert_eq!(stats.dropped, 0);
    assert_eq!(stats.forecasts, direct.forecasts());
    assert_eq!(stats.published, stats.forecasts);
    assert!(stats.forecasts > 0);
    // With a quantum, only forecasts whose peak moved by that much are published.
    let mut svc = ForecastService::start(engine(&w), chunks.len(), 64 << 20).unwrap();
    for c in &chunks {
        assert!(svc.submit(c));
    }
    let stats = svc.shutdown();
    assert_eq!(stats.processed, chunks.len() as u64);
    assert!(
        stats.published >= 1 && stats.published < stats.forecasts,
        "{stats:?}"
    );
}

#[test]
fn empty_series_evaluates_to_nothing() {
    let s = Series::from_trace("empty", &Default::default(), StepConfig::default(), 5);
    assert!(s.is_empty());
    let r = evaluate(&s, None).unwrap();
    assert_eq!(r.steps, 0);
}

/// Sets its flag when dropped: the service's engine (and so this) is dropped when the
/// service thread ends.
struct DropFlag(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl memcast_predictor::Forecaster for DropFlag {
    fn name(&self) -> &'static str {
        "drop-flag"
    }
    fn horizon(&self) -> usize {
        1
    }
    fn forecast(
        &mut self,
        _: &memcast_trace::features::Step,
        _: &memcast_trace::features::StepFeaturizer,
        _: &mut memcast_predictor::Forecast,
    ) -> bool {
        false
    }
}

#[test]
fn dropping_the_service_stops_and_joins_its_thread() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let flag = std::sync::Arc::new(AtomicBool::new(false));
    let engine =
        memcast_predictor::Engine::new(StepConfig::default(), Box::new(DropFlag(flag.clone())));
    let mut svc = ForecastService::start(engine, 4, 0).unwrap();
    assert!(svc.submit(&memcast_predictor::EventChunk::default()));
    // Let the thread go idle (parked), so that only the stop can end it.
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(
        !flag.load(Ordering::SeqCst),
        "the engine was dropped while the service ran"
    );
    drop(svc);
    // `drop` returned: the thread has ended (joined), and dropped the engine with it.
    assert!(
        flag.load(Ordering::SeqCst),
        "the service thread outlived its drop"
    );
}

#[test]
fn a_flooded_service_takes_a_bounded_share_of_a_core() {
    use memcast_predictor::forecaster::{encode_alloc, encode_free, NoForecaster};
    use memcast_predictor::{Engine, EventChunk};
    // Full chunks of allocations and frees, submitted as fast as the queue takes them
    // for 100 ms: the paced service processes at most 2,048 events per 5 ms (plus
    // slack for a late pause), not the millions an unpaced one gets through.
    let mut chunk = EventChunk::default();
    for (i, e) in chunk.events.iter_mut().enumerate() {
        *e = if i % 2 == 0 {
            encode_alloc(4096)
        } else {
            encode_free(4096)
        };
    }
    chunk.len = chunk.events.len();
    let engine = Engine::new(StepConfig::default(), Box::new(NoForecaster));
    // The allocator's queue: 16,384 events.
    let mut svc =
        ForecastService::start(engine, 16384 / memcast_predictor::service::CHUNK, 0).unwrap();
    let t0 = std::time::Instant::now();
    while t0.elapsed() < std::time::Duration::from_millis(100) {
        for _ in 0..64 {
            svc.submit(&chunk);
        }
        std::thread::yield_now();
    }
    let processed = svc.stats().processed * memcast_predictor::service::CHUNK as u64;
    let bound = 2048 * (t0.elapsed().as_millis() as u64 / 5 + 2);
    let stats = svc.shutdown();
    assert!(processed > 0, "{stats:?}");
    assert!(
        processed <= 2 * bound,
        "{processed} events > 2 x {bound}: {stats:?}"
    );
    assert_eq!(stats.submitted, stats.dropped + stats.processed);
}

#[test]
fn boundaries_of_dropped_chunks_reach_the_engine() {
    use memcast_predictor::forecaster::{encode_alloc, SeasonalForecaster, BOUNDARY};
    use memcast_predictor::{Engine, EventChunk};
    // Chunks of allocations into a queue of one, and a chunk that ends an iteration
    // only when the queue was just seen full: the boundary chunks are dropped (all of
    // them, unless the service popped in between), and the engine still sees
    // iterations (without them every allocation is setup: no step, no forecast).
    let mut allocs = EventChunk::default();
    allocs.events.fill(encode_alloc(1 << 20));
    allocs.len = allocs.events.len();
    let mut boundary = EventChunk::default();
    boundary.events[..4].fill(encode_alloc(1 << 20));
    boundary.events[4] = BOUNDARY;
    boundary.len = 5;
    let engine = Engine::new(
        StepConfig::default(),
        Box::new(SeasonalForecaster { horizon: 2 }),
    );
    let mut svc = ForecastService::start(engine, 1, 0).unwrap();
    let (mut lost, mut accepted) = (0, 0);
    let t0 = std::time::Instant::now();
    while lost < 20 && t0.elapsed() < std::time::Duration::from_secs(10) {
        if !svc.submit(&allocs) {
            if svc.submit(&boundary) {
                accepted += 1;
            } else {
                lost += 1;
                // Let the thread take the queued chunk, so that later chunks (which
                // carry the loss) are queued and iterations form.
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
    }
    let stats = svc.shutdown();
    assert!(lost > 0, "no boundary chunk was dropped: {stats:?}");
    assert_eq!(stats.carried, lost, "{stats:?}");
    if accepted == 0 {
        assert!(stats.forecasts > 0, "{stats:?}");
    }
}

#[test]
fn the_peak_head_is_read_saved_and_published() {
    use memcast_predictor::service::Published;
    use memcast_predictor::{Forecast, ModelConfig};
    use memcast_trace::features::{CH_FREED, CH_PEAK};
    // A config.json written before the peak head existed has none.
    let old: ArtifactConfig =
        serde_json::from_str(r#"{"model": {"hidden": 8, "horizon": 3}}"#).unwrap();
    assert!(!old.model.peak_head);
    assert_eq!(old.model.outputs(), 3 * old.model.channels);
    // A model with one round-trips through safetensors and forecasts its own peak.
    let config = ArtifactConfig {
        model: ModelConfig {
            hidden: 8,
            peak_head: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let w = weights(&config, 5);
    let dir = std::env::temp_dir().join(format!("memcast-peak-{}", std::process::id()));
    memcast_predictor::artifact::save(&dir, &w).unwrap();
    let back = memcast_predictor::artifact::load_weights(&dir).unwrap();
    assert_eq!(back, w);
    std::fs::remove_dir_all(&dir).ok();
    let t = common::trace(6, 100, common::dyn_scale(3));
    let s = Series::from_trace("dyn", &t, config.step, 5);
    let mut m = EmbeddedLstm::new(w).unwrap();
    let fc = run_model(&s, &mut m).unwrap();
    assert!(fc.iter().any(|f| f.peak.is_some()));
    for (f, r) in fc.iter().zip(&s.records) {
        let derived = memcast_predictor::forecaster::peak_rise(&f.bytes[..5], f64::MAX).unwrap();
        match f.peak {
            // The base is used as is (no previous iteration, or a repeat): derived.
            None => assert!(r.step.repeat || r.step.prev_iteration_steps == 0),
            Some(p) => {
                assert!(p.is_finite() && p >= 0.0);
                assert_eq!(f.horizon_peak_rise(f64::MAX), Some(p));
                assert_ne!(p, derived, "the head's own figure, not the derived one");
            }
        }
    }
    // The derived figure without a head; a non-finite value anywhere: no forecast.
    let mut f = Forecast {
        horizon: 2,
        ..Forecast::default()
    };
    f.bytes[0][CH_TOTAL] = 10.0;
    f.bytes[0][CH_PEAK] = 10.0;
    f.bytes[1][CH_FREED] = 4.0;
    f.bytes[1][CH_PEAK] = 3.0;
    assert_eq!(f.horizon_peak_rise(100.0), Some(13.0));
    assert_eq!(
        Forecast {
            peak: Some(50.0),
            ..f
        }
        .horizon_peak_rise(100.0),
        Some(50.0)
    );
    assert_eq!(
        Forecast {
            peak: Some(500.0),
            ..f
        }
        .horizon_peak_rise(100.0),
        Some(100.0)
    );
    assert_eq!(
        Forecast {
            peak: Some(-5.0),
            ..f
        }
        .horizon_peak_rise(100.0),
        Some(0.0)
    );
    assert_eq!(
        Forecast {
            peak: Some(f64::NAN),
            ..f
        }
        .horizon_peak_rise(100.0),
        None
    );
    let mut bad = f;
    bad.bytes[1][CH_FREED] = f64::INFINITY;
    assert_eq!(
        Forecast {
            peak: Some(50.0),
            ..bad
        }
        .horizon_peak_rise(100.0),
        None
    );
    // The seqlock carries the peak: none, a value, NaN (still no forecast after it).
    let p = Published::default();
    for peak in [None, Some(7.5), Some(f64::NAN), Some(0.0)] {
        p.write(&Forecast { peak, ..f });
        let got = p.read().unwrap().peak;
        match peak {
            Some(v) if v.is_nan() => assert!(got.is_some_and(f64::is_nan)),
            _ => assert_eq!(got, peak),
        }
    }
    // And every other field, the level envelope among them.
    let all = Forecast {
        step_index: 9,
        live_bytes: 1 << 33,
        reference: true,
        trust: 0.25,
        seen_rise: 12345,
        level_envelope: 67890,
        peak: Some(3.0),
        ..f
    };
    p.write(&all);
    assert_eq!(p.read(), Some(all));
}

#[test]
fn a_loss_travels_with_the_next_chunk_and_a_lost_boundary_closes_a_gap() {
    use memcast_predictor::forecaster::{encode_alloc, BOUNDARY};
    use memcast_predictor::service::Lost;
    let mid = [encode_alloc(1 << 20)];
    let end = [encode_alloc(1 << 20), BOUNDARY];
    // Events lost mid-iteration, then the chunk that ended it: the next iteration
    // starts in phase.
    let mut l = Lost::default();
    l.add(&mid);
    assert_eq!(
        l,
        Lost {
            boundaries: 0,
            gap: true
        }
    );
    l.add(&end);
    assert_eq!(
        l,
        Lost {
            boundaries: 1,
            gap: false
        }
    );
    // A boundary lost, then events of the next iteration: a gap after it.
    l.add(&mid);
    assert_eq!(
        l,
        Lost {
            boundaries: 1,
            gap: true
        }
    );
    l.add(&end);
    l.add(&end);
    assert_eq!(
        l,
        Lost {
            boundaries: 3,
            gap: false
        }
    );
    let mut none = Lost::default();
    none.add(&[]);
    assert!(none.is_empty());
    // The copy a hand-over makes (the service's module docs give its size).
    assert_eq!(std::mem::size_of::<memcast_predictor::EventChunk>(), 88);
}

#[test]
fn the_peak_rise_is_scored_over_the_horizon() {
    // Written from the definition: after step t, the peak rise of live bytes over
    // steps t+1..=t+N; every method's figure is scored against it.
    let t = common::trace(6, 100, common::dyn_scale(3));
    let s = Series::from_trace("dyn", &t, StepConfig::default(), 5);
    let r = evaluate(&s, None).unwrap();
    let mut num = 0.0;
    let mut den = 0.0;
    for t in 0..s.len() - 5 {
        // Live bytes step by step, from the step values (requested, freed, rise).
        let (mut live, mut peak) = (0i128, 0i128);
        for k in t + 1..=t + 5 {
            let v = s.actual(k);
            peak = peak.max(live + v[memcast_trace::features::CH_PEAK] as i128);
            live += v[CH_TOTAL] as i128 - v[memcast_trace::features::CH_FREED] as i128;
        }
        let y = peak as f64;
        let yhat = memcast_predictor::forecaster::peak_rise(&s.records[t].base, f64::MAX).unwrap();
        num += (y - yhat).abs();
        den += y;
        assert_eq!(s.peak_rise_after(t), Some(y));
    }
    let want = num / den;
    let got = r.peak_rise["seasonal_rescaled"].wape;
    assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    assert!(r.peak_rise.contains_key("last_value") && !r.peak_rise.contains_key("lstm"));
    let (name, best) = r.best_peak_baseline();
    assert!(best <= got && r.peak_rise[&name].wape == best);
}

#[test]
fn a_chunk_dropped_mid_iteration_leaves_the_forecasts_without_a_basis_until_a_boundary() {
    use memcast_predictor::forecaster::{encode_alloc, encode_free, SeasonalForecaster, BOUNDARY};
    use memcast_predictor::{Engine, EventChunk};
    use std::time::{Duration, Instant};
    // A step is 16 allocations: a chunk of 16 allocation-free pairs closes one.
    let mut step = EventChunk::default();
    for (i, e) in step.events.iter_mut().enumerate() {
        *e = if i % 2 == 0 {
            encode_alloc(1 << 20)
        } else {
            encode_free(1 << 20)
        };
    }
    step.len = step.events.len();
    let mut boundary = EventChunk::default();
    boundary.events[0] = BOUNDARY;
    boundary.len = 1;
    let engine = Engine::new(
        StepConfig::default(),
        Box::new(SeasonalForecaster { horizon: 2 }),
    );
    let mut svc = ForecastService::start(engine, 1, 0).unwrap();
    // Hands a chunk over once the queue has room, and waits until it is processed.
    let send = |svc: &mut ForecastService, c: &EventChunk| {
        let t0 = Instant::now();
        while !svc.has_room() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the queue never drained"
            );
            std::thread::sleep(Duration::from_micros(100));
        }
        let before = svc.stats().processed;
        assert!(svc.submit(c));
        while svc.stats().processed == before {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the chunk was not processed"
            );
            std::thread::sleep(Duration::from_micros(100));
        }
    };
    // Two iterations of eight steps: forecasts from the second have a basis.
    for _ in 0..2 {
        send(&mut svc, &boundary);
        for _ in 0..8 {
            send(&mut svc, &step);
        }
    }
    assert!(svc.latest().unwrap().reference);
    // A step's chunk dropped (the queue of one full), then the iteration goes on.
    let t0 = Instant::now();
    while svc.submit(&step) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no chunk was dropped"
        );
    }
    for _ in 0..3 {
        send(&mut svc, &step);
    }
    assert!(!svc.latest().unwrap().reference, "{:?}", svc.stats());
    // The next iteration is in phase again.
    send(&mut svc, &boundary);
    for _ in 0..3 {
        send(&mut svc, &step);
    }
    assert!(svc.latest().unwrap().reference, "{:?}", svc.stats());
}
