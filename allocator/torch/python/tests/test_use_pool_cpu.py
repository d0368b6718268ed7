"""use_pool() and the device argument on the CPU, with PyTorch's pool entry points
faked (records of the calls): which entry point it calls for which device, and that the
routing ends on every way out of the block. Not a test of CUDA behaviour
(test_memcast_torch.py is, on a GPU)."""

import os
import sys

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import memcast_torch as mt  # noqa: E402


class Pool:
    id = (7, 0)


@pytest.fixture
def calls(monkeypatch):
    log = []
    for name in ("_cuda_beginAllocateToPool", "_cuda_beginAllocateCurrentThreadToPool",
                 "_cuda_endAllocateToPool", "_cuda_releasePool"):
        monkeypatch.setattr(torch._C, name,
                            lambda d, pid, _n=name: log.append((_n, d, pid)),
                            raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return log


def test_device_takes_what_torch_takes():
    assert mt._device(3) == 3
    assert mt._device(torch.device("cuda", 2)) == 2
    assert mt._device("cuda:1") == 1
    with pytest.raises(ValueError):
        mt._device("cpu")
    with pytest.raises(ValueError):
        mt._device(torch.device("cpu"))


def test_current_device_by_default(calls):
    assert mt._device(None) == 0
    assert mt._device("cuda") == 0


def test_use_pool_routes_every_thread_and_ends_on_an_exception(calls):
    p = Pool()
    with pytest.raises(RuntimeError):
        with mt.use_pool(p, device="cuda:1") as got:
            assert got is p
            assert calls == [("_cuda_beginAllocateToPool", 1, p.id)]
            raise RuntimeError("in the block")
    assert calls[1:] == [("_cuda_endAllocateToPool", 1, p.id),
                         ("_cuda_releasePool", 1, p.id)]


def test_use_pool_for_the_calling_thread_only(calls):
    p = Pool()
    with mt.use_pool(p, all_threads=False):
        pass
    assert [c[0] for c in calls] == ["_cuda_beginAllocateCurrentThreadToPool",
                                     "_cuda_endAllocateToPool", "_cuda_releasePool"]
    assert {c[1] for c in calls} == {0}
