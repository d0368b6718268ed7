//! Prefetch policy: which host-resident tensors to bring back before they are used.
//!
//! [`PrefetchPolicy`] is the trait predictive mode replaces (a forecast is advice: the
//! manager still checks room and state before issuing anything). The reactive
//! baseline, [`PreviousIterationOrder`], assumes this iteration accesses tensors in the
//! order the previous one did, which is exact for static training graphs (every
//! iteration makes the same allocations in the same order) and approximate
//! for dynamic ones. It keeps the previous iteration's access sequence (tensor keys,
//! see [`TensorKey`]); after each access it scans the next `window` entries of that
//! sequence from the current position and prefetches, in order, those whose tensor is
//! on the host, until the device headroom is used (it stops at the first that does
//! not fit rather than skip it). Past the end the scan wraps to the sequence's start,
//! where the next iteration's first accesses (parameters) are expected.
//!
//! With [`PreviousIterationOrder::new_shapes`] (predictive mode) it also prefetches the
//! tensors of an iteration longer than the previous one, which that order does not
//! name, for their reads predicted from their size class's lifetime, and once such an
//! iteration has run past the previous one's end it no longer wraps there (where this
//! one ends is unknown: the wrap would bring the weights back amid a long generation
//! request); with
//! [`PreviousIterationOrder::stream`], in the first iteration (no previous iteration
//! registered a tensor), it follows the reads that bring tensors back instead
//! ([`ReturnStream`]).
//!
//! Cost per call: O(window) registry lookups (a vector index each), plus O(log n) per
//! predicted read due or passed; the manager calls it when there is headroom, and
//! without for swap ahead (`tier::swap`), which reads [`PrefetchPolicy::wanted`]: the
//! first predicted read it found no room for.
//!
//! The same log answers `next_use` (read only by predictive mode's victims by next use,
//! [`FarthestNextUse`](super::spill::FarthestNextUse)): the previous iteration's next
//! access of the same key, or, for a tensor the previous iteration's log does not
//! describe (its ordinal had other bytes), its free at the last lifetime seen for its
//! size class (quarter octaves; kept across iterations, so it predicts from the first
//! iteration on).

use super::handle::{TensorHandle, TensorKey};
use super::stream::ReturnStream;

/// Where a tensor is, as a prefetch policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    Device,
    Host,
    /// A host-to-device copy is in flight.
    Incoming,
    /// A device-to-host copy is in flight.
    Outgoing,
    /// Dropped: its next access recomputes it (nothing to prefetch).
    Dropped,
}

/// A host-resident tensor whose read a prefetch policy predicts, and for which it found
/// no room (swap ahead makes it: `tier::swap`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Wanted {
    pub handle: TensorHandle,
    /// The device bytes it lacked: its bytes plus what the policy took before it
    /// (earlier prefetches, allocations predicted before its read), less the headroom.
    pub short: u64,
    /// Operations until its predicted read.
    pub ahead: f64,
}

/// The manager's state as a policy may read it.
pub trait PrefetchView {
    /// The current tensor with this key, where it is, and its bytes.
    fn lookup(&self, key: TensorKey) -> Option<(TensorHandle, Residency, u64)>;
}

/// Decides prefetches. The manager calls `on_alloc`, `on_access` and `on_free` for
/// every registration, access and free (in order), `on_iteration` at iteration
/// boundaries, and `plan` after each registration and access.
pub trait PrefetchPolicy: Send {
    fn on_access(&mut self, key: TensorKey);
    /// A tensor of `bytes` was registered (also a write access).
    fn on_alloc(&mut self, key: TensorKey, _bytes: u64) {
        self.on_access(key);
    }
    /// A tensor of `bytes` was freed.
    fn on_free(&mut self, _key: TensorKey, _bytes: u64) {}
    /// The access about to be reported (`on_access`) found `key` away from the device
    /// or only just back: on the host (a fault), in a copy either way, or prefetched
    /// and not used since. Default: ignored.
    fn on_returned(&mut self, _key: TensorKey) {}
    fn on_iteration(&mut self);
    /// Appends tensors to prefetch now, in order, at most `headroom` bytes in all.
    fn plan(&mut self, view: &dyn PrefetchView, headroom: u64, out: &mut Vec<TensorHandle>);
    /// Device-resident tensors this policy expects to be accessed soon; the manager
    /// spills them last. Default: none.
    fn upcoming(&self, _view: &dyn PrefetchView, _out: &mut Vec<TensorHandle>) {}
    /// The first read the last [`plan`](Self::plan) predicted past the previous
    /// iteration's end and found no room for (see [`Wanted`]). Default: none.
    fn wanted(&self) -> Option<Wanted> {
        None
    }
    /// Operations (registrations, accesses, frees) until `key`'s next access, as far
    /// as this policy can tell; `f64::INFINITY` when it cannot. Default: never.
    fn next_use(&self, _key: TensorKey) -> f64 {
        f64::INFINITY
    }
    fn name(&self) -> &'static str;
    /// Checks the policy's own bookkeeping (the manager's `check_invariants` calls it).
    /// Default: nothing to check.
    fn check_invariants(&self) -> Result<(), String> {
        Ok(())
    }
}

/// Never prefetches: every access of a spilled tensor faults it in (the floor a
/// prefetcher must beat).
#[derive(Debug, Clone, Default)]
pub struct NoPrefetch;

impl PrefetchPolicy for NoPrefetch {
    fn on_access(&mut self, _key: TensorKey) {}
    fn on_iteration(&mut self) {}
    fn plan(&mut self, _: &dyn PrefetchView, _: u64, _: &mut Vec<TensorHandle>) {}
    fn name(&self) -> &'static str {
        "none"
    }
}

/// One logged operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Logged {
    Alloc(u64),
    Access(TensorKey),
    Free(u64),
}

/// The reactive prefetcher: the previous iteration's access order. See the module docs.
#[derive(Debug, Clone)]
pub struct PreviousIterationOrder {
    /// Registrations, accesses and frees of the previous iteration, in order.
    prev: Vec<Logged>,
    /// Those of this iteration so far.
    cur: Vec<Logged>,
    /// Per key, the positions in `prev` of its accesses (increasing), for `next_use`.
    positions: std::collections::HashMap<TensorKey, Vec<u32>>,
    /// Per ordinal of the previous iteration, its bytes.
    prev_bytes: Vec<u64>,
    /// Per ordinal of this iteration: its bytes and the position in `cur` of its
    /// registration.
    cur_allocs: Vec<(u64, u32)>,
    /// Per size class ([`size_class`]), the lifetime in operations of the last tensor
    /// of that class freed (any iteration).
    lifetimes: std::collections::HashMap<u32, u32>,
    pub window: usize,
    /// Also prefetch the tensors of an iteration longer than the previous one (ordinals
    /// the previous iteration did not reach), for their read before their free,
    /// predicted at their size class's last lifetime as [`PrefetchPolicy::next_use`]
    /// predicts it. Predictive mode's `prefetch` action turns it on; the reactive
    /// baseline has it off. Generation is the case: a request that generates more
    /// tokens than the last one makes, at every token step past the last one's end,
    /// key/value tensors that are read at the next step and that no position of the
    /// previous iteration names. Not when the previous iteration registered no tensor
    /// (the first iteration): there a class's last lifetime predicted reads badly
    /// (measured, docs/predictive.md). Past the previous iteration's end, the scan no
    /// longer wraps to its start: only these predicted reads are prefetched there.
    pub new_shapes: bool,
    /// With `new_shapes`: (predicted position in `cur` of the read, ordinal) of this
    /// iteration's tensors past the previous iteration's ordinals, not read yet, so
    /// that the scan meets them in order.
    // Invariant: an ordinal `n` has an entry iff `expect_at[n] != NONE`, and it is
    // `(expect_at[n], n)`.
    expected: std::collections::BTreeSet<(u32, u32)>,
    /// Per ordinal of this iteration, its predicted read (its entry in `expected`), or
    /// `NONE`.
    expect_at: Vec<u32>,
    /// While no previous iteration registered a tensor (the first iteration), follow
    /// the reads that bring tensors back instead ([`ReturnStream`]). Predictive mode's
    /// `prefetch` action turns it on; the reactive baseline has it off.
    pub stream: bool,
    returns: ReturnStream,
    /// What the last `plan` predicted and had no room for (`wanted`).
    want: Option<Wanted>,
}

/// No predicted read.
const NONE: u32 = u32::MAX;

/// Quarter-octave size classes: `4 x floor(log2 bytes)` plus the next two bits.
fn size_class(bytes: u64) -> u32 {
    let b = bytes.max(1);
    let log = 63 - b.leading_zeros();
    let quarter = if log >= 2 { (b >> (log - 2)) & 3 } else { 0 };
    4 * log + quarter as u32
}

impl PreviousIterationOrder {
    pub fn new(window: usize) -> Self {
        PreviousIterationOrder {
            prev: Vec::new(),
            cur: Vec::new(),
            positions: std::collections::HashMap::new(),
            prev_bytes: Vec::new(),
            cur_allocs: Vec::new(),
            lifetimes: std::collections::HashMap::new(),
            window,
            new_shapes: false,
            expected: std::collections::BTreeSet::new(),
            expect_at: Vec::new(),
            stream: false,
            returns: ReturnStream::default(),
            want: None,
        }
    }

    /// The position of the free of a tensor of `bytes` registered at `at`, at the last
    /// lifetime of its size class (`None`: no tensor of that class freed yet). The one
    /// estimate behind `next_use` for a tensor the previous iteration does not describe
    /// and behind `new_shapes`' predicted reads. O(1).
    fn predicted_free(&self, bytes: u64, at: u32) -> Option<u64> {
        let life = self.lifetimes.get(&size_class(bytes))?;
        Some(u64::from(at) + u64::from(*life))
    }

    /// Forgets ordinal `n`'s predicted read. O(log entries).
    fn unexpect(&mut self, n: u32) {
        if let Some(at) = self.expect_at.get_mut(n as usize) {
            if *at != NONE {
                self.expected.remove(&(*at, n));
                *at = NONE;
            }
        }
    }
}

impl PrefetchPolicy for PreviousIterationOrder {
    fn on_access(&mut self, key: TensorKey) {
        if let TensorKey::Ordinal(n) = key {
            self.unexpect(n);
        }
        self.cur.push(Logged::Access(key));
    }

    fn on_alloc(&mut self, key: TensorKey, bytes: u64) {
        if let TensorKey::Ordinal(n) = key {
            let n = n as usize;
            if self.cur_allocs.len() <= n {
                self.cur_allocs.resize(n + 1, (0, 0));
            }
            let at = self.cur.len() as u32;
            self.cur_allocs[n] = (bytes, at);
            self.unexpect(n as u32);
            let past_previous = !self.prev_bytes.is_empty() && n >= self.prev_bytes.len();
            if self.new_shapes && past_previous {
                // Read just before its free. O(log).
                if let Some(free) = self.predicted_free(bytes, at) {
                    if self.expect_at.len() <= n {
                        self.expect_at.resize(n + 1, NONE);
                    }
                    // (Below `NONE`: an iteration of 4 G operations.)
                    let read = free
                        .saturating_sub(1)
                        .max(u64::from(at) + 1)
                        .min(u64::from(NONE - 1)) as u32;
                    self.expect_at[n] = read;
                    self.expected.insert((read, n as u32));
                }
            }
        }
        self.cur.push(Logged::Alloc(bytes));
    }

    fn on_free(&mut self, key: TensorKey, bytes: u64) {
        if let TensorKey::Ordinal(n) = key {
            self.unexpect(n);
            if let Some(&(b, at)) = self.cur_allocs.get(n as usize) {
                if b == bytes {
                    let life = self.cur.len() as u32 - at;
                    self.lifetimes.insert(size_class(bytes), life);
                }
            }
        }
        self.cur.push(Logged::Free(bytes));
    }

    fn on_returned(&mut self, key: TensorKey) {
        if let (true, TensorKey::Ordinal(n)) = (self.stream, key) {
            self.returns.on_returned(n);
        }
    }

    fn on_iteration(&mut self) {
        self.returns.reset();
        self.prev_bytes.clear();
        self.prev_bytes
            .extend(self.cur_allocs.drain(..).map(|(b, _)| b));
        self.prev = std::mem::take(&mut self.cur);
        self.expected.clear();
        self.expect_at.clear();
        self.positions.clear();
        for (i, l) in self.prev.iter().enumerate() {
            if let Logged::Access(k) = l {
                self.positions.entry(*k).or_default().push(i as u32);
            }
        }
    }

    /// The previous iteration's next access of `key` after this iteration's position
    /// (a binary search); for a persistent tensor with none left, its first access of
    /// the next iteration, or `INFINITY` once this iteration has run longer than the
    /// previous one (where it ends is then unknown: in a generation request longer than
    /// the last, the weights would otherwise rank as needed at once, and the caches the
    /// next token step reads were spilled in their place).
    ///
    /// A tensor whose ordinal had other bytes in the previous iteration (or had none:
    /// the first iteration, or a longer one) is not the tensor those positions describe:
    /// for it, the operations until its free, its registration plus the lifetime of the
    /// last tensor of its size class freed, or `INFINITY` with no such tensor or once
    /// it has outlived that lifetime. Generation is the case this serves: every token
    /// step makes new key/value and logits tensors that die a step later, and the
    /// previous iteration's positions, at another prompt length, describe none of them.
    /// Cost: O(1) (a vector index and a hash lookup) besides the binary search.
    fn next_use(&self, key: TensorKey) -> f64 {
        if let TensorKey::Ordinal(n) = key {
            let mine = self.cur_allocs.get(n as usize);
            if let Some(&(bytes, at)) =
                mine.filter(|m| self.prev_bytes.get(n as usize) != Some(&m.0))
            {
                // Not the previous iteration's tensor of this ordinal: its free, at
                // its size class's last lifetime.
                let p = self.cur.len() as f64;
                return match self.predicted_free(bytes, at) {
                    Some(free) if free as f64 > p => free as f64 - p,
                    _ => f64::INFINITY,
                };
            }
        }
        let Some(pos) = self.positions.get(&key) else {
            return f64::INFINITY;
        };
        let p = self.cur.len() as u32;
        let i = pos.partition_point(|&x| x < p);
        match (pos.get(i), key) {
            (Some(&x), _) => f64::from(x - p),
            // Past the previous iteration's end, when this one ends is unknown, and so
            // is the next read of a block read at the boundary.
            (None, TensorKey::Persistent(_)) if p as usize >= self.prev.len() => f64::INFINITY,
            (None, TensorKey::Persistent(_)) => {
                (self.prev.len() as f64 - f64::from(p)).max(0.0) + f64::from(pos[0])
            }
            (None, TensorKey::Ordinal(_)) => f64::INFINITY,
        }
    }

    fn plan(&mut self, view: &dyn PrefetchView, headroom: u64, out: &mut Vec<TensorHandle>) {
        self.want = None;
        if self.stream && self.prev_bytes.is_empty() {
            // No previous iteration registered a tensor: its log (the setup's, if
            // any) names none of this one's.
            let registered = self.cur_allocs.len();
            self.returns
                .plan(view, headroom, registered, self.window, out);
            return;
        }
        let n = self.prev.len();
        if n == 0 {
            return;
        }
        let pos = self.cur.len();
        // Predicted reads already passed: the tensor outlived its class's lifetime, and
        // `next_use` no longer predicts it either (a prefetch now would be its victims'
        // first pick). O(log entries) each.
        while self
            .expected
            .first()
            .is_some_and(|&(at, _)| (at as usize) < pos)
        {
            if let Some((_, k)) = self.expected.pop_first() {
                self.expect_at[k as usize] = NONE;
            }
        }
        // Asked without headroom (for swap ahead): with no read predicted, nothing to
        // want. O(1).
        if headroom == 0 && self.expected.is_empty() {
            return;
        }
        // Those due within the window, in order of their predicted reads.
        let mut due = self
            .expected
            .iter()
            .take_while(|&&(at, _)| (at as usize) < pos + self.window)
            .map(|&(at, k)| (at as usize, TensorKey::Ordinal(k)))
            .peekable();
        // Past the previous iteration's end the scan would take its positions for the
        // next iteration's, but this one has not ended: with `new_shapes` only the
        // predicted reads are prefetched there.
        let end = if self.new_shapes && pos >= n {
            pos
        } else {
            (pos + self.window).min(2 * n)
        };
        // Scan the whole window every time: an entry that is resident now may be
        // spilled before its access, so no position is ever settled for good.
        // `delta` is the device use the previous iteration's allocations and frees
        // predict from now to position i, `peak` its maximum so far: a prefetch must
        // fit beside the allocations that come before its access.
        let (mut delta, mut peak, mut planned) = (0i128, 0i128, 0i128);
        let room = headroom as i128;
        // A host-resident tensor to prefetch, in order; `Err` (it, the bytes it
        // lacks): no room, stop.
        let mut take = |key: TensorKey, peak: i128, out: &mut Vec<TensorHandle>| {
            if let Some((h, Residency::Host, bytes)) = view.lookup(key) {
                let need = planned + bytes as i128 + peak;
                if need > room {
                    return Err((h, (need - room) as u64));
                }
                planned += bytes as i128;
                out.push(h);
            }
            Ok(())
        };
        let want = |(handle, short): (TensorHandle, u64), at: usize| {
            Some(Wanted {
                handle,
                short,
                ahead: at.saturating_sub(pos) as f64,
            })
        };
        for i in pos..end.max(pos) {
            while let Some(&(at, key)) = due.peek().filter(|&&(at, _)| at <= i) {
                due.next();
                if let Err(w) = take(key, peak, out) {
                    self.want = want(w, at);
                    return;
                }
            }
            match self.prev[i % n] {
                Logged::Alloc(b) => {
                    delta += b as i128;
                    peak = peak.max(delta);
                }
                Logged::Free(b) => delta -= b as i128,
                // Past the end, ordinals name next-iteration tensors not created yet.
                Logged::Access(TensorKey::Ordinal(_)) if i >= n => {}
                // A tensor with a predicted read is taken there (`due`), not twice (a
                // tensor of an older iteration, still live, may share its ordinal).
                Logged::Access(TensorKey::Ordinal(k))
                    if self.expect_at.get(k as usize).is_some_and(|&at| at != NONE) => {}
                Logged::Access(key) => {
                    if take(key, peak, out).is_err() {
                        // In order: wait for room rather than skip ahead. (Not wanted:
                        // room made for the previous iteration's positions raised the
                        // stall on training traces, `tier::swap`.)
                        return;
                    }
                }
            }
        }
        // Predicted reads past the window's scan (an iteration over twice as long as
        // the previous one scans nothing above).
        for (at, key) in due {
            if let Err(w) = take(key, peak, out) {
                self.want = want(w, at);
                return;
            }
        }
    }

    fn wanted(&self) -> Option<Wanted> {
        self.want
    }

    fn upcoming(&self, view: &dyn PrefetchView, out: &mut Vec<TensorHandle>) {
        let n = self.prev.len();
        let pos = self.cur.len();
        for i in pos..(pos + self.window).min(n) {
            if let Logged::Access(key) = self.prev[i] {
                if let Some((h, Residency::Device, _)) = view.lookup(key) {
                    out.push(h);
                }
            }
        }
    }

    /// Checks the invariant of `expected` and `expect_at`, and the return stream's.
    /// O(entries + ordinals).
    fn check_invariants(&self) -> Result<(), String> {
        self.returns.check_invariants()?;
        let set = self.expect_at.iter().filter(|&&at| at != NONE).count();
        if set != self.expected.len() {
            return Err(format!(
                "{} predicted reads, {} ordinals with one",
                self.expected.len(),
                set
            ));
        }
        for &(at, n) in &self.expected {
            if self.expect_at.get(n as usize) != Some(&at) {
                return Err(format!("ordinal {n}: read predicted at {at}, not recorded"));
            }
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        "previous-iteration-order"
    }
}

/// The tests' registry: ordinal `n` is handle `n`, where the map says and of its bytes;
/// a persistent key of handle index `i` is the map's entry [`TestView::PERSISTENT`]` | i`.
#[cfg(test)]
pub(crate) struct TestView(pub std::collections::HashMap<u32, (Residency, u64)>);

#[cfg(test)]
impl TestView {
    pub const PERSISTENT: u32 = 1 << 31;
}

#[cfg(test)]
impl PrefetchView for TestView {
    fn lookup(&self, key: TensorKey) -> Option<(TensorHandle, Residency, u64)> {
        let (entry, index) = match key {
            TensorKey::Ordinal(n) => (n, n),
            TensorKey::Persistent(h) => (Self::PERSISTENT | h.index, h.index),
        };
        self.0
            .get(&entry)
            .map(|&(r, b)| (TensorHandle { index, gen: 0 }, r, b))
    }
}

#[cfg(test)]
mod tests {
    use super::TestView as View;
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn prefetches_in_previous_order_within_headroom() {
        let mut p = PreviousIterationOrder::new(10);
        for n in [0, 1, 2, 3, 4] {
            p.on_access(TensorKey::Ordinal(n));
        }
        p.on_alloc(TensorKey::Ordinal(5), 50);
        p.on_access(TensorKey::Ordinal(4));
        p.on_iteration();
        // Nothing recorded before: first iteration plans nothing.
        let view = View(HashMap::from([
            (1, (Residency::Host, 10)),
            (2, (Residency::Device, 10)),
            (3, (Residency::Host, 30)),
            (4, (Residency::Host, 10)),
        ]));
        let mut out = Vec::new();
        p.on_access(TensorKey::Ordinal(0));
        p.plan(&view, 25, &mut out);
        // 1 fits, 2 is resident, 3 does not fit: stop there (in order).
        assert_eq!(out.iter().map(|h| h.index).collect::<Vec<_>>(), vec![1]);
        out.clear();
        p.plan(&view, 100, &mut out);
        assert_eq!(
            out.iter().map(|h| h.index).collect::<Vec<_>>(),
            vec![1, 3, 4]
        );
        // The window bounds the look-ahead.
        p.window = 2;
        out.clear();
        p.plan(&view, 100, &mut out);
        assert_eq!(out.iter().map(|h| h.index).collect::<Vec<_>>(), vec![1]);
        // Past the first access of 4: its next access comes after an allocation of 50,
        // so it must fit beside it.
        p.window = 10;
        for n in [1, 2, 3, 4] {
            p.on_access(TensorKey::Ordinal(n));
        }
        let view4 = View(HashMap::from([(4, (Residency::Host, 10))]));
        out.clear();
        p.plan(&view4, 59, &mut out);
        assert!(out.is_empty());
        p.plan(&view4, 60, &mut out);
        assert_eq!(out.iter().map(|h| h.index).collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn past_the_previous_iteration_end_the_boundary_is_not_expected() {
        let k = TensorKey::Ordinal;
        let w = TensorKey::Persistent(TensorHandle { index: 7, gen: 0 });
        let run = |new_shapes: bool| {
            let mut p = PreviousIterationOrder::new(8);
            p.new_shapes = new_shapes;
            // An iteration of four operations; the weight is read at its boundary.
            p.on_alloc(k(0), 100);
            p.on_alloc(k(1), 100);
            p.on_free(k(0), 100);
            p.on_free(k(1), 100);
            p.on_access(w);
            p.on_iteration();
            p.on_access(w);
            // This one runs longer: at 3 operations the weight is read at the
            // previous iteration's position 4, one operation on.
            for n in 0..2 {
                p.on_alloc(k(n), 100);
            }
            assert_eq!(p.next_use(w), 1.0);
            // Past the previous iteration's 5 operations, where this one ends is
            // unknown: so is the weight's next read.
            for n in 2..5 {
                p.on_alloc(k(n), 100);
            }
            assert_eq!(p.next_use(w), f64::INFINITY);
            // The weight is on the host: the scan would wrap to the previous
            // iteration's start and take its first access for the next iteration's.
            let view = View(HashMap::from([(
                View::PERSISTENT | 7,
                (Residency::Host, 10),
            )]));
            let mut out = Vec::new();
            p.plan(&view, 1 << 20, &mut out);
            out.len()
        };
        // Predictive mode's prefetcher does not wrap there; the reactive one does.
        assert_eq!(run(true), 0);
        assert_eq!(run(false), 1);
    }

    #[test]
    fn past_the_previous_iteration_a_tensor_is_prefetched_for_its_predicted_read() {
        let k = TensorKey::Ordinal;
        let ids = |out: &[TensorHandle]| out.iter().map(|h| h.index).collect::<Vec<_>>();
        let run = |new_shapes: bool| {
            let mut p = PreviousIterationOrder::new(4);
            p.new_shapes = new_shapes;
            // Iteration 1 (one token step): ordinal 0, 1000 B, read and freed 3
            // operations after its registration.
            p.on_alloc(k(0), 1000);
            p.on_alloc(k(1), 64);
            p.on_access(k(0));
            p.on_free(k(0), 1000);
            p.on_iteration();
            // Iteration 2 is longer: its ordinal 2 (1010 B, the same size class) has no
            // counterpart in iteration 1. Registered at position 0, read predicted at 2.
            p.on_alloc(k(2), 1010);
            p.check_invariants().unwrap();
            let view = View(HashMap::from([(2, (Residency::Host, 1010))]));
            // It must fit beside the 64 B that iteration 1 allocated before that point.
            let mut out = Vec::new();
            p.plan(&view, 1074, &mut out);
            let first = ids(&out);
            out.clear();
            p.plan(&view, 1073, &mut out);
            assert!(out.is_empty());
            // Once read, it is not expected again; a read predicted and passed is
            // dropped too.
            p.on_access(k(2));
            out.clear();
            p.plan(&view, 1 << 20, &mut out);
            assert!(out.is_empty());
            // Ordinal 3: registered at 2, read predicted at 4; at 3 it is due, at 5 it
            // has outlived its class's lifetime and is no longer predicted.
            p.on_alloc(k(3), 1010);
            p.check_invariants().unwrap();
            let view = View(HashMap::from([(3, (Residency::Host, 1010))]));
            out.clear();
            p.plan(&view, 1 << 20, &mut out);
            assert_eq!(ids(&out), if new_shapes { vec![3] } else { vec![] });
            for _ in 0..2 {
                p.on_access(k(1));
            }
            out.clear();
            p.plan(&view, 1 << 20, &mut out);
            assert!(out.is_empty());
            p.check_invariants().unwrap();
            // A prediction is forgotten at the tensor's free, and at the boundary.
            p.on_alloc(k(4), 1010);
            assert_eq!(p.expected.len(), usize::from(new_shapes));
            p.on_free(k(4), 1010);
            assert!(p.expected.is_empty());
            p.on_alloc(k(5), 1010);
            assert_eq!(p.expected.len(), usize::from(new_shapes));
            p.on_iteration();
            assert!(p.expected.is_empty() && p.expect_at.is_empty());
            first
        };
        assert_eq!(run(true), vec![2]);
        // The reactive baseline (`new_shapes` off) does not predict it.
        assert!(run(false).is_empty());
    }

    #[test]
    fn no_read_is_predicted_in_the_first_iteration_or_beyond_the_window() {
        let k = TensorKey::Ordinal;
        let mut p = PreviousIterationOrder::new(2);
        p.new_shapes = true;
        p.on_alloc(k(0), 1000);
        p.on_access(k(0));
        p.on_free(k(0), 1000);
        // First iteration: the class lifetime is known, but no read is predicted.
        p.on_alloc(k(1), 1000);
        assert!(p.expected.is_empty());
        let view = View(HashMap::from([(1, (Residency::Host, 1000))]));
        let mut out = Vec::new();
        p.plan(&view, 1 << 20, &mut out);
        assert!(out.is_empty());
        p.on_free(k(1), 1000);
        p.on_iteration();
        // Ordinal 2 (past the previous iteration's 0 and 1) shows that its class lives
        // 6 operations; ordinal 4, registered at 9, is predicted read at 14: beyond a
        // window of 2 from position 10, within one of 8.
        p.on_alloc(k(0), 8);
        p.on_free(k(0), 8);
        for n in 2..4 {
            p.on_alloc(k(n), 1 << 20);
        }
        for _ in 0..4 {
            p.on_access(k(2));
        }
        p.on_free(k(2), 1 << 20);
        p.on_alloc(k(4), 1 << 20);
        let view = View(HashMap::from([(4, (Residency::Host, 1 << 20))]));
        out.clear();
        p.plan(&view, 1 << 30, &mut out);
        assert!(out.is_empty());
        p.window = 8;
        p.plan(&view, 1 << 30, &mut out);
        assert_eq!(out.iter().map(|h| h.index).collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn a_tensor_of_a_new_shape_is_next_used_at_its_size_class_lifetime() {
        let k = TensorKey::Ordinal;
        let mut p = PreviousIterationOrder::new(10);
        // Iteration 1: ordinal 0 (1000 B) is read and freed 3 operations after its
        // registration; ordinal 1 (64 B) lives on.
        p.on_alloc(k(0), 1000);
        p.on_alloc(k(1), 64);
        p.on_access(k(0));
        p.on_free(k(0), 1000);
        // With no previous iteration, the class lifetime already predicts: a new
        // 1010 B tensor (the same quarter octave) is freed 3 operations after its
        // registration, so 2 after the operation that follows it.
        p.on_alloc(k(2), 1010);
        assert_eq!(p.next_use(k(2)), 2.0);
        p.on_access(k(1));
        assert_eq!(p.next_use(k(2)), 1.0);
        // A class never freed: no prediction.
        p.on_alloc(k(3), 1 << 20);
        assert_eq!(p.next_use(k(3)), f64::INFINITY);
        p.on_free(k(2), 1010);
        p.on_free(k(3), 1 << 20);
        p.on_free(k(1), 64);
        p.on_iteration();
        // Iteration 2, the same shapes: the previous iteration's positions (ordinal
        // 0's read at position 2, 2 operations after its registration at 0).
        p.on_alloc(k(0), 1000);
        assert_eq!(p.next_use(k(0)), 1.0);
        // A new shape for ordinal 1 (a 1020 B tensor where the previous iteration had
        // 64 B): its class's lifetime, not the 64 B tensor's read at position 5.
        p.on_alloc(k(1), 1020);
        assert_eq!(p.next_use(k(1)), 2.0);
        // Past its predicted life: unknown again.
        p.on_access(k(0));
        p.on_free(k(0), 1000);
        p.on_access(k(1));
        assert_eq!(p.next_use(k(1)), f64::INFINITY);
        // The same shape as the previous iteration's ordinal: its positions, whatever
        // the class lifetime says (ordinal 2 was freed at position 7 and read at none).
        p.on_alloc(k(2), 1010);
        assert_eq!(p.next_use(k(2)), f64::INFINITY);
    }
}
