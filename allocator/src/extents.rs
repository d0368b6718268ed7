//! The placement index: every segment's mapped range as a list of blocks, free or used,
//! linked in address order (TLSF's physical neighbours), with the free blocks in
//! segregated size bins.
//!
//! Bins as in TLSF, finer: 32 bins per power of two (`bin = 32 * floor(log2 len) + the
//! next 5 bits`, so blocks in one bin differ by less than 3.2%), a bitmap of non-empty
//! bins per kind (small-object segments, large-run segments) with one summary word
//! above it, so that the first non-empty bin above any bin is two bit scans. A bin is a
//! doubly linked list through the blocks, newest first.
//!
//! Why lists and fine bins: with 8 bins per power of two a bin held blocks up to 12.5%
//! apart, best fit had to scan up to 16 of them, and dense per-bin arrays beat a list
//! walk for that. With 32 bins a scan of 2 finds the same placements (the same reserved
//! bytes on all eight bundled PyTorch traces, `examples/replay_table`), and a list is
//! cheaper to keep than arrays whose swap-removes touch a third block: the index alone
//! went from 76 to 63 ns per mid-size alloc+free (`examples/fast_path_parts`).
//!
//! A used block's index is its run's handle: the caller keeps it (the allocator's record
//! or slab) and hands it back on free, so a free finds its neighbours through the
//! address-order links and merges with them without any lookup by address. No hash
//! table is touched on any path.
//!
//! Invariants (checked by [`Extents::check`]), per live segment with `mapped` bytes:
//! - its blocks tile `[0, mapped)`: `first.off == 0`, `b.off + b.len == b.right.off`,
//!   `last.off + last.len == mapped`, and `sum(free) + sum(used) == mapped`;
//! - no two free blocks are neighbours (a free block is a maximal free extent);
//! - a block is in a bin iff it is free, on the list of bin `bin_of(len)` of its kind
//!   (`heads[kind][bin]`, linked by `prev`/`next`).
//!
//! `best_fit(len)`: the smallest of (at most `SCAN`, newest first) free blocks >= len in
//! the request's own bin, else the smallest of (at most `SCAN`) in the first non-empty
//! bin above it, else (no bin above) the smallest fitting one anywhere in the own bin,
//! else the smallest fitting free tail of a growable segment: it never misses a block
//! that fits.
//!
//! **The free tail of a growable segment is used last.** It lives in its own bin
//! (`TAIL_BIN`, above every size) whatever its length, so a run goes there only when
//! no other free block fits. Then placement does not depend on how far the tail is
//! mapped: growing more, or ahead of need (predictive mode), or less changes which
//! memory is mapped, never where a run goes, and the free tail stays whole for release
//! and growth. The property test against lying forecasters (tests/predictive.rs) found
//! the reverse: a bigger tail taken as the best fit moved later runs into holes and
//! left a request unserved that a smaller tail's layout served.
//! Blocks within a bin differ by less than 3.2%, so while the own bin holds at most
//! `SCAN` blocks this is best fit to within that; a fuller bin can hide a closer fit among
//! its older entries, and a block of the next bin is taken instead (measured in
//! docs/allocator.md: the same reserved bytes as an exact ordered set; `SCAN` = 1 costs
//! resnet50 1.25% -> 2.37% overhead).
//!
//! Costs: `take`, `release`, `append`, `trim_tail` are O(1): a handful of block
//! accesses, at most two bin unlinks and one link. `best_fit` is O(SCAN) plus two bit
//! scans, except when nothing above the request's bin is free: then it reads
//! the whole own bin (the pool grows otherwise). `containing` (buddy placement only)
//! walks a segment's blocks.

use crate::buddy::NIL;
use crate::table::Table;

/// Bins per power of two: 2^SUB_BITS (measured in the module docs).
const SUB_BITS: usize = 5;
const NBINS: usize = 64 << SUB_BITS;
const WORDS: usize = NBINS / 64;
const _: () = assert!(WORDS <= 64, "one summary word covers the bitmap");
/// Blocks a best-fit scan reads per bin (measured in the module docs).
const SCAN: usize = 2;
/// The bin of growable segments' free tails (see the module docs); no length maps to
/// it (`bin_of` stays below for every length under 2^63).
const TAIL_BIN: usize = NBINS - 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlkState {
    Free,
    Used,
    /// On the dead list, reusable.
    Dead,
}

#[derive(Debug, Clone, Copy)]
struct Blk {
    off: u64,
    len: u64,
    seg: u32,
    /// Neighbours in its bin's list (free blocks only; newest first).
    prev: u32,
    next: u32,
    /// Address-order neighbours in the segment (NIL at its ends).
    left: u32,
    right: u32,
    // Invariant: bin == bin_of(len) while Free (kept so that an unlink needs no
    // recomputation).
    bin: u16,
    state: BlkState,
    small: bool,
}

/// Blocks of every segment of one pool, free ones in size bins.
#[derive(Debug, Clone)]
pub struct Extents {
    blks: Table<Blk>,
    dead: Vec<u32>,
    /// Per segment: its first and last block (NIL, NIL while nothing is mapped).
    ends: Vec<(u32, u32)>,
    /// Per segment: growable (its last block, when free, is binned in `TAIL_BIN`).
    growable: Vec<bool>,
    /// Per kind and bin: the newest free block of its list (NIL if none).
    heads: Box<[[u32; NBINS]; 2]>,
    // Invariant: bit b of bits[k] set iff bin b of kind k is not empty.
    bits: [[u64; WORDS]; 2],
    // Invariant: bit w of top[k] set iff bits[k][w] != 0 (next_bin is two bit scans).
    top: [u64; 2],
    // Invariant: nfree == number of Free blocks.
    nfree: usize,
}

impl Default for Extents {
    fn default() -> Self {
        Extents {
            blks: Table::default(),
            dead: Vec::new(),
            ends: Vec::new(),
            growable: Vec::new(),
            heads: Box::new([[NIL; NBINS]; 2]),
            bits: [[0; WORDS]; 2],
            top: [0; 2],
            nfree: 0,
        }
    }
}

#[inline]
fn bin_of(len: u64) -> usize {
    let e = 63 - len.max(1 << SUB_BITS).leading_zeros() as usize;
    let m = ((len >> (e - SUB_BITS)) as usize) & ((1 << SUB_BITS) - 1);
    (e << SUB_BITS) + m
}

impl Extents {
    /// Number of free blocks.
    pub fn len(&self) -> usize {
        self.nfree
    }

    pub fn is_empty(&self) -> bool {
        self.nfree == 0
    }

    /// `(segment, offset, length)` of block `i`.
    #[inline]
    pub fn span(&self, i: u32) -> (u32, u64, u64) {
        let b = &self.blks[i];
        (b.seg, b.off, b.len)
    }

    #[inline(always)]
    fn new_blk(&mut self, b: Blk) -> u32 {
        match self.dead.pop() {
            Some(i) => {
                self.blks[i] = b;
                i
            }
            None => {
                self.blks.push(b);
                (self.blks.len() - 1) as u32
            }
        }
    }

    #[inline(always)]
    fn kill(&mut self, i: u32) {
        self.blks[i].state = BlkState::Dead;
        self.dead.push(i);
    }

    /// Takes free block `i` out of its size bin (it stays Free). O(1): a list unlink.
    #[inline(always)]
    fn unbin(&mut self, i: u32) {
        let e = &self.blks[i];
        let (k, b, prev, next) = (e.small as usize, e.bin as usize, e.prev, e.next);
        if prev != NIL {
            self.blks[prev].next = next;
        } else {
            self.heads[k][b] = next;
            if next == NIL {
                let w = &mut self.bits[k][b / 64];
                *w &= !(1 << (b % 64));
                if *w == 0 {
                    self.top[k] &= !(1 << (b / 64));
                }
            }
        }
        if next != NIL {
            self.blks[next].prev = prev;
        }
    }

    /// Puts free block `i` at the head of bin `b` (which must be `bin_of` its length).
    #[inline(always)]
    fn bin_at(&mut self, i: u32, b: usize) {
        let k = self.blks[i].small as usize;
        let head = self.heads[k][b];
        if head != NIL {
            self.blks[head].prev = i;
        } else {
            self.bits[k][b / 64] |= 1 << (b % 64);
            self.top[k] |= 1 << (b / 64);
        }
        let e = &mut self.blks[i];
        e.prev = NIL;
        e.next = head;
        e.bin = b as u16;
        self.heads[k][b] = i;
    }

    /// The bin free block `i` of length `len` belongs in: `TAIL_BIN` for the last block
    /// of a growable segment, else its length's bin.
    #[inline(always)]
    fn bin_for(&self, i: u32, len: u64) -> usize {
        let b = &self.blks[i];
        if b.right == NIL && self.growable.get(b.seg as usize).copied().unwrap_or(false) {
            TAIL_BIN
        } else {
            bin_of(len)
        }
    }

    /// Puts free block `i` in its bin.
    #[inline(always)]
    fn bin(&mut self, i: u32) {
        self.bin_at(i, self.bin_for(i, self.blks[i].len));
    }

    /// Marks segment `seg` growable or not (before anything of it is mapped).
    pub fn set_growable(&mut self, seg: u32, growable: bool) {
        let i = seg as usize;
        if self.growable.len() <= i {
            self.growable.resize(i + 1, false);
            self.ends.resize(self.ends.len().max(i + 1), (NIL, NIL));
        }
        debug_assert_eq!(self.ends[i], (NIL, NIL), "segment already mapped");
        self.growable[i] = growable;
    }

    /// Sets free block `i` to `[off, off + len)`, moving it between bins only if its
    /// bin changes (its length's, or its place as a growable segment's tail).
    #[inline(always)]
    fn reshape_free(&mut self, i: u32, off: u64, len: u64) {
        let nb = self.bin_for(i, len);
        let e = &mut self.blks[i];
        e.off = off;
        e.len = len;
        if e.bin as usize != nb {
            self.unbin(i);
            self.bin_at(i, nb);
        }
    }

    /// A new block linked between `left` and `right` (either may be NIL) of `seg`.
    #[inline(always)]
    fn link_new(&mut self, mut b: Blk, left: u32, right: u32) -> u32 {
        b.left = left;
        b.right = right;
        let i = self.new_blk(b);
        let seg = b.seg as usize;
        if left != NIL {
            self.blks[left].right = i;
        } else {
            self.ends[seg].0 = i;
        }
        if right != NIL {
            self.blks[right].left = i;
        } else {
            self.ends[seg].1 = i;
        }
        i
    }

    /// Unlinks block `i` from its segment's address list and kills it.
    #[inline(always)]
    fn unlink_kill(&mut self, i: u32) {
        let e = &self.blks[i];
        let (seg, left, right) = (e.seg as usize, e.left, e.right);
        if left != NIL {
            self.blks[left].right = right;
        } else {
            self.ends[seg].0 = right;
        }
        if right != NIL {
            self.blks[right].left = left;
        } else {
            self.ends[seg].1 = left;
        }
        self.kill(i);
    }

    /// Maps `len` more bytes at the end of segment `seg` (free): the last block grows
    /// if it is free, else a free block is appended.
    pub fn append(&mut self, small: bool, seg: u32, len: u64) {
        if self.ends.len() <= seg as usize {
            self.ends.resize(seg as usize + 1, (NIL, NIL));
        }
        if len == 0 {
            return;
        }
        let last = self.ends[seg as usize].1;
        if last != NIL && self.blks[last].state == BlkState::Free {
            let (off, l) = (self.blks[last].off, self.blks[last].len);
            self.reshape_free(last, off, l + len);
            return;
        }
        let off = if last == NIL {
            0
        } else {
            let b = &self.blks[last];
            b.off + b.len
        };
        let i = self.link_new(
            Blk {
                seg,
                off,
                len,
                prev: NIL,
                next: NIL,
                left: NIL,
                right: NIL,
                bin: 0,
                state: BlkState::Free,
                small,
            },
            last,
            NIL,
        );
        self.bin(i);
        self.nfree += 1;
    }

    /// Free bytes at the end of segment `seg`'s mapped range.
    #[inline]
    pub fn tail_free(&self, seg: u32) -> u64 {
        match self.ends.get(seg as usize) {
            Some(&(_, last)) if last != NIL => {
                let b = &self.blks[last];
                if b.state == BlkState::Free {
                    b.len
                } else {
                    0
                }
            }
            _ => 0,
        }
    }

    /// The last block of segment `seg` (NIL if nothing is mapped).
    #[inline]
    pub fn last(&self, seg: u32) -> u32 {
        self.ends.get(seg as usize).map_or(NIL, |e| e.1)
    }

    /// Unmaps the last `len` bytes of `seg`, which must be free.
    pub fn trim_tail(&mut self, seg: u32, len: u64) {
        let last = self.last(seg);
        assert!(
            last != NIL && self.blks[last].state == BlkState::Free && self.blks[last].len >= len,
            "trimming bytes that are not free"
        );
        let (off, l) = (self.blks[last].off, self.blks[last].len);
        if l == len {
            self.unbin(last);
            self.unlink_kill(last);
            self.nfree -= 1;
        } else {
            self.reshape_free(last, off, l - len);
        }
    }

    /// Forgets segment `seg`, which must hold one free block or none.
    pub fn remove_segment(&mut self, seg: u32) {
        let Some(&(first, last)) = self.ends.get(seg as usize) else {
            return;
        };
        if first == NIL {
            return;
        }
        assert!(
            first == last && self.blks[first].state == BlkState::Free,
            "removing a segment in use"
        );
        self.unbin(first);
        self.kill(first);
        self.nfree -= 1;
        self.ends[seg as usize] = (NIL, NIL);
    }

    /// Takes `[off, off + len)` out of free block `i` (which must contain it) as a used
    /// block; returns the used block's index. O(1): the free remainder keeps `i` (and
    /// its bin, unless its length's bin changes).
    #[inline]
    pub fn take(&mut self, i: u32, off: u64, len: u64) -> u32 {
        // Checked: `i` comes from outside this module.
        let b = self.blks.at(i);
        let (boff, blen, left, right) = (b.off, b.len, b.left, b.right);
        // The state check stays on in release builds (a stale block index would
        // otherwise corrupt the tiling); the range comes from `best_fit`/`span`.
        assert!(
            b.state == BlkState::Free,
            "taking from a block that is not free"
        );
        debug_assert!(
            boff <= off && off + len <= boff + blen && len > 0,
            "taken range lies in the free block"
        );
        let (head, tail) = (off - boff, boff + blen - off - len);
        let used = Blk {
            state: BlkState::Used,
            off,
            len,
            prev: NIL,
            next: NIL,
            ..*b
        };
        if head == 0 && tail != 0 {
            // Best fit's case: the run at the start, the remainder stays free.
            self.reshape_free(i, off + len, tail);
            return self.link_new(used, left, i);
        }
        if head == 0 {
            self.unbin(i);
            let e = &mut self.blks[i];
            e.state = BlkState::Used;
            e.prev = NIL;
            e.next = NIL;
            self.nfree -= 1;
            return i;
        }
        // Growth's case (`tail == 0`): the run at the end of the free tail. Linked
        // first: the free head is no longer its segment's last block (its bin).
        let u = self.link_new(used, i, right);
        self.reshape_free(i, boff, head);
        if tail != 0 {
            let t = self.link_new(
                Blk {
                    state: BlkState::Free,
                    off: off + len,
                    len: tail,
                    ..used
                },
                u,
                right,
            );
            self.bin(t);
            self.nfree += 1;
        }
        u
    }

    /// Whether used block `i` has a free address-order neighbour (its release would
    /// merge). O(1): two block reads.
    #[inline]
    pub fn has_free_neighbour(&self, i: u32) -> bool {
        let b = self.blks.at(i);
        let free = |j: u32| j != NIL && self.blks[j].state == BlkState::Free;
        free(b.left) || free(b.right)
    }

    /// Frees used block `i`, merging it with free neighbours. O(1).
    #[inline]
    pub fn release(&mut self, i: u32) {
        // Checked: `i` comes from outside this module.
        let b = self.blks.at(i);
        assert_eq!(
            b.state,
            BlkState::Used,
            "releasing a block that is not used"
        );
        let (off, len, left, right) = (b.off, b.len, b.left, b.right);
        let lf = left != NIL && self.blks[left].state == BlkState::Free;
        let rf = right != NIL && self.blks[right].state == BlkState::Free;
        match (lf, rf) {
            (false, false) => {
                self.blks[i].state = BlkState::Free;
                self.bin(i);
                self.nfree += 1;
            }
            (true, false) => {
                let l = &self.blks[left];
                let (loff, llen) = (l.off, l.len);
                self.unlink_kill(i);
                self.reshape_free(left, loff, llen + len);
            }
            (false, true) => {
                let rlen = self.blks[right].len;
                self.unlink_kill(i);
                self.reshape_free(right, off, len + rlen);
            }
            (true, true) => {
                let l = &self.blks[left];
                let (loff, llen) = (l.off, l.len);
                let rlen = self.blks[right].len;
                self.unbin(right);
                self.unlink_kill(right);
                self.unlink_kill(i);
                self.nfree -= 1;
                self.reshape_free(left, loff, llen + len + rlen);
            }
        }
    }

    /// The free block of `seg` containing `[off, off + len)`, if any. O(blocks of the
    /// segment): used only by buddy placement and checks.
    pub fn containing(&self, seg: u32, off: u64, len: u64) -> Option<u32> {
        self.walk_to(self.ends.get(seg as usize)?.0, off, len)
    }

    /// From block `i` (at or left of `off`) rightwards to the block holding `off`: that
    /// block if it is free and holds all of `[off, off + len)`.
    fn walk_to(&self, mut i: u32, off: u64, len: u64) -> Option<u32> {
        while i != NIL {
            let b = self.blks.at(i);
            if b.off + b.len > off {
                let inside = b.off <= off && off + len <= b.off + b.len;
                return (inside && b.state == BlkState::Free).then_some(i);
            }
            i = b.right;
        }
        None
    }

    /// [`Extents::containing`], walking right from block `from` of `seg` (a block
    /// that starts at or before `off`: a used run left of the range) instead of from
    /// the segment's first block. O(blocks between the two).
    pub fn containing_from(&self, seg: u32, from: u32, off: u64, len: u64) -> Option<u32> {
        let b = self.blks.get(from)?;
        if b.state == BlkState::Dead || b.seg != seg || b.off > off {
            return self.containing(seg, off, len);
        }
        self.walk_to(from, off, len)
    }

    /// Smallest of up to `limit` candidates (newest first) in bin `b` with length >=
    /// `len`; among equal lengths seen, the lowest (segment, offset), except that an
    /// exact-length match ends the scan at once. Walks the bin's list.
    #[inline]
    fn scan_bin(&self, k: usize, b: usize, len: u64, limit: usize) -> Option<u32> {
        let (mut best, mut best_len) = (NIL, u64::MAX);
        let mut i = self.heads[k][b];
        let mut left = limit;
        while i != NIL && left > 0 {
            let e = &self.blks[i];
            let l = e.len;
            if l >= len && l <= best_len {
                let better = l < best_len || {
                    let f = &self.blks[best];
                    (e.seg, e.off) < (f.seg, f.off)
                };
                if better {
                    best = i;
                    best_len = l;
                    if l == len {
                        break;
                    }
                }
            }
            i = e.next;
            left -= 1;
        }
        (best != NIL).then_some(best)
    }

    /// First non-empty bin > `b` of kind `k`.
    #[inline]
    fn next_bin(&self, k: usize, b: usize) -> Option<usize> {
        let b = b + 1;
        let w = b / 64;
        if w < WORDS {
            let word = self.bits[k][w] & (!0u64 << (b % 64));
            if word != 0 {
                return Some(w * 64 + word.trailing_zeros() as usize);
            }
        }
        // Words above w with a non-empty bin.
        let above = self.top[k] & (!0u64).checked_shl(w as u32 + 1).unwrap_or(0);
        if above == 0 {
            return None;
        }
        let w = above.trailing_zeros() as usize;
        Some(w * 64 + self.bits[k][w].trailing_zeros() as usize)
    }

    /// The free block a run of `len` goes into, among blocks of kind `small`; the run
    /// goes at its start. `None` only if no free block of that kind is >= `len`.
    #[inline]
    pub fn best_fit(&self, small: bool, len: u64) -> Option<u32> {
        let k = small as usize;
        let b = bin_of(len);
        if let Some(i) = self.scan_bin(k, b, len, SCAN) {
            return Some(i);
        }
        match self.next_bin(k, b) {
            // Every block of a higher size bin fits: the scan cannot come back empty.
            Some(nb) if nb != TAIL_BIN => self.scan_bin(k, nb, len, SCAN),
            // No size bin above: a fitting block may still sit in the request's own bin
            // beyond the first SCAN entries (the whole bin is read: rare, the pool is
            // about to grow otherwise); then the free tails, last.
            _ => self
                .scan_bin(k, b, len, usize::MAX)
                .or_else(|| self.scan_bin(k, TAIL_BIN, len, usize::MAX)),
        }
    }

    /// Length of the largest free block (either kind): the largest of the highest
    /// non-empty size bin and of the free tails.
    pub fn largest(&self) -> u64 {
        let mut best = 0;
        let mut walk = |head: u32| {
            let mut i = head;
            while i != NIL {
                best = best.max(self.blks.at(i).len);
                i = self.blks.at(i).next;
            }
        };
        for k in 0..2 {
            walk(self.heads[k][TAIL_BIN]);
            let below_tail = |w: usize| {
                if w == TAIL_BIN / 64 {
                    self.bits[k][w] & !(1u64 << (TAIL_BIN % 64))
                } else {
                    self.bits[k][w]
                }
            };
            if let Some(w) = (0..WORDS).rev().find(|&w| below_tail(w) != 0) {
                let b = w * 64 + 63 - below_tail(w).leading_zeros() as usize;
                walk(self.heads[k][b]);
            }
        }
        best
    }

    /// Every free block: `(small, segment, offset, length)`.
    pub fn iter(&self) -> impl Iterator<Item = (bool, u32, u64, u64)> + '_ {
        self.free_blocks()
            .map(|(_, small, seg, off, len)| (small, seg, off, len))
    }

    /// Every free block with its index: `(block, small, segment, offset, length)`.
    pub fn free_blocks(&self) -> impl Iterator<Item = (u32, bool, u32, u64, u64)> + '_ {
        self.blks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.state == BlkState::Free)
            .map(|(i, b)| (i as u32, b.small, b.seg, b.off, b.len))
    }

    /// Every block of segment `seg` in address order: `(offset, length, free)`.
    pub fn blocks_of(&self, seg: u32) -> impl Iterator<Item = (u64, u64, bool)> + '_ {
        let mut i = self.ends.get(seg as usize).map_or(NIL, |e| e.0);
        std::iter::from_fn(move || {
            if i == NIL {
                return None;
            }
            let b = self.blks.at(i);
            i = b.right;
            Some((b.off, b.len, b.state == BlkState::Free))
        })
    }
}

#[path = "extents_check.rs"]
mod check;

#[cfg(test)]
#[path = "extents_tests.rs"]
mod tests;
