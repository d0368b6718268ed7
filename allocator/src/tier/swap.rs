//! Swap ahead: room for a predicted read, made by spilling tensors read later.
//!
//! The prefetcher brings a tensor back only into free headroom. In a generation request
//! longer than the previous one, past that one's end, the reads it predicts are the
//! key/value caches of the next token step (from size-class lifetimes:
//! [`PreviousIterationOrder::new_shapes`](super::prefetch::PreviousIterationOrder::new_shapes)),
//! and once the caches fill the device it has no headroom: each token step the
//! out-of-memory path spills the newest caches, read a step later, and every read comes
//! back as a fault.
//!
//! With [`TierConfig::swap_ahead`](super::TierConfig::swap_ahead), when the link is
//! idle both ways and no plan is in charge of this stretch of the iteration, the manager
//! asks the prefetch policy which predicted read found no room
//! ([`Wanted`](super::prefetch::Wanted)) and spills, in the spill policy's order, device
//! tensors whose predicted next use
//! ([`PrefetchPolicy::next_use`](super::prefetch::PrefetchPolicy::next_use)) is
//! strictly later than that read, until the room the read lacked against the
//! prefetcher's headroom is on its way out; once those copies land, the prefetcher
//! issues it. This is the "aggressive" rule of integrated prefetching and caching (Cao,
//! Felten, Karlin and Li, 1995): fetch the next block not in memory as soon as the
//! link is free, replacing the block whose next reference is furthest, if that is after
//! the fetched block's. Only reads predicted past the previous iteration's end make
//! room this way: the previous iteration's positions did too in a prototype, and raised
//! the stall on training traces (docs/predictive.md, "An iteration longer than the one
//! before it").
//!
//! A wrong prediction costs copies (a victim read sooner than predicted faults back),
//! never a byte: the spills and prefetches are the manager's own, checked like every
//! other. A read that found no victim farther than itself is not tried again until the
//! policy wants another tensor (the candidate list is the cost).
//!
//! Cost: O(1) while the link is busy or a plan is in charge; otherwise one prefetch
//! plan even without headroom (O(1) when the policy predicts no read, else up to
//! O(window) lookups), and for a new want the candidate list (O(tensors)) and the spill
//! policy's order.

use crate::backend::DeviceBackend;

use super::manager::TierManager;
use super::TierError;

impl<B: DeviceBackend> TierManager<B> {
    /// Whether swap ahead may act now: on, no plan in charge of this stretch of the
    /// iteration (none, none with moves, or past the end of its trajectory), the link
    /// idle both ways. O(1).
    pub(crate) fn swap_ready(&self) -> bool {
        self.cfg.swap_ahead
            && !self
                .planner
                .as_deref()
                .is_some_and(|p| p.has_moves() && !p.past_end())
            && self.pipe.in_bytes == 0
            && self.pipe.oldest_out().is_none()
    }

    /// Spills, for the predicted read the prefetch policy last found no room for, the
    /// tensors predicted to be read after it, until the room it lacked is on its way
    /// out. See the module docs. Call after the policy's `plan`; returns whether it
    /// spilled.
    pub(crate) fn swap_ahead(&mut self) -> Result<bool, TierError> {
        let Some(w) = self.prefetch.wanted() else {
            return Ok(false);
        };
        if self.swap_tried == Some(w.handle) {
            return Ok(false);
        }
        let mut cands = self.candidates(false);
        cands.retain(|c| c.handle != w.handle && c.next_use > w.ahead);
        let now = self.alloc.backend().now_us();
        let order = self.spill.order(&cands, w.short, now, self.cost.as_ref());
        let mut issued = 0;
        for i in order {
            if issued >= w.short {
                break;
            }
            let Some(c) = cands.get(i) else { continue };
            issued += self.spill_or_drop(c, false)?;
        }
        if issued == 0 {
            self.swap_tried = Some(w.handle);
            return Ok(false);
        }
        self.swap_tried = None;
        self.stats.swap_spills += 1;
        Ok(true)
    }
}

/// Swap ahead inside the tier manager: token steps of a generation request longer than
/// the previous one, on a simulated device, with and without it.
#[cfg(test)]
mod tests {
    use crate::tier::tests::short_then_long_request;
    use crate::tier::TierConfig;

    /// A request of 2 token steps, then one of 12, under a 16 MiB budget (the caches
    /// need 20 and the new one beside them): the faults and prefetch hits of the run.
    fn requests(swap: bool) -> (u64, u64, u64) {
        let cfg = TierConfig {
            swap_ahead: swap,
            ..TierConfig::default()
        };
        let s = short_then_long_request(cfg, |_| {}).stats().clone();
        (s.faults, s.prefetch_hits, s.swap_spills)
    }

    #[test]
    fn swap_ahead_brings_the_next_token_steps_caches_back_before_their_reads() {
        let (faults_off, hits_off, swaps_off) = requests(false);
        let (faults_on, hits_on, swaps_on) = requests(true);
        assert_eq!(swaps_off, 0);
        assert!(swaps_on > 0, "no swap ahead");
        // Without it every cache the out-of-memory path pushed out faults back; with it
        // most come back before their reads.
        assert!(
            faults_on * 2 < faults_off,
            "faults: {faults_off} without, {faults_on} with"
        );
        assert!(
            hits_on > hits_off,
            "hits: {hits_off} without, {hits_on} with"
        );
    }
}
