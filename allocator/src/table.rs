//! [`Table`]: a vector indexed by `u32` ids without a bounds check.
//!
//! The allocator's tables (records, slabs, placement blocks) are indexed by ids that
//! only the allocator hands out and links: free lists, bin lists, address-order links,
//! a record's block or slab. A bounds check on each of those reads cost ~40
//! instructions per alloc+free pair in the `alloc_free` bench (callgrind). Ids that come
//! from outside (a caller's handle) are checked with `get` before they index anything;
//! everywhere else `debug_assert!` checks the bound in debug builds and tests, and the
//! invariant checks walk every link.

use std::ops::{Deref, DerefMut, Index, IndexMut};

#[derive(Debug, Clone)]
pub(crate) struct Table<T>(pub Vec<T>);

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table(Vec::new())
    }
}

impl<T> Deref for Table<T> {
    type Target = Vec<T>;
    #[inline(always)]
    fn deref(&self) -> &Vec<T> {
        &self.0
    }
}

impl<T> DerefMut for Table<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut Vec<T> {
        &mut self.0
    }
}

impl<T> Index<u32> for Table<T> {
    type Output = T;
    #[inline(always)]
    fn index(&self, i: u32) -> &T {
        debug_assert!((i as usize) < self.0.len(), "id {i} out of range");
        // SAFETY: see the module docs: every id used here is below len by the
        // allocator's invariants (checked in debug builds).
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
        let mut t = Table(vec![10, 20, 30]);
        t[1] += 1;
        assert_eq!((t[0], t[1], t[2]), (10, 21, 30));
        assert_eq!(t.get(3), None);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "out of range")]
    fn debug_builds_check_the_bound() {
        let t = Table(vec![1u8]);
        let _ = t[1];
    }
}
