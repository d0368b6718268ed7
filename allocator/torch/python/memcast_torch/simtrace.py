"""The job ``memcast_torch.offload`` planned, as a memcast trace and plan, for memcast's
simulator (``memcast replay TRACE --budget B --plan PLAN --json``).

Pure Python (no torch), like ``plan.py``. ``build`` turns what the planner saw (the
profile: per block forward and backward time, saved bytes, input bytes; the memory
allocated before the blocks; the time the step spends outside them) and the plan it
chose (per block mode, the prefetch issue points) into two JSON documents:

- the **trace** (``memcast-trace``, read by every ``memcast`` command and converted by
  ``memcast trace import DOC -o X.mctrace``): a static block for what was allocated
  before the blocks (parameters, optimizer state); per iteration and block ``i``, its
  input ``in`` (``inp`` bytes, made when block ``i - 1`` starts; block 0's with the
  iteration) and what it saves beyond its input, ``saved`` (``saved - inp`` bytes, at
  least 4 KiB), made when the block starts; the clock advances by the block's measured
  forward time. Inside a segment of recomputed blocks (``plan.segments``) only the
  first block's ``in`` is kept: the others' are freed when their block's forward ends. After the forward, the time outside the blocks before backward
  (``head_s``: the head, the loss, their backward). Backward, from the last block:
  ``in`` and ``saved`` are read when backward reaches the block, the clock advances by
  its backward time, both are freed. Then the static block is written (the optimizer)
  and ``tail_s`` passes (the rest of the step). ``TensorMeta`` gives each ``saved`` its
  producer (the block's forward, which reads its ``in``) and its recompute cost (the
  block's measured forward time), so the simulator's recompute brings ``in`` back and
  charges that time. The same iteration is written ``iterations`` times between
  iteration boundaries. Memory outside the blocks (a head's logits) is not in it.
- the **plan** (``memcast-plan``): for a recomputed block, ``saved`` dropped when its
  forward ends; for an offloaded one, ``saved`` and ``in`` (block 0: only ``saved``)
  spilled when its forward ends; for ``offload_input`` (the first block of a segment: the
  segment's input), ``in`` spilled when the block starts (block 0's belongs to the
  caller: not spilled); each spilled tensor
  prefetched when backward reaches the block ``plan.issue_blocks`` chose for it, in the
  order backward needs them. A segment ``a..b`` whose input is offloaded reads ``a``'s
  ``in`` when backward reaches ``b`` (where the segment is recomputed).

Times are whole microseconds from the trace's start, rounded from the cumulated seconds.
"""

import json

from . import plan as P

MIN_SAVED = 4096
"""The least bytes of a block's ``saved`` tensor (a block that saves no more than its
input still has its recompute cost charged on it)."""


class _Writer(object):
    def __init__(self):
        self.events = []
        self.tensors = {}
        self.directives = []
        self.next_id = 2
        self.t = 0.0

    def now(self):
        return int(round(self.t * 1e6))

    def ev(self, kind):
        self.events.append({"time_us": self.now(), "kind": kind})
        return len(self.events) - 1

    def alloc(self, nbytes, producer=None, consumers=(), recompute_s=None):
        tid = self.next_id
        self.next_id += 1
        idx = self.ev({"Alloc": {"id": tid, "bytes": int(nbytes), "stream": 0}})
        self.tensors[tid] = {
            "id": tid, "size": int(nbytes), "producer": producer,
            "consumers": list(consumers), "alloc_event": idx, "free_event": None,
            "recompute_us": (max(1, int(round(recompute_s * 1e6)))
                             if recompute_s is not None else None),
        }
        return tid

    def access(self, tid, write=False):
        self.ev({"Access": {"id": tid, "write": bool(write)}})

    def free(self, tid):
        self.tensors[tid]["free_event"] = self.ev({"Free": {"id": tid}})

    def directive(self, action, tid):
        # Acts before the next event (after the clock advanced to its time).
        self.directives.append({"before_event": len(self.events), "action": action,
                                "id": tid})


def build(prof, modes, issue, base_bytes=0, head_s=0.0, tail_s=0.0, iterations=3,
          name="offload", description="", segs=None):
    """The trace and plan documents (two dicts, see the module docs) of ``modes`` over
    ``prof`` (``plan.BlockProfile`` list) with prefetches issued at ``issue``
    (``plan.issue_blocks``: offloaded block or offloaded segment input -> the block at
    whose backward start it is prefetched). ``segs``: the segments (``plan.segments``;
    default: none merged)."""
    n = len(prof)
    if n == 0 or len(modes) != n:
        raise ValueError("simtrace: one mode per block is needed (%d blocks, %d modes)"
                         % (n, len(modes)))
    for m in modes:
        if m not in P.MODES:
            raise ValueError("simtrace: unknown mode %r" % (m,))
    if iterations < 1:
        raise ValueError("simtrace: at least one iteration")
    segs = segs if segs is not None else {i: i for i in range(n) if modes[i] in P.RECOMPUTED}
    ins = P.input_spills(modes, segs)
    input_of = {b: a for a, b in ins.items()}
    # Blocks inside a segment (not its first): their inputs are not kept (the
    # segment's recomputation makes them again from the first block's).
    internal = {m for a, b in segs.items() for m in range(a + 1, b + 1)}
    w = _Writer()
    static = []
    if base_bytes > 0:
        static = [{"id": 1, "bytes": int(base_bytes), "stream": 0}]
    for it in range(iterations):
        op = lambda i, what: "it%d.b%d.%s" % (it, i, what)  # noqa: E731
        w.ev("IterationBoundary")
        if static:
            w.access(1)
        inp = [None] * n
        saved = [None] * n
        inp[0] = w.alloc(prof[0].inp, "it%d.data" % it,
                         [op(0, "fwd"), op(0, "bwd")]) if prof[0].inp > 0 else None
        for i, p in enumerate(prof):
            if i in ins and i > 0 and inp[i] is not None:
                w.directive("spill", inp[i])
            rec = p.fwd if modes[i] in P.RECOMPUTED else None
            # Inside a segment the recompute starts from the segment's input: the
            # producer reads no tensor of the trace.
            saved[i] = w.alloc(max(MIN_SAVED, p.saved - p.inp),
                               op(i, "fwd.in_segment" if i in internal else "fwd"),
                               [op(i, "bwd")], recompute_s=p.fwd)
            if rec is None:
                # Only recomputed blocks' tensors may be dropped.
                w.tensors[saved[i]]["recompute_us"] = None
            if i + 1 < n and prof[i + 1].inp > 0:
                inp[i + 1] = w.alloc(prof[i + 1].inp, op(i, "fwd"),
                                     [op(i + 1, "fwd"), op(i + 1, "bwd")])
            w.t += p.fwd
            if i in internal and inp[i] is not None:
                w.free(inp[i])
                inp[i] = None
            if modes[i] in P.RECOMPUTED:
                w.directive("drop", saved[i])
            elif modes[i] == P.OFFLOAD:
                w.directive("spill", saved[i])
                if i > 0 and inp[i] is not None:
                    w.directive("spill", inp[i])
        w.t += head_s
        # Prefetches, per issue block, in the order backward needs them.
        at = {}
        for key, k in issue.items():
            key = int(key)
            if key in ins:
                if key > 0 and inp[key] is not None:
                    at.setdefault(int(k), []).append((ins[key] + 0.5, [inp[key]]))
            elif modes[key] == P.OFFLOAD:
                tids = [saved[key]] + ([inp[key]] if key > 0 and inp[key] is not None else [])
                at.setdefault(int(k), []).append((key, tids))
        for i in reversed(range(n)):
            for _, tids in sorted(at.get(i, ()), key=lambda x: -x[0]):
                for tid in tids:
                    w.directive("prefetch", tid)
            if i in input_of and inp[input_of[i]] is not None:
                w.access(inp[input_of[i]])
            if inp[i] is not None:
                w.access(inp[i])
            w.access(saved[i])
            w.t += prof[i].bwd
            w.free(saved[i])
            if inp[i] is not None:
                w.free(inp[i])
        if static:
            w.access(1, write=True)
        w.t += tail_s
    w.ev("IterationBoundary")
    trace = {"format": "memcast-trace", "version": 1, "trace": {
        "meta": {"name": name, "source": "memcast-torch:offload",
                 "description": description},
        "static_blocks": static,
        "events": w.events,
        "tensors": sorted(w.tensors.values(), key=lambda t: t["id"]),
        "source_segments": [],
    }}
    plan = {"format": "memcast-plan", "version": 1, "directives": w.directives}
    return trace, plan


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def write(path, doc):
    """Writes a document as compact JSON."""
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))


def rest_times(prof, cal_modes, link, cal, freed=None):
    """The time of the step outside the blocks, from the calibration step's measured
    figures (``cal``: ``gpu_step_s``, ``fwd_s``, ``head_s``; another plan than the one
    replayed): ``head_s`` as measured, ``tail_s`` = the step less the blocks' measured
    forward, the head and the blocks' backward the planner predicts for that step
    (recomputes included). Missing figures give 0."""
    head = cal.get("head_s") or 0.0
    step, fwd = cal.get("gpu_step_s"), cal.get("fwd_s")
    if step is None or fwd is None:
        return head, 0.0
    sim = P.simulate(prof, cal_modes, link, freed, cap=0)
    bwd = sim["step_s"] - sum(p.fwd for p in prof)
    return head, max(0.0, step - fwd - head - bwd)


def from_offload(off, path, plan_path=None, iterations=3):
    """``Offload.write_trace``: the current shape's profile, the plan its last
    completed iteration ran, the memory allocated at the last iteration's start, the
    time outside the blocks as measured in the iterations that ran that plan (median;
    else from the calibration step, ``rest_times``). Returns the figures used and the
    planner's own prediction of the plan (``predicted_blocks_s``; ``predicted_step_s``
    adds the same time outside the blocks)."""
    sh = off.shape
    if sh is None or sh.prof is None or sh.modes is None:
        raise RuntimeError("write_trace: no iteration has run through the blocks yet")
    sig = [k for k, v in off.shapes.items() if v is sh]
    its = [r for r in off.iterations() if sig and r.get("shape") == list(sig[0])]
    cal = [r for r in its if r.get("calibration")]
    # The plan the last iteration ran (the one after it may be re-planned already).
    modes = list(its[-1]["modes"]) if its else list(sh.modes)
    cap = off.link.segment_cap
    # The time outside the blocks as measured in the iterations that ran this plan:
    # the head (the forward's end to backward's arrival at the last block) and the
    # tail (backward leaving the first block to the next step's start), the recording's
    # own times; the simulator predicts the blocks' part (forward, backward,
    # recomputation, waits for the link) from the profile.
    ran = [r for r in its if not r.get("calibration") and list(r["modes"]) == modes]
    heads = [r.get("head_s") for r in ran]
    tails = [r.get("tail_s") for r in ran]
    if ran and None not in heads and None not in tails:
        head, tail = _median(heads), _median(tails)
        rest_from = "measured in the %d iterations that ran the plan" % len(ran)
    elif cal:
        # Without the backward's end marked: the calibration step's figures, less the
        # blocks' time the planner predicts for it (a first step: slower than later).
        head, tail = rest_times(sh.prof, sh.cal_modes, off.link, cal[-1])
        rest_from = "calibration step"
    else:
        # Forced modes run no calibration: the last iteration's own figures (then the
        # time outside the blocks is not independent of the step replayed).
        head, tail = rest_times(sh.prof, modes, off.link, its[-1] if its else {})
        rest_from = "last iteration (no calibration step)"
    base = its[-1]["base"] if its else sh.base
    pred = P.simulate(sh.prof, modes, off.link, sh.freed)
    counts = {m: modes.count(m) for m in P.MODES}
    trace, plan = build(sh.prof, modes, P.issue_blocks(sh.prof, modes, off.link, cap),
                        base_bytes=base, head_s=head, tail_s=tail, iterations=iterations,
                        segs=P.segments(sh.prof, modes, cap),
                        description="memcast_torch.offload, budget %d bytes, plan %s"
                        % (off.budget, counts))
    write(path, trace)
    if plan_path is not None:
        write(plan_path, plan)
    return {"trace": path, "plan": plan_path, "budget": off.budget, "base": base,
            "head_s": head, "tail_s": tail, "rest_from": rest_from, "counts": counts,
            "modes": modes, "predicted_blocks_s": pred["step_s"],
            "predicted_stall_s": pred["stall_s"],
            "predicted_step_s": pred["step_s"] + head + tail,
            "link": {"d2h": off.link.d2h, "h2d": off.link.h2d}}
