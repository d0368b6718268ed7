//! The PyTorch emulation against PyTorch itself: on every bundled real trace, the
//! emulated peak reserved bytes against the native run's own `peak_reserved`
//! (`pytorch_allocator_figures.jsonl`). Read only here, never by the emulation.

use memcast_trace::bundled;

use crate::replay::pytorch::PytorchConfig;
use crate::replay::warmup::Warmup;
use crate::replay::{replay, Policy, ReplayOptions};

/// The fidelity the emulation is held to.
const TOLERANCE: f64 = 0.05;

/// The trace whose recording reserved no memory, its error with the first iteration as
/// the warm-up (docs/allocator.md, "Validating the PyTorch emulation": its warm-up ran
/// at its largest shape, which `auto` infers from the recording).
const LARGEST_WARMUP: (&str, f64) = ("resnet50_multiscale_b32_train", 0.102);

/// The emulation's peak reserved bytes relative to PyTorch's, with `warmup` (`None`:
/// the default configuration, what `memcast replay --policy pytorch` runs).
fn error(name: &str, warmup: Option<Warmup>) -> f64 {
    let t = bundled::get(name).unwrap().load().unwrap();
    let mut pytorch = PytorchConfig::default();
    if let Some(w) = warmup {
        pytorch.warmup = w;
    }
    let opts = ReplayOptions {
        policy: Policy::Pytorch,
        pytorch,
        ..Default::default()
    };
    let r = replay(&t, &opts).unwrap();
    let torch = bundled::pytorch_figures(name, "pytorch-native")
        .unwrap()
        .peak_reserved;
    r.peak_reserved_bytes as f64 / torch as f64 - 1.0
}

#[test]
fn emulated_peak_reserved_is_within_five_percent_of_pytorch() {
    for b in bundled::ALL {
        let e = error(b.name, None);
        assert!(e.abs() < TOLERANCE, "{}: {:+.1}%", b.name, 100.0 * e);
    }
}

#[test]
fn auto_picks_the_largest_warm_up_only_where_the_recording_reserved_nothing() {
    for b in bundled::ALL {
        let t = b.load().unwrap();
        let opts = ReplayOptions {
            policy: Policy::Pytorch,
            ..Default::default()
        };
        let r = replay(&t, &opts).unwrap();
        let want = if b.name == LARGEST_WARMUP.0 {
            "largest"
        } else {
            "first"
        };
        assert_eq!(r.extra["warmup"]["iteration"], want, "{}", b.name);
    }
    // With the first iteration as its warm-up, that trace misses as documented.
    let (name, documented) = LARGEST_WARMUP;
    let e = error(name, Some(Warmup::First));
    assert!(
        (e - documented).abs() < 0.005,
        "{name} (first): {:+.1}%",
        100.0 * e
    );
}

#[test]
fn auto_reads_only_source_recordings() {
    use crate::replay::warmup::reserved_nothing_while_recording;
    let mut t = bundled::get(LARGEST_WARMUP.0).unwrap().load().unwrap();
    assert!(reserved_nothing_while_recording(&t));
    // A trace with no source recording (synthetic, native) has no evidence either way.
    t.meta.source = "synthetic:resnet".into();
    assert!(!reserved_nothing_while_recording(&t));
    // A recording that reserved a segment started from less than it needed.
    let mut t = bundled::get(LARGEST_WARMUP.0).unwrap().load().unwrap();
    t.source_segments.push(memcast_trace::SourceSegmentEvent {
        before_event: 0,
        bytes: 2 << 20,
        alloc: true,
    });
    assert!(!reserved_nothing_while_recording(&t));
}

#[test]
fn without_the_warm_up_the_static_traces_miss_by_more() {
    // The warm-up is what closes bert_base's gap: allocating the optimizer state
    // first, densely, leaves it 7% above PyTorch.
    let e = error("bert_base_b32_s128_train", Some(Warmup::None));
    assert!(
        e > TOLERANCE,
        "bert_base without warm-up: {:+.1}%",
        100.0 * e
    );
}

#[test]
fn the_warm_up_recognises_each_recorded_optimizer() {
    // From the snapshots' annotations (`Optimizer.step#AdamW.step`, `#SGD.step`):
    // AdamW keeps two state tensors per parameter, momentum SGD one; gpt2_generate has
    // no optimizer. The emulation infers this from the static blocks alone.
    for (name, copies) in [
        ("resnet50_b64_train", 2),
        ("gpt2_b8_s1024_train_bf16", 3),
        ("bert_base_b32_s128_train", 3),
        ("mobilenet_v3_b128_train", 2),
        ("bert_dynseq_b16_train", 3),
        ("gpt2_dynbatch_s512_train_bf16", 3),
        ("resnet50_multiscale_b32_train", 2),
        ("gpt2_generate_dynamic", 1),
    ] {
        let t = bundled::get(name).unwrap().load().unwrap();
        let opts = ReplayOptions {
            policy: Policy::Pytorch,
            ..Default::default()
        };
        let r = replay(&t, &opts).unwrap();
        assert_eq!(r.extra["warmup"]["state_copies"], copies, "{name}");
    }
}
