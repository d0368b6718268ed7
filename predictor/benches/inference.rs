//! Embedded inference (one step update + forecast) against burn's forward on the same
//! input, default model shape. Run: `cargo bench -p memcast-predictor --features train`.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use memcast_predictor::norm::NormStats;
use memcast_predictor::train::backend::burn_forward;
use memcast_predictor::train::model::init_weights;
use memcast_predictor::{ArtifactConfig, EmbeddedLstm, Forecast, StepInput, MAX_HORIZON};
use memcast_trace::features::{CHANNELS, FEATURES};

fn bench(c: &mut Criterion) {
    let config = ArtifactConfig::default();
    let norm = NormStats {
        feature_mean: vec![0.0; FEATURES],
        feature_std: vec![1.0; FEATURES],
        target_std: vec![1.0; CHANNELS],
    };
    let w = init_weights(&config, norm, 1).unwrap();
    let mut m = EmbeddedLstm::new(w.clone()).unwrap();
    let mut features = [0.3f32; FEATURES];
    features[14] = 1.0; // has a previous iteration: the LSTM output is used
    let input = StepInput {
        step_index: 0,
        features,
        base: [[1e6; CHANNELS]; MAX_HORIZON],
        scale: 1e6,
        repeat: false,
    };
    let mut out = Forecast::default();
    let mut g = c.benchmark_group("inference");
    g.bench_function("embedded step+forecast", |b| {
        b.iter(|| {
            m.forecast(black_box(&input), &mut out).unwrap();
            black_box(&out);
        })
    });
    g.bench_function("burn forward, 1 step", |b| {
        b.iter(|| black_box(burn_forward(&w, black_box(&features), 1, 1).unwrap()))
    });
    let window = config.train.window;
    let xs: Vec<f32> = features
        .iter()
        .copied()
        .cycle()
        .take(window * FEATURES)
        .collect();
    g.bench_function("burn forward, 32-step window", |b| {
        b.iter(|| black_box(burn_forward(&w, black_box(&xs), 1, window).unwrap()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
