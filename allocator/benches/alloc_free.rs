//! `alloc_free`: time per alloc+free pair of memcast and two peer allocators on the same
//! workloads, in the same run (criterion group `alloc_free`, one function per
//! allocator: `memcast`, `memcast-predictive`, `offset-allocator`,
//! `buddy_system_allocator`). `memcast-predictive` is memcast in predictive mode with
//! its defaults (the default LSTM on the forecast thread): what the online path costs
//! the allocating thread. Each run of the programs ends with an iteration boundary.
//!
//! One iteration = the same two programs for every allocator:
//! - `mixed`: 20,000 steps over 1,024 slots; each step frees the slot's block (if any)
//!   and allocates a new one; sizes log-uniform, 60% in 256 B..64 KiB, 30% in
//!   64 KiB..1 MiB, 10% in 1..16 MiB (xorshift, fixed seed);
//! - `trace`: the allocation/free sequence of the real `resnet50_b64_train` trace
//!   (5,488 pairs), with its 484 static blocks (parameters, optimizer state) allocated
//!   once before timing starts and kept, as in the real run.
//!
//! The peers manage offsets in 256-byte units (their granularity); memcast gets bytes
//! and runs on the `sim` backend (device calls are free in wall time there, and warm-up
//! makes them rare). Throughput is reported per alloc+free pair.
//!
//! `memcast` and `memcast-predictive` are measured in alternation (each timed run of
//! one is followed by an untimed run of the other): their ratio is what predictive
//! mode costs, even on a machine whose speed drifts while the group runs.
//!
//! A second group, `lock`, measures what the `SharedAllocator` mutex costs per pair.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use memcast_alloc::backend::sim::SimBackend;
use memcast_alloc::{AllocConfig, Allocation, Allocator, SharedAllocator};

mod workload;
use workload::{MIX, SLOTS, STEPS};

const UNIT: u64 = 256;

/// One program: the mixed random steps (the slot's old block is freed first) and the
/// trace's operations (Some(bytes) = alloc into slot, None = free slot).
struct Program {
    mixed: Vec<(usize, u64)>,
    trace: Vec<(usize, Option<u64>)>,
    trace_slots: usize,
    statics: Vec<u64>,
    pairs: u64,
}

fn program() -> Program {
    let mixed = workload::program(&MIX);
    let t = workload::trace_ops();
    let pairs = STEPS as u64 + t.ops.iter().filter(|(_, b)| b.is_some()).count() as u64;
    Program {
        mixed,
        trace: t.ops,
        trace_slots: t.slots,
        statics: t.statics,
        pairs,
    }
}

/// The interface the three allocators are driven through.
trait Under {
    type H: Copy;
    fn alloc(&mut self, bytes: u64) -> Self::H;
    fn free(&mut self, h: Self::H);
    fn boundary(&mut self) {}
}

struct Memcast(Allocator<SimBackend>);
impl Under for Memcast {
    type H = Allocation;
    #[inline]
    fn alloc(&mut self, bytes: u64) -> Allocation {
        self.0.allocate(bytes, 0).expect("memcast alloc")
    }
    #[inline]
    fn free(&mut self, h: Allocation) {
        self.0.deallocate(h, 0).expect("memcast free")
    }
    fn boundary(&mut self) {
        self.0.iteration_boundary()
    }
}

struct Shared(SharedAllocator<SimBackend>);
impl Under for Shared {
    type H = Allocation;
    #[inline]
    fn alloc(&mut self, bytes: u64) -> Allocation {
        self.0.allocate(bytes, 0).expect("shared alloc")
    }
    #[inline]
    fn free(&mut self, h: Allocation) {
        self.0.deallocate(h, 0).expect("shared free")
    }
}

struct Offset(offset_allocator::Allocator);
impl Under for Offset {
    type H = offset_allocator::Allocation;
    #[inline]
    fn alloc(&mut self, bytes: u64) -> Self::H {
        self.0
            .allocate(bytes.div_ceil(UNIT) as u32)
            .expect("offset-allocator alloc")
    }
    #[inline]
    fn free(&mut self, h: Self::H) {
        self.0.free(h)
    }
}

struct Buddy(buddy_system_allocator::FrameAllocator<40>);
impl Under for Buddy {
    type H = (usize, usize);
    #[inline]
    fn alloc(&mut self, bytes: u64) -> (usize, usize) {
        let n = bytes.div_ceil(UNIT) as usize;
        (self.0.alloc(n).expect("buddy alloc"), n)
    }
    #[inline]
    fn free(&mut self, h: (usize, usize)) {
        self.0.dealloc(h.0, h.1)
    }
}

/// Runs both programs once; every block is freed at the end.
fn run<U: Under>(u: &mut U, p: &Program, mixed: &mut [Option<U::H>], trace: &mut [Option<U::H>]) {
    for &(slot, bytes) in &p.mixed {
        if let Some(h) = mixed[slot].take() {
            u.free(h);
        }
        mixed[slot] = Some(u.alloc(bytes));
    }
    for h in mixed.iter_mut() {
        if let Some(h) = h.take() {
            u.free(h);
        }
    }
    for &(slot, op) in &p.trace {
        match op {
            Some(bytes) => trace[slot] = Some(u.alloc(bytes)),
            None => u.free(trace[slot].take().expect("live")),
        }
    }
    u.boundary();
}

/// One allocator with its slots and the trace's static blocks, warmed up.
struct Rig<U: Under> {
    u: U,
    mixed: Vec<Option<U::H>>,
    trace: Vec<Option<U::H>>,
    // Never freed: the trace's static blocks live through every run.
    _statics: Vec<U::H>,
}

impl<U: Under> Rig<U> {
    fn new(mut u: U, p: &Program) -> Self {
        let mixed = (0..SLOTS).map(|_| None).collect();
        let trace = (0..p.trace_slots).map(|_| None).collect();
        let _statics = p.statics.iter().map(|&b| u.alloc(b)).collect();
        let mut r = Rig {
            u,
            mixed,
            trace,
            _statics,
        };
        r.run(p); // warm-up: segments exist afterwards
        r
    }
    fn run(&mut self, p: &Program) {
        run(&mut self.u, p, &mut self.mixed, &mut self.trace);
    }
}

fn bench_one<U: Under>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    u: U,
    p: &Program,
) {
    let mut r = Rig::new(u, p);
    c.bench_function(name, |b| b.iter(|| r.run(p)));
}

/// Two functions measured in alternation: every timed run of one is followed by an
/// untimed run of the other, so a drift of the machine's speed while criterion runs
/// the group (these machines are shared; one function alone has moved by 58% between
/// runs of the group) falls on both alike, and their ratio is the cost of the
/// difference between them.
fn bench_alternating<A: Under, B: Under>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    (name_a, a): (&str, A),
    (name_b, b): (&str, B),
    p: &Program,
) {
    let mut a = Rig::new(a, p);
    let mut b = Rig::new(b, p);
    c.bench_function(name_a, |bn| {
        bn.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                let t0 = Instant::now();
                a.run(p);
                t += t0.elapsed();
                b.run(p);
            }
            t
        })
    });
    c.bench_function(name_b, |bn| {
        bn.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                a.run(p);
                let t0 = Instant::now();
                b.run(p);
                t += t0.elapsed();
            }
            t
        })
    });
}

fn memcast() -> Allocator<SimBackend> {
    Allocator::new(
        SimBackend::h200(),
        AllocConfig::from_env().expect("MEMCAST_ALLOC_CONF"),
    )
    .expect("allocator")
}

fn memcast_predictive() -> Allocator<SimBackend> {
    let mut cfg = AllocConfig::from_env().expect("MEMCAST_ALLOC_CONF");
    cfg.predictive = true;
    Allocator::new(SimBackend::h200(), cfg).expect("predictive allocator")
}

fn alloc_free(c: &mut Criterion) {
    let p = program();
    let mut g = c.benchmark_group("alloc_free");
    g.throughput(Throughput::Elements(p.pairs));
    g.sample_size(20);
    bench_alternating(
        &mut g,
        ("memcast", Memcast(memcast())),
        ("memcast-predictive", Memcast(memcast_predictive())),
        &p,
    );
    // 64 Gi units of 256 B do not fit u32: 16 GiB is plenty for these programs.
    bench_one(
        &mut g,
        "offset-allocator",
        Offset(offset_allocator::Allocator::new(
            (16u64 << 30).div_ceil(UNIT) as u32,
        )),
        &p,
    );
    let mut fa = buddy_system_allocator::FrameAllocator::<40>::new();
    fa.add_frame(0, ((16u64 << 30) / UNIT) as usize);
    bench_one(&mut g, "buddy_system_allocator", Buddy(fa), &p);
    g.finish();

    let mut g = c.benchmark_group("lock");
    g.throughput(Throughput::Elements(p.pairs));
    g.sample_size(20);
    bench_one(&mut g, "unlocked", Memcast(memcast()), &p);
    bench_one(
        &mut g,
        "shared_mutex",
        Shared(SharedAllocator::new(memcast())),
        &p,
    );
    g.finish();
    let _ = BatchSize::SmallInput;
}

criterion_group!(benches, alloc_free);
criterion_main!(benches);
