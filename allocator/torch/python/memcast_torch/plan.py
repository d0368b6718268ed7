"""The planner of ``memcast_torch.offload``: per block, keep, offload or recompute (and
whether a recomputed block's input is offloaded).

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
  (measured in the all-recompute step, ``freed``); more than ``Link.inflight`` spill
  bytes in flight make the forward wait (the engine's CPU waits for the oldest copy);
- recompute: the block's forward again in backward;
- offload_input: recomputed, and the one tensor it keeps, its input, leaves on the
  same link when the block starts and comes back before backward recomputes it (issued
  as an offloaded block's tensors are): ``inp`` fewer bytes on the device between the
  spill's completion and the prefetch, when the block before it is recomputed too (a
  kept or offloaded block may save that tensor, its output, itself; the first block's
  input is the caller's).

``simulate`` predicts one step of a plan; ``make_plan`` chooses greedily: blocks are
offloaded in forward order (the earliest have the longest time to leave and come back)
while that shortens the predicted step and fits, recomputed blocks are kept, the most
recompute time per byte first, while they fit the headroom, and recomputed blocks'
inputs are offloaded in forward order while the link hides them, which frees memory
for keeping more (and, when recomputing every block does not fit, however slow until
it fits). Several orders of these passes are tried and the fastest prediction that
fits wins.
"""

KEEP = "keep"
OFFLOAD = "offload"
RECOMPUTE = "recompute"
OFFLOAD_INPUT = "offload_input"
MODES = (KEEP, OFFLOAD, RECOMPUTE, OFFLOAD_INPUT)
RECOMPUTED = (RECOMPUTE, OFFLOAD_INPUT)
"""Modes whose block is recomputed in backward (``offload_input``: and its input, the
one tensor a recomputed block keeps, is offloaded)."""


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
    prefetch window (device bytes prefetched and not yet used), the pinned pool and the
    spill bytes in flight beyond which the CPU waits for the oldest copy."""

    def __init__(self, d2h=50e9, h2d=50e9, window=2 << 30, pool=8 << 30, segment_cap=0,
                 inflight=4 << 30):
        self.d2h = float(d2h)
        self.h2d = float(h2d)
        self.window = int(window)
        self.pool = int(pool)
        # Consecutive recomputed blocks whose saved bytes together stay under this are
        # recomputed as one segment (0: never).
        self.segment_cap = int(segment_cap)
        self.inflight = int(inflight)


def segments(prof, modes, cap):
    """Runs of consecutive recomputed blocks (``RECOMPUTED``), each recomputed as one
    segment: a dict first block -> last block. A segment keeps only its first block's
    input (offloaded when that block's mode is ``offload_input``); its recomputation in
    backward holds its blocks' saved bytes at once, so they stay under ``cap`` (the
    largest single block's, by default: no larger than the all-recompute step already
    held)."""
    out = {}
    n = len(prof)
    i = 0
    while i < n:
        if modes[i] not in RECOMPUTED:
            i += 1
            continue
        j, total = i, prof[i].saved
        while (cap and j + 1 < n and modes[j + 1] in RECOMPUTED
               and total + prof[j + 1].saved <= cap):
            j += 1
            total += prof[j].saved
        out[i] = j
        i = j + 1
    return out


def input_spills(modes, segs):
    """The segments whose input is offloaded: first block -> last block."""
    return {a: b for a, b in segs.items() if modes[a] == OFFLOAD_INPUT}


def input_frees(modes, a):
    """Whether offloading block ``a``'s input frees its device memory: only when the
    block before it is recomputed too (a kept or offloaded block before it may save
    that tensor itself, its output; the first block's input belongs to the caller)."""
    return a > 0 and modes[a - 1] in RECOMPUTED


LEAD = 1.5
"""A prefetch is issued when the backward still has ``LEAD`` times its copy's time to
run before the block needs it (measured backward and recompute times)."""


def _cap(link, cap):
    return link.segment_cap if cap is None else cap


def issue_blocks(prof, modes, link, cap=None):
    """For each offloaded block ``j`` and each segment ``a..b`` whose input is offloaded
    (keyed by ``a``): the block at whose backward start the tensors are prefetched: the
    nearest block ``k`` after the one that needs them (``j``; ``b``, whose backward
    start recomputes the segment) such that the backward from ``k`` down to that block
    takes ``LEAD`` times the copy back (as late as hides it, so that the prefetched
    bytes arrive when backward has freed memory), else the last block; a ``k`` inside
    a segment is moved to the segment's last block (where backward enters it).
    ``cap``: the segment cap (default ``link.segment_cap``)."""
    n = len(prof)
    segs = segments(prof, modes, _cap(link, cap))
    tail = {}
    for a, b in segs.items():
        for m in range(a, b + 1):
            tail[m] = b
    wanted = [(j, j, prof[j].saved) for j in range(n) if modes[j] == OFFLOAD]
    wanted += [(a, b, prof[a].inp) for a, b in input_spills(modes, segs).items()]
    out = {}
    for key, need_at, nbytes in wanted:
        need = LEAD * nbytes / link.h2d
        acc = 0.0
        k = n - 1
        for m in range(need_at + 1, n):
            acc += prof[m].bwd + (prof[m].fwd if modes[m] in RECOMPUTED else 0.0)
            if acc >= need:
                k = m
                break
        k = tail.get(k, k)
        out[key] = max(k, need_at)
    return out


def _freed(prof, freed, b):
    """Bytes below the all-recompute peak at block ``b``'s backward start: measured
    (``freed``) or, without a measurement, the inputs of the blocks after it."""
    if freed is not None and b < len(freed) and freed[b] is not None:
        return freed[b]
    return sum(p.inp for p in prof[b + 1:])


def simulate(prof, modes, link, freed=None, cap=None):
    """Predicted step of ``modes`` over ``prof``: a dict with ``step_s`` (forward +
    backward of the blocks), ``stall_s`` (waits for prefetches), ``host_wait_s``
    (forward waits while more than ``link.inflight`` spill bytes are in flight),
    ``recompute_s``, ``undrained`` (offloaded blocks' bytes still on the device at the
    end of the forward), ``inputs_freed`` (offloaded inputs off the device at the end of
    the forward), ``extra`` (bytes above the all-recompute plan's peak, the most of: the
    end of the forward, and each prefetch's issue), ``offloaded`` (bytes through the
    pool), ``recomputed`` (saved bytes), ``issue`` (``issue_blocks``). ``freed``: per
    block, the measured bytes below the all-recompute peak at its backward start.
    ``cap``: the segment cap (default ``link.segment_cap``)."""
    n = len(prof)
    cap = _cap(link, cap)
    segs = segments(prof, modes, cap)
    ins = input_spills(modes, segs)
    # Forward: spills leave serially on the device-to-host link; an input's when its
    # block starts, a block's saved bytes when it ends.
    t = 0.0
    d2h = 0.0
    pending = []   # [done, bytes] of spills in flight, oldest first
    host_wait = 0.0
    spill_done = {}

    def enqueue(key, nbytes):
        nonlocal t, d2h, host_wait
        while pending and pending[0][0] <= t:
            pending.pop(0)
        while pending and sum(b for _, b in pending) + nbytes > link.inflight:
            done = pending.pop(0)[0]
            if done > t:
                host_wait += done - t
                t = done
        d2h = max(d2h, t) + nbytes / link.d2h
        pending.append([d2h, nbytes])
        spill_done[key] = d2h

    for i, p in enumerate(prof):
        if i in ins:
            enqueue(("i", i), p.inp)
        t += p.fwd
        if modes[i] == OFFLOAD:
            enqueue(("b", i), p.saved)
    fwd_end = t
    undrained = sum(prof[i].saved for i in range(n)
                    if modes[i] == OFFLOAD and spill_done[("b", i)] > fwd_end)
    frees = {a for a in ins if input_frees(modes, a)}
    inputs_freed = sum(prof[a].inp for a in frees if spill_done[("i", a)] <= fwd_end)
    issue = issue_blocks(prof, modes, link, cap)
    # What is prefetched at each block's backward start, in the order backward needs it.
    at = {}
    for key, k in issue.items():
        if key in ins:
            at.setdefault(k, []).append((ins[key] + 0.5, ("i", key), prof[key].inp))
        else:
            at.setdefault(k, []).append((key, ("b", key), prof[key].saved))
    input_of = {b: a for a, b in ins.items()}
    h2d = fwd_end
    arrive = {}
    tb = [0.0] * n
    stall = 0.0
    recompute = 0.0
    for i in reversed(range(n)):
        p = prof[i]
        tb[i] = t
        for _, key, nbytes in sorted(at.get(i, ()), reverse=True):
            start = max(h2d, t, spill_done[key])
            h2d = start + nbytes / link.h2d
            arrive[key] = h2d
        need = []
        if i in input_of:
            need.append(("i", input_of[i]))
        if modes[i] == OFFLOAD:
            need.append(("b", i))
        for key in need:
            if arrive[key] > t:
                stall += arrive[key] - t
                t = arrive[key]
        if modes[i] in RECOMPUTED:
            t += p.fwd
            recompute += p.fwd
        t += p.bwd

    def keep_extra(upto):
        return sum(max(0, prof[m].saved - prof[m].inp)
                   for m in range(min(upto + 1, n)) if modes[m] == KEEP)

    # Inputs that segments do not keep (their blocks' inputs, but the first's).
    merged = [m for a, b in segs.items() for m in range(a + 1, b + 1)]

    def seg_saving(upto):
        return sum(prof[m].inp for m in merged if m <= upto)

    def inputs_off(k):
        # Offloaded inputs of segments not yet recomputed at block k's backward start,
        # whose spill completed and whose prefetch is not issued yet.
        return sum(prof[a].inp for a in frees
                   if a <= k and issue[a] < k and spill_done[("i", a)] <= tb[k])

    extra = keep_extra(n - 1) + undrained - seg_saving(n - 1) - inputs_freed
    for k in set(issue.values()):
        inflight = sum(prof[j].saved for j, kj in issue.items()
                       if j not in ins and kj >= k and j <= k)
        extra = max(extra, keep_extra(k) - seg_saving(k) + inflight - inputs_off(k)
                    - _freed(prof, freed, k))
    return {
        "step_s": t,
        "stall_s": stall,
        "host_wait_s": host_wait,
        "recompute_s": recompute,
        "undrained": undrained,
        "inputs_freed": inputs_freed,
        "extra": extra,
        "offloaded": (sum(p.saved for p, m in zip(prof, modes) if m == OFFLOAD)
                      + sum(prof[a].inp for a in ins)),
        "recomputed": sum(p.saved for p, m in zip(prof, modes) if m in RECOMPUTED),
        "issue": issue,
        "segments": len(segs),
        "inputs_offloaded": len(ins),
    }


def _fits(sim, headroom, link):
    return sim["extra"] <= headroom and sim["offloaded"] <= link.pool


def _offload_pass(prof, modes, headroom, link, min_bytes, freed):
    best = simulate(prof, modes, link, freed)
    for i, p in enumerate(prof):
        if modes[i] not in RECOMPUTED or p.saved < min_bytes:
            continue
        trial = list(modes)
        trial[i] = OFFLOAD
        s = simulate(prof, trial, link, freed)
        if _fits(s, headroom, link) and s["step_s"] < best["step_s"]:
            modes, best = trial, s
    return modes


def _keep_pass(prof, modes, headroom, link, freed):
    # Blocks whose input is offloaded stay so (the memory they free is what is spent).
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


SLOWER = 1.002
"""An input is offloaded to free memory for keeping only while the predicted step gets
at most this much longer (the link hides it)."""


def _input_pass(prof, modes, headroom, link, min_bytes, freed, cap=None, until=None):
    """Offloads recomputed blocks' inputs in forward order (the earliest have the most
    time to leave and come back) while that lowers the memory and the step stays
    within ``SLOWER`` (or, with ``until``, while the memory is above ``until``: then
    however slow)."""
    best = simulate(prof, modes, link, freed, cap)
    for i, p in enumerate(prof):
        if until is not None and best["extra"] <= until:
            break
        if modes[i] != RECOMPUTE or p.inp < min_bytes or not input_frees(modes, i):
            continue
        trial = list(modes)
        trial[i] = OFFLOAD_INPUT
        s = simulate(prof, trial, link, freed, cap)
        if s["offloaded"] > link.pool or s["extra"] >= best["extra"]:
            continue
        if until is None and s["step_s"] > best["step_s"] * SLOWER:
            continue
        modes, best = trial, s
    return modes


def make_plan(prof, headroom, link, min_offload_bytes=16 << 20, freed=None, inputs=True):
    """The modes (one per block) of the fastest plan found within ``headroom`` bytes
    above the all-recompute plan's peak, and its prediction (``simulate``'s dict).
    ``freed``: as in ``simulate``. When recomputing every block does not fit, inputs of
    recomputed blocks are offloaded (in forward order) until it does. ``inputs=False``:
    no input is offloaded."""
    n = len(prof)
    base = [RECOMPUTE] * n
    least = simulate(prof, base, link, freed)["extra"]
    if not inputs:
        if least > headroom:
            raise PlanError(
                "no plan fits: recomputing every block already needs %.2f GB more than "
                "the budget allows" % ((least - headroom) / 1e9))
        candidates = [_keep_pass(prof, _offload_pass(prof, base, headroom, link,
                                                     min_offload_bytes, freed),
                                 headroom, link, freed),
                      _offload_pass(prof, _keep_pass(prof, base, headroom, link, freed),
                                    headroom, link, min_offload_bytes, freed)]
        sims = [simulate(prof, m, link, freed) for m in candidates]
        k = min(range(len(candidates)), key=lambda j: sims[j]["step_s"])
        return candidates[k], sims[k]
    if least > headroom:
        base = _input_pass(prof, base, headroom, link, min_offload_bytes, freed,
                           until=headroom)
        s = simulate(prof, base, link, freed)
        if not _fits(s, headroom, link):
            raise PlanError(
                "no plan fits: recomputing every block, with the inputs the link and the "
                "pool can move offloaded, still needs %.2f GB more than the budget "
                "allows" % ((s["extra"] - headroom) / 1e9))
    def inputs(m):
        return _input_pass(prof, m, headroom, link, min_offload_bytes, freed)

    def offl(m):
        return _offload_pass(prof, m, headroom, link, min_offload_bytes, freed)

    def keep(m):
        return _keep_pass(prof, m, headroom, link, freed)

    candidates = []
    for start in (base, inputs(base)):
        candidates += [keep(offl(start)), offl(keep(start))]
    # Keep first, then free memory by offloading inputs, and keep more with it.
    candidates.append(offl(keep(inputs(keep(base)))))
    candidates = [_tidy(prof, m, headroom, link, freed) for m in candidates]
    sims = [simulate(prof, m, link, freed) for m in candidates]
    ok = [j for j in range(len(candidates)) if _fits(sims[j], headroom, link)] or [0]
    k = min(ok, key=lambda j: sims[j]["step_s"])
    return candidates[k], sims[k]


def _tidy(prof, modes, headroom, link, freed):
    """Offloaded inputs that no longer pay (a block kept before one frees nothing, or
    the memory is not needed) are kept again, when the plan still fits and is no
    slower."""
    best = simulate(prof, modes, link, freed)
    for i in range(len(prof)):
        if modes[i] != OFFLOAD_INPUT:
            continue
        trial = list(modes)
        trial[i] = RECOMPUTE
        s = simulate(prof, trial, link, freed)
        if _fits(s, headroom, link) and s["step_s"] <= best["step_s"]:
            modes, best = trial, s
    return modes


def calibration_modes(prof, link, need, min_bytes=1 << 20):
    """The calibration step's modes (every block recomputed, block by block) when
    keeping every block's input would not fit: inputs offloaded in forward order until
    ``need`` bytes of them are predicted off the device at the end of the forward (or
    the link and the pool allow no more)."""
    modes = [RECOMPUTE] * len(prof)
    for i, p in enumerate(prof):
        if simulate(prof, modes, link, None, cap=0)["inputs_freed"] >= need:
            break
        if p.inp < min_bytes or not input_frees(modes, i):
            continue
        trial = list(modes)
        trial[i] = OFFLOAD_INPUT
        if simulate(prof, trial, link, None, cap=0)["offloaded"] <= link.pool:
            modes = trial
    return modes


def min_peak(base_bytes, prof, link=None):
    """The least peak the planner predicts for any plan, from the profile: what is
    allocated before the blocks run, every block's input (kept for recomputation) and
    the largest block recomputed at once in backward; with ``link``, less the inputs
    that offloading every recomputed block's input (in forward order, within the pool)
    is predicted to have off the device at the end of the forward. The parts outside
    the blocks (a head, the loss, the optimizer's state) come on top."""
    if not prof:
        return base_bytes
    need = base_bytes + sum(p.inp for p in prof) + max(p.saved for p in prof)
    if link is not None:
        modes = calibration_modes(prof, link, float("inf"))
        need -= simulate(prof, modes, link, None, cap=0)["inputs_freed"]
    return need
