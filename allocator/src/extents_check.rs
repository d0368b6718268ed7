//! The placement index's invariant check (`Extents::check`, part of
//! `Allocator::check_invariants`): the bins and their bitmaps, and each live segment's
//! tiling by blocks.

use super::*;

impl Extents {
    /// Checks the invariants of the module docs for the given live segments
    /// `(segment, mapped, small)`, and that no live block lies outside them; returns the
    /// free and used bytes of each in order.
    pub fn check(
        &self,
        segs: impl IntoIterator<Item = (u32, u64, bool)>,
    ) -> Result<Vec<(u64, u64)>, String> {
        let mut binned = 0;
        for k in 0..2 {
            for b in 0..NBINS {
                let nonempty = self.bits[k][b / 64] & (1 << (b % 64)) != 0;
                if (self.heads[k][b] == NIL) == nonempty {
                    return Err(format!("extent bin {b}: bitmap disagrees"));
                }
                if b % 64 == 0 && (self.top[k] >> (b / 64) & 1 == 1) != (self.bits[k][b / 64] != 0)
                {
                    return Err(format!(
                        "extent bins {b}..{}: summary bit disagrees",
                        b + 64
                    ));
                }
                let (mut i, mut prev) = (self.heads[k][b], NIL);
                while i != NIL {
                    let e = &self.blks.at(i);
                    if e.state != BlkState::Free
                        || self.bin_for(i, e.len) != b
                        || e.bin as usize != b
                        || e.small as usize != k
                        || e.prev != prev
                    {
                        return Err(format!("extent bin {b}: bad entry {i}"));
                    }
                    binned += 1;
                    if binned > self.blks.len() {
                        return Err(format!("extent bin {b}: the list loops"));
                    }
                    prev = i;
                    i = e.next;
                }
            }
        }
        let mut out = Vec::new();
        let (mut walked, mut walked_used) = (0, 0);
        for (seg, mapped, small) in segs {
            let (mut cur, mut free, mut used) = (0u64, 0u64, 0u64);
            let (first, last) = self.ends.get(seg as usize).copied().unwrap_or((NIL, NIL));
            let (mut i, mut left, mut left_free) = (first, NIL, false);
            while i != NIL {
                let b = self.blks.at(i);
                if b.seg != seg || b.off != cur || b.len == 0 || b.left != left {
                    return Err(format!(
                        "segment {seg}: block {i} at {} (len {}) breaks the tiling at {cur}",
                        b.off, b.len
                    ));
                }
                if b.small != small {
                    return Err(format!("segment {seg}: block {i} has the wrong kind"));
                }
                match b.state {
                    BlkState::Free if left_free => {
                        return Err(format!("segment {seg}: free neighbours at {}", b.off))
                    }
                    BlkState::Free => {
                        free += b.len;
                        walked += 1;
                    }
                    BlkState::Used => {
                        used += b.len;
                        walked_used += 1;
                    }
                    BlkState::Dead => return Err(format!("segment {seg}: dead block {i}")),
                }
                left_free = b.state == BlkState::Free;
                cur += b.len;
                left = i;
                i = b.right;
            }
            if left != last || cur != mapped {
                return Err(format!(
                    "segment {seg}: blocks cover {cur} of {mapped} mapped bytes"
                ));
            }
            out.push((free, used));
        }
        // No block outside the given segments: every live block was walked.
        let live = self.blks.len() - self.dead.len();
        if live != walked + walked_used {
            return Err(format!(
                "{live} live blocks, {} in the given segments",
                walked + walked_used
            ));
        }
        if walked != binned || binned != self.nfree {
            return Err(format!(
                "{binned} binned free blocks, {walked} in segments, counter {}",
                self.nfree
            ));
        }
        Ok(out)
    }
}
