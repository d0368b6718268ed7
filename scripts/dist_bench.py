#!/usr/bin/env python3
"""GPT-2 small under DDP or FSDP, one allocator per rank: peak reserved memory and median
step time of every rank, and memcast's exchange cost per step.

    torchrun --nproc-per-node N scripts/dist_bench.py --wrap ddp|fsdp --mode MODE \\
        [--steps 20] [--warmup 3]

(`python3 -m torch.distributed.run` is the same launcher as `torchrun`.) N ranks, one
per GPU, over NCCL; N = 1 runs on one GPU. MODE: `native` (PyTorch's caching
allocator), `expandable` (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), `memcast`
(memcast_torch.install() in every rank: its own memcast allocator).

Recipe (scripts/torch_bench.py's gpt2, per rank): GPT-2 small (transformers
GPT2LMHeadModel(GPT2Config()), random weights, the same on every rank), batch 8 of
1024 tokens (random ids, other ones on each rank), bf16 autocast, AdamW (lr 1e-4).
`--wrap ddp`: DistributedDataParallel. `--wrap fsdp`: FSDP2, `fully_shard` on each
transformer block and then on the whole model (parameters stay fp32, autocast computes
in bf16, as under DDP).

Each rank measures: step time, the wall time of one iteration (forward, backward,
optimizer step) with a CUDA synchronization at its end, median over the steps after
`--warmup`; peak reserved bytes (memcast's reserved peak under memcast, else PyTorch's
max_memory_reserved), peak allocated bytes (memcast's allocated peak, else PyTorch's
max_memory_allocated) and peak requested bytes (memcast's requested peak, else PyTorch's
requested_bytes.all.peak). Under memcast every rank also calls mt.step() and then
memcast_torch.distributed.exchange() after each iteration (outside the timed part):
the median, min and max of exchange.last_seconds over the steps after `--warmup`. The
other modes make neither call. Rank 0 prints one JSON line with every rank's figures
(gathered with all_gather_object after the last step).
"""

import argparse
import json
import os
import statistics
import sys
import time


def parse_args(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--wrap", required=True, choices=["ddp", "fsdp"])
    ap.add_argument("--mode", required=True, choices=["native", "expandable", "memcast"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    return ap.parse_args(argv)


def wrap_model(model, how, device):
    """`model` under DDP or FSDP2 over the default process group."""
    import torch

    if how == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def build(how, device, rank, config=None, batch=8, seq=1024):
    """GPT-2 (GPT2Config() unless `config`) wrapped by `how`; returns one training step
    (it returns the loss, a tensor)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = config or GPT2Config()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = wrap_model(GPT2LMHeadModel(config).to(device), how, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device=device).manual_seed(1000 + rank)
    ids = torch.randint(0, config.vocab_size, (batch, seq), device=device, generator=g)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def main(argv=None):
    args = parse_args(argv)
    if args.mode == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch
    import torch.distributed as dist

    mt = mtd = None
    if args.mode == "memcast":
        import memcast_torch as mt
        from memcast_torch import distributed as mtd

        mt.install()  # before this rank's first CUDA allocation
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()

    step = build(args.wrap, device, rank)
    times, exchange_s, losses = [], [], []
    for i in range(args.warmup + args.steps):
        t = time.perf_counter()
        losses.append(step())
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        if mt is not None:
            mt.step()
            mtd.exchange()
            exchange_s.append(mtd.exchange.last_seconds)

    mine = {"rank": rank, "local_rank": local_rank,
            "device": torch.cuda.get_device_name(device),
            "median_step_ms": 1e3 * statistics.median(times[args.warmup:]),
            "first_loss": losses[0].item(), "last_loss": losses[-1].item()}
    if mt is None:
        mine["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        mine["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        mine["peak_requested_bytes"] = torch.cuda.memory_stats(device).get(
            "requested_bytes.all.peak")
    else:
        s = mt.stats(local_rank)
        mine["peak_reserved_bytes"] = s["reserved"]["peak"]
        mine["peak_allocated_bytes"] = s["allocated"]["peak"]
        mine["peak_requested_bytes"] = s["requested"]["peak"]
        mine["memcast_device_allocs"] = s.get("device_allocs")
        mine["memcast_steps"] = s.get("steps")
        mine["memcast_failed_allocs"] = s.get("failed_allocs")
        mine["memcast_failed_frees"] = s.get("failed_frees")
        ex = exchange_s[args.warmup:]
        mine["exchange_median_ms"] = 1e3 * statistics.median(ex)
        mine["exchange_min_ms"] = 1e3 * min(ex)
        mine["exchange_max_ms"] = 1e3 * max(ex)
        mine["exchange_first_ms"] = 1e3 * exchange_s[0]

    every = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        r = {"model": "gpt2", "wrap": args.wrap, "mode": args.mode, "world_size": world,
             "backend": dist.get_backend(), "batch_per_rank": 8, "seq": 1024,
             "steps": args.steps, "warmup": args.warmup, "torch": torch.__version__,
             "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
             "max_peak_reserved_bytes": max(x["peak_reserved_bytes"] for x in every),
             "max_median_step_ms": max(x["median_step_ms"] for x in every),
             "ranks": every}
        print(json.dumps(r))
        sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
