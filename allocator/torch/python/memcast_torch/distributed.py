"""Each rank's memory picture, shared over the job's own process group.

    import torch.distributed as dist, memcast_torch as mt
    from memcast_torch import distributed as mtd

    mt.install()                       # in every rank, before its first CUDA allocation
    dist.init_process_group("nccl")    # torchrun sets the rank and world size
    ...
    for batch in loader:
        train_step(batch)
        mt.step()
        ranks = mtd.exchange()         # one all_gather of 6 integers per rank
        tightest = min(r["headroom"] for r in ranks)

`exchange()` is a collective: every rank of the group must call it, once per iteration
(after `step()`), in the same order as its other collectives. Each rank contributes, from
its own memcast allocator (one per rank and device):

- ``forecast_peak``: the peak of requested bytes over the last completed step, which the
  next step is forecast to need if it repeats the last (the seasonal forecast; memcast's
  statistics ``step_peak.last``);
- ``reserved`` and ``allocated``: memcast's current figures; ``free_reserve`` =
  reserved - allocated, what memcast holds and could give back (``empty_cache()``);
- ``device_free``: the driver's free device memory (``torch.cuda.mem_get_info``);
- ``headroom`` = device_free + free_reserve - (forecast_peak - allocated), the bytes the
  rank has left at its forecast peak (negative: it will not fit without spilling).

It returns one dict per rank (rank order) and ``exchange.last_seconds``, the time the
collective took (its cost per iteration). Ranks of an uneven job (pipeline stages,
experts) can then agree on who spills or offloads. Pure PyTorch, no dependency beyond it.
"""

import time

FIELDS = ("rank", "forecast_peak", "reserved", "allocated", "device_free", "headroom")


def local_figures(device=None):
    """This rank's figures (see the module docs) from memcast's statistics."""
    import torch
    from . import stats

    s = stats(device)
    free, _total = torch.cuda.mem_get_info(device)
    forecast = int(s.get("step_peak", {}).get("last", 0))
    reserved = int(s["reserved"]["current"])
    allocated = int(s["allocated"]["current"])
    return {
        "forecast_peak": forecast,
        "reserved": reserved,
        "allocated": allocated,
        "device_free": int(free),
    }


def exchange(group=None, device=None, figures=None):
    """All-gathers every rank's figures over ``group`` (default: the world). A
    collective. ``figures`` replaces this rank's own (tests, or a caller with its own
    forecast): a dict with ``forecast_peak``, ``reserved``, ``allocated``,
    ``device_free``."""
    import torch
    import torch.distributed as dist

    f = dict(figures) if figures is not None else local_figures(device)
    f["headroom"] = f["device_free"] + (f["reserved"] - f["allocated"]) - (
        f["forecast_peak"] - f["allocated"]
    )
    f["rank"] = dist.get_rank(group)
    # NCCL moves CUDA tensors only; gloo moves either.
    on_cuda = dist.get_backend(group) == "nccl"
    dev = torch.device("cuda", torch.cuda.current_device()) if on_cuda else torch.device("cpu")
    mine = torch.tensor([int(f[k]) for k in FIELDS], dtype=torch.int64, device=dev)
    world = dist.get_world_size(group)
    out = [torch.empty_like(mine) for _ in range(world)]
    t0 = time.perf_counter()
    dist.all_gather(out, mine, group=group)
    if on_cuda:
        torch.cuda.current_stream().synchronize()
    exchange.last_seconds = time.perf_counter() - t0
    rows = [dict(zip(FIELDS, (int(x) for x in t.tolist()))) for t in out]
    for r in rows:
        r["free_reserve"] = r["reserved"] - r["allocated"]
    return rows


exchange.last_seconds = None
