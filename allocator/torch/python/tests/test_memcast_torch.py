"""GPU tests of memcast_torch. Each test runs in its own Python process: install()
must come before CUDA is initialized, which can happen only once per process.

Run: ``python -m pytest -q allocator/torch/python/tests`` with ``MEMCAST_TORCH_LIB``
pointing at ``libmemcast_torch.so`` (scripts/gpu-tests.sh does). Skipped without a GPU.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)


def run(code, timeout=300, env=None, args=()):
    """Runs `code` in a fresh interpreter (`args` its sys.argv[1:]); returns the JSON it
    prints last."""
    e = dict(os.environ)
    e["PYTHONPATH"] = PKG + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=e,
    )
    if p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_install_routes_every_allocation_to_memcast():
    r = run(
        """
        import json, torch, memcast_torch as mt
        mt.install()
        x = torch.randn(1 << 20, device="cuda")
        y = (x * 2).sum().item()
        big = torch.ones(64 << 20, dtype=torch.uint8, device="cuda")
        ok = abs(y - 2 * x.sum().item()) < 1e-2 * abs(y) + 1e-3 and int(big.sum().item()) == (64 << 20)
        s1 = mt.stats()
        del x, big
        mt.step()
        torch.cuda.empty_cache()
        s2 = mt.stats()
        print(json.dumps({"ok": ok, "allocs": s1["allocs"], "reserved": s1["reserved"]["current"],
                          "live_after": s2["requested"]["current"], "steps": s2["steps"],
                          "reserved_after": s2["reserved"]["current"],
                          "installed": mt.installed()}))
        """
    )
    assert r["ok"] and r["installed"]
    assert r["allocs"] >= 3
    assert r["reserved"] >= 64 << 20
    assert r["steps"] == 1
    # torch.cuda.empty_cache() reaches memcast's cache after install().
    assert r["reserved_after"] < r["reserved"], r


def test_install_after_the_first_cuda_allocation_says_it_is_too_late():
    r = run(
        """
        import json, torch, memcast_torch as mt
        torch.zeros(1, device="cuda")
        try:
            mt.install()
            msg = None
        except mt.MemcastError as e:
            msg = str(e)
        print(json.dumps({"msg": msg}))
        """
    )
    assert r["msg"] and "too late" in r["msg"] and "before the first CUDA allocation" in r["msg"]


def test_pool_gives_pytorch_segments_from_memcast():
    r = run(
        """
        import json, torch, memcast_torch as mt
        a = torch.ones(1024, device="cuda")   # native allocator first: pool() works any time
        p = mt.pool()
        with torch.cuda.use_mem_pool(p):
            x = torch.arange(8 << 20, device="cuda", dtype=torch.int64)
            y = x + 1
        ok = bool(torch.equal(y - 1, x)) and int(y[-1].item()) == (8 << 20)
        s = mt.stats()
        print(json.dumps({"ok": ok, "allocs": s.get("allocs", 0),
                          "reserved": s.get("reserved", {}).get("current", 0),
                          "torch_reserved": torch.cuda.memory_reserved()}))
        """
    )
    assert r["ok"]
    assert r["allocs"] >= 1 and r["reserved"] >= 32 << 20
    assert r["torch_reserved"] >= r["reserved"]


POOL_TRAINING = """
    import json, sys, torch, memcast_torch as mt
    all_threads = sys.argv[1] == "all"
    torch.manual_seed(0)
    p = mt.pool()
    ctx = mt.use_pool(p) if all_threads else torch.cuda.use_mem_pool(p)
    with ctx:
        m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).cuda()
        x = torch.randn(512, 1024, device="cuda")
        for _ in range(3):
            m(x).square().mean().backward()   # backward allocates on autograd's thread
        torch.cuda.synchronize()
        loss = float(m(x).square().mean().item())
    segs = torch.cuda.memory._snapshot()["segments"]
    outside = sum(s["total_size"] for s in segs if tuple(s["segment_pool_id"]) != tuple(p.id))
    print(json.dumps({"outside": outside, "loss": loss,
                      "memcast_reserved": mt.stats()["reserved"]["current"]}))
"""


def test_use_pool_routes_autograds_backward_thread_to_memcast_too():
    every = run(POOL_TRAINING, args=["all"])
    thread = run(POOL_TRAINING, args=["thread"])
    # use_pool(): every segment of the process is memcast's, backward's included.
    assert every["outside"] == 0, every
    assert every["memcast_reserved"] > 0
    # torch.cuda.use_mem_pool(): backward's allocations took native segments.
    assert thread["outside"] > 0, thread
    assert every["loss"] == thread["loss"]


def test_out_of_memory_in_a_pool_raises_pytorchs_error_and_the_process_goes_on():
    r = run(
        """
        import json, torch, memcast_torch as mt
        mt.configure("max_request:1G")
        p = mt.pool()
        with torch.cuda.use_mem_pool(p):
            try:
                torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
                raised = None
            except torch.OutOfMemoryError as e:
                raised = str(e)[:200]
            x = torch.ones(1 << 20, device="cuda")
            after = float(x.sum().item())
        s = mt.stats()
        print(json.dumps({"raised": raised, "after": after, "failed": s["failed_allocs"],
                          "err": mt.last_error()}))
        """,
        env={"MEMCAST_QUIET": "1"},
    )
    assert r["raised"], r
    assert r["after"] == float(1 << 20)
    assert r["failed"] >= 1 and "exceeds" in r["err"], r


def test_out_of_memory_after_install_is_reported_by_check():
    # PyTorch 2.11's CUDAPluggableAllocator does not check the pointer it gets: a null
    # return gives a tensor with a null data pointer and no error. memcast counts the
    # failure, and check() raises it.
    r = run(
        """
        import json, torch, memcast_torch as mt
        mt.install(conf="max_request:1G")
        mt.check()
        t = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        null = t.data_ptr() == 0
        try:
            mt.check()
            msg = None
        except mt.MemcastError as e:
            msg = str(e)
        mt.check()  # the failure was reported once
        del t
        x = torch.ones(1 << 20, device="cuda")
        print(json.dumps({"null": null, "msg": msg, "after": float(x.sum().item())}))
        """,
        env={"MEMCAST_QUIET": "1"},
    )
    assert r["null"], r
    assert r["msg"] and "exceeds" in r["msg"], r
    assert r["after"] == float(1 << 20)


def test_configure_after_the_first_allocation_is_refused():
    r = run(
        """
        import json, torch, memcast_torch as mt
        mt.install()
        torch.zeros(1, device="cuda")
        try:
            mt.configure("growth_factor:2")
            msg = None
        except mt.MemcastError as e:
            msg = str(e)
        print(json.dumps({"msg": msg}))
        """
    )
    assert r["msg"] and "too late" in r["msg"]


def test_training_steps_and_a_recorded_trace(tmp_path):
    path = str(tmp_path / "mlp.mctrace")
    r = run(
        f"""
        import json, os, torch, memcast_torch as mt
        mt.install()
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10)).cuda()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        x = torch.randn(256, 512, device="cuda"); t = torch.randint(0, 10, (256,), device="cuda")
        losses = []
        rec = mt.record({path!r})
        for i in range(20):
            loss = torch.nn.functional.cross_entropy(m(x), t)
            opt.zero_grad(); loss.backward(); opt.step()
            losses.append(loss.item()); mt.step()
        rec.stop()
        s = mt.stats()
        print(json.dumps({{"first": losses[0], "last": losses[-1], "steps": s["steps"],
                          "size": os.path.getsize({path!r})}}))
        """
    )
    assert r["last"] < r["first"]
    assert r["steps"] == 20
    assert r["size"] > 0
    memcast = os.environ.get("MEMCAST_BIN")
    if memcast:
        p = subprocess.run([memcast, "trace", "stats", path, "--json"], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        st = json.loads(p.stdout)
        assert st["iterations"] >= 19 and st["allocs"] > 0, st
        # The recording replays (memcast's allocator on the simulated device).
        p = subprocess.run([memcast, "replay", path, "--json"], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["allocs"] == st["allocs"] + st["static_blocks"]


def test_predictive_goes_through_the_config_string():
    r = run(
        """
        import json, torch, memcast_torch as mt
        mt.predictive(True)
        mt.install()
        m = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 10)).cuda()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        x = torch.randn(512, 512, device="cuda"); t = torch.randint(0, 10, (512,), device="cuda")
        losses = []
        for i in range(30):
            loss = torch.nn.functional.cross_entropy(m(x), t)
            opt.zero_grad(); loss.backward(); opt.step()
            losses.append(loss.item()); mt.step()
        s = mt.stats()
        try:
            mt.predictive(False)
            late = None
        except mt.MemcastError as e:
            late = str(e)
        print(json.dumps({"predictive": s["predictive"], "steps": s["steps"],
                          "forecasts_used": s["forecasts_used"], "first": losses[0],
                          "last": losses[-1], "late": late}))
        """
    )
    assert r["predictive"] is True and r["steps"] == 30, r
    assert r["last"] < r["first"]
    assert r["late"] and "too late" in r["late"]


TRAIN_MLP = """
import json, torch, memcast_torch as mt
{setup}
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.ReLU(),
                        torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                        torch.nn.Linear(4096, 10)).cuda()
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
x = torch.randn(1024, 2048, device="cuda"); t = torch.randint(0, 10, (1024,), device="cuda")
losses = []
for i in range({steps}):
    loss = torch.nn.functional.cross_entropy(m(x), t)
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    losses.append(loss.item()); mt.step()
{teardown}
s = mt.stats()
print(json.dumps({{"losses": losses, "reserved": s["reserved"]["peak"],
                  "requested": s["requested"]["peak"], "placement": s["placement"]}}))
"""


def test_a_recording_from_the_start_is_a_placement_profile_for_the_next_run(tmp_path):
    path = str(tmp_path / "mlp.mctrace")
    # A run recorded from before its first CUDA allocation: a warm-up step and 3 more.
    first = run(TRAIN_MLP.format(
        setup=f"mt.install()\nrec = mt.record({path!r})", steps=4, teardown="rec.stop()"))
    # The next run of the same job, longer than the recording, with it as its profile.
    second = run(TRAIN_MLP.format(
        setup=f"mt.install(conf='placement_profile:{path}')", steps=10, teardown=""))
    p = second["placement"]
    # Every large allocation of the recorded steps went where the plan put it, and so
    # did those of the steps after them (the recording's last step repeated).
    assert p["profile_hits"] > 0 and p["profile_misses"] == 0, p
    assert p["planned_hits"] > 0 and p["planned_misses"] == 0, p
    # Placement changes addresses, not results.
    for a, b in zip(first["losses"], second["losses"]):
        assert abs(a - b) <= 1e-6 * abs(a), (first["losses"], second["losses"])
    assert second["reserved"] <= first["reserved"], (first, second)
