"""memcast_torch.offload's run replayed in memcast's simulator: predicted step time
against measured (docs/oversubscription.md, "Replayed in the simulator").

On the GPU machine (in a folder staged by scripts/stage-gpu.sh DIR):

    python3 oversub_replay.py OUT_DIR

For each model (ResNet-152 batch 248, GPT-2 small batch 24, the recipes of
oversub_bench.py, under CAP_GIB=24), in its own process: trains with
memcast_torch.offload (MEMCAST_WARM=5 warm-up steps: profile, calibration, plans; then
TIMED=4 timed steps), writes the run with Offload.write_trace (OUT_DIR/MODEL.trace.json
and .plan.json, 3 iterations), replays it with `memcast replay TRACE --budget CAP --plan
PLAN --json` (the plan the run ran) and `--policy reactive` (the simulator's own
policies), and prints one JSON line: the measured step (median wall time and GPU time),
the planner's prediction, the simulator's (median of its iterations, compute + stall),
and the figures behind them. Lines also go to OUT_DIR/oversub_replay.jsonl.

Without a GPU, from the JSON lines of an earlier oversub_bench.py run:

    python3 scripts/oversub_replay.py --from-log LOG [OUT_DIR]

replays each memcast row's logged profile and plan (the blocks only: the log has no
time outside the blocks and no base memory) and prints the simulator's blocks time
beside the planner's and the measured step; `--from-log-variants` adds four made-up
plans over each profile (link-bound ones), without the spill_inflight limit.

env: MODELS=resnet152,gpt2 RESNET_BATCH=248 GPT2_BATCH=24 CAP_GIB=24 HOST_GIB=12
     MEMCAST_BIN (default: ./memcast beside this script, else target/release/memcast)
"""
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# The staged layout (scripts/stage-gpu.sh DIR): the library and the CLI's shared
# libraries beside this script.
if not os.environ.get("MEMCAST_TORCH_LIB") and os.path.isfile(os.path.join(HERE, "libmemcast_torch.so")):
    os.environ["MEMCAST_TORCH_LIB"] = os.path.join(HERE, "libmemcast_torch.so")
for p in (os.path.join(HERE, "python"),
          os.path.join(HERE, "..", "allocator", "torch", "python")):
    if os.path.isdir(os.path.join(p, "memcast_torch")):
        sys.path.insert(0, p)
        break

from memcast_torch import plan as P  # noqa: E402
from memcast_torch import simtrace as S  # noqa: E402

GIB = 1 << 30


def memcast_bin():
    for c in (os.environ.get("MEMCAST_BIN"), os.path.join(HERE, "memcast"),
              os.path.join(HERE, "..", "target", "release", "memcast"),
              os.path.join(os.environ.get("CARGO_TARGET_DIR", "/nonexistent"), "release",
                           "memcast")):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise SystemExit("oversub_replay: no memcast binary (set MEMCAST_BIN)")


def replay(trace, budget, plan=None, policy=None):
    """`memcast replay` of `trace`: the report (a dict), or {"error": ...}."""
    cmd = [memcast_bin(), "replay", trace, "--budget", str(budget), "--json"]
    cmd += ["--plan", plan] if plan else ["--policy", policy or "reactive"]
    env = dict(os.environ)
    lib = os.path.join(HERE, "lib")
    if os.path.isdir(lib):
        env["LD_LIBRARY_PATH"] = lib + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    try:
        r = json.loads(p.stdout)
    except ValueError:
        return {"error": (p.stderr or p.stdout).strip()[-500:], "rc": p.returncode}
    steps = [(c + s) / 1e6 for c, s in zip(r.get("compute_per_iteration_us", []),
                                           r.get("stall_per_iteration_us", []))]
    out = {k: r.get(k) for k in ("completed", "error", "compute_us", "stall_us",
                                 "transfer_stall_us", "recompute_us", "spilled_bytes",
                                 "prefetched_bytes", "faults", "late_prefetches",
                                 "peak_allocated_bytes", "peak_requested_bytes", "plan",
                                 "wall_secs")}
    out["step_s"] = statistics.median(steps) if steps else None
    out["steps_s"] = steps
    if p.returncode and not out.get("error"):
        out["error"] = p.stderr.strip()[-500:]
    return out


def one(model, out):
    import torch
    sys.argv = [sys.argv[0]]
    import oversub_bench as B

    batch = int(os.environ.get({"resnet152": "RESNET_BATCH", "gpt2": "GPT2_BATCH"}[model],
                               {"resnet152": "248", "gpt2": "24"}[model]))
    warm, timed = int(os.environ.get("MEMCAST_WARM", "5")), int(os.environ.get("TIMED", "4"))
    row = {"model": model, "batch": batch, "budget": B.CAP}
    off = None
    try:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(B.CAP / total)
        step, off = B.BUILD[model](batch, "memcast")
        ts = B.timed_steps(step, warm, timed)
        row.update(report(off, ts, B.CAP, out, model))
    except Exception as e:  # the line says what failed (no partial figures lost)
        row["error"] = "%s: %s" % (type(e).__name__, str(e)[:500])
    finally:
        if off is not None:
            off.remove()
    line = json.dumps(row)
    print(line, flush=True)
    with open(os.path.join(out, "oversub_replay.jsonl"), "a") as f:
        f.write(line + "\n")


def report(off, ts, budget, out, name):
    """After the timed steps (wall times ``ts``) of ``off``: writes the trace and the
    plan (OUT/NAME.trace.json, .plan.json), replays them and returns the figures."""
    off.flush()
    its = off.iterations()[-len(ts):]
    tp = os.path.join(out, name + ".trace.json")
    pp = os.path.join(out, name + ".plan.json")
    info = off.write_trace(tp, pp, iterations=3)
    gpu = [i["gpu_step_s"] for i in its if i.get("gpu_step_s")]
    row = {"plans_in_timed_steps": len({tuple(i["modes"]) for i in its}),
           "measured": {"step_s": statistics.median(ts), "steps_s": ts,
                        "gpu_step_s": statistics.median(gpu) if gpu else None,
                        "head_s": [i.get("head_s") for i in its],
                        "tail_s": [i.get("tail_s") for i in its],
                        "blocks_s": [(i["fwd_s"] + i["bwd_s"]) if i.get("fwd_s") is not None
                                     and i.get("bwd_s") is not None else None for i in its],
                        "compute_wait_s": [i.get("compute_wait_s") for i in its],
                        "host_wait_s": [i.get("host_wait_s") for i in its],
                        "spilled_bytes": its[-1]["spilled_bytes"],
                        "peak_allocated": max(i["peak_allocated"] for i in its)}}
    row["planner"] = {k: info[k] for k in ("predicted_step_s", "predicted_blocks_s",
                                            "predicted_stall_s", "head_s", "tail_s",
                                            "rest_from", "base", "counts", "link")}
    row["sim_plan"] = replay(tp, budget, plan=pp)
    row["sim_reactive"] = replay(tp, budget, policy="reactive")
    m, s = row["measured"]["step_s"], row["sim_plan"].get("step_s")
    row["sim_vs_measured"] = s / m - 1 if s else None
    row["planner_vs_measured"] = info["predicted_step_s"] / m - 1
    # The blocks' part alone: the simulator's step less the time outside the blocks it
    # was given, against the GPU time measured from the first block's forward to the
    # end of backward through the first block, less the head.
    blocks = [b for b in row["measured"]["blocks_s"] if b is not None]
    if s and blocks:
        sim_blocks = s - info["head_s"] - info["tail_s"]
        row["sim_blocks_s"] = sim_blocks
        row["measured_blocks_s"] = statistics.median(blocks)
        row["sim_blocks_vs_measured"] = sim_blocks / statistics.median(blocks) - 1
    return row


def variants(prof, logged):
    """The logged plan and four made-up ones over the same profile (the link-bound
    cases where the simulator's mechanisms and the planner's model can disagree)."""
    n = len(prof)
    return [("logged", logged),
            ("offload first 3", [P.OFFLOAD] * 3 + [P.RECOMPUTE] * (n - 3)),
            ("offload first 8", [P.OFFLOAD] * 8 + [P.RECOMPUTE] * (n - 8)),
            ("offload all", [P.OFFLOAD] * n),
            ("inputs all", [P.RECOMPUTE] + [P.OFFLOAD_INPUT] * (n - 1))]


def from_log(log, out, more=False):
    """Replays the memcast rows of an oversub_bench.py log (blocks only); ``more``:
    the made-up plans of ``variants`` too, without the ``spill_inflight`` limit."""
    os.makedirs(out, exist_ok=True)
    for line in open(log):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
        except ValueError:
            continue
        mc = r.get("memcast")
        if not mc or not r.get("fits") or not mc.get("profile"):
            continue
        prof = [P.BlockProfile(p["fwd_s"], p["bwd_s"], p["saved"], p["inp"])
                for p in mc["profile"]]
        link = P.Link(d2h=mc["link"]["d2h"], h2d=mc["link"]["h2d"],
                      inflight=1 << 62 if more else 4 << 30)
        cap = max(p.saved for p in prof)
        link.segment_cap = cap
        plans = variants(prof, mc["modes"]) if more else [("logged", mc["modes"])]
        for label, modes in plans:
            issue = P.issue_blocks(prof, modes, link, cap)
            name = "%s_b%d_%s" % (r["model"], r["batch"], r["method"])
            trace, plan = S.build(prof, modes, issue, iterations=2, name=name,
                                  segs=P.segments(prof, modes, cap))
            tp = os.path.join(out, name + ".trace.json")
            pp = os.path.join(out, name + ".plan.json")
            S.write(tp, trace)
            S.write(pp, plan)
            own = P.simulate(prof, modes, link, None)
            sim = replay(tp, os.environ.get("BUDGET", "400G"), plan=pp)
            print(json.dumps({
                "model": r["model"], "batch": r["batch"], "method": r["method"],
                "plan": label, "measured_step_s": r["step_s"] if label == "logged" else None,
                "planner_logged_blocks_s": mc["predicted"]["step_s"] if label == "logged" else None,
                "planner_blocks_s": own["step_s"], "planner_stall_s": own["stall_s"],
                "sim_blocks_s": sim.get("step_s"), "sim": sim,
                "counts": {m: modes.count(m) for m in P.MODES}}), flush=True)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] in ("--from-log", "--from-log-variants"):
        return from_log(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "oversub_replay_out",
                        more=sys.argv[1] == "--from-log-variants")
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        return one(sys.argv[2], sys.argv[3])
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    memcast_bin()
    for model in os.environ.get("MODELS", "resnet152,gpt2").split(","):
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", model, out],
                           cwd=HERE)
        if r.returncode != 0:
            print(json.dumps({"model": model, "crashed": r.returncode}), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main()
