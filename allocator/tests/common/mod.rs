//! What several test binaries share (each `mod common;` compiles its own copy, so a
//! helper one binary does not use is not dead code there).
#![allow(dead_code)]

use memcast_alloc::Allocation;

pub const MIB: u64 = 1 << 20;

/// Up to 32 bytes that only this allocation (its address and size) writes: stamped at
/// its head (and tail) when allocated and checked when freed, they show any overlap of
/// two live allocations as overwritten bytes.
pub fn stamp(a: &Allocation) -> Vec<u8> {
    let n = a.size.min(32) as usize;
    (0..n)
        .map(|i| (a.ptr.0 as usize).wrapping_mul(31).wrapping_add(i) as u8)
        .collect()
}
