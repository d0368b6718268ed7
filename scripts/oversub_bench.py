"""Train a larger batch than fits under a device cap: memcast_torch.offload beside what a
PyTorch user picks today, in the same run on the same machine (docs/oversubscription.md).

Models (random data and weights, as in docs/oversubscription.md):
- resnet152: torchvision ResNet-152, fp32, 224x224, SGD momentum 0.9; the blocks are the
  stem (conv1, bn1, relu, maxpool: one block) and the 50 bottlenecks;
- gpt2: transformers GPT2LMHeadModel(GPT2Config(n_positions=1024, use_cache=False)),
  seq 1024, bf16 autocast, AdamW; the blocks are the 12 transformer blocks.

Methods: uncapped (no cap: the compute-only ideal), native (capped), save_on_cpu
(torch.autograd.graph.save_on_cpu(pin_memory=True), capped), checkpoint (ResNet:
checkpoint_sequential 8 segments, use_reentrant=False; GPT-2:
gradient_checkpointing_enable(); capped), memcast (memcast_torch.offload, capped),
memcast_noseg (the same without merging recomputed blocks into segments), memcast_noinput
(the same without offloading recomputed blocks' inputs).
The cap: torch.cuda.set_per_process_memory_fraction(CAP / total), CAP = 24 GiB.
Step = forward + backward + optimizer step, synchronized; median of TIMED steps after
WARM warm-up steps (memcast's first steps profile, calibrate and plan: it gets
MEMCAST_WARM warm-up steps).

Usage: python3 scripts/oversub_bench.py OUT_DIR
  env: MODELS=resnet152,gpt2  RESNET_BATCHES=248  GPT2_BATCHES=24
       METHODS=uncapped,native,save_on_cpu,checkpoint,memcast  (per batch)
       EXTRA=resnet152:320:uncapped+memcast;gpt2:32:uncapped+memcast  (more points)
       CAP_GIB=24 WARM=2 TIMED=4 MEMCAST_WARM=5 HOST_GIB=12
Writes OUT_DIR/oversub_bench.jsonl (one line per measurement) and prints the lines.
Each model runs in its own process (a crash of one does not lose the other).
"""
import gc
import json
import os
import statistics
import subprocess
import sys
import time

import torch

GIB = 1 << 30
CAP = int(float(os.environ.get("CAP_GIB", "24")) * GIB)
WARM = int(os.environ.get("WARM", "2"))
TIMED = int(os.environ.get("TIMED", "4"))
MEMCAST_WARM = int(os.environ.get("MEMCAST_WARM", "5"))
HOST = int(float(os.environ.get("HOST_GIB", "12")) * GIB)


def resnet(batch, method):
    import torchvision.models as M
    from torch.utils.checkpoint import checkpoint_sequential

    model = M.resnet152().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    lossf = torch.nn.CrossEntropyLoss()
    seq = torch.nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool,
                              *model.layer1, *model.layer2, *model.layer3, *model.layer4)
    off = None
    if method.startswith("memcast"):
        import memcast_torch as mt
        # Blocks: the stem (its ReLU works in place on the BatchNorm's output, so it
        # stays with it) and the 50 bottlenecks; the same modules as `seq`.
        stem = torch.nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool)
        seq = torch.nn.Sequential(stem, *model.layer1, *model.layer2, *model.layer3,
                                  *model.layer4)
        off = mt.offload(seq, budget=CAP, host_bytes=HOST, segments=method != "memcast_noseg",
                         offload_inputs=method != "memcast_noinput")

    def fwd(x):
        if method == "checkpoint":
            h = checkpoint_sequential(seq, 8, x, use_reentrant=False)
        else:
            h = seq(x)
        return model.fc(torch.flatten(model.avgpool(h), 1))

    def step():
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (batch,), device="cuda")
        if method == "save_on_cpu":
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                loss = lossf(fwd(x), y)
        else:
            loss = lossf(fwd(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, off


def gpt2(batch, method):
    import transformers as T

    model = T.GPT2LMHeadModel(T.GPT2Config(n_positions=1024, use_cache=False)).cuda()
    if method == "checkpoint":
        model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    off = None
    if method.startswith("memcast"):
        import memcast_torch as mt
        off = mt.offload(model.transformer.h, budget=CAP, host_bytes=HOST,
                         segments=method != "memcast_noseg",
                         offload_inputs=method != "memcast_noinput")

    def step():
        ids = torch.randint(0, 50257, (batch, 1024), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if method == "save_on_cpu":
                with torch.autograd.graph.save_on_cpu(pin_memory=True):
                    loss = model(input_ids=ids, labels=ids).loss
            else:
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, off


BUILD = {"resnet152": resnet, "gpt2": gpt2}


def timed_steps(step, warm, timed, between=None):
    """Runs ``warm`` steps, then ``between()`` if given, then ``timed`` steps, each
    synchronized; returns the timed steps' wall times in seconds."""
    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    if between is not None:
        between()
    ts = []
    for _ in range(timed):
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    return ts


def measure(model, batch, method):
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    total = torch.cuda.get_device_properties(0).total_memory
    capped = method != "uncapped"
    torch.cuda.set_per_process_memory_fraction(CAP / total if capped else 1.0)
    step = off = None
    warm = MEMCAST_WARM if method.startswith("memcast") else WARM
    row = {"model": model, "batch": batch, "method": method, "cap_bytes": CAP if capped else None}
    t0 = time.perf_counter()
    try:
        step, off = BUILD[model](batch, "native" if method == "uncapped" else method)
        ts = timed_steps(step, warm, TIMED, between=torch.cuda.reset_peak_memory_stats)
        st = torch.cuda.memory_stats()
        row.update({"fits": True, "step_s": statistics.median(ts), "step_s_all": ts,
                    "peak_allocated": st["allocated_bytes.all.peak"],
                    "peak_reserved": st["reserved_bytes.all.peak"],
                    "alloc_retries": st.get("num_alloc_retries", 0)})
        if off is not None:
            off.flush()
            its = off.iterations()
            timed = its[-TIMED:]
            s = off.stats()
            # offload resets the peak at each iteration: the run's peak is the largest.
            row["peak_allocated"] = max(i["peak_allocated"] for i in timed)
            row["peak_reserved"] = max(i["peak_reserved"] for i in timed)
            row["memcast"] = {
                "modes": timed[-1]["modes"],
                "counts": {m: timed[-1]["modes"].count(m) for m in ("keep", "offload", "recompute", "offload_input")},
                "per_step": [{k: v for k, v in i.items() if k != "modes"} for i in timed],
                "warmup_peaks": [i["peak_allocated"] for i in its[:-TIMED]],
                "predicted": s["predicted"], "headroom": s["headroom"], "link": s["link"],
                "pool": s["pool"], "pool_create_s": s["pool_create_s"],
                "profile": s["profile"],
            }
    except torch.OutOfMemoryError as e:
        row.update({"fits": False, "error": str(e).splitlines()[0][:200]})
    except Exception as e:  # a method that fails otherwise is a row too
        row.update({"fits": False, "error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300])})
    finally:
        if off is not None:
            try:
                off.remove()
            except Exception as e:
                row["remove_error"] = str(e)[:200]
        step = off = None
        gc.collect()
        torch.cuda.empty_cache()
    row["wall_s"] = time.perf_counter() - t0
    return row


def plan_points(model):
    env = {"resnet152": os.environ.get("RESNET_BATCHES", "248"),
           "gpt2": os.environ.get("GPT2_BATCHES", "24")}
    methods = os.environ.get("METHODS", "uncapped,native,save_on_cpu,checkpoint,memcast").split(",")
    pts = [(int(b), m) for b in env[model].split(",") if b for m in methods]
    for item in filter(None, os.environ.get("EXTRA", "").split(";")):
        name, b, ms = item.split(":")
        if name == model:
            pts += [(int(b), m) for m in ms.split("+")]
    return pts


def one(model, out):
    for batch, method in plan_points(model):
        row = measure(model, batch, method)
        print(json.dumps(row), flush=True)
        with open(os.path.join(out, "oversub_bench.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        return one(sys.argv[2], sys.argv[3])
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for model in os.environ.get("MODELS", "resnet152,gpt2").split(","):
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", model, out])
        if r.returncode != 0:
            print(json.dumps({"model": model, "crashed": r.returncode}), flush=True)


if __name__ == "__main__":
    main()
