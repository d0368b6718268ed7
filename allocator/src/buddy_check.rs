//! The buddy pool's invariant check (`buddy.rs` module docs list the invariants).

use super::*;

impl BuddyPool {
    /// Verifies every invariant of the module docs; `Err` names the first broken one.
    pub fn check(&self) -> Result<(), String> {
        let mut free_seen = 0u64;
        let mut free_nodes = 0usize;
        // The placement index tiles every segment with free and used blocks.
        let tiles = self
            .ext
            .check(self.live_segments().map(|(i, s)| (i, s.mapped, s.small)))?;
        let mut ext_total = 0;
        for ((si, s), (ext_free, ext_used)) in self.live_segments().zip(tiles) {
            ext_total += ext_free;
            if ext_used != s.used {
                return Err(format!(
                    "segment {si}: used blocks hold {ext_used} bytes, counter {}",
                    s.used
                ));
            }
            if !s.tree {
                if self.index_runs {
                    // The run index names exactly the used blocks.
                    let mut runs: Vec<(u64, u64)> = self
                        .runs
                        .iter()
                        .filter(|(&(s, _), _)| s == si)
                        .map(|(&(_, o), &(l, _))| (o, l))
                        .collect();
                    runs.sort_unstable();
                    let used: Vec<(u64, u64)> = self
                        .ext
                        .blocks_of(si)
                        .filter(|b| !b.2)
                        .map(|(o, l, _)| (o, l))
                        .collect();
                    if runs != used {
                        return Err(format!(
                            "segment {si}: run index disagrees with the used blocks"
                        ));
                    }
                }
                free_seen += ext_free;
                continue;
            }
            let (mut free, mut used, mut unmapped) = (0u64, 0u64, 0u64);
            let mut stack = vec![s.root];
            if self.nodes[s.root as usize].parent != NIL {
                return Err(format!("segment {si}: root has a parent"));
            }
            while let Some(i) = stack.pop() {
                let n = &self.nodes[i as usize];
                if n.seg != si {
                    return Err(format!("node {i} in segment {si} says segment {}", n.seg));
                }
                let size = 1u64 << n.order;
                if !n.offset.is_multiple_of(size) {
                    return Err(format!(
                        "node {i}: offset {} not aligned to {size}",
                        n.offset
                    ));
                }
                match n.state {
                    State::Split => {
                        let (l, r) = (
                            &self.nodes[n.child as usize],
                            &self.nodes[n.child as usize + 1],
                        );
                        if !n.child.is_multiple_of(2)
                            || l.parent != i
                            || r.parent != i
                            || l.order + 1 != n.order
                            || r.order + 1 != n.order
                            || l.offset != n.offset
                            || r.offset != n.offset + size / 2
                        {
                            return Err(format!("node {i}: bad children"));
                        }
                        if l.state == State::Free && r.state == State::Free {
                            return Err(format!("node {i}: two free children not merged"));
                        }
                        stack.push(n.child);
                        stack.push(n.child + 1);
                    }
                    State::Free => {
                        free += size;
                        free_nodes += 1;
                    }
                    State::Used => used += size,
                    State::Unmapped => unmapped += size,
                    State::Dead => return Err(format!("node {i}: dead node in a tree")),
                }
            }
            if free + used + unmapped != 1u64 << s.order {
                return Err(format!("segment {si}: free+used+unmapped != range"));
            }
            if free + used != s.mapped {
                return Err(format!(
                    "segment {si}: free {free} + used {used} != mapped {}",
                    s.mapped
                ));
            }
            if used != s.used {
                return Err(format!("segment {si}: used {used} != counter {}", s.used));
            }
            free_seen += free;
        }
        if free_seen != self.free_bytes {
            return Err(format!(
                "free bytes {free_seen} != counter {}",
                self.free_bytes
            ));
        }
        let mut listed = 0usize;
        for o in 0..64 {
            let mut i = self.heads[o];
            let mut prev = NIL;
            if (i != NIL) != (self.nonempty & (1 << o) != 0) {
                return Err(format!("order {o}: bitmask disagrees with list"));
            }
            while i != NIL {
                let n = &self.nodes[i as usize];
                if n.state != State::Free || n.order as usize != o || n.prev != prev {
                    return Err(format!("order {o}: bad free list entry {i}"));
                }
                listed += 1;
                prev = i;
                i = n.next;
            }
        }
        if listed != free_nodes {
            return Err(format!("{listed} listed free nodes, {free_nodes} in trees"));
        }
        for (_, seg, off, len) in self.ext.iter() {
            if self.segs[seg].tree && !self.is_free_range(seg, off, len) {
                return Err(format!("extent ({seg}, {off}, {len}) is not free"));
            }
        }
        if ext_total != self.free_bytes {
            return Err(format!(
                "extents hold {ext_total} bytes, free lists {}",
                self.free_bytes
            ));
        }
        Ok(())
    }
}
