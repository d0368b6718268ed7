"""The planner of ``memcast_torch.offload``: per block, keep, offload or recompute.

Pure Python (no torch), so it can be tested anywhere. Inputs:

- a measured profile: per block its forward and backward time (seconds), the bytes of
  the tensors it saves for backward (``saved``, parameters left out) and the bytes of its
  input (``inp``: what recomputation keeps, as ``torch.utils.checkpoint`` does);
- ``headroom``: device bytes the plan may add on top of the all-recompute plan (measured:
  the peak of a step with every block recomputed, against the budget);
- the link: bandwidth each way (bytes/s, measured on the pool), the prefetch window
  (a cap on prefetched-and-unused bytes, enforced at run time) and the pinned pool.

Costs relative to recomputing a block (the plan every budget-feasible run starts from):

- keep: no time, ``saved - inp`` more bytes at the end of the forward (the peak);
- offload: no recomputation; its saved tensors leave on the device-to-host link as the
  block runs, serially in forward order, and come back host-to-device in the order
  backward needs them, each issued as late as still hides the copy (``issue_blocks``),
  so that it lands when backward has freed memory; a block waits for its tensors
  (``stall``) when the link has not brought them in time. Bytes whose spill has not
  completed by the end of the forward are still on the device at the peak; at each
  prefetch's issue the bytes in flight count against what backward has freed by then
  (measured in the all-recompute step, ``freed``);
- recompute: the block's forward again in backward.

``simulate`` predicts one step of a plan; ``make_plan`` chooses greedily: blocks are
offloaded in forward order (the earliest have the longest time to leave and come back)
while that shortens the predicted step and fits, then recomputed blocks are kept, the
most recompute time per byte first, while they fit the headroom. Both orders (offload
first, keep first) are tried and the faster prediction wins.
"""

KEEP = "keep"
OFFLOAD = "offload"
RECOMPUTE = "recompute"
MODES = (KEEP, OFFLOAD, RECOMPUTE)


class PlanError(RuntimeError):
    """No plan fits the budget; the message gives the figures."""


class BlockProfile(object):
    __slots__ = ("fwd", "bwd", "saved", "inp")

    def __init__(self, fwd, bwd, saved, inp):
        self.fwd = float(fwd)
        self.bwd = float(bwd)
        self.saved = int(saved)
        self.inp = int(inp)

    def as_dict(self):
        return {"fwd_s": self.fwd, "bwd_s": self.bwd, "saved": self.saved, "inp": self.inp}

    def __repr__(self):
        return "BlockProfile(fwd=%.4g, bwd=%.4g, saved=%d, inp=%d)" % (
            self.fwd, self.bwd, self.saved, self.inp)


class Link(object):
    """The host link: bytes/s device-to-host and host-to-device (concurrently), the
    prefetch window (device bytes prefetched and not yet used) and the pinned pool."""

    def __init__(self, d2h=50e9, h2d=50e9, window=2 << 30, pool=8 << 30, segment_cap=0):
        self.d2h = float(d2h)
        self.h2d = float(h2d)
        self.window = int(window)
        self.pool = int(pool)
        # Consecutive recomputed blocks whose saved bytes together stay under this are
        # recomputed as one segment (0: never).
        self.segment_cap = int(segment_cap)


def segments(prof, modes, cap):
    """Runs of consecutive recomputed blocks, each recomputed as one segment: a dict
    first block -> last block. A segment keeps only its first block's input; its
    recomputation in backward holds its blocks' saved bytes at once, so they stay
    under ``cap`` (the largest single block's, by default: no larger than the
    all-recompute step already held)."""
    out = {}
    n = len(prof)
    i = 0
    while i < n:
        if modes[i] != RECOMPUTE:
            i += 1
            continue
        j, total = i, prof[i].saved
        while (cap and j + 1 < n and modes[j + 1] == RECOMPUTE
               and total + prof[j + 1].saved <= cap):
            j += 1
            total += prof[j].saved
        out[i] = j
        i = j + 1
    return out


LEAD = 1.5
"""A prefetch is issued when the backward still has ``LEAD`` times its copy's time to
run before the block needs it (measured backward and recompute times)."""


def issue_blocks(prof, modes, link):
    """For each offloaded block ``j``: the block at whose backward start its tensors
    are prefetched: the nearest ``k > j`` such that the backward from ``k`` down to
    ``j + 1`` takes ``LEAD`` times the copy back (as late as hides it, so that
    the prefetched bytes arrive when backward has freed memory), else the last block."""
    n = len(prof)
    out = {}
    for j in range(n):
        if modes[j] != OFFLOAD:
            continue
        need = LEAD * prof[j].saved / link.h2d
        acc = 0.0
        k = n - 1
        for m in range(j + 1, n):
            acc += prof[m].bwd + (prof[m].fwd if modes[m] == RECOMPUTE else 0.0)
            if acc >= need:
                k = m
                break
        out[j] = max(k, j)
    return out


def _freed(prof, freed, b):
    """Bytes below the all-recompute peak at block ``b``'s backward start: measured
    (``freed``) or, without a measurement, the inputs of the blocks after it."""
    if freed is not None and b < len(freed) and freed[b] is not None:
        return freed[b]
    return sum(p.inp for p in prof[b + 1:])


def simulate(prof, modes, link, freed=None):
    """Predicted step of ``modes`` over ``prof``: a dict with ``step_s`` (forward +
    backward of the blocks), ``stall_s`` (waits for prefetches), ``recompute_s``,
    ``undrained`` (offloaded bytes still on the device at the end of the forward),
    ``extra`` (bytes above the all-recompute plan's peak, the most of: the end of the
    forward, and each prefetch's issue), ``offloaded`` and ``recomputed`` (saved bytes),
    ``issue`` (``issue_blocks``). ``freed``: per block, the measured bytes below the
    all-recompute peak at its backward start."""
    n = len(prof)
    t = 0.0
    d2h = 0.0
    spill_done = {}
    for i, p in enumerate(prof):
        t += p.fwd
        if modes[i] == OFFLOAD:
            d2h = max(d2h, t) + p.saved / link.d2h
            spill_done[i] = d2h
    fwd_end = t
    undrained = sum(prof[i].saved for i, d in spill_done.items() if d > fwd_end)
    issue = issue_blocks(prof, modes, link)
    h2d = fwd_end
    arrive = {}
    stall = 0.0
    recompute = 0.0
    for i in reversed(range(n)):
        p = prof[i]
        for j in sorted((j for j, k in issue.items() if k == i), reverse=True):
            start = max(h2d, t, spill_done[j])
            h2d = start + prof[j].saved / link.h2d
            arrive[j] = h2d
        if modes[i] == OFFLOAD and arrive[i] > t:
            stall += arrive[i] - t
            t = arrive[i]
        if modes[i] == RECOMPUTE:
            t += p.fwd
            recompute += p.fwd
        t += p.bwd

    def keep_extra(upto):
        return sum(max(0, prof[m].saved - prof[m].inp)
                   for m in range(min(upto + 1, n)) if modes[m] == KEEP)

    # Inputs that segments do not keep (their blocks' inputs, but the first's).
    segs = segments(prof, modes, link.segment_cap)
    merged = [m for a, b in segs.items() for m in range(a + 1, b + 1)]

    def seg_saving(upto):
        return sum(prof[m].inp for m in merged if m <= upto)

    extra = keep_extra(n - 1) + undrained - seg_saving(n - 1)
    for j, k in issue.items():
        inflight = sum(prof[i].saved for i, ki in issue.items() if ki >= k and i <= k)
        extra = max(extra, keep_extra(k) - seg_saving(k) + inflight - _freed(prof, freed, k))
    return {
        "step_s": t,
        "stall_s": stall,
        "recompute_s": recompute,
        "undrained": undrained,
        "extra": extra,
        "offloaded": sum(p.saved for p, m in zip(prof, modes) if m == OFFLOAD),
        "recomputed": sum(p.saved for p, m in zip(prof, modes) if m == RECOMPUTE),
        "issue": issue,
        "segments": len(segs),
    }


def _fits(sim, headroom, link):
    return sim["extra"] <= headroom and sim["offloaded"] <= link.pool


def _offload_pass(prof, modes, headroom, link, min_bytes, freed):
    best = simulate(prof, modes, link, freed)
    for i, p in enumerate(prof):
        if modes[i] != RECOMPUTE or p.saved < min_bytes:
            continue
        trial = list(modes)
        trial[i] = OFFLOAD
        s = simulate(prof, trial, link, freed)
        if _fits(s, headroom, link) and s["step_s"] < best["step_s"]:
            modes, best = trial, s
    return modes


def _keep_pass(prof, modes, headroom, link, freed):
    order = sorted(
        (i for i in range(len(prof)) if modes[i] == RECOMPUTE),
        key=lambda i: -prof[i].fwd / max(1, prof[i].saved - prof[i].inp),
    )
    for i in order:
        trial = list(modes)
        trial[i] = KEEP
        if _fits(simulate(prof, trial, link, freed), headroom, link):
            modes = trial
    return modes


def make_plan(prof, headroom, link, min_offload_bytes=16 << 20, freed=None):
    """The modes (one per block) of the fastest plan found within ``headroom`` bytes
    above the all-recompute plan's peak, and its prediction (``simulate``'s dict).
    ``freed``: as in ``simulate``."""
    n = len(prof)
    base = [RECOMPUTE] * n
    least = simulate(prof, base, link, freed)["extra"]
    if least > headroom:
        raise PlanError(
            "no plan fits: recomputing every block already needs %.2f GB more than the "
            "budget allows" % ((least - headroom) / 1e9))
    off_first = _offload_pass(prof, base, headroom, link, min_offload_bytes, freed)
    a = _keep_pass(prof, off_first, headroom, link, freed)
    b = _offload_pass(prof, _keep_pass(prof, base, headroom, link, freed), headroom, link,
                      min_offload_bytes, freed)
    candidates = [a, b]
    sims = [simulate(prof, m, link, freed) for m in candidates]
    k = min(range(len(candidates)), key=lambda j: sims[j]["step_s"])
    return candidates[k], sims[k]


def min_peak(base_bytes, prof):
    """The least peak any plan can have, from the profile: what is allocated before the
    blocks run, every block's input (kept for recomputation) and the largest block
    recomputed at once in backward. The parts outside the blocks (a head, the loss, the
    optimizer's state) come on top."""
    if not prof:
        return base_bytes
    return base_bytes + sum(p.inp for p in prof) + max(p.saved for p in prof)
