#!/usr/bin/env python3
"""Training under four allocators: peak reserved memory and median step time.

    python3 scripts/torch_bench.py --model resnet50|gpt2|bert --mode MODE [--steps N]

MODE: `native` (PyTorch's caching allocator), `expandable`
(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), `memcast` (memcast_torch.install():
every allocation through memcast), `memcast-predictive` (the same in predictive mode,
default forecaster), `memcast-pool` (memcast_torch.use_pool(): PyTorch's caching
allocator over memcast's segments, every thread's allocations), `memcast-pool-thread`
(memcast_torch.pool() under torch.cuda.use_mem_pool: the calling thread's only).
One JSON line on stdout. Recipes (random weights, as the shared traces):
resnet50: torchvision ResNet-50, batch 64, 224x224, fp32, SGD (momentum 0.9);
gpt2: GPT-2 small (transformers), batch 8, seq 1024, bf16 autocast, AdamW;
bert: BERT-base MLM, batch 32, seq 128, fp32, AdamW.

peak_reserved_bytes: bytes the process took from the device at the peak: PyTorch's
max_memory_reserved for native/expandable; memcast's reserved peak for
memcast and memcast-pool (every segment PyTorch holds is then memcast's); for
memcast-pool-thread PyTorch's max_memory_reserved (use_mem_pool routes only the
calling thread's allocations, and autograd's backward runs on another thread, so the
process uses both pools; PyTorch's figure counts the memcast pool's segments too).
Step time: wall time of one iteration with a CUDA synchronization at its end, median
over the steps after `--warmup`; beside it the step's GPU time (CUDA events), the time
the thread took to launch it, and under memcast the allocator's time on the calling
threads per step (`stats()["host_time"]`).
"""

import argparse
import json
import os
import statistics
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True, choices=["resnet50", "gpt2", "bert"])
ap.add_argument("--mode", required=True,
                choices=["native", "expandable", "memcast", "memcast-pool", "memcast-pool-thread",
                         "memcast-predictive"])
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=3)
args = ap.parse_args()

if args.mode == "expandable":
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
import torch  # noqa: E402

mt = None
if args.mode.startswith("memcast"):
    import memcast_torch as mt  # noqa: E402

    if args.mode == "memcast":
        mt.install()
    elif args.mode == "memcast-predictive":
        mt.predictive(True)
        mt.install()


def build():
    dev = "cuda"
    if args.model == "resnet50":
        import torchvision

        m = torchvision.models.resnet50().to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(64, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (64,), device=dev)

        def step():
            loss = torch.nn.functional.cross_entropy(m(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step
    if args.model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        m = GPT2LMHeadModel(GPT2Config()).to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        ids = torch.randint(0, 50257, (8, 1024), device=dev)

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = m(input_ids=ids, labels=ids).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step
    from transformers import BertConfig, BertForMaskedLM

    m = BertForMaskedLM(BertConfig()).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    ids = torch.randint(0, 30522, (32, 128), device=dev)

    def step():
        loss = m(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def main():
    ctx = None
    if args.mode == "memcast-pool":
        ctx = mt.use_pool()
    elif args.mode == "memcast-pool-thread":
        ctx = torch.cuda.use_mem_pool(mt.pool())
    if ctx is not None:
        ctx.__enter__()
    step = build()
    times, launch, gpu = [], [], []
    host0 = None
    for i in range(args.warmup + args.steps):
        if i == args.warmup and mt is not None:
            host0 = mt.stats().get("host_time")
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        e0.record()
        step()
        e1.record()
        launch.append(time.perf_counter() - t)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        gpu.append(e0.elapsed_time(e1) / 1e3)
        if mt is not None:
            mt.step()
    if ctx is not None:
        ctx.__exit__(None, None, None)
    r = {"model": args.model, "mode": args.mode, "steps": args.steps,
         "median_step_ms": 1e3 * statistics.median(times[args.warmup:]),
         # The step's GPU time (CUDA events around it on the current stream) and the
         # time the Python thread took to launch it (before the synchronization).
         "median_gpu_ms": 1e3 * statistics.median(gpu[args.warmup:]),
         "median_launch_ms": 1e3 * statistics.median(launch[args.warmup:])}
    if args.mode in ("native", "expandable", "memcast-pool", "memcast-pool-thread"):
        r["torch_peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        r["torch_peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    if mt is not None:
        s = mt.stats()
        r["memcast_peak_reserved_bytes"] = s["reserved"]["peak"]
        r["memcast_peak_requested_bytes"] = s["requested"]["peak"]
        r["memcast_device_allocs"] = s["device_allocs"]
        r["peak_reserved_bytes"] = s["reserved"]["peak"]
        r["memcast_forecasts_used"] = s.get("forecasts_used")
        r["memcast_advice_applied"] = s.get("advice_applied")
        r["memcast_placement"] = s.get("placement")
        h1 = s.get("host_time")
        if host0 and h1:
            # The allocator's time on the calling threads per timed step (malloc + free).
            ns = (h1["malloc_ns"] - host0["malloc_ns"]) + (h1["free_ns"] - host0["free_ns"])
            calls = (h1["mallocs"] - host0["mallocs"]) + (h1["frees"] - host0["frees"])
            r["memcast_host_us_per_step"] = ns / 1e3 / args.steps
            r["memcast_calls_per_step"] = calls / args.steps
    if args.mode == "memcast-pool-thread":
        # use_mem_pool routes only this thread's allocations (autograd's backward runs
        # on its own thread and uses PyTorch's native pool): the process's total is
        # PyTorch's figure, which counts the memcast pool's segments too.
        r["peak_reserved_bytes"] = r["torch_peak_reserved_bytes"]
    if "peak_reserved_bytes" not in r:
        r["peak_reserved_bytes"] = r["torch_peak_reserved_bytes"]
    print(json.dumps(r))
    sys.stdout.flush()


main()
