//! The first iteration's prefetches: follow the reads that bring tensors back.
//!
//! The window prefetcher ([`PreviousIterationOrder`](super::prefetch::PreviousIterationOrder))
//! goes by the previous iteration's order, and a job's first iteration has none: every
//! tensor spilled in it comes back as a fault, one synchronous copy at a time. One
//! order is common enough to follow without history: a backward reads the tensors its
//! forward saved in reverse order of registration, and a decode step reads its caches
//! in order. [`ReturnStream`] watches the reads that find a tensor away from the device
//! (faults, cancelled spills, prefetches used) and, once the last [`RUN`] pairs of them
//! it judged were neighbours in one direction among the tensors on the host (no tensor
//! still on the host between the two), prefetches the host-resident tensors next in
//! that direction, under the same headroom rule as the window prefetcher, with at most
//! [`DEGREE`] of its copies in flight at a time. A copy that has landed no longer
//! counts: while copies land, each scan (after every registration, access and free)
//! issues the next ones, so the stream runs ahead as far as the headroom and the
//! window allow.
//!
//! A pair is judged at the next scan, which the manager makes only when there is
//! headroom; a pair not judged before the next return ends the run (it was not seen
//! to be neighbours).
//!
//! Why neighbours and a run: in a forward, the out-of-memory path's victims are read
//! back in an order that skips other spilled tensors (a generation's prefill reads its
//! temporaries back and leaves the key/value caches on the host); following one pair
//! there fetched tensors needed much later, whose copies then delayed the faults of
//! those needed now (measured: docs/predictive.md, "The first iteration").
//!
//! Cost: O(1) per return; per plan, at most `window` registry lookups to judge the
//! newest pair (once) and to scan ahead, stopping after [`DEGREE`] tensors.

use super::handle::{TensorHandle, TensorKey};
use super::prefetch::{PrefetchView, Residency};

/// Copies the stream keeps in flight ahead of its last return (issued by this scan or
/// still incoming). Chosen on the corpus's train and validation splits (1, 2, 4 and
/// unbounded measured: within 0.2% of each other on both means; 2 the lowest on
/// train).
pub const DEGREE: usize = 2;

/// Pairs of neighbouring returns in one direction, in a row, before the stream
/// prefetches (1, 2 and 3 measured on train and validation).
pub const RUN: u32 = 2;

/// The stream of returns of one iteration. See the module docs.
#[derive(Debug, Clone, Default)]
pub struct ReturnStream {
    /// The ordinal of the last return this iteration.
    last: Option<u32>,
    /// The newest pair of returns (the one before, the last), not judged yet: judging
    /// needs the registry (`plan`).
    pending: Option<(u32, u32)>,
    /// The run's direction: -1 (down the ordinals), +1 (up), 0 (no run).
    direction: i8,
    /// Neighbouring pairs in `direction`, in a row.
    // Invariant: `run == 0` iff `direction == 0`.
    run: u32,
}

impl ReturnStream {
    /// A read found ordinal `n` away from the device (or just back). O(1).
    pub fn on_returned(&mut self, n: u32) {
        match self.last {
            // The same tensor again (spilled and read back twice): no step.
            Some(p) if p == n => return,
            Some(p) => {
                // The pair before this one was never judged (no scan between them):
                // it cannot count as neighbours, so the run ends there.
                if self.pending.is_some() {
                    (self.direction, self.run) = (0, 0);
                }
                self.pending = Some((p, n));
            }
            None => {}
        }
        self.last = Some(n);
    }

    /// An iteration boundary: ordinals restart.
    pub fn reset(&mut self) {
        *self = ReturnStream::default();
    }

    /// Judges the newest pair: neighbours if no ordinal strictly between them is on
    /// the host, and at most `window` apart. O(window) lookups, once per pair.
    fn judge(&mut self, view: &dyn PrefetchView, window: usize) {
        let Some((p, n)) = self.pending.take() else {
            return;
        };
        let (lo, hi) = (p.min(n), p.max(n));
        let neighbours = (hi - lo) as usize <= window
            && (lo + 1..hi).all(|k| {
                !matches!(
                    view.lookup(TensorKey::Ordinal(k)),
                    Some((_, Residency::Host, _))
                )
            });
        let d = if n > p { 1 } else { -1 };
        (self.direction, self.run) = match (neighbours, d == self.direction) {
            (false, _) => (0, 0),
            (true, true) => (d, self.run.saturating_add(1)),
            (true, false) => (d, 1),
        };
    }

    /// Appends the stream's prefetches: from the last return, the next host-resident
    /// ordinals in the run's direction (below `registered`, the ordinals this
    /// iteration has registered; at most `window` ordinals on), in order, until
    /// [`DEGREE`] copies are in flight (issued here or already incoming; one that has
    /// landed is passed over like any tensor on the device) or one does not fit in
    /// `headroom`. Nothing before a run of [`RUN`] pairs.
    pub fn plan(
        &mut self,
        view: &dyn PrefetchView,
        headroom: u64,
        registered: usize,
        window: usize,
        out: &mut Vec<TensorHandle>,
    ) {
        self.judge(view, window);
        let Some(from) = self.last else {
            return;
        };
        if self.run < RUN {
            return;
        }
        let (mut room, mut ahead) = (headroom, 0);
        for i in 1..=window as i64 {
            let k = i64::from(from) + i * i64::from(self.direction);
            if k < 0 || k >= registered as i64 {
                return;
            }
            match view.lookup(TensorKey::Ordinal(k as u32)) {
                Some((h, Residency::Host, bytes)) => {
                    if bytes > room {
                        return;
                    }
                    room -= bytes;
                    out.push(h);
                    ahead += 1;
                }
                Some((_, Residency::Incoming, _)) => ahead += 1,
                // On the device, leaving, dropped, or freed.
                _ => {}
            }
            if ahead >= DEGREE {
                return;
            }
        }
    }

    /// Checks the field invariants. O(1).
    pub fn check_invariants(&self) -> Result<(), String> {
        if (self.run == 0) != (self.direction == 0) {
            return Err(format!(
                "return stream: run {} in direction {}",
                self.run, self.direction
            ));
        }
        if let Some((p, n)) = self.pending {
            if Some(n) != self.last || p == n {
                return Err(format!(
                    "return stream: pending pair ({p}, {n}) is not the last return {:?}",
                    self.last
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::prefetch::TestView as View;
    use std::collections::HashMap;

    fn planned(s: &mut ReturnStream, view: &View, headroom: u64) -> Vec<u32> {
        let mut out = Vec::new();
        s.plan(view, headroom, 100, 2048, &mut out);
        s.check_invariants().unwrap();
        out.iter().map(|h| h.index).collect()
    }

    /// A backward: 20 .. 29 spilled, read back from the top; 25 freed on the way, 23
    /// still on the device.
    fn backward() -> View {
        let mut m: HashMap<u32, (Residency, u64)> =
            (20..30).map(|n| (n, (Residency::Host, 10))).collect();
        m.remove(&25);
        m.insert(23, (Residency::Device, 10));
        View(m)
    }

    #[test]
    fn a_run_of_neighbouring_returns_is_followed_down() {
        let mut view = backward();
        let mut s = ReturnStream::default();
        // One return, then one pair: no run of two pairs yet.
        for n in [29, 28] {
            view.0.insert(n, (Residency::Device, 10));
            s.on_returned(n);
            assert!(planned(&mut s, &view, 1000).is_empty(), "after {n}");
        }
        // A run of two pairs: down from 27, 26 and then 24 (25 was freed).
        view.0.insert(27, (Residency::Device, 10));
        s.on_returned(27);
        assert_eq!(planned(&mut s, &view, 1000), vec![26, 24]);
        // They are in flight: nothing more until one lands.
        view.0.insert(26, (Residency::Incoming, 10));
        view.0.insert(24, (Residency::Incoming, 10));
        assert!(planned(&mut s, &view, 1000).is_empty());
        // One landed: one more copy, the next on the host past it.
        view.0.insert(24, (Residency::Device, 10));
        view.0.insert(22, (Residency::Host, 10));
        assert_eq!(planned(&mut s, &view, 1000), vec![22]);
        // The headroom bounds it, in order: 22 does not fit, so 21 is not taken.
        view.0.insert(26, (Residency::Device, 10));
        s.on_returned(26);
        view.0.insert(22, (Residency::Host, 50));
        assert!(planned(&mut s, &view, 40).is_empty());
        assert_eq!(planned(&mut s, &view, 50), vec![22]);
    }

    #[test]
    fn returns_that_skip_a_tensor_on_the_host_start_no_run() {
        let mut view = backward();
        let mut s = ReturnStream::default();
        // 29, 27, 26, 28: 29 -> 27 skips 28 (on the host), so only one pair follows.
        for n in [29, 27, 26] {
            view.0.insert(n, (Residency::Device, 10));
            s.on_returned(n);
            assert!(planned(&mut s, &view, 1000).is_empty(), "after {n}");
        }
        // A turn restarts the run: 26 -> 28 is up (27 is back), then 28 -> 29 is up too.
        s.on_returned(28);
        assert!(planned(&mut s, &view, 1000).is_empty());
        view.0.insert(28, (Residency::Device, 10));
        s.on_returned(29);
        // Up from 29: nothing registered above on the host.
        view.0.insert(30, (Residency::Host, 10));
        view.0.insert(31, (Residency::Host, 10));
        view.0.insert(32, (Residency::Host, 10));
        assert_eq!(planned(&mut s, &view, 1000), vec![30, 31]);
        // Not past the ordinals registered.
        let mut out = Vec::new();
        s.plan(&view, 1000, 31, 2048, &mut out);
        assert_eq!(out.iter().map(|h| h.index).collect::<Vec<_>>(), vec![30]);
        // A pair never judged (two returns with no scan between them, as when there is
        // no headroom) ends the run: 29 -> 30 and 30 -> 31 go up, but the first pair
        // was not seen, so after 31 the run is one pair.
        s.reset();
        for n in [28, 29] {
            s.on_returned(n);
            planned(&mut s, &view, 1000);
        }
        s.on_returned(30);
        s.on_returned(31);
        view.0.insert(30, (Residency::Device, 10));
        view.0.insert(31, (Residency::Device, 10));
        assert!(planned(&mut s, &view, 1000).is_empty());
        s.on_returned(32);
        view.0.insert(32, (Residency::Device, 10));
        view.0.insert(33, (Residency::Host, 10));
        assert_eq!(planned(&mut s, &view, 1000), vec![33]);
        // A boundary forgets the run.
        s.reset();
        s.on_returned(10);
        assert!(planned(&mut s, &view, 1000).is_empty());
    }
}

/// The stream inside the tier manager: a first iteration's backward on a simulated
/// device, with and without it.
#[cfg(test)]
mod manager_tests {
    use crate::backend::DeviceBackend;
    use crate::tier::manager::TensorOpts;
    use crate::tier::prefetch::PreviousIterationOrder;
    use crate::tier::spill::LruK;
    use crate::tier::tests::sim_manager;
    use crate::tier::TierConfig;

    const MIB: u64 = 1 << 20;

    /// Registers 24 tensors of 1 MiB under a 16 MiB budget (a forward), then reads and
    /// frees them newest first (a backward), 200 us of compute before each step: the
    /// faults and prefetch hits of this one iteration.
    fn first_backward(stream: bool) -> (u64, u64) {
        let mut order = PreviousIterationOrder::new(2048);
        order.stream = stream;
        let mut m = sim_manager(TierConfig::default(), Box::new(LruK { k: 2 }), order);
        let mut hs = Vec::new();
        for _ in 0..24 {
            m.backend_mut().advance_us(200.0);
            hs.push(m.register(MIB, TensorOpts::default()).unwrap());
            m.end_step();
        }
        for &h in hs.iter().rev() {
            m.backend_mut().advance_us(200.0);
            m.access(h, false).unwrap();
            m.end_step();
            m.free(h).unwrap();
            m.check_invariants().unwrap();
        }
        (m.stats().faults, m.stats().prefetch_hits)
    }

    #[test]
    fn a_first_backward_faults_less_with_the_stream() {
        let (faults_off, hits_off) = first_backward(false);
        let (faults_on, hits_on) = first_backward(true);
        // Without a previous iteration the window prefetcher brings nothing back.
        assert_eq!(hits_off, 0);
        assert!(faults_off >= 8, "{faults_off} faults without the stream");
        // With it, only the returns before a run of two pairs fault (and the copies
        // have 200 us to land).
        assert!(faults_on <= 3, "{faults_on} faults with the stream");
        assert_eq!(
            faults_on + hits_on,
            faults_off,
            "every tensor back came back once"
        );
    }
}
