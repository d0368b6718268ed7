//! What several test binaries share (each `mod common;` compiles its own copy, so a
//! helper one binary does not use is not dead code there).
#![allow(dead_code)]

use memcast_alloc::Allocation;
use proptest::prelude::*;

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

/// One step of a random allocation program: allocate, free a live allocation (`pick`
/// modulo their count; nothing when none is live), or an iteration boundary.
#[derive(Debug, Clone)]
pub enum Op {
    Alloc { bytes: u64 },
    Free { pick: usize },
    Boundary,
}

/// Programs of [`Op`]s: 6 allocations to 4 frees to 1 boundary; sizes below 64 KiB,
/// below 4 MiB and up to `large_max` bytes in the weights `small : mid : 2`.
pub fn op(small: u32, mid: u32, large_max: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop_oneof![
            small => 1u64..(64 << 10),
            mid => (64u64 << 10)..(4 * MIB),
            2 => (4 * MIB)..large_max,
        ].prop_map(|bytes| Op::Alloc { bytes }),
        4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => Just(Op::Boundary),
    ]
}
