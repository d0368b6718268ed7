"""``memcast_torch.offload`` (this module: ``memcast_torch.offloading``): train a larger
batch than fits, by keeping, offloading or recomputing what each block saves for
backward. docs/oversubscription.md describes the design and the measurements.

Usage::

    off = memcast_torch.offload(blocks, budget=24 << 30)   # blocks: modules run in a chain
    for x, y in data:
        loss = lossf(model(x), y)     # the blocks' forwards go through `off`
        loss.backward()
        opt.step(); opt.zero_grad(set_to_none=True)
    print(off.stats())
    off.remove()                      # or `with memcast_torch.offload(...) as off:`

``blocks`` (an ``nn.Sequential`` or a list of modules) must run in order, each block's
first argument being the previous block's first output, the other arguments the same
for all blocks. A forward of the first block with gradients enabled starts an
iteration. Per input shape, the first iteration profiles the blocks (``_profile``),
checks the budget (``plan.min_peak``: ``PlanError`` before the step) and runs with every
block recomputed (inputs offloaded when keeping them all would not fit the budget),
measuring its peak and the memory at each block's backward; then the planner
(``plan.make_plan``) spends the measured headroom, corrected by the measured peaks of
the next steps (``_adapt``). Offloaded blocks' saved tensors, and the inputs of
recomputed blocks whose mode is ``offload_input`` (saved by their checkpoint through
the spill hooks around it), go to the pinned
host pool (``hostpool.py``) on its device-to-host stream (``_spill``) and come back on
its host-to-device stream at the point ``plan.issue_blocks`` chose, in the previous
iteration's order (``_prefetch_ahead``); the compute stream waits on a copy's event only
when it uses the tensor (``_unpack``).
"""

import time

import torch
from torch.utils.checkpoint import checkpoint

from . import figures
from . import plan as P
from .hostpool import host_pool

class _Spilled(object):
    """A storage saved for backward and spilled to the host pool."""

    __slots__ = ("dev", "nbytes", "host", "addr", "ev_out", "ev_in", "prefetched",
                 "uses", "order", "consumed", "key", "block")

    def __init__(self):
        self.dev = None
        self.prefetched = None
        self.ev_in = None
        self.uses = 0
        self.consumed = False


class _Shape(object):
    """What offload knows about one input shape."""

    def __init__(self):
        self.prof = None
        self.base = 0
        self.modes = None
        self.pred = None
        self.calibrated = None   # (peak, base) of the all-recompute step
        self.fixes = 0
        self.needs_plan = False
        self.headroom = None
        self.grows = 0
        self.unmeasured = False
        self.calibrating = False
        self.mem_bwd = {}
        self.freed = None
        self.cal_modes = None    # the calibration step's modes (inputs offloaded or not)
        self.cal_freed = 0       # its inputs predicted off the device at the forward's end
        self.order = None        # previous iteration's use order of spill ordinals


class Offload(object):
    def __init__(self, blocks, budget, host_bytes=8 << 30, margin=0.92, window=6 << 30,
                 spill_inflight=4 << 30, min_bytes=1 << 20, modes=None, device=None,
                 verbose=None, segments=True, segment_cap=None, offload_inputs=True):
        self.blocks = list(blocks)
        if not self.blocks:
            raise ValueError("offload: no blocks")
        if modes is not None:
            modes = list(modes)
            if len(modes) != len(self.blocks) or any(m not in P.MODES for m in modes):
                raise ValueError("offload: modes must be one of %s per block" % (P.MODES,))
        self.forced = modes
        if verbose is None:
            import os
            verbose = bool(os.environ.get("MEMCAST_OFFLOAD_VERBOSE"))
        self.verbose = verbose
        self.budget = int(budget)
        self.margin = margin
        self.window = int(window)
        self.spill_inflight = int(spill_inflight)
        self.min_bytes = int(min_bytes)
        self.device = torch.cuda.current_device() if device is None else device
        self.torch_device = torch.device("cuda", self.device)
        self.pool = host_pool(self.device, int(host_bytes))
        bw = self.pool.bw or {}
        self.link = P.Link(d2h=bw.get("d2h", 50e9), h2d=bw.get("h2d", 50e9),
                           window=self.window, pool=int(host_bytes),
                           inflight=self.spill_inflight)
        self.params = set()
        for b in self.blocks:
            for p in b.parameters():
                self.params.add(p.data_ptr())
        self.segments_on = segments
        self.offload_inputs = bool(offload_inputs)
        self.segment_cap = segment_cap
        self.segs = {}
        self.shapes = {}
        self.shape = None
        self.iteration = 0
        self.modes = None
        self.started = False
        self.it_shape = None
        self._orig = []
        # (event, addr): host ranges to give back once their copies completed; kept
        # across iterations (a copy may still run when the next forward begins).
        self.to_release = []
        self._reset_iteration()
        self.history = []
        for i, b in enumerate(self.blocks):
            self._orig.append(b.forward)
            b.forward = self._wrap(i, b.forward)
        self._bwd_end = figures.watch_backward_end(self, self.blocks[0])

    # ---- the wrapper -------------------------------------------------------------

    def _wrap(self, i, fwd):
        def forward(*args, **kwargs):
            if not torch.is_grad_enabled():
                return fwd(*args, **kwargs)
            if i == 0:
                self._begin(fwd, args, kwargs)
            if self.modes is None:
                return fwd(*args, **kwargs)
            if self.inflight:
                self._poll_spills()
            mode = self.modes[i]
            if mode in P.RECOMPUTED and i not in self.segs:
                # Inside a segment recomputed as one: its first block ran it whole.
                if i == len(self.blocks) - 1:
                    self._mark("fwd_end")
                return self.seg_out
            self.seg_out = None
            last = i
            if mode in P.RECOMPUTED:
                last = self.segs[i]
                run = fwd if last == i else self._segment(i, last)
                if mode == P.OFFLOAD_INPUT and args and torch.is_tensor(args[0]):
                    # The checkpoint saves its inputs through the hooks around it (the
                    # block's own saved tensors go through the checkpoint's hooks):
                    # the first argument is spilled, the others stay.
                    self.cur_block = i
                    self.spill_only = args[0].untyped_storage().data_ptr()
                    try:
                        with torch.autograd.graph.saved_tensors_hooks(self._pack,
                                                                      self._unpack):
                            out = checkpoint(run, *args, use_reentrant=False, **kwargs)
                    finally:
                        self.spill_only = None
                else:
                    out = checkpoint(run, *args, use_reentrant=False, **kwargs)
                if last > i:
                    self.seg_out = out
            elif mode == P.OFFLOAD:
                self.cur_block = i
                with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                    out = fwd(*args, **kwargs)
            else:
                out = fwd(*args, **kwargs)
            last_block = last == len(self.blocks) - 1
            if last_block:
                self._mark("fwd_end")
            if self.spilled or self.it_shape.calibrating or last_block:
                self._on_backward(out, last)
            return out

        return forward

    def _segment(self, a, b):
        """Blocks ``a`` to ``b`` as one function (for one checkpoint)."""
        def run(x, *rest, **kwargs):
            out = None
            for m in range(a, b + 1):
                out = self._orig[m](x, *rest, **kwargs)
                x = out[0] if isinstance(out, (tuple, list)) else out
            return out

        return run

    def _on_backward(self, out, i):
        """Prefetching follows the backward from block to block: a hook on the block's
        output runs when backward reaches the block (in the calibration step it
        measures the memory allocated there)."""
        o = out
        while isinstance(o, (tuple, list)) and o:
            o = o[0]
        if torch.is_tensor(o) and o.requires_grad:
            o.register_hook(lambda grad: self._grad_hook(i))

    def _grad_hook(self, i):
        sh = self.it_shape
        if sh.calibrating:
            sh.mem_bwd[i] = torch.cuda.memory_allocated(self.device)
        self.bwd_block = i
        if i == len(self.blocks) - 1:
            self._mark("bwd_start")
        if self.spilled:
            self._poll_spills()
            self._prefetch_ahead()
            self._drain(block=False)
        return None

    def _mark(self, what):
        """A timing event on the compute stream (resolved in ``_resolve``)."""
        if what not in self.marks:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks[what] = e

    def write_trace(self, path, plan_path=None, iterations=3):
        """Writes the job the planner saw as a memcast trace document (JSON; ``memcast
        trace import PATH -o X.mctrace`` converts it) and, with ``plan_path``, the
        plan the last completed iteration ran as a ``memcast-plan`` document, for ``memcast replay
        PATH --budget B --plan PLAN_PATH --json`` (docs/oversubscription.md, "Replayed
        in the simulator"). Returns the figures it used (``simtrace.from_offload``)."""
        from . import simtrace
        return simtrace.from_offload(self, path, plan_path, iterations)

    def flush(self):
        """Ends the current iteration now (its figures go to ``history`` and
        ``stats()``); the next forward of the first block starts a new one."""
        self._end_iteration()

    def remove(self):
        """Restores the blocks' forwards and releases what is still held."""
        self._end_iteration()
        for b, f in zip(self.blocks, self._orig):
            b.forward = f
        for h in self._bwd_end:
            h.remove()
        self._bwd_end = []
        self._drain(block=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False

    # ---- iterations --------------------------------------------------------------

    def _reset_iteration(self):
        self.spilled = []        # _Spilled in pack order
        self.by_storage = {}
        self.inflight = []       # spills whose copy has not been seen complete
        self.waits = []          # (start, end) timing events around compute waits
        self.use_order = []
        self.seg_out = None
        self.spill_only = None
        self.marks = {}
        self.bwd_block = len(self.blocks)
        self.cur_block = 0
        self.next_prefetch = 0
        self.prefetched_unused = 0
        self.it = {"spilled_bytes": 0, "prefetched_bytes": 0, "demand_bytes": 0,
                   "kept_small_bytes": 0, "pool_full_bytes": 0, "host_wait_s": 0.0,
                   "spills": 0}

    def _sig(self, args, kwargs):
        sig = []
        for a in list(args) + list(kwargs.values()):
            if torch.is_tensor(a):
                sig.append((tuple(a.shape), str(a.dtype)))
        return tuple(sig)

    def _begin(self, fwd, args, kwargs):
        """Start of an iteration (the first block's forward)."""
        self._end_iteration()
        self.iteration += 1
        sig = self._sig(args, kwargs)
        self.it_sig = sig
        sh = self.shapes.get(sig)
        if sh is None:
            sh = self.shapes[sig] = _Shape()
            self._profile(sh, fwd, args, kwargs)
        self.shape = sh
        if not self.segments_on:
            self.link.segment_cap = 0
        elif self.segment_cap is not None:
            self.link.segment_cap = int(self.segment_cap)
        else:
            self.link.segment_cap = max(p.saved for p in sh.prof)
        base = torch.cuda.memory_allocated(self.device)
        if self.forced is not None:
            sh.modes = list(self.forced)
        elif sh.calibrated is None or sh.calibrating:
            sh.modes = list(sh.cal_modes)
            sh.calibrated = "pending"
            sh.calibrating = True
        elif sh.needs_plan:
            # The calibration step's peak, plus what the step left allocated beyond
            # its start (the optimizer's state, created by its first step); inputs the
            # calibration offloaded count as kept (the planner's frame: every block
            # recomputed, its input kept), as predicted off the device at the end of
            # the forward (the most the prediction has off the device at any point).
            sh.needs_plan = False
            peak, cal_base = sh.calibrated
            peak += sh.cal_freed
            full = self.margin * self.budget - peak - max(0, base - cal_base)
            # The first plan spends half of it; the next ones correct from measured peaks.
            self._plan(sh, full / 2 if full > 0 else full)
        self.modes = sh.modes
        # The calibration step recomputes block by block (its memory is measured per
        # block); planned steps merge runs of recomputed blocks into segments.
        cap = 0 if sh.calibrating else self.link.segment_cap
        self.issue = P.issue_blocks(sh.prof, self.modes, self.link, cap)
        self.segs = P.segments(sh.prof, self.modes, cap)
        self.it_base = base
        self.it_shape = sh
        torch.cuda.reset_peak_memory_stats(self.device)
        self.it_retries = torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0)
        self.started = True
        self._mark("start")

    def _end_iteration(self):
        if not self.started:
            return
        self.started = False
        sh = self.it_shape
        peak = torch.cuda.max_memory_allocated(self.device)
        retries = torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0) - self.it_retries
        rec = dict(self.it)
        self._mark("end")
        rec["_marks"] = self.marks
        rec["calibration"] = bool(sh.calibrating)
        rec["shape"] = list(self.it_sig)
        rec["base"] = self.it_base
        rec["alloc_retries"] = retries
        rec["peak_reserved"] = torch.cuda.max_memory_reserved(self.device)
        rec.update({"iteration": self.iteration, "peak_allocated": peak,
                    "modes": list(self.modes),
                    "recomputed_bytes": sum(p.saved for p, m in zip(sh.prof, self.modes)
                                            if m in P.RECOMPUTED)})
        sh.order = [s.order for s in self.use_order] or None
        # What backward did not use: drop the device copies (a copy still in flight
        # keeps its memory through record_stream), give the host ranges back once
        # their copies completed.
        for s in self.spilled:
            if s.dev is not None and not s.ev_out.query():
                s.dev.record_stream(self.pool.d2h)
            s.dev = None
            if s.prefetched is not None and not s.ev_in.query():
                s.prefetched.record_stream(self.pool.h2d)
            s.prefetched = None
            if s.addr:
                self.to_release.append((s.ev_in or s.ev_out, s.addr))
                s.addr = 0
            s.host = None
        self._drain(block=False)
        rec["_waits"] = self.waits
        self.history.append(rec)
        if self.verbose:
            import sys
            print("memcast offload: iteration %d: %s, peak allocated %.2f GB, reserved %.2f "
                  "GB, retries %d, spilled %.2f GB" % (
                      self.iteration, {m: rec["modes"].count(m) for m in P.MODES},
                      peak / 1e9, rec["peak_reserved"] / 1e9, retries,
                      rec["spilled_bytes"] / 1e9), file=sys.stderr, flush=True)
        if self.forced is None:
            self._adapt(sh, rec, peak, retries)
        self._reset_iteration()

    def _adapt(self, sh, rec, peak, retries):
        """Planning from the iteration's measurements: the calibration step's peak and
        memory at each block's backward; a plan's first measured peak (grow into the
        room left, at most twice); overshoots, cap hits and a full pool (plan with
        less, at most three times)."""
        target = self.margin * self.budget
        fresh = sh.unmeasured
        sh.unmeasured = False
        if peak < self.it_base:
            # The peak statistics were reset during the iteration (by the caller): this
            # measurement says nothing; a calibration is done again.
            if sh.calibrating:
                sh.mem_bwd = {}
            return
        if sh.calibrating:
            sh.calibrated = (peak, self.it_base)
            sh.calibrating = False
            if sh.cal_freed:
                # Offloaded inputs came back at times the measurement does not say: the
                # planner's estimate (the inputs of the blocks after each) is used.
                sh.freed = None
            else:
                sh.freed = [peak - sh.mem_bwd[b] if b in sh.mem_bwd else None
                            for b in range(len(self.blocks))]
            sh.needs_plan = True
        elif rec["pool_full_bytes"] and sh.fixes < 3:
            # Spills that found the pool full stayed on the device, beyond the plan.
            sh.fixes += 1
            self.link.pool = max(0, self.link.pool - 2 * rec["pool_full_bytes"])
            self._plan(sh, sh.headroom)
        elif (peak > target or retries) and sh.fixes < 3:
            # Over the target, or the caching allocator hit the device cap (it then
            # frees its cache and retries, synchronizing): plan with less.
            sh.fixes += 1
            self._plan(sh, sh.pred["extra"] - max(0, peak - target) - 0.04 * self.budget)
        elif (fresh and sh.grows < 2 and sh.fixes == 0
              and target - peak > 0.03 * self.budget):
            # Below the target: 90% of the measured room goes to the next plan.
            sh.grows += 1
            self._plan(sh, sh.pred["extra"] + 0.9 * (target - peak))

    def _plan(self, sh, headroom):
        sh.headroom = headroom
        sh.unmeasured = True
        try:
            sh.modes, sh.pred = P.make_plan(sh.prof, headroom, self.link,
                                            min_offload_bytes=self.min_bytes, freed=sh.freed,
                                            inputs=self.offload_inputs)
        except P.PlanError:
            # Even recomputing everything (inputs offloaded) is predicted above the
            # target: the calibration step's modes, and let the next measured step say.
            sh.modes = list(sh.cal_modes)
            sh.pred = P.simulate(sh.prof, sh.modes, self.link, sh.freed)
        if self.verbose:
            import sys
            print("memcast offload: plan for headroom %.2f GB: %s, predicted blocks %.4f s, "
                  "stall %.4f s, extra %.2f GB" % (
                      headroom / 1e9, {m: sh.modes.count(m) for m in P.MODES},
                      sh.pred["step_s"], sh.pred["stall_s"], sh.pred["extra"] / 1e9),
                  file=sys.stderr, flush=True)

    # ---- profile -----------------------------------------------------------------

    def _profile(self, sh, fwd0, args, kwargs):
        dev = self.device
        cpu_rng = torch.get_rng_state()
        gpu_rng = torch.cuda.get_rng_state(dev)
        bufs = [(b, n, t.detach().clone()) for blk in self.blocks
                for n, t in blk.named_buffers(recurse=True) for b in [blk]]
        base = torch.cuda.memory_allocated(dev)
        prof = []
        x = args[0]
        rest = args[1:]
        for i, blk in enumerate(self.blocks):
            fwd = self._orig[i]
            seen = {}

            def pack(t, seen=seen):
                if t.data_ptr() not in self.params:
                    st = t.untyped_storage()
                    seen[st.data_ptr()] = st.nbytes()
                return t

            times = []
            for rep in range(2):
                leaf = x.detach().requires_grad_(x.is_floating_point())
                # Not a leaf itself, and fresh each time: a block may begin in place
                # (ReLU(inplace=True)).
                xi = leaf.clone() if leaf.requires_grad else leaf
                seen.clear()
                e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                e[0].record()
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    out = fwd(xi, *rest, **kwargs)
                e[1].record()
                o = out[0] if isinstance(out, (tuple, list)) else out
                ins = [leaf] if leaf.requires_grad else []
                ins += [p for p in blk.parameters() if p.requires_grad]
                if o.requires_grad and ins:
                    torch.autograd.grad(o, ins, torch.ones_like(o), allow_unused=True)
                e[2].record()
                e[2].synchronize()
                times.append((e[0].elapsed_time(e[1]) / 1e3, e[1].elapsed_time(e[2]) / 1e3))
                nxt = o.detach()
                del out, o, xi, leaf
            saved = sum(seen.values())
            inp = x.untyped_storage().nbytes() if torch.is_tensor(x) else 0
            prof.append(P.BlockProfile(times[-1][0], times[-1][1], saved, inp))
            x = nxt
        del x, nxt
        # The profile's blocks stay in PyTorch's cache; give them back so that the
        # training steps do not find the cache fragmented by them.
        torch.cuda.empty_cache()
        for blk, n, t in bufs:
            mod, _, leaf = n.rpartition(".")
            owner = blk.get_submodule(mod) if mod else blk
            getattr(owner, leaf).copy_(t)
        torch.set_rng_state(cpu_rng)
        torch.cuda.set_rng_state(gpu_rng, dev)
        sh.prof = prof
        sh.base = base
        link = self.link
        need = P.min_peak(base, prof, link if self.offload_inputs else None)
        if need > self.budget:
            inputs = sum(p.inp for p in prof)
            raise P.PlanError(
                "offload: the budget of %.2f GB is too small for any plan: the blocks "
                "alone need at least %.2f GB (%.2f GB allocated before them, %.2f GB of "
                "block inputs kept for recomputation, of %.2f GB, the rest offloaded "
                "before the forward ends, %.2f GB for the largest block recomputed in "
                "backward)" % (
                    self.budget / 1e9, need / 1e9, base / 1e9,
                    (need - base - max(p.saved for p in prof)) / 1e9, inputs / 1e9,
                    max(p.saved for p in prof) / 1e9))
        # The calibration step recomputes every block; when keeping their inputs would
        # not fit the budget, inputs are offloaded (in forward order) until they are
        # predicted under the target, with a tenth of the budget to spare for what lies
        # outside the blocks.
        kept = P.min_peak(base, prof)
        excess = kept - (self.margin - 0.1) * self.budget
        sh.cal_modes = [P.RECOMPUTE] * len(prof)
        sh.cal_freed = 0
        if kept > self.budget and self.offload_inputs:
            sh.cal_modes = P.calibration_modes(prof, link, excess, self.min_bytes)
            sh.cal_freed = P.simulate(prof, sh.cal_modes, link, None, cap=0)["inputs_freed"]

    # ---- spill and prefetch ----------------------------------------------------------

    def _pack(self, t):
        if t.device != self.torch_device or t.data_ptr() in self.params:
            return t
        if self.spill_only is not None and t.untyped_storage().data_ptr() != self.spill_only:
            return t
        if t.untyped_storage().nbytes() < self.min_bytes:
            self.it["kept_small_bytes"] += t.untyped_storage().nbytes()
            return t
        st = t.untyped_storage()
        key = st.data_ptr()
        s = self.by_storage.get(key)
        if s is None:
            s = self._spill(t, st)
            if s is None:
                return t
            self.by_storage[key] = s
        s.uses += 1
        return (s, t.dtype, t.storage_offset(), tuple(t.shape), tuple(t.stride()))

    def _spill(self, t, st):
        n = st.nbytes()
        self._poll_spills()
        while self.inflight and sum(s.nbytes for s in self.inflight) + n > self.spill_inflight:
            w = time.perf_counter()
            self.inflight[0].ev_out.synchronize()
            self.it["host_wait_s"] += time.perf_counter() - w
            self._poll_spills()
        host, addr = self.pool.alloc(n)
        if host is None:
            self.it["pool_full_bytes"] += n
            return None
        s = _Spilled()
        s.nbytes, s.host, s.addr = n, host, addr
        s.order = len(self.spilled)
        s.key = st.data_ptr()
        s.block = self.cur_block
        src = torch.empty(0, dtype=torch.uint8, device=t.device).set_(st)
        ready = torch.cuda.Event()
        ready.record()
        with torch.cuda.stream(self.pool.d2h):
            self.pool.d2h.wait_event(ready)
            host.copy_(src, non_blocking=True)
            s.ev_out = torch.cuda.Event()
            s.ev_out.record()
        s.dev = src   # held until the copy completed, then released
        self.spilled.append(s)
        self.inflight.append(s)
        self.it["spilled_bytes"] += n
        self.it["spills"] += 1
        return s

    def _poll_spills(self):
        while self.inflight and self.inflight[0].ev_out.query():
            self._released(self.inflight.pop(0))

    def _released(self, s):
        """The spill's copy completed: its device copy is let go. Its storage may die
        now and its address be reused, so later saves of that address are new spills
        (a tensor is matched to a spill only while the spill holds it)."""
        s.dev = None
        if self.by_storage.get(s.key) is s:
            del self.by_storage[s.key]

    def _forecast(self):
        sh = self.it_shape
        if sh.order and len(sh.order) == len(self.spilled):
            return sh.order
        return list(range(len(self.spilled) - 1, -1, -1))

    def _fetch(self, s):
        """Issues the host-to-device copy of ``s`` on the transfer stream."""
        cur = torch.cuda.current_stream()
        dst = torch.empty(s.nbytes, dtype=torch.uint8, device=self.torch_device)
        ready = torch.cuda.Event()
        ready.record(cur)
        with torch.cuda.stream(self.pool.h2d):
            self.pool.h2d.wait_event(s.ev_out)
            self.pool.h2d.wait_event(ready)
            dst.copy_(s.host, non_blocking=True)
            s.ev_in = torch.cuda.Event()
            s.ev_in.record()
        s.prefetched = dst
        return dst

    def _prefetch_ahead(self):
        """Prefetches, in the forecast order, the spills whose block's issue point
        (``plan.issue_blocks``) backward has reached, while the prefetched-and-unused
        bytes stay under the window."""
        order = self._forecast()
        while self.next_prefetch < len(order):
            s = self.spilled[order[self.next_prefetch]]
            if s.consumed or s.prefetched is not None:
                self.next_prefetch += 1
                continue
            if self.issue.get(s.block, s.block) < self.bwd_block:
                break
            if self.prefetched_unused and self.prefetched_unused + s.nbytes > self.window:
                break
            self._fetch(s)
            self.prefetched_unused += s.nbytes
            self.it["prefetched_bytes"] += s.nbytes
            self.next_prefetch += 1

    def _unpack(self, packed):
        if torch.is_tensor(packed):
            return packed
        s, dtype, off, shape, stride = packed
        if s.host is None:
            raise RuntimeError(
                "memcast offload: a spilled tensor was unpacked after its last use "
                "(retain_graph / double backward is not supported in offloaded blocks)")
        if s.prefetched is None:
            self._fetch(s)
            self.it["demand_bytes"] += s.nbytes
        elif not s.consumed:
            self.prefetched_unused -= s.nbytes
        if not s.consumed:
            s.consumed = True
            self.use_order.append(s)
        self._prefetch_ahead()
        cur = torch.cuda.current_stream()
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record(cur)
        cur.wait_event(s.ev_in)
        b.record(cur)
        self.waits.append((a, b))
        dst = s.prefetched
        s.uses -= 1
        if s.uses == 0:
            self.to_release.append((s.ev_in, s.addr))
            s.addr = 0
            s.prefetched = None
            s.host = None
        self._poll_spills()
        self._drain(block=False)
        return torch.empty(0, dtype=dtype, device=dst.device).set_(
            dst.untyped_storage(), off, shape, stride)

    def _drain(self, block):
        keep = []
        for ev, addr in self.to_release:
            if not addr:
                continue
            if ev is None or block or ev.query():
                if ev is not None and block:
                    ev.synchronize()
                self.pool.release(addr)
            else:
                keep.append((ev, addr))
        self.to_release = keep

    _resolve = staticmethod(figures.resolve)

    def iterations(self):
        """The figures of every completed iteration (a list of dicts)."""
        return [self._resolve(r) for r in self.history]

    # ---- reporting -----------------------------------------------------------------

    def stats(self):
        """The last completed iteration's figures (bytes spilled, prefetched ahead,
        fetched on demand, saved bytes of recomputed blocks, compute-stream wait, peak
        allocated), the plan and its prediction, and the host pool's figures."""
        last = self._resolve(self.history[-1]) if self.history else {}
        sh = self.shape
        return {
            "last": last,
            "modes": list(self.modes) if getattr(self, "modes", None) else None,
            "predicted": sh.pred if sh else None,
            "headroom": getattr(sh, "headroom", None) if sh else None,
            "profile": [p.as_dict() for p in sh.prof] if sh and sh.prof else None,
            "link": {"d2h": self.link.d2h, "h2d": self.link.h2d},
            "pool": self.pool.stats(),
            "pool_create_s": self.pool.create_s,
        }


def offload(blocks, budget, **kw):
    """Keeps, offloads or recomputes what ``blocks`` save for backward so that a step
    fits ``budget`` device bytes; see the module docs. Returns an ``Offload`` (also a
    context manager: leaving it restores the blocks)."""
    return Offload(blocks, budget, **kw)
