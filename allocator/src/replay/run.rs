//! The replay loop: a trace's static blocks, then its events, through any
//! [`ReplayTarget`], with the metrics of the module above.

use std::time::Instant;

use memcast_trace::{EventKind, Trace};

use super::{warmup, ReplayError, ReplayOptions, ReplayReport, ReplayTarget};
use crate::error::AllocError;
use crate::pool::FxMap;

/// The replay loop over any [`ReplayTarget`].
pub fn run<T: ReplayTarget>(
    trace: &Trace,
    t: T,
    opts: &ReplayOptions,
) -> Result<ReplayReport, ReplayError> {
    run_warm(trace, t, opts, None)
}

/// [`run`], the static blocks created by the modelled warm-up `warmup` when given
/// (not counted in `events`; its device calls are in the device counters).
pub fn run_warm<T: ReplayTarget>(
    trace: &Trace,
    t: T,
    opts: &ReplayOptions,
    warmup: Option<&warmup::WarmupPlan>,
) -> Result<ReplayReport, ReplayError> {
    run_inner(trace, SkipEmpty(t), opts, warmup)
}

fn run_inner<T: ReplayTarget>(
    trace: &Trace,
    mut t: T,
    opts: &ReplayOptions,
    warmup: Option<&warmup::WarmupPlan>,
) -> Result<ReplayReport, ReplayError> {
    let mut live: FxMap<u64, (T::Handle, u32, u64)> = FxMap::default();
    live.reserve(trace.static_blocks.len() + 1024);
    let mut streams = 1u32;
    let mut requested = 0u64;
    let mut peak_requested = 0u64;
    let (mut allocs, mut frees, mut events) = (0u64, 0u64, 0u64);
    let mut max_frag = 0.0f64;
    let mut frag_at_peak = 0.0f64;
    let mut last_peak = 0u64;
    let fail = |index: u64| move |source| ReplayError::Alloc { index, source };

    let mut ensure_stream = |t: &mut T, s: u32, index: u64| -> Result<(), ReplayError> {
        // Every target refuses what memcast's records cannot hold (16 bits), before
        // making the streams below it (a stream of u32::MAX would be 4 billion).
        if s > u16::MAX as u32 {
            return Err(fail(index)(AllocError::TooManyStreams(s)));
        }
        while streams <= s {
            t.create_stream().map_err(fail(index))?;
            streams += 1;
        }
        Ok(())
    };
    let frag = |t: &T| -> Option<f64> {
        let (free, largest) = t.free_and_largest();
        let reserved = t.reserved();
        if reserved == 0 || (free as f64) < 0.01 * reserved as f64 {
            return None;
        }
        Some(1.0 - largest.min(free) as f64 / free as f64)
    };

    let start = Instant::now();
    // With a warm-up, its handles; the static blocks it did not create (none, as
    // planned) are allocated here, first, in order.
    let mut warmed: Vec<Option<T::Handle>> = vec![None; trace.static_blocks.len()];
    if let Some(plan) = warmup {
        for (i, h) in warmup::run(trace, &mut t, plan, &mut ensure_stream)? {
            warmed[i] = Some(h);
        }
    }
    for (i, (b, w)) in trace.static_blocks.iter().zip(warmed).enumerate() {
        let h = match w {
            Some(h) => h,
            None => {
                ensure_stream(&mut t, b.stream, 0)?;
                t.alloc(b.bytes, b.stream)
                    .map_err(|source| ReplayError::StaticBlock {
                        index: i as u64,
                        id: b.id,
                        bytes: b.bytes,
                        source,
                    })?
            }
        };
        if live.insert(b.id, (h, b.stream, b.bytes)).is_some() {
            return Err(ReplayError::Trace {
                index: 0,
                what: format!("static block id {} twice", b.id),
            });
        }
        requested += b.bytes;
        allocs += 1;
        events += 1;
    }
    peak_requested = peak_requested.max(requested);
    let mut last_time = trace.events.first().map(|e| e.time_us).unwrap_or(0);
    // Time-weighted sums: reserved bytes x time, fragmentation x time (sampled).
    let (mut reserved_time, mut span) = (0.0f64, 0.0f64);
    let (mut frag_time, mut frag_span, mut frag_last) = (0.0f64, 0.0f64, None::<(u64, f64)>);
    let mut boundaries = 0u32;
    let mut timeline = Vec::new();
    let mut critical_at_first: Option<u64> = None;
    let critical = |t: &T| t.device_allocs() + t.device_frees() - t.ahead().0;
    // At the last boundary: (device calls, pages moved).
    let mut at_boundary: Option<(u64, u64)> = None;
    let (mut calls_per_it, mut pages_per_it) = (Vec::new(), Vec::new());
    let (first_time, clock) = (last_time, Instant::now());
    for (index, e) in trace.events.iter().enumerate() {
        let index = index as u64;
        if opts.real_time {
            wait_until(clock, e.time_us.saturating_sub(first_time));
        }
        if e.time_us > last_time {
            let dt = (e.time_us - last_time) as f64;
            reserved_time += t.reserved() as f64 * dt;
            span += dt;
            t.advance_us(dt);
            last_time = e.time_us;
        }
        match e.kind {
            EventKind::Alloc { id, bytes, stream } => {
                ensure_stream(&mut t, stream, index)?;
                let h = t.alloc(bytes, stream).map_err(fail(index))?;
                if live.insert(id, (h, stream, bytes)).is_some() {
                    return Err(ReplayError::Trace {
                        index,
                        what: format!("tensor {id} allocated twice"),
                    });
                }
                requested += bytes;
                allocs += 1;
                peak_requested = peak_requested.max(requested);
            }
            EventKind::Free { id } => {
                let (h, stream, bytes) = live.remove(&id).ok_or_else(|| ReplayError::Trace {
                    index,
                    what: format!("free of tensor {id}, which is not live"),
                })?;
                t.free(h, stream).map_err(fail(index))?;
                requested -= bytes;
                frees += 1;
            }
            EventKind::IterationBoundary => {
                if opts.timeline {
                    timeline.push([e.time_us as f64, requested as f64, t.reserved() as f64]);
                }
                boundaries += 1;
                if boundaries == 2 {
                    critical_at_first = Some(critical(&t));
                }
                let now = (t.device_allocs() + t.device_frees(), t.pages_moved());
                if let Some((calls, pages)) = at_boundary {
                    calls_per_it.push(now.0 - calls);
                    pages_per_it.push(now.1 - pages);
                }
                at_boundary = Some(now);
                t.iteration_boundary();
            }
            EventKind::Access { .. } => {}
        }
        events += 1;
        let pr = t.peak_reserved();
        let mut sampled = None;
        if pr > last_peak {
            last_peak = pr;
            frag_at_peak = frag(&t).unwrap_or(0.0);
            max_frag = max_frag.max(frag_at_peak);
            sampled = Some(frag(&t));
        } else if index.is_multiple_of(256) {
            let f = frag(&t);
            if let Some(f) = f {
                max_frag = max_frag.max(f);
            }
            sampled = Some(f);
        }
        if opts.timeline && index.is_multiple_of(256) {
            timeline.push([e.time_us as f64, requested as f64, t.reserved() as f64]);
        }
        if let Some(f) = sampled {
            // The previous sample holds until this one (piecewise constant).
            if let Some((t0, f0)) = frag_last {
                let dt = e.time_us.saturating_sub(t0) as f64;
                frag_time += f0 * dt;
                frag_span += dt;
            }
            frag_last = f.map(|f| (e.time_us, f));
        }
        if opts.check_every > 0 && index.is_multiple_of(opts.check_every) {
            t.check().map_err(fail(index))?;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    if opts.check_every > 0 {
        t.check().map_err(fail(trace.events.len() as u64))?;
    }
    let mut extra = t.extra();
    if let (Some(plan), Some(obj)) = (warmup, extra.as_object_mut()) {
        obj.insert("warmup".into(), plan.summary());
    }
    let internal_waste_at_peak = extra
        .get("internal_waste_at_peak")
        .and_then(|v| v.as_u64())
        .unwrap_or(0);
    let peak_reserved = t.peak_reserved();
    let (ahead_calls, ahead_us) = t.ahead();
    let all_critical = critical(&t);
    Ok(ReplayReport {
        trace: trace.meta.name.clone(),
        // memcast's allocator with predictive mode switched on by its settings
        // (`predictive:true` in MEMCAST_ALLOC_CONF or --conf) ran predictive mode.
        policy: match opts.policy {
            super::Policy::Memcast if opts.config.predictive => super::Policy::Predictive,
            p => p,
        },
        forecaster: t.forecaster(),
        device: opts.device,
        events,
        allocs,
        frees,
        static_blocks: trace.static_blocks.len() as u64,
        peak_requested_bytes: peak_requested,
        peak_reserved_bytes: peak_reserved,
        reserved_overhead: if peak_requested == 0 {
            0.0
        } else {
            peak_reserved as f64 / peak_requested as f64 - 1.0
        },
        mean_reserved_bytes: if span > 0.0 {
            reserved_time / span
        } else {
            t.reserved() as f64
        },
        device_allocs: t.device_allocs(),
        device_frees: t.device_frees(),
        critical_path_device_calls: all_critical,
        critical_path_device_calls_after_first_iteration: all_critical
            - critical_at_first.unwrap_or(all_critical),
        critical_path_device_us: t.device_time_us() - ahead_us,
        ahead_device_calls: ahead_calls,
        device_calls_per_iteration: calls_per_it,
        pages_moved_per_iteration: pages_per_it,
        mean_fragmentation: if frag_span > 0.0 {
            frag_time / frag_span
        } else {
            0.0
        },
        max_fragmentation: max_frag,
        fragmentation_at_peak: frag_at_peak,
        events_per_sec: if wall > 0.0 {
            events as f64 / wall
        } else {
            0.0
        },
        wall_secs: wall,
        device_time_us: t.device_time_us(),
        internal_waste_at_peak,
        extra,
        timeline,
    })
}

/// Waits until `us` microseconds have passed since `clock` (real-time replay): sleeps
/// while more than 200 us remain, then spins, so that events keep their gaps to a few
/// microseconds.
fn wait_until(clock: Instant, us: u64) {
    let target = std::time::Duration::from_micros(us);
    loop {
        let now = clock.elapsed();
        if now >= target {
            return;
        }
        let left = target - now;
        if left > std::time::Duration::from_micros(200) {
            std::thread::sleep(left - std::time::Duration::from_micros(100));
        } else {
            std::hint::spin_loop();
        }
    }
}

/// A zero-byte tensor holds no memory, as in PyTorch (its caching allocator returns no
/// block for one) and in the tiered replay: the target never sees it, and its free
/// is a no-op; it still counts as an event, an allocation and a free.
struct SkipEmpty<T>(T);

impl<T: ReplayTarget> ReplayTarget for SkipEmpty<T> {
    type Handle = Option<T::Handle>;
    fn alloc(&mut self, bytes: u64, stream: u32) -> Result<Self::Handle, AllocError> {
        if bytes == 0 {
            return Ok(None);
        }
        self.0.alloc(bytes, stream).map(Some)
    }
    fn free(&mut self, h: Self::Handle, stream: u32) -> Result<(), AllocError> {
        match h {
            Some(h) => self.0.free(h, stream),
            None => Ok(()),
        }
    }
    fn create_stream(&mut self) -> Result<u32, AllocError> {
        self.0.create_stream()
    }
    fn reserved(&self) -> u64 {
        self.0.reserved()
    }
    fn peak_reserved(&self) -> u64 {
        self.0.peak_reserved()
    }
    fn device_allocs(&self) -> u64 {
        self.0.device_allocs()
    }
    fn device_frees(&self) -> u64 {
        self.0.device_frees()
    }
    fn free_and_largest(&self) -> (u64, u64) {
        self.0.free_and_largest()
    }
    fn device_time_us(&self) -> f64 {
        self.0.device_time_us()
    }
    fn advance_us(&mut self, us: f64) {
        self.0.advance_us(us)
    }
    fn check(&self) -> Result<(), AllocError> {
        self.0.check()
    }
    fn extra(&self) -> serde_json::Value {
        self.0.extra()
    }
    fn iteration_boundary(&mut self) {
        self.0.iteration_boundary()
    }
    fn ahead(&self) -> (u64, f64) {
        self.0.ahead()
    }
    fn forecaster(&self) -> &'static str {
        self.0.forecaster()
    }
    fn pages_moved(&self) -> u64 {
        self.0.pages_moved()
    }
}
