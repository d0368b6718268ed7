//! Tests of the modelled warm-up ([`super`]).

use memcast_trace::{Event, StaticBlock};

use super::*;
use crate::backend::sim::SimBackend;
use crate::replay::pytorch::{PytorchConfig, PytorchEmu};
use crate::replay::{run_warm, ReplayOptions};

const MIB: u64 = 1 << 20;

pub(crate) fn statics(sizes: &[u64]) -> Vec<StaticBlock> {
    (0..sizes.len())
        .map(|i| StaticBlock {
            id: 1000 + i as u64,
            bytes: sizes[i],
            stream: 0,
        })
        .collect()
}

/// `+id:bytes` allocates, `-id` frees, `|` is an iteration boundary.
pub(crate) fn events(prog: &[(char, u64, u64)]) -> Vec<Event> {
    prog.iter()
        .enumerate()
        .map(|(i, &(op, id, bytes))| Event {
            time_us: i as u64,
            kind: match op {
                '+' => EventKind::Alloc {
                    id,
                    bytes,
                    stream: 0,
                },
                '-' => EventKind::Free { id },
                _ => EventKind::IterationBoundary,
            },
        })
        .collect()
}

/// One Adam-trained 9 MiB parameter: the parameter and its two state tensors are
/// static; each iteration holds two 12 MiB activations, frees them in backward while
/// creating the gradient, runs a step (a 9 MiB temporary), and frees the gradient.
fn adam_trace() -> Trace {
    let iteration = |base: u64| {
        vec![
            ('+', base, 12 * MIB),
            ('+', base + 1, 12 * MIB),
            ('-', base + 1, 0),
            ('+', base + 2, 9 * MIB), // gradient
            ('-', base, 0),
            ('+', base + 3, 9 * MIB), // step temporary
            ('-', base + 3, 0),
            ('-', base + 2, 0), // zero_grad
        ]
    };
    let mut prog = vec![('|', 0, 0)];
    prog.extend(iteration(1));
    prog.push(('|', 0, 0));
    prog.extend(iteration(11));
    prog.push(('|', 0, 0));
    let t = Trace {
        static_blocks: statics(&[9 * MIB, 9 * MIB, 9 * MIB]),
        events: events(&prog),
        ..Default::default()
    };
    t.validate().unwrap();
    t
}

#[test]
fn optimizer_state_is_recognised_by_its_copies_of_parameter_sizes() {
    let t = |sizes: &[u64]| Trace {
        static_blocks: statics(sizes),
        ..Default::default()
    };
    // Adam: three of each parameter size; a small one-off buffer does not matter.
    assert_eq!(state_copies(&t(&[8, 8, 8, 4, 4, 4, 4, 4, 4, 1])), 3);
    // Momentum SGD: two of each.
    assert_eq!(state_copies(&t(&[8, 8, 4, 4, 4, 4])), 2);
    // Momentum SGD over twelve identical layers (counts of 24, also multiples of
    // 3): the one-off tensors, two copies each, decide.
    let mut sgd = vec![100u64; 24];
    sgd.extend([8, 8]);
    assert_eq!(state_copies(&t(&sgd)), 2);
    // Only multiples of 6: Adam or SGD cannot be told apart: no state assumed.
    assert_eq!(state_copies(&t(&[100; 12])), 1);
    // Inference: repeated layers, but the one-off embedding breaks the pattern.
    assert_eq!(state_copies(&t(&[50, 6, 6, 6, 6, 6, 6])), 1);
    assert_eq!(state_copies(&t(&[])), 1);
    // Sizes from the input cannot overflow the shares.
    assert_eq!(state_copies(&t(&[u64::MAX; 3])), 3);
    // Parameters first, in order; state parameter by parameter.
    let tr = t(&[8, 4, 8, 4, 8, 4, 1]);
    let p = plan(
        &Trace {
            events: events(&[('|', 0, 0), ('|', 0, 0)]),
            ..tr
        },
        Warmup::First,
        0,
        StaticOrder::Trace,
    )
    .unwrap();
    assert_eq!(p.copies, 3);
    assert_eq!(p.before, vec![0, 1, 6]);
    assert_eq!(p.state, vec![2, 4, 3, 5]);
}

#[test]
fn the_step_point_is_after_backward_before_the_step_and_zero_grad() {
    let t = adam_trace();
    let p = plan(&t, Warmup::First, 0, StaticOrder::Trace).unwrap();
    assert_eq!(p.iteration, 1..9);
    // Events 1..9: +a +b -b +g -a | +tmp -tmp -g: least held after `-a`.
    assert_eq!(p.step_at, 6);
    assert_eq!(p.before, vec![0]);
    assert_eq!(p.state, vec![1, 2]);
    // Without any allocation after the peak, the state comes at the end.
    let flat = Trace {
        events: events(&[('|', 0, 0), ('+', 1, 5), ('-', 1, 0), ('|', 0, 0)]),
        ..Default::default()
    };
    assert_eq!(step_point(&flat, 1..3), 3);
    assert!(plan(&flat, Warmup::None, 0, StaticOrder::Trace).is_none());
    let no_iteration = Trace {
        events: events(&[('|', 0, 0), ('+', 1, 5)]),
        ..Default::default()
    };
    assert!(plan(&no_iteration, Warmup::First, 0, StaticOrder::Trace).is_none());
}

/// The rule reads synthetic traces too: a generated BERT trained with AdamW has its
/// state recognised and placed as on the real trace (the same layout gain); an
/// inference trace has none, and its warm-up changes nothing.
#[test]
fn synthetic_traces_get_the_same_warm_up() {
    use memcast_trace::synth::{generate, Family, Mode, SynthConfig};
    let peak = |t: &Trace, warmup| {
        let opts = ReplayOptions {
            policy: crate::replay::Policy::Pytorch,
            pytorch: PytorchConfig {
                warmup,
                ..Default::default()
            },
            ..Default::default()
        };
        crate::replay::replay(t, &opts).unwrap().peak_reserved_bytes
    };
    let mut cfg = SynthConfig::preset(Family::Bert);
    cfg.iterations = 2;
    let train = generate(&cfg).unwrap();
    assert_eq!(
        plan(&train, Warmup::First, 0, StaticOrder::Trace)
            .unwrap()
            .copies,
        3
    );
    assert!(peak(&train, Warmup::First) < peak(&train, Warmup::None));
    cfg.mode = Mode::Infer;
    let infer = generate(&cfg).unwrap();
    assert_eq!(
        plan(&infer, Warmup::First, 0, StaticOrder::Trace)
            .unwrap()
            .copies,
        1
    );
    assert_eq!(peak(&infer, Warmup::First), peak(&infer, Warmup::None));
}

/// Worked by hand from PyTorch's rules (1-10 MiB requests take 20 MiB segments,
/// larger ones their size rounded to 2 MiB; large blocks split when more than
/// 1 MiB remains).
#[test]
fn the_warm_up_puts_the_state_where_the_activations_were() {
    let t = adam_trace();
    let replay = |warmup| {
        let cfg = PytorchConfig {
            warmup,
            ..Default::default()
        };
        let opts = ReplayOptions {
            check_every: 1,
            ..Default::default()
        };
        let emu = PytorchEmu::new(SimBackend::h200(), cfg.clone());
        let r = run_warm(&t, emu, &opts, cfg.warmup_plan(&t).as_ref()).unwrap();
        (r.peak_reserved_bytes / MIB, r.device_allocs)
    };
    // Cold: the three 9 MiB statics fill 20 + 20 MiB (2 + 11 MiB left), so both
    // activations need 12 MiB segments: 64 MiB. Gradient and temporary fit later.
    assert_eq!(replay(Warmup::None), (64, 4));
    // Warm: the parameter takes a 20 MiB segment (11 left), the activations two
    // 12 MiB ones; backward frees them and the gradient takes the 11 MiB block;
    // the state then splits the two free 12 MiB blocks (3 MiB left each), so the
    // step's 9 MiB temporary needs a 20 MiB segment: 64 MiB after warm-up. The
    // recording's first activation splits that segment, the second needs a new
    // 12 MiB one: 76 MiB in 5 segments.
    assert_eq!(replay(Warmup::First), (76, 5));

    // The layout after the warm-up alone: the state sits in the activations' place.
    let mut emu = PytorchEmu::new(SimBackend::h200(), PytorchConfig::default());
    let p = plan(&t, Warmup::First, 0, StaticOrder::Trace).unwrap();
    let statics = run(&t, &mut emu, &p, &mut |_: &mut _, _, _| Ok(())).unwrap();
    assert_eq!(
        statics.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    let layout: Vec<Vec<(u64, bool)>> = emu
        .segments()
        .into_iter()
        .map(|s| s.blocks.iter().map(|&(b, a)| (b / MIB, a)).collect())
        .collect();
    assert_eq!(
        layout,
        vec![
            vec![(9, true), (11, false)],
            vec![(9, true), (3, false)],
            vec![(9, true), (3, false)],
            vec![(20, false)],
        ]
    );
}

#[test]
fn creation_order_puts_recorded_frees_first_then_size() {
    let mut t = Trace {
        static_blocks: statics(&[4, 8, 2, 8]),
        events: events(&[('-', 1002, 0), ('-', 1000, 0)]),
        ..Default::default()
    };
    assert_eq!(creation_order(&t, StaticOrder::SizeDesc), vec![2, 0, 1, 3]);
    assert_eq!(creation_order(&t, StaticOrder::SizeAsc), vec![2, 0, 1, 3]);
    t.events.clear();
    assert_eq!(creation_order(&t, StaticOrder::SizeDesc), vec![1, 3, 0, 2]);
    assert_eq!(creation_order(&t, StaticOrder::SizeAsc), vec![2, 0, 1, 3]);
    assert_eq!(creation_order(&t, StaticOrder::Trace), vec![0, 1, 2, 3]);
}

/// The emulation's default order carries no layout: permuting a real trace's static
/// blocks (whose order is PyTorch's final layout) leaves its result unchanged, while
/// the trace's own order changes it.
#[test]
fn the_default_order_ignores_the_order_of_static_blocks() {
    let peak = |tr: &Trace, order: StaticOrder| {
        let cfg = PytorchConfig {
            static_order: order,
            ..Default::default()
        };
        let backend = SimBackend::new(u64::MAX / 4, Default::default());
        let emu = PytorchEmu::new(backend, cfg.clone());
        run_warm(
            tr,
            emu,
            &ReplayOptions::default(),
            cfg.warmup_plan(tr).as_ref(),
        )
        .unwrap()
        .peak_reserved_bytes
    };
    let mut trace_order_mattered = 0;
    for b in memcast_trace::bundled::ALL {
        let t = b.load().unwrap();
        let mut shuffled = t.clone();
        // A fixed permutation: reversal, then a rotation.
        shuffled.static_blocks.reverse();
        let k = shuffled.static_blocks.len() / 3;
        shuffled.static_blocks.rotate_left(k);
        assert_eq!(
            peak(&t, StaticOrder::SizeDesc),
            peak(&shuffled, StaticOrder::SizeDesc),
            "{}",
            b.name
        );
        trace_order_mattered +=
            (peak(&t, StaticOrder::Trace) != peak(&shuffled, StaticOrder::Trace)) as usize;
    }
    assert!(trace_order_mattered > 0);
}

/// A trace recorded from its process's start holds its warm-up: `auto` models none.
/// One that allocates before its first boundary but has static blocks, or has no
/// static blocks but starts at a boundary, still gets one.
#[test]
fn a_trace_recorded_from_the_start_gets_no_modelled_warm_up() {
    let prog = [
        ('+', 1, 9 * MIB), // the model, built before the first boundary
        ('+', 2, 12 * MIB),
        ('-', 2, 0), // its warm-up iteration
        ('|', 0, 0),
        ('+', 3, 12 * MIB),
        ('-', 3, 0),
        ('|', 0, 0),
    ];
    let mut t = Trace {
        events: events(&prog),
        ..Default::default()
    };
    assert!(holds_its_own_warm_up(&t));
    assert!(plan(&t, Warmup::Auto, 0, StaticOrder::default()).is_none());
    // Asked for, a modelled warm-up is still made.
    assert!(plan(&t, Warmup::First, 0, StaticOrder::default()).is_some());
    t.static_blocks = statics(&[MIB]);
    assert!(!holds_its_own_warm_up(&t));
    assert!(plan(&t, Warmup::Auto, 0, StaticOrder::default()).is_some());
    t.static_blocks.clear();
    t.events = events(&prog[3..]);
    assert!(!holds_its_own_warm_up(&t));
    assert!(plan(&t, Warmup::Auto, 0, StaticOrder::default()).is_some());
}
