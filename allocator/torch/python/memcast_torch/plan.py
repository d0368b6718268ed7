"""The planner of ``memcast_torch.offload``: per block, keep, offload or recompute.

Pure Python (no torch), so it can be tested anywhere. Inputs:

- a measured profile: per block its forward and backward time (seconds), the bytes of
  the tensors it saves for backward (``saved``, parameters left out) and the bytes of its
  input (``inp``: what recomputation keeps, as ``torch.utils.checkpoint`` does);
- ``headroom``: device bytes the plan may add on top of the all-recompute plan (measured:
  the peak of a step with every block recomputed, against the budget);
- the link: bandwidth each way (bytes/s), the prefetch window (bytes) and the pinned pool.

Costs relative to recomputing a block (the plan every budget-feasible run starts from):

- keep: no time, ``saved - inp`` more bytes at the end of the forward (the peak);
- offload: no recomputation; its saved tensors leave on the device-to-host link as the
  block runs, serially in forward order, and come back host-to-device in the order
  backward needs them, each as soon as the prefetch window has room; a block waits for
  its tensors (``stall``) when the link has not brought them in time. Bytes whose spill
  has not completed by the end of the forward are still on the device at the peak, and
  the window is reserved on top;
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

    def __init__(self, d2h=50e9, h2d=50e9, window=2 << 30, pool=8 << 30):
        self.d2h = float(d2h)
        self.h2d = float(h2d)
        self.window = int(window)
        self.pool = int(pool)


def _extra_bytes(prof, modes, undrained, link):
    keep = sum(max(0, p.saved - p.inp) for p, m in zip(prof, modes) if m == KEEP)
    off = [p.saved for p, m in zip(prof, modes) if m == OFFLOAD]
    window = max([link.window] + off) if off else 0
    return keep + undrained + window


def simulate(prof, modes, link):
    """Predicted step of ``modes`` over ``prof``: a dict with ``step_s`` (forward +
    backward of the blocks), ``stall_s`` (waits for prefetches), ``recompute_s``,
    ``undrained`` (offloaded bytes still on the device at the end of the forward),
    ``extra`` (bytes above the all-recompute plan at the peak), ``offloaded`` and
    ``recomputed`` (saved bytes)."""
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
    h2d = fwd_end
    consumed = []  # (time its device copy is freed, bytes) of earlier prefetches
    stall = 0.0
    recompute = 0.0
    for i in reversed(range(n)):
        p = prof[i]
        if modes[i] == OFFLOAD:
            window = max(link.window, p.saved)
            issue = fwd_end
            # The window has room once enough earlier prefetches were consumed.
            for when, _ in sorted(consumed):
                if sum(b for w, b in consumed if w > issue) + p.saved <= window:
                    break
                issue = max(issue, when)
            start = max(h2d, issue, spill_done[i])
            h2d = start + p.saved / link.h2d
            if h2d > t:
                stall += h2d - t
                t = h2d
        if modes[i] == RECOMPUTE:
            t += p.fwd
            recompute += p.fwd
        t += p.bwd
        if modes[i] == OFFLOAD:
            consumed.append((t, p.saved))
    return {
        "step_s": t,
        "stall_s": stall,
        "recompute_s": recompute,
        "undrained": undrained,
        "extra": _extra_bytes(prof, modes, undrained, link),
        "offloaded": sum(p.saved for p, m in zip(prof, modes) if m == OFFLOAD),
        "recomputed": sum(p.saved for p, m in zip(prof, modes) if m == RECOMPUTE),
    }


def _fits(sim, headroom, link):
    return sim["extra"] <= headroom and sim["offloaded"] <= link.pool


def _offload_pass(prof, modes, headroom, link, min_bytes):
    best = simulate(prof, modes, link)
    for i, p in enumerate(prof):
        if modes[i] != RECOMPUTE or p.saved < min_bytes:
            continue
        trial = list(modes)
        trial[i] = OFFLOAD
        s = simulate(prof, trial, link)
        if _fits(s, headroom, link) and s["step_s"] < best["step_s"]:
            modes, best = trial, s
    return modes


def _keep_pass(prof, modes, headroom, link):
    order = sorted(
        (i for i in range(len(prof)) if modes[i] == RECOMPUTE),
        key=lambda i: -prof[i].fwd / max(1, prof[i].saved - prof[i].inp),
    )
    for i in order:
        trial = list(modes)
        trial[i] = KEEP
        if _fits(simulate(prof, trial, link), headroom, link):
            modes = trial
    return modes


def make_plan(prof, headroom, link, min_offload_bytes=16 << 20):
    """The modes (one per block) of the fastest plan found within ``headroom`` bytes
    above the all-recompute plan, and its prediction (``simulate``'s dict)."""
    n = len(prof)
    base = [RECOMPUTE] * n
    if headroom < 0:
        raise PlanError(
            "no plan fits: recomputing every block already needs %.2f GB more than the "
            "budget allows" % (-headroom / 1e9))
    candidates = []
    a = _keep_pass(prof, _offload_pass(prof, base, headroom, link, min_offload_bytes),
                   headroom, link)
    candidates.append(a)
    b = _offload_pass(prof, _keep_pass(prof, base, headroom, link), headroom, link,
                      min_offload_bytes)
    candidates.append(b)
    sims = [simulate(prof, m, link) for m in candidates]
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
