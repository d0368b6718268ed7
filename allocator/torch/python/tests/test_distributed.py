"""memcast in torch.distributed jobs: one allocator per rank, DDP over a real process
group, and `memcast_torch.distributed.exchange`.

The CPU test (gloo, two processes) checks the exchange itself. The GPU tests need one
GPU: two DDP ranks share it over gloo (NCCL refuses two ranks on one device), each with
its own memcast allocator, against the same two ranks without memcast; and one rank over
NCCL (its communication streams and the allocator's cross-stream frees). The FSDP tests
do the same with a model sharded by FSDP2 (``fully_shard``): one rank over
NCCL, and two ranks sharing the GPU over gloo (all_gather_into_tensor and
reduce_scatter_tensor on CUDA tensors, which gloo stages through the host).
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks(code, world, timeout=300, env=None):
    """Runs `code` in `world` fresh interpreters as ranks 0..world-1 of one job; returns
    the JSON each prints last."""
    port = free_port()
    procs = []
    for r in range(world):
        e = dict(os.environ)
        e["PYTHONPATH"] = PKG + os.pathsep + e.get("PYTHONPATH", "")
        e.update({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        e.update(env or {})
        procs.append(subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=e))
    out = []
    for p in procs:
        so, se = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise AssertionError(f"exit {p.returncode}\nstdout:\n{so}\nstderr:\n{se}")
        out.append(json.loads(so.strip().splitlines()[-1]))
    return out


def test_exchange_gathers_every_ranks_figures_over_gloo():
    rows = ranks(
        """
        import json, torch.distributed as dist
        from memcast_torch import distributed as mtd
        dist.init_process_group("gloo")
        r = dist.get_rank()
        mine = {"forecast_peak": 1000 * (r + 1), "reserved": 5000 + r, "allocated": 800,
                "device_free": 10 ** 12 + r}
        rows = mtd.exchange(figures=mine)
        print(json.dumps({"rows": rows, "seconds": mtd.exchange.last_seconds}))
        dist.destroy_process_group()
        """,
        world=2,
    )
    for got in rows:
        assert got["seconds"] > 0
        assert [x["rank"] for x in got["rows"]] == [0, 1]
        r1 = got["rows"][1]
        assert r1["forecast_peak"] == 2000 and r1["reserved"] == 5001
        assert r1["free_reserve"] == 5001 - 800
        assert r1["headroom"] == 10 ** 12 + 1 + (5001 - 800) - (2000 - 800)
    assert rows[0]["rows"] == rows[1]["rows"]


DDP = """
import json, os, torch, torch.distributed as dist
{install}
dist.init_process_group("{backend}")
r = dist.get_rank()
torch.cuda.set_device(0)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                        torch.nn.Linear(4096, 10)).cuda()
ddp = torch.nn.parallel.DistributedDataParallel(m)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
g = torch.Generator(device="cuda").manual_seed(100 + r)
x = torch.randn(512, 1024, device="cuda", generator=g)
t = torch.randint(0, 10, (512,), device="cuda", generator=g)
losses, rows, secs = [], None, []
for i in range(12):
    loss = torch.nn.functional.cross_entropy(ddp(x), t)
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    losses.append(loss.item())
    {after_step}
w = [p.detach().double().sum().item() for p in m.parameters()]
out = {{"rank": r, "losses": losses, "weights": w, "rows": rows}}
{stats}
print(json.dumps(out))
dist.destroy_process_group()
"""

MEMCAST = dict(
    install="import memcast_torch as mt\nfrom memcast_torch import distributed as mtd\nmt.install()",
    after_step="mt.step(); rows = mtd.exchange(); secs.append(mtd.exchange.last_seconds)",
    stats='out["stats"] = {k: mt.stats()[k] for k in ("reserved", "requested", "steps", "failed_allocs", "failed_frees")}\nout["seconds"] = secs',
)
NATIVE = dict(install="", after_step="pass", stats="")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_ddp_with_memcast_per_rank_equals_ddp_without_it():
    native = ranks(DDP.format(backend="gloo", **NATIVE), world=2)
    ours = ranks(DDP.format(backend="gloo", **MEMCAST), world=2)
    for a, b in zip(native, ours):
        assert a["rank"] == b["rank"]
        # The same computation, other addresses: losses and weights as without memcast.
        for x, y in zip(a["losses"], b["losses"]):
            assert abs(x - y) <= 1e-6 * abs(x), (a["losses"], b["losses"])
        for x, y in zip(a["weights"], b["weights"]):
            assert abs(x - y) <= 1e-6 * max(1.0, abs(x)), (a["weights"], b["weights"])
        s = b["stats"]
        assert s["steps"] == 12 and s["failed_allocs"] == 0 and s["failed_frees"] == 0, s
        assert s["reserved"]["peak"] > 0
        # Each rank saw both ranks' figures from their own allocators.
        assert [r["rank"] for r in b["rows"]] == [0, 1]
        assert all(r["forecast_peak"] > 0 and r["reserved"] > 0 for r in b["rows"]), b["rows"]
    # DDP keeps the ranks' weights equal.
    assert ours[0]["weights"] == ours[1]["weights"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_ddp_over_nccl_with_memcast():
    (one,) = ranks(DDP.format(backend="nccl", **MEMCAST), world=1)
    assert one["stats"]["failed_allocs"] == 0 and one["stats"]["failed_frees"] == 0, one
    assert one["losses"][-1] < one["losses"][0]
    assert one["rows"][0]["forecast_peak"] > 0 and min(one["seconds"]) > 0


FSDP = """
import json, os, torch, torch.distributed as dist
{install}
dist.init_process_group("{backend}")
r = dist.get_rank()
torch.cuda.set_device(0)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                        torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                        torch.nn.Linear(4096, 10)).cuda()
from torch.distributed.fsdp import fully_shard
from torch.distributed.device_mesh import init_device_mesh
mesh = init_device_mesh("cuda", (dist.get_world_size(),))
for layer in m:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer, mesh=mesh)
fsdp = fully_shard(m, mesh=mesh)
opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-4)
g = torch.Generator(device="cuda").manual_seed(100 + r)
x = torch.randn(512, 1024, device="cuda", generator=g)
t = torch.randint(0, 10, (512,), device="cuda", generator=g)
losses, rows, secs = [], None, []
for i in range(8):
    loss = torch.nn.functional.cross_entropy(fsdp(x), t)
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    losses.append(loss.item())
    {after_step}
# This rank's shards (each parameter is a DTensor; its local part).
w = [p.to_local().detach().double().sum().item() for p in fsdp.parameters()]
out = {{"rank": r, "losses": losses, "weights": w, "rows": rows}}
{stats}
print(json.dumps(out))
dist.destroy_process_group()
"""


def same_training(native, ours, world, steps):
    """FSDP with memcast trained as FSDP without it, rank by rank, and memcast counted
    every step with no failed allocation or free."""
    assert len(native) == len(ours) == world
    for a, b in zip(native, ours):
        assert a["rank"] == b["rank"]
        assert len(a["losses"]) == len(b["losses"]) == steps
        assert len(a["weights"]) == len(b["weights"]) > 0
        for x, y in zip(a["losses"], b["losses"]):
            assert abs(x - y) <= 1e-6 * abs(x), (a["losses"], b["losses"])
        for x, y in zip(a["weights"], b["weights"]):
            assert abs(x - y) <= 1e-6 * max(1.0, abs(x)), (a["weights"], b["weights"])
        assert b["losses"][-1] < b["losses"][0], b["losses"]
        s = b["stats"]
        assert s["steps"] == steps and s["failed_allocs"] == 0 and s["failed_frees"] == 0, s
        assert s["reserved"]["peak"] > 0 and s["requested"]["peak"] > 0, s
        assert [r["rank"] for r in b["rows"]] == list(range(world)), b["rows"]
        assert all(r["forecast_peak"] > 0 for r in b["rows"]), b["rows"]
        assert min(b["seconds"]) > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_fsdp_over_nccl_with_memcast_equals_fsdp_without_it():
    native = ranks(FSDP.format(backend="nccl", **NATIVE), world=1)
    ours = ranks(FSDP.format(backend="nccl", **MEMCAST), world=1)
    same_training(native, ours, world=1, steps=8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_fsdp_two_ranks_on_one_gpu_over_gloo_with_memcast_equals_without_it():
    native = ranks(FSDP.format(backend="gloo", **NATIVE), world=2)
    ours = ranks(FSDP.format(backend="gloo", **MEMCAST), world=2)
    same_training(native, ours, world=2, steps=8)
    # Each rank holds its own shards: the two ranks' shards differ.
    assert ours[0]["weights"] != ours[1]["weights"]
