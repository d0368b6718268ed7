//! [`Table`]: a vector indexed by `u32` ids that only the allocator makes.
//!
//! The allocator's tables (records, slabs, segments, placement blocks) are indexed by
//! ids that only the allocator hands out and links: free lists, bin lists,
//! address-order links, a record's block or slab. A bounds check on each of those reads
//! cost ~40 instructions per alloc+free pair in the `alloc_free` bench (callgrind), so
//! `table[id]` does not check the bound in release builds.
//!
//! Invariant (what makes `table[id]` sound): every id used as `table[id]` is
//! `< table.len()`. It holds because
//! - ids are made only by the table's owner (`push` returns the next one, a free list
//!   hands back one it was given) and tables never shrink;
//! - a value a caller supplies never reaches `table[id]`: a caller's handle is checked
//!   with [`Table::get`] first (`Allocator::check_handle`), and stream ids do not
//!   index a `Table` at all (the per-stream pools are a `Vec`, indexed with a check);
//! - `debug_assert!` checks the bound in debug builds and tests, and
//!   `check_invariants` walks every link.
//!
//! `Table` does not deref to `Vec`: indexing by `usize` (checked) or `u32` (unchecked)
//! is not a choice the index's type makes silently. [`Table::at`] is the checked
//! index, for ids a module takes from outside itself.

use std::ops::{Index, IndexMut};

#[derive(Debug, Clone)]
pub(crate) struct Table<T>(Vec<T>);

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table(Vec::new())
    }
}

impl<T> From<Vec<T>> for Table<T> {
    fn from(v: Vec<T>) -> Self {
        Table(v)
    }
}

impl<T> Table<T> {
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Appends `x` under the next id (`len()` before the call).
    #[inline]
    pub fn push(&mut self, x: T) {
        self.0.push(x)
    }
    /// Checked: `None` if `i` is out of range.
    #[inline(always)]
    pub fn get(&self, i: u32) -> Option<&T> {
        self.0.get(i as usize)
    }
    /// Checked: panics (never reads out of bounds) if `i` is out of range.
    #[inline(always)]
    pub fn at(&self, i: u32) -> &T {
        &self.0[i as usize]
    }
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }
}

impl<T> Index<u32> for Table<T> {
    type Output = T;
    #[inline(always)]
    fn index(&self, i: u32) -> &T {
        debug_assert!((i as usize) < self.0.len(), "id {i} out of range");
        // SAFETY: `i < self.0.len()` by the module's invariant (ids are made by the
        // table's owner, tables never shrink, and callers' values are checked with
        // `get` first); checked in debug builds.
        unsafe { self.0.get_unchecked(i as usize) }
    }
}

impl<T> IndexMut<u32> for Table<T> {
    #[inline(always)]
    fn index_mut(&mut self, i: u32) -> &mut T {
        debug_assert!((i as usize) < self.0.len(), "id {i} out of range");
        // SAFETY: as for `index`.
        unsafe { self.0.get_unchecked_mut(i as usize) }
    }
}

#[cfg(test)]
mod tests {
    use super::Table;

    #[test]
    fn indexes_like_the_vector() {
        let mut t = Table::from(vec![10, 20, 30]);
        t[1] += 1;
        assert_eq!((t[0], t[1], t[2]), (10, 21, 30));
        assert_eq!(t.get(3), None);
        assert_eq!(*t.at(2), 30);
    }

    #[test]
    #[should_panic]
    fn at_checks_the_bound() {
        let t = Table::from(vec![1u8]);
        let _ = t.at(1);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "out of range")]
    fn debug_builds_check_the_bound() {
        let t = Table::from(vec![1u8]);
        let _ = t[1];
    }
}
