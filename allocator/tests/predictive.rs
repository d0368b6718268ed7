//! Predictive mode: the online path, forecasters that lie, model files that are wrong.
//!
//! - Programs of alloc / free / boundary run on a capped `host` device (real bytes,
//!   stamped and verified) under adversarial forecasters (random, huge, zero, NaN,
//!   stale, slow) with `check_invariants()` after every step; every request the
//!   reactive allocator serves under the same cap, the predictive one serves too.
//! - The steps the allocator's online path closes equal an independent computation
//!   from the event list.

use std::sync::{Arc, Mutex};

use memcast_alloc::backend::host::HostBackend;
use memcast_alloc::backend::layers::Limit;
use memcast_alloc::backend::sim::SimBackend;
use memcast_alloc::backend::{DeviceBackend, MemRef};
use memcast_alloc::config::{Actions, AllocConfig, PageRelease, Placement};
use memcast_alloc::{AllocError, Allocation, Allocator};
use memcast_predictor::forecaster::Forecaster;
use memcast_predictor::{Forecast, MAX_HORIZON};
use memcast_trace::features::{
    size_class, Step, StepFeaturizer, CHANNELS, CH_FREED, CH_PEAK, CH_TOTAL,
};
use proptest::prelude::*;

mod common;
use common::{stamp, Op, MIB};

/// Forecasters that lie in every way a broken model or a broken thread could.
#[derive(Debug, Clone, Copy)]
enum Liar {
    Random(u64),
    Huge,
    Zero,
    Nan,
    /// The first forecast it made, forever.
    Stale,
    /// Correct-looking but slow: 200 us per step (on the service thread).
    Slow,
}

struct Adversary {
    kind: Liar,
    first: Option<Forecast>,
}

impl Forecaster for Adversary {
    fn name(&self) -> &'static str {
        "adversary"
    }
    fn horizon(&self) -> usize {
        5
    }
    fn forecast(&mut self, step: &Step, f: &StepFeaturizer, out: &mut Forecast) -> bool {
        out.horizon = 5;
        match self.kind {
            Liar::Random(ref mut s) => {
                for b in out.bytes.iter_mut() {
                    for v in b.iter_mut() {
                        *s ^= *s << 13;
                        *s ^= *s >> 7;
                        *s ^= *s << 17;
                        *v = (*s % (1 << 40)) as f64;
                    }
                }
            }
            Liar::Huge => out.bytes = [[1e18; CHANNELS]; MAX_HORIZON],
            Liar::Zero => out.bytes = [[0.0; CHANNELS]; MAX_HORIZON],
            Liar::Nan => out.bytes = [[f64::NAN; CHANNELS]; MAX_HORIZON],
            Liar::Stale => {
                if self.first.is_none() {
                    let mut g = *out;
                    for (h, b) in g.bytes.iter_mut().enumerate() {
                        *b = f.base_forecast(h + 1);
                    }
                    self.first = Some(g);
                }
                out.bytes = self.first.expect("set").bytes;
            }
            Liar::Slow => {
                std::thread::sleep(std::time::Duration::from_micros(200));
                for (h, b) in out.bytes.iter_mut().enumerate() {
                    *b = f.base_forecast(h + 1);
                }
            }
        }
        let _ = step;
        true
    }
}

fn op() -> impl Strategy<Value = Op> {
    common::op(3, 3, 24 * MIB)
}

fn liar() -> impl Strategy<Value = Liar> {
    prop_oneof![
        any::<u64>().prop_map(|s| Liar::Random(s | 1)),
        Just(Liar::Huge),
        Just(Liar::Zero),
        Just(Liar::Nan),
        Just(Liar::Stale),
        Just(Liar::Slow),
    ]
}

type Dev = Limit<HostBackend>;

fn device(cap: u64) -> Dev {
    Limit::new(HostBackend::new(cap), cap)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn lying_forecasts_cost_no_request_and_no_byte(
        kind in liar(),
        growable in any::<bool>(),
        release in any::<bool>(),
        presplit in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        let cap = 96 * MIB;
        let cfg = AllocConfig {
            growable_segments: growable,
            predictive_actions: Actions { release, presplit, ..Actions::all() },
            // The slow liar runs on the service thread, the others inline.
            forecast_thread: matches!(kind, Liar::Slow),
            ..AllocConfig::default()
        };
        // The same placement on both sides: `presplit` is planned placement.
        let placement = if presplit { Placement::Planned } else { cfg.placement };
        let mut reactive =
            Allocator::new(device(cap), AllocConfig { placement, ..cfg.clone() }).unwrap();
        let mut pred = Allocator::with_forecaster(
            device(cap),
            cfg,
            Box::new(Adversary { kind, first: None }),
        )
        .unwrap();
        let mut live: Vec<(Allocation, Option<Allocation>)> = Vec::new();
        for op in &ops {
            match *op {
                Op::Alloc { bytes } => {
                    let r = reactive.allocate(bytes, 0);
                    let p = pred.allocate(bytes, 0);
                    match (&r, &p) {
                        (Ok(_), Err(e)) => prop_assert!(false, "{kind:?}: reactive served {bytes}, predictive failed: {e}"),
                        (Err(AllocError::OutOfMemory { .. }), _) => {}
                        (Err(e), _) => prop_assert!(false, "unexpected error {e}"),
                        _ => {}
                    }
                    if let Ok(a) = p {
                        let s = stamp(&a);
                        pred.backend_mut().write(MemRef::Device(a.ptr), &s).unwrap();
                    }
                    if let Ok(ra) = r {
                        live.push((ra, p.ok()));
                    } else if let Ok(a) = p {
                        pred.deallocate(a, 0).unwrap();
                    }
                }
                Op::Free { pick } if !live.is_empty() => {
                    let (ra, pa) = live.swap_remove(pick % live.len());
                    reactive.deallocate(ra, 0).unwrap();
                    if let Some(a) = pa {
                        let s = stamp(&a);
                        let mut buf = vec![0u8; s.len()];
                        pred.backend_mut().read(MemRef::Device(a.ptr), &mut buf).unwrap();
                        prop_assert_eq!(buf, s, "bytes of a live allocation changed");
                        pred.deallocate(a, 0).unwrap();
                    }
                }
                Op::Free { .. } => {}
                Op::Boundary => {
                    reactive.iteration_boundary();
                    pred.iteration_boundary();
                }
            }
            pred.check_invariants().map_err(|e| TestCaseError::fail(format!("{kind:?}: {e}")))?;
            prop_assert!(pred.backend().used() <= cap);
        }
        for (ra, pa) in live {
            reactive.deallocate(ra, 0).unwrap();
            if let Some(a) = pa {
                pred.deallocate(a, 0).unwrap();
            }
        }
        pred.check_invariants().unwrap();
        prop_assert_eq!(pred.stats().requested.current, 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Growth and release ahead change only how much of a growable segment's tail is
    /// mapped and which free pages are backed, which placement never reads; the
    /// out-of-memory paths give that memory back first. So under any forecaster the
    /// predictive allocator places every run where the reactive one does and fails
    /// exactly where it fails, on a device small enough for both to run out.
    #[test]
    fn forecasts_move_no_run_and_add_no_failure(
        kind in liar(),
        release in any::<bool>(),
        peak in any::<bool>(),
        presplit in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        let cap = 96 * MIB;
        let cfg = AllocConfig {
            growable_segments: true,
            page_release: if peak { PageRelease::Peak } else { PageRelease::OnOom },
            // `presplit` is planned placement: the reactive side gets it too.
            placement: if presplit { Placement::Planned } else { Placement::BestFit },
            predictive_actions: Actions { release, presplit, ..Actions::all() },
            forecast_thread: false,
            ..AllocConfig::default()
        };
        let sim = || SimBackend::new(cap, Default::default());
        let mut reactive = Allocator::new(sim(), cfg.clone()).unwrap();
        let mut pred =
            Allocator::with_forecaster(sim(), cfg, Box::new(Adversary { kind, first: None }))
                .unwrap();
        // Both reserve their slab and large segments first, in the same order, so the
        // simulated device gives both the same addresses.
        for a in [&mut reactive, &mut pred] {
            for bytes in [512, 8 * MIB] {
                let x = a.allocate(bytes, 0).unwrap();
                a.deallocate(x, 0).unwrap();
            }
        }
        let mut live: Vec<(Allocation, Allocation)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Alloc { bytes } => {
                    match (reactive.allocate(bytes, 0), pred.allocate(bytes, 0)) {
                        (Ok(r), Ok(p)) => {
                            prop_assert_eq!(r.ptr, p.ptr, "{:?}: op {} ({} B) placed elsewhere", kind, i, bytes);
                            live.push((r, p));
                        }
                        (Err(AllocError::OutOfMemory { .. }), Err(AllocError::OutOfMemory { .. })) => {}
                        (r, p) => prop_assert!(false, "{kind:?}: op {i} ({bytes} B): reactive {:?}, predictive {:?}", r.map(|a| a.ptr), p.map(|a| a.ptr)),
                    }
                }
                Op::Free { pick } if !live.is_empty() => {
                    let (r, p) = live.swap_remove(pick % live.len());
                    reactive.deallocate(r, 0).unwrap();
                    pred.deallocate(p, 0).unwrap();
                }
                Op::Free { .. } => {}
                Op::Boundary => {
                    reactive.iteration_boundary();
                    pred.iteration_boundary();
                }
            }
            pred.check_invariants().map_err(|e| TestCaseError::fail(format!("{kind:?}: {e}")))?;
        }
    }
}

/// Records the steps the online path closes.
struct Recorder(Arc<Mutex<Vec<[u64; CHANNELS]>>>);

impl Forecaster for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }
    fn horizon(&self) -> usize {
        1
    }
    fn forecast(&mut self, step: &Step, _: &StepFeaturizer, _: &mut Forecast) -> bool {
        self.0.lock().unwrap().push(step.values);
        false
    }
}

/// An allocator in predictive mode over `f` on a simulated 64 GiB device, its
/// forecaster on the service thread or inline.
fn simulated(f: impl Forecaster + 'static, thread: bool) -> Allocator<SimBackend> {
    let cfg = AllocConfig {
        forecast_thread: thread,
        ..AllocConfig::default()
    };
    Allocator::with_forecaster(
        SimBackend::new(64 << 30, Default::default()),
        cfg,
        Box::new(f),
    )
    .unwrap()
}

/// On the forecast thread, a step reaches the forecaster as soon as it closes, not
/// hundreds of events later: a forecast that arrives after the rise it foresaw drives
/// nothing (handed over 256 events at a time, a real job's forecasts arrived beyond
/// their 5-step horizon and predictive mode made the device calls reactive mode made).
#[test]
fn a_closed_step_reaches_the_forecast_thread_without_more_events() {
    let steps = Arc::new(Mutex::new(Vec::new()));
    let mut a = simulated(Recorder(steps.clone()), true);
    a.iteration_boundary();
    let mut live = Vec::new();
    for _ in 0..16 {
        live.push(a.allocate(MIB, 0).unwrap());
    }
    let t = std::time::Instant::now();
    while steps.lock().unwrap().is_empty() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "a closed step of 16 allocations never reached the forecast thread"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(steps.lock().unwrap()[0][CH_TOTAL], 16 * MIB);
    for x in live {
        a.deallocate(x, 0).unwrap();
    }
}

/// Waits until the forecast thread has taken every chunk handed over to it (forecast
/// from it or dropped it); fails after `secs` seconds.
fn wait_for_the_service(a: &Allocator<SimBackend>, secs: u64) {
    let t = std::time::Instant::now();
    loop {
        let s = a.online().unwrap().service_stats().unwrap();
        if s.processed + s.dropped == s.submitted {
            return;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(secs),
            "the queue never drained: {s:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The same forecast every step (a steady job): 64 MiB more in the next step.
struct Steady;

impl Forecaster for Steady {
    fn name(&self) -> &'static str {
        "steady"
    }
    fn horizon(&self) -> usize {
        1
    }
    fn forecast(&mut self, _: &Step, _: &StepFeaturizer, out: &mut Forecast) -> bool {
        out.horizon = 1;
        out.bytes[0][CH_TOTAL] = (64 * MIB) as f64;
        out.bytes[0][CH_PEAK] = (64 * MIB) as f64;
        true
    }
}

/// On the forecast thread, every forecast reaches the allocator, also one that says
/// what the last said: a forecast sizes growth only within its horizon, so a steady
/// forecast left unpublished would leave a later rise to the reactive growth.
#[test]
fn a_steady_forecast_reaches_the_allocator_every_step() {
    let mut a = simulated(Steady, true);
    a.iteration_boundary();
    let steps = 12;
    for _ in 0..steps {
        let live: Vec<_> = (0..16).map(|_| a.allocate(MIB, 0).unwrap()).collect();
        for x in live {
            a.deallocate(x, 0).unwrap();
        }
        // The thread has forecast from every event handed over.
        wait_for_the_service(&a, 20);
    }
    // Each step's forecast is read at a later hand-over (the first one's a step
    // later): all but the last.
    let used = a.stats().forecasts_used;
    assert!(
        used >= steps - 1,
        "{used} forecasts read over {steps} steps"
    );
}

/// A forecaster that takes 5 ms a step (~6 events a millisecond): a service that cannot
/// keep up with any allocator, `check-invariants` builds included.
struct Sleepy;

impl Forecaster for Sleepy {
    fn name(&self) -> &'static str {
        "sleepy"
    }
    fn horizon(&self) -> usize {
        1
    }
    fn forecast(&mut self, _: &Step, _: &StepFeaturizer, _: &mut Forecast) -> bool {
        std::thread::sleep(std::time::Duration::from_millis(5));
        false
    }
}

/// While the forecast thread is behind (its queue full), the allocator hands its
/// events over every 256 instead of every 16 (dropping them unsent, as the full queue
/// would), and once the queue has room again, every 16 once more.
#[test]
fn a_service_behind_is_handed_fewer_chunks_until_it_catches_up() {
    let mut a = simulated(Sleepy, true);
    let chunks = |a: &Allocator<SimBackend>| a.online().unwrap().chunks;
    // Steps (and so the forecaster's calls) start at the first boundary.
    a.iteration_boundary();
    let pairs = 50_000u64;
    for _ in 0..pairs {
        let x = a.allocate(MIB, 0).unwrap();
        a.deallocate(x, 0).unwrap();
    }
    // The queue (16,384 events) takes 1,024 chunks of 16; the ~83,600 events after
    // them go 256 at a time (~330 hand-overs), with a chunk of 16 whenever the sleepy
    // thread has made room. Every 16: 6,250 hand-overs.
    let n = chunks(&a);
    assert!(n < 3_000, "{n} hand-overs for {} events", 2 * pairs);
    // Once the thread has caught up, a boundary empties the buffer and the next 16
    // events are one hand-over again.
    wait_for_the_service(&a, 60);
    a.iteration_boundary();
    let before = chunks(&a);
    let mut live = Vec::new();
    for _ in 0..15 {
        live.push(a.allocate(MIB, 0).unwrap());
    }
    assert_eq!(chunks(&a), before, "a hand-over before 16 events");
    live.push(a.allocate(MIB, 0).unwrap());
    assert_eq!(chunks(&a), before + 1, "no hand-over at 16 events");
    for x in live {
        a.deallocate(x, 0).unwrap();
    }
}

#[test]
fn the_online_path_closes_the_steps_an_independent_count_gives() {
    // A program with frees, boundaries and a burst within steps.
    let mut prog = Vec::new();
    let mut s = 12345u64;
    for it in 0..5 {
        prog.push(None);
        for k in 0..(70 + it * 9) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let bytes = match s % 4 {
                0 => 512 + s % 4000,
                1 => (1 + s % 16) * MIB,
                _ => (64 << 10) + s % (2 * MIB),
            };
            prog.push(Some((bytes, k % 3 == 0)));
        }
    }
    let steps = Arc::new(Mutex::new(Vec::new()));
    let mut a = simulated(Recorder(steps.clone()), false);
    let mut live = Vec::new();
    // The independent count: steps of 16 allocations, closed early at a boundary.
    let mut want: Vec<[u64; CHANNELS]> = Vec::new();
    let (mut open, mut open_allocs, mut open_any) = ([0u64; CHANNELS], 0, false);
    let (mut cur, mut start, mut peak) = (0u64, 0u64, 0u64);
    let close = |open: &mut [u64; CHANNELS],
                 start: &mut u64,
                 peak: &mut u64,
                 cur: u64,
                 want: &mut Vec<_>| {
        open[CH_PEAK] = *peak - *start;
        want.push(*open);
        *open = [0; CHANNELS];
        *start = cur;
        *peak = cur;
    };
    for p in &prog {
        match *p {
            None => {
                a.iteration_boundary();
                if open_any {
                    close(&mut open, &mut start, &mut peak, cur, &mut want);
                    open_allocs = 0;
                    open_any = false;
                }
            }
            Some((bytes, free_one)) => {
                live.push(a.allocate(bytes, 0).unwrap());
                cur += bytes;
                peak = peak.max(cur);
                open[size_class(bytes)] += bytes;
                open[CH_TOTAL] += bytes;
                open_allocs += 1;
                open_any = true;
                if open_allocs == 16 {
                    close(&mut open, &mut start, &mut peak, cur, &mut want);
                    open_allocs = 0;
                    open_any = false;
                }
                if free_one {
                    let x = live.swap_remove(live.len() / 2);
                    a.deallocate(x, 0).unwrap();
                    cur -= x.size;
                    open[CH_FREED] += x.size;
                    open_any = true;
                }
            }
        }
    }
    // Everything handed over: a boundary flushes the last chunk.
    a.iteration_boundary();
    if open_any {
        close(&mut open, &mut start, &mut peak, cur, &mut want);
    }
    let got = steps.lock().unwrap().clone();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "step {i}");
    }
}

#[test]
fn a_missing_or_corrupt_model_is_an_error_naming_the_file() {
    let dir = std::env::temp_dir().join(format!("memcast-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("nope.safetensors");
    let corrupt = dir.join("bad.safetensors");
    std::fs::write(&corrupt, b"not a safetensors file").unwrap();
    for path in [&missing, &corrupt] {
        let cfg = AllocConfig::default()
            .with_conf_string(&format!("predictive:true,model:{}", path.display()))
            .unwrap();
        let e = Allocator::new(SimBackend::new(1 << 30, Default::default()), cfg.clone())
            .unwrap_err()
            .to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
        // From the environment string: a warning and the reactive allocator.
        let a =
            Allocator::new_or_reactive(SimBackend::new(1 << 30, Default::default()), cfg).unwrap();
        assert!(a.online().is_none());
        assert!(!a.config().predictive);
    }
    let _ = std::fs::remove_dir_all(&dir);
    // The default model loads; unknown keys list the valid ones.
    let cfg = AllocConfig::default()
        .with_conf_string("predictive:true,horizon:4,predictive_actions:grow+release")
        .unwrap();
    let a = Allocator::new(SimBackend::new(1 << 30, Default::default()), cfg).unwrap();
    let o = a.online().expect("predictive");
    assert_eq!((o.forecaster(), o.horizon()), ("lstm", 4));
    let e = AllocConfig::default()
        .with_conf_string("predictiv:true")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("predictive_actions") && e.contains("min_block"),
        "{e}"
    );
    assert!(AllocConfig::default()
        .with_conf_string("predictive_actions:grow+teleport")
        .is_err());
    assert!(AllocConfig::default()
        .with_conf_string("horizon:9")
        .is_err());
}

#[test]
fn presplit_lays_out_the_forecast_iteration_and_the_oracles_is_exact() {
    // `presplit`: planned placement under predictive mode. With the oracle (the trace
    // itself as the forecast of every iteration) a static training trace is served
    // from its planned layout: far fewer device calls inside requests and less
    // reserved above the requested peak than the same actions without it; with the
    // LSTM it plans from the run's last iteration. Measured on ResNet-50: 89 -> 2
    // calls, 1.11% -> 0.57% (oracle); the LSTM's 89 calls and 1.25% unchanged.
    use memcast_alloc::replay::{replay, Policy, ReplayForecaster, ReplayOptions};
    let t = memcast_trace::bundled::get("resnet50_b64_train")
        .unwrap()
        .load()
        .unwrap();
    let run = |presplit: bool, forecaster: ReplayForecaster| {
        replay(
            &t,
            &ReplayOptions {
                policy: Policy::Predictive,
                forecaster,
                config: AllocConfig {
                    predictive_actions: Actions {
                        presplit,
                        ..Actions::default()
                    },
                    ..AllocConfig::default()
                },
                ..Default::default()
            },
        )
        .unwrap()
    };
    let (off, on) = (
        run(false, ReplayForecaster::Oracle),
        run(true, ReplayForecaster::Oracle),
    );
    assert!(off.extra["placement"].is_null());
    assert!(on.extra["placement"].is_object(), "{}", on.extra);
    assert!(
        on.critical_path_device_calls * 10 <= off.critical_path_device_calls,
        "{} vs {}",
        on.critical_path_device_calls,
        off.critical_path_device_calls
    );
    assert!(on.reserved_overhead < off.reserved_overhead);
    let lstm = run(true, ReplayForecaster::Lstm);
    assert!(lstm.extra["placement"].is_object());
    assert_eq!(lstm.peak_requested_bytes, on.peak_requested_bytes);
    let a = AllocConfig::default()
        .with_conf_string("predictive_actions:grow+presplit")
        .unwrap()
        .predictive_actions;
    assert!(a.presplit && a.grow && !a.spill);
    assert_eq!(a.label(), "grow+presplit");
}

/// A GPT-2 job of random sequence lengths as memcast saw it on an H100, from before
/// the model was built (`training-data/corpus/jobs/gpt2_dynseq_b8_bf16_job_complete.mctrace`):
/// its setup (the model built, the warm-up, the first iteration) ends at the first
/// boundary in one step that holds the setup's whole climb. With that step counted as
/// a rise seen and no level envelope (the rule before both), a forecast predicted the
/// climb again from near the peak: predictive mode reserved 60.05% above the peak of
/// requested bytes here (reactive 6.95%), as the job did on the GPU (57.52%). Either
/// bound alone prevents it; the test fails with both taken out.
#[test]
fn a_jobs_setup_does_not_make_a_forecast_climb_its_peak_again() {
    use memcast_alloc::replay::{replay, Policy, ReplayOptions};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../training-data/corpus/jobs/gpt2_dynseq_b8_bf16_job_complete.mctrace");
    let t = memcast_trace::io::load_trace(&path).unwrap();
    let run = |policy| {
        replay(
            &t,
            &ReplayOptions {
                policy,
                ..Default::default()
            },
        )
        .unwrap()
    };
    let (reactive, predictive) = (run(Policy::Memcast), run(Policy::Predictive));
    assert!(
        predictive.peak_reserved_bytes <= reactive.peak_reserved_bytes / 100 * 102,
        "predictive reserved {} against reactive's {}",
        predictive.peak_reserved_bytes,
        reactive.peak_reserved_bytes
    );
}
