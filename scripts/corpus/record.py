#!/usr/bin/env python3
"""Records one workload of scripts/corpus/workloads.py on a CUDA GPU.

    python3 scripts/corpus/record.py --workload NAME --mode native|expandable|memcast --out DIR

`native` runs PyTorch's default caching allocator with memory history on and writes
DIR/NAME.snapshot.pickle (`torch.cuda.memory._snapshot()`, pickle protocol 4, no stack
frames). `expandable` runs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and no
history. Both append one JSON line of PyTorch's own figures (`torch.cuda.memory_stats()`
at the end of the run) to DIR/NAME.<mode>.json. `memcast` runs every CUDA allocation
through memcast (`memcast_torch.install()`, settings from MEMCAST_ALLOC_CONF) and writes
memcast's figures the same way, with the median wall time of a recorded iteration and,
per iteration, the device calls made inside requests and ahead of need and the time
spent in memcast's malloc (`--tag T` names the file DIR/NAME.memcast-T.json, to keep
settings apart).

The recipe, for every workload:
  1. build the model (random weights) and its optimizer; seed every generator with 0;
  2. one warm-up iteration, not recorded (parameters, optimizer state and library
     workspaces are live when recording starts: they are the trace's static blocks);
  3. 8 recorded iterations (12 for dynamic workloads). Before each iteration and once
     after the last, a marker tensor of exactly MARKER_BYTES is allocated and freed:
     `memcast trace import` reads these as iteration boundaries.
With `side_stream` recipes the inputs are made on a second CUDA stream and handed to
the compute stream with `record_stream` (as an input prefetcher does).

--from-start (native mode) turns memory history on before the model is built, so the
snapshot holds the whole process: the model's construction and the warm-up iteration
are events before the first marker, and the trace has no static blocks. Nothing else
changes (the allocator does not behave differently with history on).

--launch-blocking sets CUDA_LAUNCH_BLOCKING=1 before CUDA starts: every kernel launch
waits for the kernel, so the host's clock, which the snapshot's event times are read
from, follows the GPU's work instead of running ahead of it and waiting at the
iteration's end (the figures say `launch_blocking` and each iteration's wall time).

--dry-run builds the recipe on the CPU with batches of at most 2 and runs one
iteration: it checks a recipe without a GPU.
"""

import argparse
import json
import os
import pickle
import random
import sys
import time

MARKER_BYTES = 7_341_568

ap = argparse.ArgumentParser()
ap.add_argument("--workload", required=True)
ap.add_argument("--mode", choices=["native", "expandable", "memcast"], default="native")
ap.add_argument("--tag", default="", help="memcast mode: suffix of the figures file")
ap.add_argument("--out", default=".")
ap.add_argument("--iters", type=int, default=0, help="recorded iterations (default 8, 12 if dynamic)")
ap.add_argument("--dry-run", action="store_true")
ap.add_argument("--from-start", action="store_true",
                help="native mode: record memory history from before the model is built")
ap.add_argument("--max-entries", type=int, default=10_000_000,
                help="native mode: memory history ring size (events beyond it are lost: an error)")
ap.add_argument("--launch-blocking", action="store_true",
                help="CUDA_LAUNCH_BLOCKING=1: event times follow the GPU's work")
ap.add_argument("--memcast-trace", default="",
                help="memcast mode: also record what memcast sees, from before the model is built "
                     "(its parameters, the warm-up and every iteration), to this .mctrace")
args = ap.parse_args()

if args.mode == "expandable":
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
else:
    os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
if args.launch_blocking:
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import workloads as W  # noqa: E402

mt = None
if args.mode == "memcast" and not args.dry_run:
    import memcast_torch as mt  # noqa: E402

    mt.install()

if args.workload not in W.RECIPES:
    sys.exit(f"unknown workload {args.workload!r}; known: {', '.join(W.RECIPES)}")
family, split, dynamic, desc, builder = W.RECIPES[args.workload]
iters = args.iters or (12 if dynamic else 8)

if args.dry_run:
    W.DRY, W.DEV = True, "cpu"

random.seed(0)
torch.manual_seed(0)
rng = random.Random(0)
t0 = time.time()


def history_on():
    torch.cuda.memory._record_memory_history(
        enabled="all", context=None, stacks="python", max_entries=args.max_entries)


if args.mode == "native" and args.from_start and not args.dry_run:
    history_on()
# What memcast's featurizer sees in this process: the model's construction and the warm-up
# fall in its first iteration (step() is called after each recorded iteration).
rec = mt.record(args.memcast_trace) if (mt is not None and args.memcast_trace) else None
job = builder()
side = torch.cuda.Stream() if (job.side_stream and not args.dry_run) else None


def iteration():
    W.run_iteration(job, side, rng)


def marker():
    m = torch.empty(MARKER_BYTES, dtype=torch.uint8, device="cuda")
    del m


if args.dry_run:
    iteration()
    print(f"{args.workload}: dry run ok ({time.time() - t0:.1f} s)")
    sys.exit(0)

iteration()  # warm-up
torch.cuda.synchronize()
os.makedirs(args.out, exist_ok=True)
if args.mode == "native" and not args.from_start:
    history_on()
t1 = time.time()
step_s = []
moved = []  # memcast mode: pages released + backed so far (the first entry includes the warm-up)
# memcast mode, at each boundary so far: device calls made inside requests (device
# allocations and frees less those made ahead of need, the replay's
# `critical_path_device_calls`), calls made ahead, nanoseconds spent in memcast's
# malloc, and microseconds spent in device calls (all kinds, inside requests or ahead,
# all on the allocating thread); the first entry includes the warm-up.
calls = []
for _ in range(iters):
    marker()
    ts = time.time()
    iteration()
    torch.cuda.synchronize()
    step_s.append(time.time() - ts)
    if mt is not None:
        mt.step()
        st = mt.stats()
        moved.append((st.get("pages_released") or 0) + (st.get("pages_backed") or 0))
        ahead = st.get("ahead_device_calls") or 0
        device_us = sum(k.get("total_us") or 0 for k in (st.get("device_calls") or {}).values())
        calls.append((st["device_allocs"] + st["device_frees"] - ahead, ahead,
                      st["host_time"]["malloc_ns"], device_us))
marker()
torch.cuda.synchronize()
t2 = time.time()
if args.mode == "native":
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    # One ring per device, each capped at max_entries (the oldest entries overwritten).
    if any(len(t) >= args.max_entries for t in snap.get("device_traces", [])):
        sys.exit(f"{args.workload}: the history ring ({args.max_entries} entries) is full: "
                 "its first events are lost; raise --max-entries")
    with open(os.path.join(args.out, f"{args.workload}.snapshot.pickle"), "wb") as f:
        pickle.dump(snap, f, protocol=4)
if rec is not None:
    rec.stop()
if mt is not None:
    ms = mt.stats()

    def per_iteration(k):
        at = [c[k] for c in calls]
        return [b - a for a, b in zip([0] + at[:-1], at)]

    fig = {
        "name": args.workload,
        "allocator": "memcast" + (f"-{args.tag}" if args.tag else ""),
        "conf": os.environ.get("MEMCAST_ALLOC_CONF", ""),
        "peak_requested": ms["requested"]["peak"],
        "peak_allocated": ms["allocated"]["peak"],
        "peak_reserved": ms["reserved"]["peak"],
        "reserved_overhead": ms["reserved"]["peak"] / ms["requested"]["peak"] - 1,
        "num_device_alloc": ms.get("device_allocs"),
        "num_device_free": ms.get("device_frees"),
        "pages_released": ms.get("pages_released"),
        "pages_backed": ms.get("pages_backed"),
        "placement": ms.get("placement"),
        "median_iteration_s": sorted(step_s)[len(step_s) // 2],
        "iteration_s": [round(x, 4) for x in step_s],
        "pages_moved_per_iteration": [b - a for a, b in zip([0] + moved[:-1], moved)],
        "critical_device_calls_per_iteration": per_iteration(0),
        "ahead_device_calls_per_iteration": per_iteration(1),
        "malloc_ms_per_iteration": [round(x / 1e6, 3) for x in per_iteration(2)],
        "device_call_ms_per_iteration": [round(x / 1e3, 3) for x in per_iteration(3)],
        "forecasts_used": ms.get("forecasts_used"),
        "advice_applied": ms.get("advice_applied"),
        "forecast_service": ms.get("forecast_service"),
        "iters": iters,
        "family": family,
        "split": split,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
    }
    name = f"{args.workload}.memcast{('-' + args.tag) if args.tag else ''}.json"
    with open(os.path.join(args.out, name), "w") as f:
        f.write(json.dumps(fig) + "\n")
    print(json.dumps(fig))
    sys.exit(0)
s = torch.cuda.memory_stats()
fig = {
    "name": args.workload,
    "allocator": "pytorch-native" if args.mode == "native" else "pytorch-expandable-segments",
    "peak_allocated": s["allocated_bytes.all.peak"],
    "peak_reserved": s["reserved_bytes.all.peak"],
    "peak_requested": s.get("requested_bytes.all.peak", 0),
    "num_device_alloc": s["num_device_alloc"],
    "num_device_free": s["num_device_free"],
    "num_alloc_retries": s["num_alloc_retries"],
    "num_ooms": s["num_ooms"],
    "iters": iters,
    "family": family,
    "split": split,
    "dynamic": dynamic,
    "description": desc,
    "from_start": bool(args.from_start and args.mode == "native"),
    "seconds_recorded": round(t2 - t1, 3),
    "iteration_s": [round(x, 4) for x in step_s],
    "launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING") == "1",
    "torch": torch.__version__,
    "device": torch.cuda.get_device_name(),
}
with open(os.path.join(args.out, f"{args.workload}.{args.mode}.json"), "w") as f:
    f.write(json.dumps(fig) + "\n")
print(f"{args.workload} {args.mode}: peak reserved {fig['peak_reserved'] / 2**30:.2f} GiB, "
      f"allocated {fig['peak_allocated'] / 2**30:.2f} GiB, {iters} iterations in {t2 - t1:.1f} s "
      f"(total {time.time() - t0:.1f} s)")
