"""The offload planner (pure Python: runs without a GPU, and without torch)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from memcast_torch import plan as P  # noqa: E402

GB = 10**9


def chain(n=20, fwd=0.004, saved=1 * GB, inp=0.1 * GB):
    return [P.BlockProfile(fwd, 2 * fwd, saved, inp) for _ in range(n)]


def test_no_headroom_keeps_nothing_and_negative_is_an_error():
    prof = chain()
    link = P.Link(window=1 << 30, pool=64 << 30)
    modes, sim = P.make_plan(prof, 0, link)
    assert P.KEEP not in modes
    # What is offloaded comes back only once backward has freed as much.
    assert sim["extra"] <= 0
    assert sum(modes.count(m) for m in P.RECOMPUTED) >= len(prof) // 2
    assert sim["recompute_s"] == pytest.approx(
        sum(p.fwd for p, m in zip(prof, modes) if m in P.RECOMPUTED))
    # Offloading inputs frees at most the inputs (2 GB): below that, no plan fits.
    with pytest.raises(P.PlanError, match="no plan fits"):
        P.make_plan(prof, -2.5 * GB, link)


def test_a_prefetch_is_issued_as_late_as_hides_it():
    prof = chain(n=10)  # 8 ms backward + 4 ms recompute per block; 1 GB = 20 ms at 50 GB/s
    modes = [P.OFFLOAD] + [P.RECOMPUTE] * 9
    link = P.Link(d2h=50e9, h2d=50e9)
    k = P.issue_blocks(prof, modes, link)[0]
    assert k == 3, k  # 1.5 x 20 ms = 30 ms: blocks 1..3 (36 ms) hide it
    sim = P.simulate(prof, modes, link)
    assert sim["stall_s"] == 0
    # Without freed memory at block 3 (measured as 0), the prefetch costs its bytes.
    tight = P.simulate(prof, modes, link, freed=[0] * 10)
    assert tight["extra"] == 1 * GB


def test_ample_headroom_keeps_everything():
    prof = chain()
    modes, sim = P.make_plan(prof, 100 * GB, P.Link(pool=64 << 30))
    assert modes == [P.KEEP] * len(prof)
    assert sim["step_s"] == pytest.approx(sum(p.fwd + p.bwd for p in prof))


def test_offload_only_what_the_link_hides():
    # 20 blocks of 4 ms forward, 8 ms backward, 1 GB saved: the forward (80 ms) hides
    # about 4 GB of spills at 50 GB/s; little headroom beyond the window.
    prof = chain()
    link = P.Link(d2h=50e9, h2d=50e9, window=1 << 30, pool=64 << 30)
    modes, sim = P.make_plan(prof, 1.2 * GB, link)
    n_off = modes.count(P.OFFLOAD)
    assert 2 <= n_off <= 5, modes
    assert modes[0] == P.OFFLOAD, "the earliest block has the most time to leave"
    assert modes[-1] != P.OFFLOAD, "the last block is needed first in backward"
    assert sim["stall_s"] < 0.1 * sim["step_s"]
    assert sim["extra"] <= 1.2 * GB
    everything = P.simulate(prof, [P.OFFLOAD] * len(prof), link)
    assert everything["step_s"] > sim["step_s"], "offloading all of it cannot be hidden"


def test_the_pool_bounds_what_is_offloaded():
    prof = chain()
    link = P.Link(window=1 << 30, pool=int(2.5 * GB))
    modes, sim = P.make_plan(prof, 1.2 * GB, link)
    assert sim["offloaded"] <= 2.5 * GB and modes.count(P.OFFLOAD) <= 2


def test_keep_prefers_blocks_with_the_most_recompute_per_byte():
    prof = [P.BlockProfile(0.001, 0.002, 2 * GB, 0), P.BlockProfile(0.010, 0.02, 1 * GB, 0)]
    link = P.Link(d2h=1e6, h2d=1e6, pool=0)  # no useful link: offload never pays
    modes, _ = P.make_plan(prof, 1.5 * GB, link)
    assert modes == [P.RECOMPUTE, P.KEEP]


def test_simulated_stall_grows_when_the_link_is_slow():
    prof = chain(n=6)
    modes = [P.OFFLOAD] + [P.KEEP] * 5
    fast = P.simulate(prof, modes, P.Link(d2h=100e9, h2d=100e9))
    slow = P.simulate(prof, modes, P.Link(d2h=5e9, h2d=5e9))
    assert fast["stall_s"] == 0
    assert slow["stall_s"] > 0.1 and slow["undrained"] == 1 * GB


def test_min_peak():
    prof = chain(n=3, saved=2 * GB, inp=1 * GB)
    assert P.min_peak(5, prof) == 5 + 3 * GB + 2 * GB
    # With the link: offloading inputs in forward order (1 GB each: 20 ms out at
    # 50 GB/s, the forward of 10 blocks 40 ms). Without a bound on the bytes in flight
    # only block 1's is off the device when the forward ends; with 4 GiB in flight the
    # forward waits for the copies, and all but the last 4 are off. Block 0's input is
    # the caller's.
    prof = chain(n=10, saved=2 * GB, inp=1 * GB)
    assert P.min_peak(5, prof) == 5 + 10 * GB + 2 * GB
    loose = P.Link(d2h=50e9, h2d=50e9, pool=64 << 30, inflight=64 << 30)
    assert P.min_peak(5, prof, loose) == 5 + 9 * GB + 2 * GB
    link = P.Link(d2h=50e9, h2d=50e9, pool=64 << 30, inflight=4 << 30)
    assert P.min_peak(5, prof, link) == 5 + 5 * GB + 2 * GB
    fast = P.Link(d2h=1e15, h2d=1e15, pool=64 << 30)
    assert P.min_peak(5, prof, fast) == 5 + 1 * GB + 2 * GB
    # The pool bounds it.
    assert P.min_peak(5, prof, P.Link(d2h=1e15, h2d=1e15, pool=2 * GB)) == 5 + 8 * GB + 2 * GB


def test_an_offloaded_input_frees_memory_only_after_a_recomputed_block():
    prof = chain(n=10, inp=0.3 * GB)
    link = P.Link(pool=64 << 30)
    R, I, K = P.RECOMPUTE, P.OFFLOAD_INPUT, P.KEEP
    rest = [R] * 7
    assert P.simulate(prof, [R, I, R] + rest, link)["inputs_freed"] == 0.3 * GB
    # A kept block before may save that tensor (its output) itself; the first block's
    # input is the caller's.
    assert P.simulate(prof, [K, I, R] + rest, link)["inputs_freed"] == 0
    assert P.simulate(prof, [I, R, R] + rest, link)["inputs_freed"] == 0
    base = P.simulate(prof, [R, R, R] + rest, link)
    off = P.simulate(prof, [R, I, R] + rest, link)
    assert base["extra"] - off["extra"] == pytest.approx(0.3 * GB)
    # Prefetched at the backward's first block, it is back where nothing was freed yet.
    short = P.simulate(prof[:3], [R, I, R], link)
    assert short["inputs_freed"] == 0.3 * GB and short["extra"] == 0
    assert off["offloaded"] == 0.3 * GB and off["inputs_offloaded"] == 1


def test_offloaded_inputs_fit_a_budget_below_recomputing_everything():
    prof = chain(saved=1 * GB, inp=0.3 * GB)
    link = P.Link(d2h=50e9, h2d=50e9, window=1 << 30, pool=64 << 30)
    modes, sim = P.make_plan(prof, -1.5 * GB, link)
    assert sim["extra"] <= -1.5 * GB, sim
    assert modes[0] != P.OFFLOAD_INPUT
    ins = [i for i, m in enumerate(modes) if m == P.OFFLOAD_INPUT]
    assert ins and ins[0] <= 2, modes  # the earliest blocks have the most time
    assert all(modes[i - 1] in P.RECOMPUTED for i in ins)
    # Without offloading inputs (their bytes under the size offloaded) it cannot fit.
    with pytest.raises(P.PlanError):
        P.make_plan(prof, -1.5 * GB, link, min_offload_bytes=int(0.5 * GB))
    with pytest.raises(P.PlanError):
        P.make_plan(prof, -1.5 * GB, link, inputs=False)
    assert P.OFFLOAD_INPUT not in P.make_plan(prof, 0.5 * GB, link, inputs=False)[0]


def test_the_memory_offloaded_inputs_free_is_spent_on_keeping():
    prof = chain(saved=1 * GB, inp=0.3 * GB)
    link = P.Link(d2h=50e9, h2d=50e9, window=1 << 30, pool=64 << 30)
    modes, sim = P.make_plan(prof, 0.5 * GB, link)
    without, wsim = P.make_plan(prof, 0.5 * GB, link, min_offload_bytes=int(0.5 * GB))
    assert P.OFFLOAD_INPUT not in without
    assert P.OFFLOAD_INPUT in modes and P.KEEP in modes, modes
    assert sim["step_s"] < wsim["step_s"] and sim["extra"] <= 0.5 * GB
    assert sim["stall_s"] == 0


def test_an_offloaded_input_is_prefetched_before_its_segment_and_stalls_on_a_slow_link():
    prof = chain(n=8, inp=0.5 * GB)
    R, I = P.RECOMPUTE, P.OFFLOAD_INPUT
    modes = [R, R, I, R, R, R, R, R]
    link = P.Link(d2h=50e9, h2d=50e9, segment_cap=2 * GB)
    segs = P.segments(prof, modes, link.segment_cap)
    assert segs[2] == 3
    # Needed when backward enters the segment at block 3: 1.5 x 10 ms of backward
    # before it is block 4's (12 ms with its recompute); block 4 lies in the segment
    # 4..5, entered at 5.
    assert P.issue_blocks(prof, modes, link)[2] == 5
    assert P.simulate(prof, modes, link)["stall_s"] == 0
    slow = P.simulate(prof, modes, P.Link(d2h=1e9, h2d=1e9, segment_cap=2 * GB))
    assert slow["stall_s"] > 0.1
    # Not off the device at the end of the forward: it frees nothing there.
    assert slow["inputs_freed"] == 0


def test_spills_beyond_the_bytes_in_flight_make_the_forward_wait():
    prof = chain(n=6)
    modes = [P.OFFLOAD] * 3 + [P.KEEP] * 3
    free = P.simulate(prof, modes, P.Link(inflight=64 << 30))
    tight = P.simulate(prof, modes, P.Link(inflight=1 << 30))
    assert free["host_wait_s"] == 0 and tight["host_wait_s"] > 0.02
    assert tight["step_s"] >= free["step_s"]


def test_calibration_offloads_inputs_in_forward_order_until_enough():
    prof = chain(n=10, inp=0.5 * GB)
    link = P.Link(d2h=50e9, h2d=50e9, pool=64 << 30)
    modes = P.calibration_modes(prof, link, 1 * GB)
    ins = [i for i, m in enumerate(modes) if m == P.OFFLOAD_INPUT]
    assert ins[0] == 1 and ins == list(range(1, 1 + len(ins)))
    assert P.simulate(prof, modes, link, cap=0)["inputs_freed"] >= 1 * GB
    assert len(ins) < 9


def test_segments_merge_recomputed_runs_under_the_cap_and_free_their_inputs():
    prof = chain(n=6, saved=1 * GB, inp=0.25 * GB)
    modes = [P.RECOMPUTE] * 3 + [P.KEEP] + [P.RECOMPUTE] * 2
    assert P.segments(prof, modes, 0) == {0: 0, 1: 1, 2: 2, 4: 4, 5: 5}
    assert P.segments(prof, modes, 2 * GB) == {0: 1, 2: 2, 4: 5}
    assert P.segments(prof, modes, 10 * GB) == {0: 2, 4: 5}
    link = P.Link(pool=0)
    plain = P.simulate(prof, modes, link)
    link.segment_cap = 10 * GB
    merged = P.simulate(prof, modes, link)
    # Blocks 1, 2 and 5 no longer keep their inputs.
    assert plain["extra"] - merged["extra"] == 3 * 0.25 * GB
    assert merged["recompute_s"] == plain["recompute_s"]
