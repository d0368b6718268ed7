#!/usr/bin/env python3
"""Records the whole corpus (or part of it) on one GPU, then imports it with memcast.

    python3 scripts/corpus/record_all.py --out DIR [--jobs 6] [--only a,b,...]
        [--memcast PATH/TO/memcast] [--deadline-s 540] [--from-start]
        [--modes native,expandable] [--launch-blocking] [--split S]

For each workload of scripts/corpus/workloads.py it runs record.py twice, as separate
processes (native with memory history, then expandable segments), `--jobs` processes at
a time. Runs share the GPU, so a run whose allocator had to retry (`num_alloc_retries`
or `num_ooms` above 0: another process held the memory it asked for) does not count:
it is run again at the end, alone. No new run starts after `--deadline-s`.
With --from-start the native runs record memory history from before the model is
built (record.py --from-start): the traces then hold the model's construction and the
warm-up iteration, and have no static blocks.

--modes native records the snapshots alone (no expandable-segments run, no figures of
it); --launch-blocking passes record.py --launch-blocking to every run (event times that
follow the GPU's work; with --jobs 1, so that no other job shares the GPU); --split S
records the workloads of that split only.

Then, with --memcast, each snapshot is imported (`memcast trace import`) into
DIR/traces/NAME.mctrace, and DIR/pytorch_allocator_figures.jsonl and DIR/manifest.tsv
are written for every workload whose two runs both succeeded.
"""

import argparse
import json
import os
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--jobs", type=int, default=6)
ap.add_argument("--only", default="")
ap.add_argument("--memcast", default="")
ap.add_argument("--deadline-s", type=float, default=540)
ap.add_argument("--run-timeout-s", type=float, default=240)
ap.add_argument("--from-start", action="store_true")
ap.add_argument("--modes", default="native,expandable")
ap.add_argument("--launch-blocking", action="store_true")
ap.add_argument("--split", default="")
args = ap.parse_args()
modes = args.modes.split(",")
if "native" not in modes or any(m not in ("native", "expandable") for m in modes):
    sys.exit(f"--modes {args.modes}: native, optionally with expandable")

# Read the registry without importing torch in the driver.
src = open(os.path.join(here, "workloads.py")).read()
names = [line.split('"')[1] for line in src.splitlines() if line.startswith("add(\"")]
if args.only:
    want = args.only.split(",")
    unknown = [w for w in want if w not in names]
    if unknown:
        sys.exit(f"unknown workloads: {unknown}")
    names = want
if args.split:
    # add("NAME", "family", ...), and SPLITS = {...} maps a family to its split.
    import ast
    splits = ast.literal_eval(src[src.index("SPLITS = ") + 9:src.index("}", src.index("SPLITS = ")) + 1])
    family = {line.split('"')[1]: line.split('"')[3] for line in src.splitlines()
              if line.startswith("add(\"")}
    names = [n for n in names if splits[family[n]] == args.split]
    if not names:
        sys.exit(f"no workload of split {args.split!r}")
os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
start = time.time()


def launch(name, mode):
    log = open(os.path.join(args.out, "logs", f"{name}.{mode}.log"), "w")
    p = subprocess.Popen(
        [sys.executable, os.path.join(here, "record.py"), "--workload", name,
         "--mode", mode, "--out", args.out]
        + (["--from-start"] if args.from_start and mode == "native" else [])
        + (["--launch-blocking"] if args.launch_blocking else []),
        stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    return (p, name, mode, time.time(), log)


def figures(name, mode):
    path = os.path.join(args.out, f"{name}.{mode}.json")
    if not os.path.exists(path):
        return None
    return json.loads(open(path).read())


def clean(name, mode):
    f = figures(name, mode)
    return f is not None and f["num_alloc_retries"] == 0 and f["num_ooms"] == 0


def run_all(queue, jobs):
    running = []
    while queue or running:
        while queue and len(running) < jobs and time.time() - start < args.deadline_s:
            running.append(launch(*queue.pop(0)))
        if not running:
            break
        time.sleep(0.5)
        for r in list(running):
            p, name, mode, t, log = r
            if p.poll() is None and time.time() - t > args.run_timeout_s:
                p.kill()
            if p.poll() is not None:
                running.remove(r)
                log.close()
                ok = "ok" if clean(name, mode) else f"FAILED rc={p.returncode}"
                print(f"[{time.time() - start:6.1f} s] {name} {mode}: {ok}", flush=True)
    return queue


queue = [(n, m) for n in names for m in modes]
left = run_all(queue, args.jobs)
again = [(n, m) for n in names for m in modes
         if not clean(n, m) and (n, m) not in left]
if again:
    print(f"rerunning alone: {again}", flush=True)
    run_all(again, 1)

done = [n for n in names if all(clean(n, m) for m in modes)]
print(f"{len(done)} of {len(names)} workloads recorded in {time.time() - start:.0f} s")
if args.memcast:
    os.makedirs(os.path.join(args.out, "traces"), exist_ok=True)
    procs = []
    for n in done:
        snap = os.path.join(args.out, f"{n}.snapshot.pickle")
        out = os.path.join(args.out, "traces", f"{n}.mctrace")
        procs.append((n, subprocess.Popen([args.memcast, "trace", "import", snap, "-o", out],
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
    imported = []
    for n, p in procs:
        msg = p.communicate()[0].decode(errors="replace").strip()
        if p.returncode == 0:
            imported.append(n)
        else:
            print(f"import {n} failed: {msg}")
    with open(os.path.join(args.out, "pytorch_allocator_figures.jsonl"), "w") as f:
        for n in imported:
            for m in modes:
                f.write(json.dumps(figures(n, m)) + "\n")
    with open(os.path.join(args.out, "manifest.tsv"), "w") as f:
        f.write("file\tworkload\tfamily\tshapes\tsplit\tdescription\n")
        for n in imported:
            g = figures(n, "native")
            f.write(f"{n}.mctrace\t{n}\t{g['family']}\t"
                    f"{'dynamic' if g['dynamic'] else 'static'}\t{g['split']}\t"
                    f"{g['description']}\n")
    print(f"{len(imported)} traces imported into {args.out}/traces")
