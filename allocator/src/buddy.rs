//! The buddy mechanism: power-of-two blocks inside segments, as index-linked nodes.
//!
//! A segment of `mapped` bytes (any multiple of the minimum block) is the root of one
//! buddy tree of order `ceil(log2(va_size))`. Its address space decomposes into aligned
//! power-of-two blocks; the part beyond `mapped` is held by `Unmapped` nodes that never
//! merge, so a segment of 10 MiB is the trees `[0, 8) + [8, 10)` and a growable segment
//! grows by turning `Unmapped` nodes into `Free` ones.
//!
//! An allocation is a *run*: any range `[off, off + len)` aligned to the minimum block,
//! stored as its canonical decomposition into aligned blocks (greedy largest-first), so a
//! 10 MiB request occupies an 8 MiB and a 2 MiB block and pins nothing else: the unused
//! tail of a power-of-two block stays free as smaller buddies (internal waste < one
//! minimum block per allocation). Freeing a run frees its blocks, each merging with its
//! buddy while the buddy is free.
//!
//! Invariants (checked by [`BuddyPool::check`]):
//! - `free_bytes == sum of the sizes of Free nodes`, and every Free node is on the free
//!   list of its order (and only Free nodes are);
//! - two Free siblings never coexist (they are always merged into their parent);
//! - a Split node has exactly two children covering its two halves;
//! - per segment: `free + used + unmapped == 2^order` and `free + used == mapped`.
//!
//! Costs: finding a block is O(1) (a bitmask of non-empty orders, then a list head);
//! carving or freeing a run is O(pieces x depth) with pieces <= 2 log2(len / min_block)
//! and depth <= log2(va_size / min_block); nodes are recycled through a free list.

use crate::extents::Extents;
use crate::fxmap::FxMap;
use crate::table::Table;

pub const NIL: u32 = u32::MAX;

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Available; on the free list of its order.
    Free,
    /// Split into two children (`child`, `child + 1`).
    Split,
    /// Part of a live run (an allocation, a slab, or a run held in a cache).
    Used,
    /// Address space beyond the mapped size of the segment.
    Unmapped,
    /// In the node pool, unused.
    Dead,
}

#[derive(Debug, Clone, Copy)]
struct Node {
    offset: u64,
    parent: u32,
    child: u32,
    prev: u32,
    next: u32,
    /// For Used nodes: who owns the run (an opaque tag of the caller).
    owner: u32,
    seg: u32,
    order: u8,
    state: State,
}

/// Where a run can go: offset `off` of segment `seg`, inside free block `free` of the
/// placement index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spot {
    pub seg: u32,
    pub off: u64,
    pub free: u32,
}

/// A carved run: its segment, offset, and its block in the placement index (the handle
/// a free gives back, so that freeing needs no lookup by address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub seg: u32,
    pub off: u64,
    pub blk: u32,
}

/// One segment's tree.
#[derive(Debug, Clone)]
pub struct Segment {
    pub base: u64,
    /// Mapped (usable) bytes: the device segment's size, or the growable prefix.
    pub mapped: u64,
    pub root: u32,
    pub order: u8,
    /// Bytes of the segment in Used nodes.
    pub used: u64,
    pub growable: bool,
    /// Holds small-object slabs (placed apart from large runs, as PyTorch's small pool).
    pub small: bool,
    /// Blocks kept as a buddy tree (small segments, and every segment under buddy
    /// placement); otherwise only free extents and used runs are kept (see module docs).
    pub tree: bool,
    /// False once removed (the slot is reused by later segments).
    pub live: bool,
}

/// Free lists and trees of one pool (one stream's memory).
#[derive(Debug, Clone)]
pub struct BuddyPool {
    min_order: u8,
    nodes: Vec<Node>,
    /// Even indices of dead node pairs.
    free_pairs: Vec<u32>,
    heads: [u32; 64],
    /// Bit o set iff the free list of order o is non-empty.
    nonempty: u64,
    free_bytes: u64,
    pub(crate) segs: Table<Segment>,
    free_segs: Vec<u32>,
    /// Maximal free extents (coalesced across buddy boundaries): the placement index.
    ext: Extents,
    /// Place runs best-fit over free extents (true) or by buddy order (false).
    best_fit: bool,
    /// Used runs of segments without a tree: (segment, offset) -> (length, owner).
    /// Kept only while `index_runs` is on: it serves only lookups by address
    /// ([`BuddyPool::owner_at`]) and the tiling check, and costs two hash operations
    /// per run carved and freed.
    runs: FxMap<(u32, u64), (u64, u32)>,
    index_runs: bool,
}

impl BuddyPool {
    pub fn new(min_block: u64) -> Self {
        assert!(min_block.is_power_of_two());
        BuddyPool {
            min_order: min_block.trailing_zeros() as u8,
            nodes: Vec::new(),
            free_pairs: Vec::new(),
            heads: [NIL; 64],
            nonempty: 0,
            free_bytes: 0,
            segs: Table::default(),
            free_segs: Vec::new(),
            ext: Extents::default(),
            best_fit: true,
            runs: FxMap::default(),
            index_runs: true,
        }
    }

    /// Chooses placement: best fit over coalesced free extents (default) or the classic
    /// buddy choice (smallest free block of a sufficient order).
    pub fn set_best_fit(&mut self, on: bool) {
        self.best_fit = on;
    }

    /// Turns the used-run index of large segments off (dropping it) or on. Turning it
    /// on takes every used run of those segments as `(segment, offset, length, owner)`:
    /// the caller knows them (the allocator's records), this pool does not without the
    /// index. While it is off, [`BuddyPool::owner_at`] answers `None` for large
    /// segments and the check verifies the extents and byte counts only.
    pub fn set_run_index(
        &mut self,
        on: bool,
        runs: impl IntoIterator<Item = (u32, u64, u64, u32)>,
    ) {
        self.runs.clear();
        self.index_runs = on;
        if on {
            for (seg, off, len, owner) in runs {
                if !self.segs[seg].tree {
                    self.runs.insert((seg, off), (len, owner));
                }
            }
        }
    }

    /// Whether the used-run index of large segments is kept.
    pub fn run_index(&self) -> bool {
        self.index_runs
    }

    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Size of the largest free block (0 if none).
    pub fn largest_free_block(&self) -> u64 {
        if self.best_fit {
            // The largest free extent of either kind (what a request can get).
            return self.ext.largest();
        }
        if self.nonempty == 0 {
            0
        } else {
            1u64 << (63 - self.nonempty.leading_zeros())
        }
    }

    pub fn live_segments(&self) -> impl Iterator<Item = (u32, &Segment)> {
        self.segs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live)
            .map(|(i, s)| (i as u32, s))
    }

    // ----- node pool and free lists -----

    fn new_node(&mut self, n: Node) -> u32 {
        // Roots take a whole pair (keeps sibling = index ^ 1 valid for children).
        let i = self.alloc_pair();
        self.nodes[i as usize] = n;
        i
    }

    fn alloc_pair(&mut self) -> u32 {
        if let Some(i) = self.free_pairs.pop() {
            return i;
        }
        let i = self.nodes.len() as u32;
        let dead = Node {
            offset: 0,
            parent: NIL,
            child: NIL,
            prev: NIL,
            next: NIL,
            owner: NIL,
            seg: NIL,
            order: 0,
            state: State::Dead,
        };
        self.nodes.push(dead);
        self.nodes.push(dead);
        i
    }

    fn release_pair(&mut self, i: u32) {
        self.nodes[i as usize].state = State::Dead;
        self.nodes[i as usize + 1].state = State::Dead;
        self.free_pairs.push(i);
    }

    #[inline]
    fn push_free(&mut self, i: u32) {
        let o = self.nodes[i as usize].order as usize;
        let h = self.heads[o];
        {
            let n = &mut self.nodes[i as usize];
            n.state = State::Free;
            n.prev = NIL;
            n.next = h;
        }
        if h != NIL {
            self.nodes[h as usize].prev = i;
        }
        self.heads[o] = i;
        self.nonempty |= 1 << o;
        self.free_bytes += 1u64 << o;
    }

    #[inline]
    fn unlink_free(&mut self, i: u32) {
        let Node {
            prev, next, order, ..
        } = self.nodes[i as usize];
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.heads[order as usize] = next;
            if next == NIL {
                self.nonempty &= !(1 << order);
            }
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        }
        self.free_bytes -= 1u64 << order;
    }

    /// Splits node `i` (state `st`, not on a free list) into two children of state
    /// `st`; Free children are put on their free list. Returns the left child.
    fn split(&mut self, i: u32, st: State) -> u32 {
        let c = self.alloc_pair();
        let Node {
            offset, order, seg, ..
        } = self.nodes[i as usize];
        debug_assert!(order > self.min_order);
        let half = 1u64 << (order - 1);
        for (k, off) in [(0u32, offset), (1, offset + half)] {
            self.nodes[(c + k) as usize] = Node {
                offset: off,
                parent: i,
                child: NIL,
                prev: NIL,
                next: NIL,
                owner: NIL,
                seg,
                order: order - 1,
                state: st,
            };
        }
        let n = &mut self.nodes[i as usize];
        n.state = State::Split;
        n.child = c;
        if st == State::Free {
            self.push_free(c);
            self.push_free(c + 1);
        }
        c
    }

    /// The deepest node of segment `seg` containing `off` (not Split).
    #[inline]
    fn locate(&self, seg: u32, off: u64) -> u32 {
        let mut i = self.segs[seg].root;
        loop {
            let n = &self.nodes[i as usize];
            if n.state != State::Split {
                return i;
            }
            let half = 1u64 << (n.order - 1);
            i = n.child + ((off - n.offset) >= half) as u32;
        }
    }

    /// Sets every piece of `[off, off + len)` of segment `seg` from state `from` to
    /// `to` (splitting larger `from` nodes as needed). The range must be in `from`
    /// state; Free targets are merged. `owner` tags Used pieces.
    fn set_range(&mut self, seg: u32, off: u64, len: u64, from: State, to: State, owner: u32) {
        if len == 0 {
            return;
        }
        let root = self.segs[seg].root;
        self.set_rec(root, off, off + len, from, to, owner);
    }

    /// One descent over the nodes intersecting `[a, b)`: O(depth + pieces) visits. A
    /// node wholly inside the range and in state `from` changes as a whole (so the
    /// nodes touched are exactly the canonical pieces); a partly covered one is split.
    /// Free siblings are merged on the way back up.
    fn set_rec(&mut self, i: u32, a: u64, b: u64, from: State, to: State, owner: u32) {
        let Node {
            offset: o,
            order,
            state,
            ..
        } = self.nodes[i as usize];
        let size = 1u64 << order;
        if a <= o && o + size <= b && state == from {
            if from == State::Free {
                self.unlink_free(i);
            }
            if to == State::Free {
                self.push_free(i);
            } else {
                let n = &mut self.nodes[i as usize];
                n.state = to;
                n.owner = owner;
            }
            return;
        }
        if state != State::Split {
            debug_assert_eq!(state, from, "set_range over a node in the wrong state");
            if from == State::Free {
                self.unlink_free(i);
            }
            self.split(i, from);
        }
        let c = self.nodes[i as usize].child;
        let mid = o + size / 2;
        if a < mid {
            self.set_rec(c, a, b, from, to, owner);
        }
        if b > mid {
            self.set_rec(c + 1, a, b, from, to, owner);
        }
        if to == State::Free
            && self.nodes[c as usize].state == State::Free
            && self.nodes[c as usize + 1].state == State::Free
        {
            self.unlink_free(c);
            self.unlink_free(c + 1);
            self.release_pair(c);
            self.push_free(i);
        }
    }

    /// Where a run `[off, off + len)` of segment `seg` can go, if that range lies in
    /// one free block. O(blocks of the segment up to `off`).
    pub fn spot_at(&self, seg: u32, off: u64, len: u64) -> Option<Spot> {
        let s = self.segs.get(seg)?;
        if !s.live || off.checked_add(len)? > s.mapped {
            return None;
        }
        let free = self.ext.containing(seg, off, len)?;
        Some(Spot { seg, off, free })
    }

    /// [`BuddyPool::spot_at`], searching from block `from` (a run at or left of
    /// `off`) when given.
    pub fn spot_near(&self, seg: u32, from: Option<u32>, off: u64, len: u64) -> Option<Spot> {
        let Some(from) = from else {
            return self.spot_at(seg, off, len);
        };
        let s = self.segs.get(seg)?;
        if !s.live || off.checked_add(len)? > s.mapped {
            return None;
        }
        let free = self.ext.containing_from(seg, from, off, len)?;
        Some(Spot { seg, off, free })
    }

    /// True iff `[off, off + len)` of segment `seg` is entirely Free.
    pub fn is_free_range(&self, seg: u32, off: u64, len: u64) -> bool {
        let s = &self.segs[seg];
        if off + len > s.mapped {
            return false;
        }
        if !s.tree {
            return self.ext.containing(seg, off, len).is_some();
        }
        let mut cur = off;
        let end = off + len;
        while cur < end {
            let i = self.locate(seg, cur);
            let n = &self.nodes[i as usize];
            if n.state != State::Free {
                return false;
            }
            cur = n.offset + (1u64 << n.order);
        }
        true
    }

    // ----- segments -----

    /// Adds a segment of `mapped` bytes at `base` whose tree spans `va` bytes (a power
    /// of two >= mapped; larger for a growable segment). All mapped bytes start Free.
    pub fn add_segment(
        &mut self,
        base: u64,
        mapped: u64,
        va: u64,
        growable: bool,
        small: bool,
    ) -> u32 {
        debug_assert!(va.is_power_of_two() && va >= mapped);
        let order = va.trailing_zeros() as u8;
        let tree = small || !self.best_fit;
        let seg = self.free_segs.pop().unwrap_or_else(|| {
            self.segs.push(Segment {
                base: 0,
                mapped: 0,
                root: NIL,
                order: 0,
                used: 0,
                growable: false,
                small: false,
                tree: false,
                live: false,
            });
            (self.segs.len() - 1) as u32
        });
        let root = if !tree {
            NIL
        } else {
            self.new_node(Node {
                offset: 0,
                parent: NIL,
                child: NIL,
                prev: NIL,
                next: NIL,
                owner: NIL,
                seg,
                order,
                state: State::Unmapped,
            })
        };
        self.segs[seg] = Segment {
            base,
            mapped: 0,
            root,
            order,
            used: 0,
            growable,
            small,
            tree,
            live: true,
        };
        self.ext.set_growable(seg, growable);
        if mapped > 0 {
            self.map_more(seg, mapped);
        }
        seg
    }

    /// Extends segment `seg`'s mapped prefix by `add` bytes (now Free).
    pub fn map_more(&mut self, seg: u32, add: u64) {
        let s = &self.segs[seg];
        let (start, order) = (s.mapped, s.order);
        assert!(
            start + add <= 1u64 << order,
            "growth beyond the segment's range"
        );
        if self.segs[seg].tree {
            self.set_range(seg, start, add, State::Unmapped, State::Free, NIL);
        } else {
            self.free_bytes += add;
        }
        let small = self.segs[seg].small;
        self.ext.append(small, seg, add);
        self.segs[seg].mapped += add;
    }

    /// Unmaps the last `release` bytes of `seg` (they must be Free).
    pub fn unmap_tail(&mut self, seg: u32, release: u64) {
        let m = self.segs[seg].mapped;
        debug_assert!(self.is_free_range(seg, m - release, release));
        self.ext.trim_tail(seg, release);
        if self.segs[seg].tree {
            self.set_range(seg, m - release, release, State::Free, State::Unmapped, NIL);
        } else {
            self.free_bytes -= release;
        }
        self.segs[seg].mapped -= release;
    }

    /// Bytes of free space at the end of the mapped prefix of `seg`. O(1).
    pub fn trailing_free(&self, seg: u32) -> u64 {
        self.ext.tail_free(seg)
    }

    /// Removes an entirely free segment; returns (base, mapped).
    pub fn remove_segment(&mut self, seg: u32) -> (u64, u64) {
        let s = self.segs[seg].clone();
        assert!(s.live && s.used == 0, "removing a segment in use");
        if !s.tree {
            self.ext.remove_segment(seg);
            self.free_bytes -= s.mapped;
            self.segs[seg].live = false;
            self.free_segs.push(seg);
            return (s.base, s.mapped);
        }
        let mut stack = vec![s.root];
        let mut pairs = Vec::new();
        while let Some(i) = stack.pop() {
            let n = self.nodes[i as usize];
            match n.state {
                State::Split => {
                    stack.push(n.child);
                    stack.push(n.child + 1);
                    pairs.push(n.child);
                }
                State::Free => self.unlink_free(i),
                State::Unmapped => {}
                State::Used | State::Dead => unreachable!("segment not empty"),
            }
        }
        for c in pairs {
            self.release_pair(c);
        }
        self.ext.remove_segment(seg);
        self.release_pair(s.root);
        self.segs[seg].live = false;
        self.free_segs.push(seg);
        (s.base, s.mapped)
    }
}

#[path = "buddy_runs.rs"]
mod runs;

#[path = "buddy_check.rs"]
mod check;

#[cfg(test)]
#[path = "buddy_tests.rs"]
mod tests;
