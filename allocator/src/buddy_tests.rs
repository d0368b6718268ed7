//! Unit tests of the buddy mechanism (`buddy.rs`).
use super::*;

const MIB: u64 = 1 << 20;

#[test]
fn non_power_of_two_segment_serves_an_exact_run_and_merges_back() {
    let mut b = BuddyPool::new(256);
    b.set_best_fit(false); // the buddy tree itself
    let s = b.add_segment(0x1000_0000, 10 * MIB, 16 * MIB, false, false);
    b.check().unwrap();
    assert_eq!(b.free_bytes(), 10 * MIB);
    // 10 MiB straddles the 8 MiB and the 2 MiB trees.
    let spot = b.find_run(10 * MIB, 4, false).unwrap();
    assert_eq!((spot.seg, spot.off), (s, 0));
    let run = b.carve(spot, 10 * MIB, 7);
    b.check().unwrap();
    assert_eq!(b.free_bytes(), 0);
    assert_eq!(b.owner_at(s, 9 * MIB), Some(7));
    b.free_run(run, 10 * MIB);
    b.check().unwrap();
    assert_eq!(b.free_bytes(), 10 * MIB);
    b.remove_segment(s);
    b.check().unwrap();
}

#[test]
fn tail_of_a_block_is_returned_as_buddies() {
    let mut b = BuddyPool::new(256);
    b.set_best_fit(false); // the buddy tree itself
    let s = b.add_segment(0, 16 * MIB, 16 * MIB, false, false);
    let len = 10 * MIB + 512;
    let spot = b.find_run(len, 4, false).unwrap();
    let run = b.carve(spot, len, 1);
    b.check().unwrap();
    assert_eq!(b.free_bytes(), 16 * MIB - len);
    // The tail serves another run.
    let spot2 = b.find_run(4 * MIB, 4, false).unwrap();
    assert_eq!(spot2.seg, s);
    assert!(spot2.off >= run.off + len);
    let run2 = b.carve(spot2, 4 * MIB, 2);
    b.free_run(run, len);
    b.free_run(run2, 4 * MIB);
    b.check().unwrap();
    assert_eq!(b.largest_free_block(), 16 * MIB);
}

#[test]
fn extent_mode_tracks_runs_without_a_tree() {
    let mut b = BuddyPool::new(256);
    let s = b.add_segment(0, 10 * MIB, 16 * MIB, false, false);
    assert!(!b.segs[s].tree);
    let spot = b.find_run(3 * MIB, 0, false).unwrap();
    let run = b.carve(spot, 3 * MIB, 9);
    assert_eq!(b.owner_at(s, run.off), Some(9));
    assert_eq!(b.owner_at(s, run.off + 256), None);
    b.check().unwrap();
    assert_eq!(b.largest_free_block(), 7 * MIB);
    b.free_run(run, 3 * MIB);
    b.check().unwrap();
    assert_eq!(b.trailing_free(s), 10 * MIB);
    b.remove_segment(s);
    b.check().unwrap();
}

#[test]
fn growable_segment_maps_and_unmaps_its_tail() {
    let mut b = BuddyPool::new(256);
    b.set_best_fit(false); // the buddy tree itself
    let s = b.add_segment(0, 2 * MIB, 1 << 40, true, false);
    b.map_more(s, 4 * MIB);
    b.check().unwrap();
    assert_eq!(b.free_bytes(), 6 * MIB);
    let spot = b.find_run(3 * MIB, 0, false).unwrap();
    assert_eq!((spot.seg, spot.off), (s, 0));
    let run = b.carve(spot, 3 * MIB, 1);
    assert_eq!(b.trailing_free(s), 3 * MIB);
    b.unmap_tail(s, 2 * MIB);
    b.check().unwrap();
    assert_eq!(b.segs[s].mapped, 4 * MIB);
    b.free_run(run, 3 * MIB);
    b.check().unwrap();
    assert_eq!(b.trailing_free(s), 4 * MIB);
}
