//! Spill policy: which device-resident tensors go to host memory when the device is
//! under pressure. Two traits so that predictive mode can replace either part:
//!
//! - [`MigrationCost`]: what moving a tensor out (and back) costs, in microseconds;
//!   the reactive [`LinkCost`] is `round trip bytes / link bandwidth + recompute time
//!   x recompute probability`, with the bandwidths measured on the H200
//!   (`sim::CostModel::h200`: pinned ~55 GB/s each way, pageable 8-18 GB/s).
//! - [`SpillPolicy`]: the order of victims; the reactive [`LruK`] ranks by LRU-K
//!   backward distance (K = 2) per unit of migration cost per byte.
//!
//! Cost: a choice sorts the candidates, O(n log n) for n resident tensors; the
//! manager asks once per watermark crossing (spills come in batches down to the low
//! watermark), not once per allocation.

use crate::backend::sim::CostModel;
use crate::backend::CopyKind;

use super::handle::{TensorHandle, MAX_K};

/// A tensor the policy may spill: on the device, not in use in the current step, no
/// copy in flight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub handle: TensorHandle,
    pub bytes: u64,
    /// Times of the last accesses, most recent first; `NEG_INFINITY` = no such access.
    pub history: [f64; MAX_K],
    pub recompute_us: f64,
    pub recompute_prob: f64,
    /// Would the copy go to the pinned staging pool (else pageable memory)?
    pub warm: bool,
    /// Persistent (parameters, optimizer state): read and written every iteration.
    pub persistent: bool,
    /// Operations until its next access as the prefetch policy predicts it
    /// (`f64::INFINITY`: unknown); filled only for policies that read it.
    pub next_use: f64,
}

/// The cost of moving a tensor out and back, microseconds. Policies compare it across
/// tensors; it need not be a time the device will actually spend.
pub trait MigrationCost: Send {
    fn cost_us(&self, c: &Candidate) -> f64;
    /// The measured link costs behind this cost, if it has them: the manager's
    /// drop-or-spill rule then uses the same ones.
    fn cost_model(&self) -> Option<&CostModel> {
        None
    }
}

/// Chooses victims. Implementations return indices into `cands` in the order they
/// should be spilled; the manager spills from the front until `need` bytes are freed
/// (it may stop early or go further, so return them all in preference order).
pub trait SpillPolicy: Send {
    fn order(
        &mut self,
        cands: &[Candidate],
        need: u64,
        now_us: f64,
        cost: &dyn MigrationCost,
    ) -> Vec<usize>;
    fn name(&self) -> &'static str;
    /// True if this policy reads `Candidate::next_use` (the manager computes it only
    /// then: a search per candidate).
    fn reads_next_use(&self) -> bool {
        false
    }
}

/// `cost = bytes / D2H bandwidth + bytes / H2D bandwidth + recompute_us x recompute_prob`,
/// bandwidths interpolated in the cost model's measured table (the H200's by default) for
/// the tier the copy would use.
#[derive(Debug, Clone, Default)]
pub struct LinkCost {
    /// The measured constants (`CostModel::default()` is the H200's).
    pub model: CostModel,
}

impl MigrationCost for LinkCost {
    fn cost_us(&self, c: &Candidate) -> f64 {
        let (out, back) = if c.warm {
            (CopyKind::DeviceToHostPinned, CopyKind::HostToDevicePinned)
        } else {
            (
                CopyKind::DeviceToHostPageable,
                CopyKind::HostToDevicePageable,
            )
        };
        self.model.copy_us(out, c.bytes)
            + self.model.copy_us(back, c.bytes)
            + c.recompute_us * c.recompute_prob
    }
    fn cost_model(&self) -> Option<&CostModel> {
        Some(&self.model)
    }
}

/// LRU-K (O'Neil et al., 1993) weighted by migration cost.
///
/// The backward K-distance of a tensor is `now - t_K`, its K-th most recent access
/// (infinite with fewer than K accesses). Tensors with an infinite distance go first
/// (as in LRU-K), ranked among themselves by LRU-1; every rank value is divided by the
/// migration cost per byte, so that of two equally cold tensors the cheaper one to
/// move (per byte freed) goes first:
///
/// `score = (now - t) / (cost_us / bytes)`, class 0 (infinite) before class 1.
///
/// Persistent tensors never fall in class 0: they are touched every iteration, which
/// the access model may not have shown yet at the first iteration.
#[derive(Debug, Clone)]
pub struct LruK {
    pub k: usize,
}

impl Default for LruK {
    fn default() -> Self {
        LruK { k: 2 }
    }
}

impl SpillPolicy for LruK {
    fn order(
        &mut self,
        cands: &[Candidate],
        _need: u64,
        now_us: f64,
        cost: &dyn MigrationCost,
    ) -> Vec<usize> {
        let k = self.k.clamp(1, MAX_K);
        let mut keyed: Vec<(u8, f64, usize)> = cands
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let per_byte = (cost.cost_us(c) / c.bytes.max(1) as f64).max(1e-12);
                let tk = c.history[k - 1];
                let (class, t) = if tk == f64::NEG_INFINITY && !c.persistent {
                    (0, c.history[0])
                } else if tk == f64::NEG_INFINITY {
                    (1, c.history[0])
                } else {
                    (1, tk)
                };
                // A tensor never accessed at all counts as accessed at time 0.
                let age = (now_us - t.max(0.0)).max(0.0);
                (class, age / per_byte, i)
            })
            .collect();
        // Class 0 first, then the largest score; index breaks ties (deterministic).
        keyed.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.total_cmp(&a.1)).then(a.2.cmp(&b.2)));
        keyed.into_iter().map(|(_, _, i)| i).collect()
    }
    fn name(&self) -> &'static str {
        "lru-k"
    }
}

/// Belady's choice on the predicted future: the tensor whose next access is farthest
/// goes first (its bytes are needed last, so the link has the longest to bring them
/// back); tensors with no predicted access come first of all, ranked among themselves
/// by LRU-K. With no prediction at all (every `next_use` infinite) this is LRU-K.
#[derive(Debug, Clone, Default)]
pub struct FarthestNextUse {
    pub lru: LruK,
}

impl SpillPolicy for FarthestNextUse {
    fn order(
        &mut self,
        cands: &[Candidate],
        need: u64,
        now_us: f64,
        cost: &dyn MigrationCost,
    ) -> Vec<usize> {
        // LRU-K's order is the tie-break (and the whole order without predictions).
        let lru = self.lru.order(cands, need, now_us, cost);
        let mut rank = vec![0usize; cands.len()];
        for (r, &i) in lru.iter().enumerate() {
            rank[i] = r;
        }
        let mut out = lru;
        out.sort_by(|&a, &b| {
            cands[b]
                .next_use
                .total_cmp(&cands[a].next_use)
                .then(rank[a].cmp(&rank[b]))
        });
        out
    }
    fn name(&self) -> &'static str {
        "farthest-next-use"
    }
    fn reads_next_use(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(i: u32, bytes: u64, hist: &[f64], warm: bool) -> Candidate {
        let mut history = [f64::NEG_INFINITY; MAX_K];
        history[..hist.len()].copy_from_slice(hist);
        Candidate {
            handle: TensorHandle { index: i, gen: 0 },
            bytes,
            history,
            recompute_us: 0.0,
            recompute_prob: 0.0,
            warm,
            persistent: false,
            next_use: f64::INFINITY,
        }
    }

    #[test]
    fn farthest_next_use_goes_first_and_lru_breaks_ties() {
        let mut cs = [
            cand(0, 1 << 20, &[90.0, 80.0], true),
            cand(1, 1 << 20, &[95.0], true),
            cand(2, 1 << 20, &[99.0, 10.0], true),
            cand(3, 1 << 20, &[50.0], true),
        ];
        // No predictions: LRU-K's order.
        let lc = LinkCost::default();
        let mut p = FarthestNextUse::default();
        assert_eq!(p.order(&cs, 0, 100.0, &lc), vec![3, 1, 2, 0]);
        cs[0].next_use = 500.0;
        cs[2].next_use = 10.0;
        cs[3].next_use = 40.0;
        // 1 has no predicted use (first), then 0 (500), 3 (40), 2 (10).
        assert_eq!(p.order(&cs, 0, 100.0, &lc), vec![1, 0, 3, 2]);
    }

    #[test]
    fn lru_k_prefers_single_use_then_old_second_access() {
        let cs = [
            cand(0, 1 << 20, &[90.0, 80.0], true), // K-distance 20
            cand(1, 1 << 20, &[95.0], true),       // one access: infinite
            cand(2, 1 << 20, &[99.0, 10.0], true), // K-distance 90
            cand(3, 1 << 20, &[50.0], true),       // one access, older
        ];
        let order = LruK::default().order(&cs, 0, 100.0, &LinkCost::default());
        assert_eq!(order, vec![3, 1, 2, 0]);
    }

    #[test]
    fn migration_cost_weights_the_choice() {
        // Same age; the pageable one costs ~4x more per byte: the pinned one goes first.
        let cs = [
            cand(0, 64 << 20, &[50.0], false),
            cand(1, 64 << 20, &[50.0], true),
        ];
        let lc = LinkCost::default();
        assert!(lc.cost_us(&cs[0]) > 3.0 * lc.cost_us(&cs[1]));
        let order = LruK::default().order(&cs, 0, 100.0, &lc);
        assert_eq!(order, vec![1, 0]);
        // A recomputable tensor with a probable, costly recompute is kept longer.
        let mut r = cand(2, 64 << 20, &[50.0], true);
        r.recompute_us = 1e6;
        r.recompute_prob = 1.0;
        let order = LruK::default().order(&[r, cs[1]], 0, 100.0, &lc);
        assert_eq!(order, vec![1, 0]);
    }
}
