//! burn-side checks (feature `train`): embedded inference matches burn's forward,
//! training is deterministic and learns, burn records round-trip.
#![cfg(feature = "train")]

mod common;

use memcast_predictor::data::Series;
use memcast_predictor::eval::evaluate;
use memcast_predictor::train::backend::{
    burn_forward, load_burn_record, save_burn_record, train_with,
};
use memcast_predictor::train::{BackendKind, NoProgress};
use memcast_predictor::{ArtifactConfig, EmbeddedLstm, ModelConfig, TrainConfig, Weights};
use memcast_trace::features::{StepConfig, FEATURES};

fn random_weights(config: &ArtifactConfig, seed: u64) -> Weights {
    // Training init is seeded and plain Rust: reuse it, then perturb the head so the
    // outputs are not near zero.
    let norm = memcast_predictor::norm::NormStats {
        feature_mean: vec![0.2; FEATURES],
        feature_std: vec![0.7; FEATURES],
        target_std: vec![1.0; config.model.targets()],
    };
    let mut w = memcast_predictor::train::model::init_weights(config, norm, seed).unwrap();
    w.head_w.mapv_inplace(|v| v * 10.0);
    w
}

#[test]
fn embedded_matches_burn_forward() {
    for (layers, hidden, peak_head) in [(1, 32, false), (2, 24, false), (1, 16, true)] {
        let config = ArtifactConfig {
            model: ModelConfig {
                layers,
                hidden,
                peak_head,
                ..Default::default()
            },
            ..Default::default()
        };
        let w = random_weights(&config, 3 + layers as u64);
        let (b, win) = (4, 40);
        let mut s = 12345u64;
        let x: Vec<f32> = (0..b * win * FEATURES)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 6.0 - 3.0
            })
            .collect();
        let want = burn_forward(&w, &x, b, win).unwrap();
        let o = config.model.outputs();
        let mut m = EmbeddedLstm::new(w).unwrap();
        let mut max_diff = 0f32;
        for bi in 0..b {
            m.reset();
            for t in 0..win {
                let xi = &x[(bi * win + t) * FEATURES..(bi * win + t + 1) * FEATURES];
                let got = m.step_normalized(xi);
                let off = (bi * win + t) * o;
                for k in 0..o {
                    max_diff = max_diff.max((got[k] - want[off + k]).abs());
                }
            }
        }
        assert!(
            max_diff <= 1e-4,
            "layers {layers}: max |embedded - burn| = {max_diff}"
        );
        assert!(
            want.iter().any(|v| v.abs() > 0.1),
            "outputs too small to compare"
        );
    }
}

fn small_config() -> ArtifactConfig {
    ArtifactConfig {
        model: ModelConfig {
            hidden: 16,
            ..Default::default()
        },
        train: TrainConfig {
            epochs: 4,
            window: 16,
            burn_in: 4,
            batch: 16,
            patience: 10,
            ..Default::default()
        },
        step: StepConfig {
            allocs_per_step: 16,
            ..Default::default()
        },
    }
}

fn dataset(c: &ArtifactConfig) -> Vec<Series> {
    (0..4)
        .map(|k| {
            let t = common::trace(8, 120, common::dyn_scale(k + 1));
            Series::from_trace(&format!("dyn{k}"), &t, c.step, c.model.horizon)
        })
        .collect()
}

#[test]
fn training_is_deterministic_and_records_round_trip() {
    let c = small_config();
    let data = dataset(&c);
    let a = train_with(BackendKind::Ndarray, &data, &c, &mut NoProgress).unwrap();
    let b = train_with(BackendKind::Ndarray, &data, &c, &mut NoProgress).unwrap();
    assert_eq!(a.weights, b.weights, "same seed, same model");
    assert_eq!(a.val_traces, b.val_traces);
    assert!(!a.val_traces.is_empty());
    assert!(
        a.val_traces.iter().all(|v| !a.train_traces.contains(v)),
        "split by trace"
    );
    let mut c2 = c.clone();
    c2.train.seed = 7;
    let d = train_with(BackendKind::Ndarray, &data, &c2, &mut NoProgress).unwrap();
    assert_ne!(a.weights, d.weights);

    let dir = std::env::temp_dir().join(format!("memcast-rec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.mpk");
    save_burn_record(&a.weights, &path).unwrap();
    let back = load_burn_record(&path, &c, &d.weights).unwrap();
    assert_eq!(back, a.weights);
    std::fs::remove_dir_all(&dir).ok();
}

/// A model trained on `dataset(c)` (iterations that change scale at random) for 120
/// epochs, and a held-out trace of the same family.
fn trained_on_the_family(
    mut c: ArtifactConfig,
) -> (memcast_predictor::train::TrainOutcome, Series) {
    c.train.epochs = 120;
    c.train.patience = 1000;
    let data = dataset(&c);
    let out = train_with(BackendKind::Ndarray, &data, &c, &mut NoProgress).unwrap();
    let test = Series::from_trace(
        "test",
        &common::trace(8, 120, common::dyn_scale(99)),
        c.step,
        5,
    );
    (out, test)
}

#[test]
fn training_learns_to_rescale() {
    // Iterations change scale at random: on a held-out trace of the same family the
    // trained model's WAPE is at least 10% below its untrained self's (which forecasts
    // the base forecast: its corrections start near zero), at least 10% below the best
    // non-learned forecaster's (seasonal rescaled, the base itself, counted) and at least
    // 20% below the best of last value, moving average and seasonal naive. Training is
    // deterministic (seeded): measured 0.363 against 0.423 untrained, 0.421 seasonal
    // rescaled and 0.500 for last value.
    let c = small_config();
    let (out, test) = trained_on_the_family(c.clone());
    let first = out.history.first().unwrap().train_loss;
    let last = out.history.last().unwrap().train_loss;
    assert!(last < first, "training loss {first} -> {last}");
    let wape = |w: Weights| {
        let mut m = EmbeddedLstm::new(w).unwrap();
        evaluate(&test, Some(&mut m)).unwrap()
    };
    let r = wape(out.weights.clone());
    // Its untrained self: the same initialisation (seed) and normalisation, no epochs.
    let untrained =
        memcast_predictor::train::model::init_weights(&c, out.weights.norm.clone(), c.train.seed)
            .unwrap();
    let u = wape(untrained);
    let (trained, before) = (r.models["lstm"].wape, u.models["lstm"].wape);
    let (baseline, best) = r.best_baseline();
    eprintln!("held-out WAPE: trained {trained:.4}, untrained {before:.4}, {baseline} {best:.4}");
    assert!(
        trained < 0.9 * before,
        "trained {trained} vs untrained {before}"
    );
    assert!(
        trained < 0.9 * best,
        "trained {trained} vs {baseline} {best}"
    );
    let classic = ["last_value", "moving_average", "seasonal_naive"]
        .iter()
        .map(|k| r.models[*k].wape)
        .fold(f64::INFINITY, f64::min);
    assert!(
        trained < 0.8 * classic,
        "trained {trained} vs the classic baselines' best {classic}"
    );
}

#[test]
fn the_peak_head_learns_the_horizons_peak_rise() {
    // The same family as `training_learns_to_rescale`, scored on the horizon's peak rise
    // of live bytes (what predictive mode acts on). A model with the peak head: its
    // forecasts carry their own peak, read by `Forecast::horizon_peak_rise`, and trained
    // it forecasts the held-out trace's peak rise at least 10% better than its untrained
    // self and than its base (seasonal rescaled, which the untrained head stays near).
    // Measured: 1.108 trained, 1.438 untrained, 1.437 base. (Live bytes hardly rise in
    // this family, every tensor freed four allocations later, so the peak rise is small
    // and noisy: seasonal naive does better here, 0.876; docs/predictor.md gives the
    // real traces.)
    let mut c = small_config();
    c.model.peak_head = true;
    let (out, test) = trained_on_the_family(c.clone());
    assert_eq!(
        out.weights.head_b.len(),
        c.model.horizon * c.model.channels + 1
    );
    assert_eq!(out.weights.norm.target_std.len(), c.model.channels + 1);
    let run = |w: Weights| {
        let mut m = EmbeddedLstm::new(w).unwrap();
        let fc = memcast_predictor::eval::run_model(&test, &mut m).unwrap();
        let mut m = EmbeddedLstm::new(m.weights().clone()).unwrap();
        (fc, evaluate(&test, Some(&mut m)).unwrap())
    };
    let (fc, r) = run(out.weights.clone());
    // The head's figure is what the forecast reports, where the model corrects.
    let own = fc.iter().filter(|f| f.peak.is_some()).count();
    assert!(
        own > fc.len() / 2,
        "{own} of {} forecasts carry a peak",
        fc.len()
    );
    let untrained =
        memcast_predictor::train::model::init_weights(&c, out.weights.norm.clone(), c.train.seed)
            .unwrap();
    let (_, u) = run(untrained);
    let (trained, before) = (r.peak_rise["lstm"].wape, u.peak_rise["lstm"].wape);
    let base = r.peak_rise["seasonal_rescaled"].wape;
    eprintln!(
        "held-out peak-rise WAPE: trained {trained:.4}, untrained {before:.4}, base {base:.4}"
    );
    assert!(
        trained < 0.9 * before,
        "trained {trained} vs untrained {before}"
    );
    assert!(trained < 0.9 * base, "trained {trained} vs its base {base}");
}

#[test]
fn cuda_without_feature_or_driver_is_a_clear_error() {
    let c = small_config();
    let data = dataset(&c);
    match train_with(BackendKind::Cuda, &data, &c, &mut NoProgress) {
        Err(e) => {
            let m = e.to_string();
            assert!(m.contains("cuda") || m.contains("CUDA"), "{m}");
        }
        // A machine with a GPU and the feature may train: that is fine too.
        Ok(_) => {
            let built_with_cuda = cfg!(feature = "cuda");
            assert!(built_with_cuda, "trained on CUDA without the feature");
        }
    }
}

#[test]
fn empty_training_set_is_an_error() {
    let c = small_config();
    let empty = vec![Series::from_trace("e", &Default::default(), c.step, 5)];
    assert!(train_with(BackendKind::Ndarray, &empty, &c, &mut NoProgress).is_err());
}

/// A window longer than every trace is cut to the longest one, with a warning: the
/// same model as asking for that window (its padded steps would cost time and teach
/// nothing; at 100,000 steps training did not finish in a minute).
#[test]
fn a_window_longer_than_every_trace_is_cut_to_the_longest() {
    let c = small_config();
    let data = dataset(&c);
    let longest = data.iter().map(Series::len).max().unwrap();
    let mut exact = c.clone();
    exact.train.window = longest;
    let mut huge = c.clone();
    huge.train.window = 100_000;
    let a = train_with(BackendKind::Ndarray, &data, &exact, &mut NoProgress).unwrap();
    let t = std::time::Instant::now();
    let b = train_with(BackendKind::Ndarray, &data, &huge, &mut NoProgress).unwrap();
    // The same weights (the configuration each records is the one asked for).
    let mut bw = b.weights.clone();
    bw.config = a.weights.config.clone();
    assert_eq!(a.weights, bw);
    assert!(
        b.warnings
            .iter()
            .any(|w| w.contains(&format!("longest trace ({longest} steps)"))),
        "{:?}",
        b.warnings
    );
    assert!(t.elapsed().as_secs() < 60, "{:?}", t.elapsed());
}
