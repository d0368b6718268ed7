#!/usr/bin/env python3
"""Times the iterations of corpus workloads, one after another in one process, with
nothing recorded: the wall time of an iteration as the job runs it alone on the GPU.

    python3 scripts/corpus/time_iterations.py [--split S] [--only a,b] [--deadline-s 300]

For each workload of scripts/corpus/workloads.py (of split S, or those named): build
it, one warm-up iteration, then the recorded recipe's iterations (8, 12 if dynamic),
each followed by `torch.cuda.synchronize()` and timed; prints one JSON line
`{"name", "iteration_s": [...], "launch_blocking", "device"}`. The model is dropped and
PyTorch's cache emptied before the next workload. With CUDA_LAUNCH_BLOCKING=1 in the
environment the times are those of a launch-blocking recording (record.py
--launch-blocking), whose event times follow the GPU's work but whose iterations run
longer: these figures say by how much.
"""

import argparse
import gc
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import workloads as W  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--split", default="")
ap.add_argument("--only", default="")
ap.add_argument("--deadline-s", type=float, default=300)
args = ap.parse_args()

names = [n for n, r in W.RECIPES.items() if not args.split or r[1] == args.split]
if args.only:
    want = args.only.split(",")
    unknown = [w for w in want if w not in W.RECIPES]
    if unknown:
        sys.exit(f"unknown workloads: {unknown}")
    names = want


def time_one(builder, dynamic):
    """Builds the workload, runs its warm-up and returns its timed iterations (s)."""
    random.seed(0)
    torch.manual_seed(0)
    rng = random.Random(0)
    job = builder()
    side = torch.cuda.Stream() if job.side_stream else None

    W.run_iteration(job, side, rng)
    torch.cuda.synchronize()
    times = []
    for _ in range(12 if dynamic else 8):
        t = time.time()
        W.run_iteration(job, side, rng)
        torch.cuda.synchronize()
        times.append(round(time.time() - t, 4))
    return times


start = time.time()
for name in names:
    if time.time() - start > args.deadline_s:
        print(f"deadline: {name} and after not timed", file=sys.stderr)
        break
    family, split, dynamic, desc, builder = W.RECIPES[name]
    try:
        times = time_one(builder, dynamic)
    except Exception as e:  # one workload's failure (out of memory) does not stop the rest
        print(json.dumps({"name": name, "split": split, "error": f"{type(e).__name__}: {e}"}),
              flush=True)
    else:
        print(json.dumps({"name": name, "split": split, "iteration_s": times,
                          "launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING") == "1",
                          "device": torch.cuda.get_device_name()}), flush=True)
    gc.collect()
    torch.cuda.empty_cache()
