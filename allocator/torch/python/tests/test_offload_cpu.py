"""The offload engine's Python paths on the CPU, with CUDA faked (events complete at
once, streams do nothing, a pool of plain CPU tensors): forced and planned modes give
the losses of a run without offload, every spill comes back. Not a test of CUDA
behaviour (test_offload.py is, on a GPU); it runs without one, in its own interpreter
(it replaces parts of torch.cuda)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))

CODE = r'''
# CPU smoke test of the offload engine's Python paths with CUDA faked (not a test of
# CUDA behaviour: events complete at once, streams are no-ops).
import contextlib, sys, torch
class Ev:
    # A copy "runs" until its event was queried twice (or waited for): the engine must
    # cope with copies still in flight, across iterations too.
    def __init__(self, enable_timing=False): self.q = 0
    def record(self, stream=None): self.q = 0
    def query(self):
        self.q += 1
        return self.q > 2
    def synchronize(self): self.q = 3
    def elapsed_time(self, o): return 0.01
class St:
    def wait_event(self, e): pass
torch.cuda.Event = Ev
torch.cuda.current_stream = lambda *a: St()
torch.cuda.stream = lambda s: contextlib.nullcontext()
torch.cuda.current_device = lambda: 0
torch.cuda.memory_allocated = lambda *a: 10 << 20
torch.cuda.max_memory_allocated = lambda *a: 100 << 20
torch.cuda.max_memory_reserved = lambda *a: 120 << 20
torch.cuda.reset_peak_memory_stats = lambda *a: None
torch.cuda.memory_stats = lambda *a: {}
torch.cuda.empty_cache = lambda: None
torch.cuda.get_rng_state = lambda *a: torch.get_rng_state()
torch.cuda.set_rng_state = lambda s, *a: None
from memcast_torch import offloading as O
class Pool:
    create_s = 0.0; size = 1 << 30; bw = {"d2h": 50e9, "h2d": 50e9}
    d2h = St(); h2d = St(); n = 0; live = set()
    def alloc(self, n):
        Pool.n += 1; Pool.live.add(Pool.n); return torch.empty(n, dtype=torch.uint8), Pool.n
    def release(self, a):
        Pool.live.remove(a)
    def stats(self): return {"ranges": len(Pool.live)}
O.host_pool = lambda d, n: Pool()
torch.Tensor.record_stream = lambda self, s: None
def run(wrap, modes=None, budget=1 << 30, steps=4, sizes=(16, 16, 16, 24, 24, 24), cap=None):
    torch.manual_seed(0)
    seq = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh()) for _ in range(6)])
    opt = torch.optim.SGD(seq.parameters(), lr=0.1)
    off = O.Offload(list(seq), budget, min_bytes=1 << 10, modes=modes, verbose=True,
                    segment_cap=cap) if wrap else None
    if off: off.torch_device = torch.device("cpu")
    out = []
    for b in sizes:
        x = torch.randn(b, 256)
        loss = seq(x).pow(2).mean(); loss.backward(); out.append(loss.item()); opt.step(); opt.zero_grad()
    if off:
        off.flush(); its = off.iterations(); st = off.stats(); off.remove()
        return out, its, st
    return out, None, None
ref = run(False)[0]
for modes, cap in ((["offload"] * 6, None), (["keep", "offload", "recompute"] * 2, None),
                   (None, None), (["recompute"] * 3 + ["offload"] + ["recompute"] * 2, 1 << 40),
                   (["recompute", "offload_input"] * 3, None),
                   (["recompute", "offload_input", "recompute", "keep", "offload_input", "recompute"], 1 << 40)):
    got, its, st = run(True, modes, cap=cap)
    assert not Pool.live, "host ranges not given back: %s" % Pool.live
    print(modes, got == ref, [(i["spilled_bytes"], i["prefetched_bytes"], i["demand_bytes"]) for i in its][-2:], st["modes"])
    assert got == ref
    if modes and "offload_input" in modes:
        assert its[-1]["spilled_bytes"] > 0, its[-1]
print("ok")
'''


def test_offload_engine_with_cuda_faked():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.dirname(HERE) + os.pathsep + e.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                       timeout=300, env=e)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().endswith("ok")
