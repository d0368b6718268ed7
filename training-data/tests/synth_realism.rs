//! Realism check of the synthetic traces against the real PyTorch recordings: the
//! synthetic ResNet-50 and GPT-2-small peaks of requested bytes (static + peak live)
//! land within 30% of the real traces'.

use memcast_trace::model::EventKind;
use memcast_trace::synth::{generate, SynthConfig};
use memcast_trace::Trace;

/// PyTorch's own `peak_allocated` for the same runs (pytorch_allocator_figures.jsonl).
const RESNET50_REAL_PEAK: u64 = 5_855_043_584;
const GPT2_REAL_PEAK: u64 = 14_437_960_192;

fn peak_live(t: &Trace) -> u64 {
    let mut sizes = std::collections::HashMap::new();
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

fn summary(t: &Trace) -> (u64, u64, usize) {
    let allocs = t
        .events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Alloc { .. }))
        .count();
    (
        t.static_bytes(),
        peak_live(t),
        allocs / t.iterations().max(1),
    )
}

fn check(name: &str, t: &Trace, real: u64) {
    t.validate().unwrap();
    let (st, pk, per_iter) = summary(t);
    let synth = st + pk;
    let ratio = synth as f64 / real as f64;
    eprintln!(
        "{name}: static {st} + peak live {pk} = {synth} vs real {real} (ratio {ratio:.3}), {per_iter} allocs/iteration, {} events",
        t.events.len()
    );
    assert!((0.7..=1.3).contains(&ratio), "{name}: ratio {ratio:.3}");
}

#[test]
fn resnet50_peak_within_30_percent_of_real() {
    let t = generate(&SynthConfig::resnet50()).unwrap();
    check("resnet50_b64_train", &t, RESNET50_REAL_PEAK);
}

#[test]
fn gpt2_small_peak_within_30_percent_of_real() {
    let t = generate(&SynthConfig::gpt2_small()).unwrap();
    check("gpt2_b8_s1024_train_bf16", &t, GPT2_REAL_PEAK);
}
