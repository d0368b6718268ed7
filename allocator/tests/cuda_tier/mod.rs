//! The tier manager on the device: what it moves on the GPU keeps its bytes. A module of
//! the `cuda` test binary (`mod cuda_tier;`), run with it by `scripts/gpu-tests.sh`.

use memcast_alloc::backend::host::HostBackend;
use memcast_alloc::backend::layers::Limit;
use memcast_alloc::backend::{DeviceBackend, MemRef};
use memcast_alloc::tier::manager::TensorOpts;
use memcast_alloc::tier::{TierConfig, TierManager};
use memcast_alloc::{AllocConfig, Allocator};

use super::cuda_common::{gpu, report, MIB};

/// Relocation on the device (`TierConfig::relocate`): under a 2 MiB cap, 16 tensors of
/// 64 KiB at every other slot (1 MiB free, no free block above 64 KiB); a request of
/// 5 slots opens the window holding the fewest tensor bytes by moving its two tensors
/// into free slots outside it with device copies (`cuMemcpyDtoDAsync`, then a
/// synchronization): nothing is spilled, and every tensor reads back the bytes written
/// into it before, at the address its handle now gives.
#[test]
fn relocation_moves_tensors_with_device_copies() {
    let Some(g) = gpu() else {
        return;
    };
    let v = relocation_program(g);
    report("relocation_moves_tensors_with_device_copies", v);
}

/// The same program on host memory, where no GPU is: the program itself is checked
/// everywhere.
#[test]
fn relocation_program_on_host_memory() {
    relocation_program(HostBackend::new(64 * MIB));
}

/// A tier manager on fixed segments under a cap of `device` bytes with a 4 MiB pinned
/// pool, that moves tensors only where it must: no watermark spills (only the
/// out-of-memory path and explicit spills move tensors out), and no prefetch before
/// an access.
fn quiet_manager<B: DeviceBackend>(backend: B, device: u64) -> TierManager<Limit<B>> {
    let cfg = AllocConfig {
        growable_segments: false,
        ..AllocConfig::default()
    };
    let alloc = Allocator::new(Limit::new(backend, device), cfg).unwrap();
    let tiers = TierConfig {
        budget: device,
        high_watermark: 1.0,
        low_watermark: 1.0,
        prefetch_watermark: 0.01,
        staging_bytes: 4 * MIB,
        ..TierConfig::default()
    };
    TierManager::new(alloc, tiers).unwrap()
}

/// The program of `relocation_moves_tensors_with_device_copies` on `backend`; its
/// figures.
fn relocation_program<B: DeviceBackend>(backend: B) -> serde_json::Value {
    let (device, slot) = (2 * MIB, 64 << 10);
    let mut m = quiet_manager(backend, device);
    let mut by_addr = Vec::new();
    for _ in 0..device / slot {
        let h = m.register(slot, TensorOpts::default()).unwrap();
        by_addr.push((m.access(h, false).unwrap().0, h));
        m.end_step();
    }
    by_addr.sort();
    for &(_, h) in by_addr.iter().skip(1).step_by(2) {
        m.free(h).unwrap();
    }
    let live: Vec<_> = by_addr.iter().step_by(2).map(|&(_, h)| h).collect();
    let fill = |i: usize| vec![i as u8 + 1; slot as usize];
    for (i, &h) in live.iter().enumerate() {
        let p = m.access(h, true).unwrap();
        m.backend_mut().write(MemRef::Device(p), &fill(i)).unwrap();
        m.end_step();
    }
    m.register(5 * slot, TensorOpts::default()).unwrap();
    m.end_step();
    m.check_invariants().unwrap();
    let s = m.stats().clone();
    assert_eq!((s.relocations, s.relocated_bytes), (1, 2 * slot));
    assert_eq!((s.spills, s.faults), (0, 0));
    let mut got = vec![0u8; slot as usize];
    for (i, &h) in live.iter().enumerate() {
        let p = m.access(h, false).unwrap();
        m.backend_mut().read(MemRef::Device(p), &mut got).unwrap();
        assert_eq!(got, fill(i), "tensor {i}'s bytes after relocation");
        m.end_step();
    }
    assert_eq!(m.stats().faults, 0);
    serde_json::json!({
        "relocations": s.relocations,
        "relocated_bytes": s.relocated_bytes,
        "relocate_us": s.oom_relocate_us,
        "backend": m.backend_mut().name(),
    })
}

/// A spill the pinned pool holds only in two ranges (`StagingPool::alloc(bytes, true)`)
/// on the device: tensors of 1, 0.5, 2 and 0.5 MiB fill a 4 MiB pool; the first and
/// third are freed (3 MiB free in a 1 MiB and a 2 MiB range); a 2.5 MiB tensor is
/// spilled in two unequal parts (2 MiB into the larger range, 0.5 MiB into the other),
/// each its own `cuMemcpyDtoHAsync` on one stream, into pinned memory and no pageable
/// byte; another 2.5 MiB tensor is then written on the device, where the first one's
/// block was, so that the spilled bytes can come back only from the two host ranges,
/// and do, each byte where it was (the fill does not repeat).
#[test]
fn a_spill_in_two_ranges_of_the_pinned_pool_keeps_its_bytes() {
    let Some(g) = gpu() else {
        return;
    };
    let v = split_spill_program(g);
    report(
        "a_spill_in_two_ranges_of_the_pinned_pool_keeps_its_bytes",
        v,
    );
}

/// The same program on host memory, where no GPU is.
#[test]
fn split_spill_program_on_host_memory() {
    split_spill_program(HostBackend::new(64 * MIB));
}

/// `bytes` bytes of a xorshift64* stream seeded by `seed`: no period a misplaced part
/// could hide in.
fn fill(seed: u64, bytes: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..bytes)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

fn split_spill_program<B: DeviceBackend>(backend: B) -> serde_json::Value {
    let mut m = quiet_manager(backend, 16 * MIB);
    let put = |m: &mut TierManager<Limit<B>>, i: u64, bytes: u64| {
        let h = m.register(bytes, TensorOpts::default()).unwrap();
        let p = m.access(h, true).unwrap();
        m.backend_mut()
            .write(MemRef::Device(p), &fill(i, bytes))
            .unwrap();
        m.end_step();
        h
    };
    let sizes = [MIB, MIB / 2, 2 * MIB, MIB / 2];
    let small: Vec<_> = (0..4).map(|i| put(&mut m, i, sizes[i as usize])).collect();
    for &h in &small {
        assert!(m.spill(h).unwrap());
    }
    m.synchronize().unwrap();
    assert_eq!(m.stats().spills_warm, 4, "the four fill the pool");
    m.free(small[0]).unwrap();
    m.free(small[2]).unwrap();
    let big_bytes = 5 * MIB / 2;
    let big = put(&mut m, 9, big_bytes);
    assert!(m.spill(big).unwrap());
    m.synchronize().unwrap();
    let s = m.stats().clone();
    assert_eq!((s.spills_warm, s.spills_cold), (5, 0), "{s:?}");
    assert_eq!(s.pageable_copied_bytes, 0);
    m.check_invariants().unwrap();
    let _over = put(&mut m, 10, big_bytes);
    let read = |m: &mut TierManager<Limit<B>>, h| {
        let n = m.bytes(h).unwrap();
        let p = m.access(h, false).unwrap();
        let mut got = vec![0u8; n as usize];
        m.backend_mut().read(MemRef::Device(p), &mut got).unwrap();
        m.end_step();
        got
    };
    assert!(
        read(&mut m, big) == fill(9, big_bytes),
        "the split tensor's bytes"
    );
    assert!(read(&mut m, small[1]) == fill(1, MIB / 2));
    assert!(read(&mut m, small[3]) == fill(3, MIB / 2));
    m.check_invariants().unwrap();
    let s = m.stats();
    assert_eq!(s.faults, 3, "each came back at its access: {s:?}");
    serde_json::json!({
        "spills_warm": s.spills_warm,
        "pageable_copied_bytes": s.pageable_copied_bytes,
        "faults": s.faults,
        "transfer_stall_us": s.transfer_stall_us,
        "backend": m.backend_mut().name(),
    })
}
