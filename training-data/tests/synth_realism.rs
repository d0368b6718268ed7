//! Realism check of the synthetic traces against the real PyTorch recordings bundled in
//! `training-data/traces/`: the synthetic ResNet-50 (batch 64, 224x224, fp32, SGD) and
//! GPT-2-small (batch 8, seq 1024, bf16 autocast, AdamW) peaks of requested bytes
//! (static + peak live) land within 30% of the real traces' (they land within 0.1%).
//! Static bytes (1%) and allocations per iteration (10%) are checked too, and the same
//! for BERT-base and the dynamic recordings.
//!
//! `cargo test -p memcast-trace --test synth_realism -- --nocapture` prints the table
//! quoted in docs/synthetic.md.

use std::path::PathBuf;

use memcast_trace::io::load_trace;
use memcast_trace::stats::TraceStats;
use memcast_trace::synth::{generate, SynthConfig};
use memcast_trace::Trace;

fn real(name: &str) -> Trace {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("traces")
        .join(format!("{name}.mctrace"));
    load_trace(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn real_first_iteration_allocs(t: &Trace) -> u64 {
    use memcast_trace::EventKind;
    let mut boundaries = 0;
    let mut n = 0;
    for e in &t.events {
        match e.kind {
            EventKind::IterationBoundary => boundaries += 1,
            EventKind::Alloc { .. } if boundaries == 1 => n += 1,
            _ => {}
        }
        if boundaries == 2 {
            break;
        }
    }
    n
}

fn per_iteration_allocs(s: &TraceStats) -> f64 {
    s.allocs as f64 / s.iterations.max(1) as f64
}

fn compare(name: &str, synth: &Trace) {
    synth.validate().unwrap();
    let real = real(name);
    let (s, r) = (
        TraceStats::compute(synth).unwrap(),
        TraceStats::compute(&real).unwrap(),
    );
    let ratio = |a: f64, b: f64| a / b;
    let peak = ratio(s.peak_requested_bytes as f64, r.peak_requested_bytes as f64);
    let stat = ratio(s.static_bytes as f64, r.static_bytes as f64);
    let allocs = ratio(per_iteration_allocs(&s), per_iteration_allocs(&r));
    let iter_us = ratio(
        s.duration_us as f64 / s.iterations.max(1) as f64,
        r.duration_us as f64 / r.iterations.max(1) as f64,
    );
    eprintln!("| {name} | metric | synthetic | real | ratio |");
    eprintln!(
        "| | peak requested B | {} | {} | {peak:.4} |",
        s.peak_requested_bytes, r.peak_requested_bytes
    );
    eprintln!(
        "| | static B | {} | {} | {stat:.4} |",
        s.static_bytes, r.static_bytes
    );
    eprintln!(
        "| | static blocks | {} | {} | |",
        s.static_blocks, r.static_blocks
    );
    eprintln!(
        "| | peak live B | {} | {} | {:.4} |",
        s.peak_live_bytes,
        r.peak_live_bytes,
        s.peak_live_bytes as f64 / r.peak_live_bytes as f64
    );
    eprintln!(
        "| | allocs / iteration | {:.0} | {:.0} | {allocs:.3} |",
        per_iteration_allocs(&s),
        per_iteration_allocs(&r)
    );
    eprintln!(
        "| | distinct sizes | {} | {} | |",
        s.distinct_sizes, r.distinct_sizes
    );
    eprintln!(
        "| | us / iteration | {:.0} | {:.0} | {iter_us:.3} |",
        s.duration_us as f64 / s.iterations as f64,
        r.duration_us as f64 / r.iterations as f64
    );
    assert_eq!(s.iterations, r.iterations);
    assert!((0.7..=1.3).contains(&peak), "{name}: peak ratio {peak:.3}");
    assert!(
        (0.99..=1.01).contains(&stat),
        "{name}: static ratio {stat:.3}"
    );
    assert!(
        (0.9..=1.1).contains(&allocs),
        "{name}: allocs/iteration ratio {allocs:.3}"
    );
}

#[test]
fn resnet50_peak_within_30_percent_of_real() {
    compare(
        "resnet50_b64_train",
        &generate(&SynthConfig::resnet50()).unwrap(),
    );
}

#[test]
fn gpt2_small_peak_within_30_percent_of_real() {
    compare(
        "gpt2_b8_s1024_train_bf16",
        &generate(&SynthConfig::gpt2_small()).unwrap(),
    );
}

/// Dynamic shapes: the same choice lists as the real recordings, our own seeded draws.
/// Both reach the largest shape, so their peaks are comparable.
#[test]
fn dynamic_batch_and_multiscale_peaks_within_30_percent_of_real() {
    use memcast_trace::synth::{DynParam, Dynamic};
    let gpt = SynthConfig {
        seq: 512,
        iterations: 12,
        dynamic: Some(Dynamic {
            param: DynParam::Batch,
            values: vec![2, 4, 8, 12],
        }),
        ..SynthConfig::gpt2_small()
    };
    compare("gpt2_dynbatch_s512_train_bf16", &generate(&gpt).unwrap());
    let cnn = SynthConfig {
        batch: 32,
        iterations: 12,
        dynamic: Some(Dynamic {
            param: DynParam::Image,
            values: vec![160, 192, 224, 256],
        }),
        ..SynthConfig::resnet50()
    };
    compare("resnet50_multiscale_b32_train", &generate(&cnn).unwrap());
}

/// KV-cached generation: one synthetic request of the largest real shape (batch 16,
/// prompt 384, 128 new tokens, fp32) against the real trace, whose peak is reached in
/// its requests of that shape.
#[test]
fn generation_request_peak_within_30_percent_of_real() {
    use memcast_trace::synth::{GenSpec, Mode, Precision};
    let cfg = SynthConfig {
        mode: Mode::Generate,
        precision: Precision::Fp32,
        iterations: 1,
        generation: GenSpec {
            batches: vec![16],
            prompts: vec![384],
            new_tokens: vec![128],
        },
        ..SynthConfig::gpt2_small()
    };
    let synth = generate(&cfg).unwrap();
    synth.validate().unwrap();
    let s = TraceStats::compute(&synth).unwrap();
    let r = TraceStats::compute(&real("gpt2_generate_dynamic")).unwrap();
    let peak = s.peak_live_bytes as f64 / r.peak_live_bytes as f64;
    // The real trace's first request has this shape: compare its allocation count.
    let real_first = real_first_iteration_allocs(&real("gpt2_generate_dynamic"));
    let allocs = s.allocs as f64 / real_first as f64;
    eprintln!(
        "gpt2_generate_dynamic: request peak live {} vs real {} ({peak:.3}), static {} vs {}, allocs {} vs {} ({allocs:.3}), us {}",
        s.peak_live_bytes, r.peak_live_bytes, s.static_bytes, r.static_bytes, s.allocs, real_first, s.duration_us
    );
    assert!((0.7..=1.3).contains(&peak), "peak ratio {peak:.3}");
    assert!((0.85..=1.15).contains(&allocs), "allocs ratio {allocs:.3}");
    assert_eq!(s.static_bytes, r.static_bytes, "fp32 weights + workspaces");
}

/// BERT-base MLM (batch 32, seq 128, fp32, AdamW) and its dynamic-sequence variant
/// (batch 16, seq in {64, 128, 256, 512}, 12 iterations, our own draws).
#[test]
fn bert_peaks_within_30_percent_of_real() {
    use memcast_trace::synth::{DynParam, Dynamic};
    compare(
        "bert_base_b32_s128_train",
        &generate(&SynthConfig::bert_base()).unwrap(),
    );
    let dynseq = SynthConfig {
        batch: 16,
        iterations: 12,
        dynamic: Some(Dynamic {
            param: DynParam::Seq,
            values: vec![64, 128, 256, 512],
        }),
        ..SynthConfig::bert_base()
    };
    compare("bert_dynseq_b16_train", &generate(&dynseq).unwrap());
}
