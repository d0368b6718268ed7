//! Tensor handles and the registry that knows where every tensor is.
//!
//! The caller holds a [`TensorHandle`] (index + generation, `Copy`); the registry owns
//! the placement, so a tensor moves between tiers without the caller noticing. A
//! stale handle (freed, or from another manager) is an error, never a wrong tensor:
//! the generation of a slot is bumped when the slot is reused.
//!
//! Cost: every lookup is one vector index and one generation compare.

use crate::pool::Allocation;

use super::staging::HostLoc;
use super::transfer::TransferId;
use super::TierError;

/// The most accesses of history kept per tensor (the K of LRU-K is at most this).
pub const MAX_K: usize = 4;

/// A tensor, as the caller names it. Stays valid while the tensor moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct TensorHandle {
    pub(crate) index: u32,
    pub(crate) gen: u32,
}

impl std::fmt::Display for TensorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}.{}", self.index, self.gen)
    }
}

/// The identity of a tensor across iterations, for the prefetcher: a persistent
/// tensor (parameters, optimizer state) is itself; any other is the n-th tensor
/// registered since the last iteration boundary (the same layer's activation has the
/// same ordinal in every iteration of a static graph).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorKey {
    Persistent(TensorHandle),
    Ordinal(u32),
}

/// Where a tensor's bytes are. Exactly one authoritative copy exists at all times:
/// - `Device`: on the device only;
/// - `Host`: in the warm or cold tier only;
/// - `SpillingOut`: device copy authoritative, a device-to-host copy in flight;
/// - `PrefetchingIn`: host copy authoritative until the host-to-device copy completes;
/// - `Dropped`: no copy anywhere; its producer can make it again from inputs that are
///   registered and not dropped (`tier::recompute`), which its next access does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Device {
        alloc: Allocation,
    },
    Host {
        host: HostLoc,
    },
    SpillingOut {
        alloc: Allocation,
        host: HostLoc,
        transfer: TransferId,
    },
    PrefetchingIn {
        alloc: Allocation,
        host: HostLoc,
        transfer: TransferId,
    },
    Dropped,
}

impl Place {
    /// Device memory this tensor holds now (also while a copy is in flight).
    pub fn device(&self) -> Option<Allocation> {
        match *self {
            Place::Device { alloc }
            | Place::SpillingOut { alloc, .. }
            | Place::PrefetchingIn { alloc, .. } => Some(alloc),
            Place::Host { .. } | Place::Dropped => None,
        }
    }
    /// Host memory this tensor holds now.
    pub fn host(&self) -> Option<HostLoc> {
        match *self {
            Place::Host { host }
            | Place::SpillingOut { host, .. }
            | Place::PrefetchingIn { host, .. } => Some(host),
            Place::Device { .. } | Place::Dropped => None,
        }
    }
    pub fn in_flight(&self) -> Option<TransferId> {
        match *self {
            Place::SpillingOut { transfer, .. } | Place::PrefetchingIn { transfer, .. } => {
                Some(transfer)
            }
            _ => None,
        }
    }
}

/// One registered tensor.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Requested bytes (> 0).
    pub bytes: u64,
    pub place: Place,
    pub key: TensorKey,
    pub persistent: bool,
    /// Times of the last accesses, most recent first; `NEG_INFINITY` = none.
    pub history: [f64; MAX_K],
    /// Recompute cost (microseconds) and the probability the caller recomputes it.
    pub recompute_us: f64,
    pub recompute_prob: f64,
    /// The step in which it was last accessed: tensors of the current step are pinned.
    pub step: u64,
    /// Brought back by a prefetch and not accessed since.
    pub prefetched_unused: bool,
    /// Read only with `prefetched_unused`: that prefetch read pageable memory, so the
    /// host waited inside the copy call and its access counts as a miss, not a hit.
    pub prefetch_blocked: bool,
    /// A cancelled spill's copy still reading this tensor's device memory: the memory
    /// must outlive it (a free hands it to that transfer).
    pub reader: Option<TransferId>,
}

impl Entry {
    pub(crate) fn touch(&mut self, now: f64, step: u64) {
        self.history.copy_within(0..MAX_K - 1, 1);
        self.history[0] = now;
        self.step = step;
        self.prefetched_unused = false;
    }
}

#[derive(Debug, Clone)]
struct Slot {
    gen: u32,
    // Invariant: `entry.is_some()` iff the slot is not in `free`.
    entry: Option<Entry>,
}

/// All registered tensors: a slot vector with a free list.
///
/// `live == slots.len() - free.len()` (checked by `check`).
#[derive(Debug, Default)]
pub struct Registry {
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
}

impl Registry {
    pub fn insert(&mut self, e: Entry) -> TensorHandle {
        self.live += 1;
        if let Some(i) = self.free.pop() {
            let s = &mut self.slots[i as usize];
            s.gen = s.gen.wrapping_add(1);
            s.entry = Some(e);
            TensorHandle {
                index: i,
                gen: s.gen,
            }
        } else {
            self.slots.push(Slot {
                gen: 0,
                entry: Some(e),
            });
            TensorHandle {
                index: (self.slots.len() - 1) as u32,
                gen: 0,
            }
        }
    }

    pub fn get(&self, h: TensorHandle) -> Result<&Entry, TierError> {
        match self.slots.get(h.index as usize) {
            Some(Slot {
                gen,
                entry: Some(e),
            }) if *gen == h.gen => Ok(e),
            _ => Err(TierError::UnknownHandle(h)),
        }
    }

    pub fn get_mut(&mut self, h: TensorHandle) -> Result<&mut Entry, TierError> {
        match self.slots.get_mut(h.index as usize) {
            Some(Slot {
                gen,
                entry: Some(e),
            }) if *gen == h.gen => Ok(e),
            _ => Err(TierError::UnknownHandle(h)),
        }
    }

    /// Removes a tensor; its handle becomes invalid.
    pub fn remove(&mut self, h: TensorHandle) -> Result<Entry, TierError> {
        self.get(h)?;
        let e = self.slots[h.index as usize].entry.take().expect("checked");
        self.free.push(h.index);
        self.live -= 1;
        Ok(e)
    }

    pub fn len(&self) -> usize {
        self.live
    }
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Every live tensor with its handle. O(slots).
    pub fn iter(&self) -> impl Iterator<Item = (TensorHandle, &Entry)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            s.entry.as_ref().map(|e| {
                (
                    TensorHandle {
                        index: i as u32,
                        gen: s.gen,
                    },
                    e,
                )
            })
        })
    }

    pub(crate) fn check(&self) -> Result<(), TierError> {
        let n = self.slots.iter().filter(|s| s.entry.is_some()).count();
        if n != self.live || self.slots.len() - self.free.len() != self.live {
            return Err(TierError::Invariant(format!(
                "registry: {n} live slots, count {}, {} slots, {} free",
                self.live,
                self.slots.len(),
                self.free.len()
            )));
        }
        Ok(())
    }
}
