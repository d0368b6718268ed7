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
    assert modes.count(P.RECOMPUTE) >= len(prof) // 2
    assert sim["recompute_s"] == pytest.approx(
        sum(p.fwd for p, m in zip(prof, modes) if m == P.RECOMPUTE))
    with pytest.raises(P.PlanError, match="no plan fits"):
        P.make_plan(prof, -1, link)


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
