#!/usr/bin/env python3
"""Records a training run through memcast as a .mctrace trace.

    python3 scripts/torch_record.py --model resnet50|gpt2|bert --steps N [--from-start] OUT.mctrace

The model (recipes of scripts/torch_bench.py) trains under memcast_torch.install(); one
warm-up iteration runs before recording starts (so parameters and optimizer state are
the trace's static blocks), then N iterations are recorded, each ended by
memcast_torch.step() (an iteration boundary). With --from-start, recording starts before
the first CUDA allocation instead: the trace has no static blocks and holds the whole
run (the model's parameters, the warm-up iteration and the optimizer state's creation in
it), so that a replay's peak reserved is the live run's. The trace is what `memcast trace
stats`, `memcast replay` and `memcast train --traces` read.
"""

import argparse
import os
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True, choices=["resnet50", "gpt2", "bert"])
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--from-start", action="store_true")
ap.add_argument("out")
args = ap.parse_args()

import torch  # noqa: E402
import memcast_torch as mt  # noqa: E402

mt.install()
sys.argv = [sys.argv[0], "--model", args.model, "--mode", "memcast"]
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
# torch_bench's model builders, without running its main().
src = open(os.path.join(here, "torch_bench.py")).read().split("def main():")[0]
ns = {"__name__": "torch_bench"}
exec(compile(src, "torch_bench.py", "exec"), ns)
rec = mt.record(args.out) if args.from_start else None
step = ns["build"]()
step()
torch.cuda.synchronize()
mt.step()
if rec is None:
    rec = mt.record(args.out)
for _ in range(args.steps):
    step()
    torch.cuda.synchronize()
    mt.step()
rec.stop()
print("peak reserved", mt.stats()["reserved"]["peak"], "bytes")
print(args.out, os.path.getsize(args.out), "bytes")
