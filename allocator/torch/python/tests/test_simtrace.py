"""The offload run as a memcast trace and plan (``simtrace.py``, ``Offload.write_trace``),
read and replayed by the ``memcast`` CLI. Runs without a GPU: the documents are built
from a made-up profile, and from a CPU run of the engine with CUDA faked (the fakes of
``test_offload_cpu.py``); the real run writes them in ``scripts/oversub_replay.py`` on
the GPU. The CLI tests need a built ``memcast`` (``MEMCAST_BIN``, else the workspace's
``target/release/memcast`` or ``$CARGO_TARGET_DIR/release/memcast``) and are skipped
without one."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from memcast_torch import plan as P  # noqa: E402
from memcast_torch import simtrace as S  # noqa: E402

MB = 1 << 20


def memcast_bin():
    cands = [os.environ.get("MEMCAST_BIN")]
    if os.environ.get("CARGO_TARGET_DIR"):
        cands.append(os.path.join(os.environ["CARGO_TARGET_DIR"], "release", "memcast"))
    cands.append(os.path.join(HERE, "..", "..", "..", "..", "target", "release", "memcast"))
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    return None


def cli(*args):
    b = memcast_bin()
    if b is None:
        pytest.skip("no memcast binary (set MEMCAST_BIN or build: cargo build --release -p memcast)")
    p = subprocess.run([b] + [str(a) for a in args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def profile():
    # Six blocks of 4 ms forward, 8 ms backward, 512 MiB saved, 64 MiB input each.
    return [P.BlockProfile(0.004, 0.008, 512 * MB, 64 * MB) for _ in range(6)]


MODES = [P.KEEP, P.OFFLOAD, P.RECOMPUTE, P.OFFLOAD_INPUT, P.RECOMPUTE, P.KEEP]


def docs(tmp_path, modes=MODES, head=0.005, tail=0.003, iterations=3):
    prof = profile()
    link = P.Link(d2h=55e9, h2d=55e9)
    issue = P.issue_blocks(prof, modes, link, 0)
    trace, plan = S.build(prof, modes, issue, base_bytes=256 * MB, head_s=head, tail_s=tail,
                          iterations=iterations, name="fake")
    tp, pp = tmp_path / "run.trace.json", tmp_path / "run.plan.json"
    S.write(str(tp), trace)
    S.write(str(pp), plan)
    return prof, link, trace, plan, tp, pp


def test_the_documents_describe_the_planned_job(tmp_path):
    prof, link, trace, plan, tp, pp = docs(tmp_path)
    t = trace["trace"]
    ev = t["events"]
    assert sum(1 for e in ev if e["kind"] == "IterationBoundary") == 4
    # Per iteration: the blocks' forward and backward, the head and the tail.
    per_it = sum(p.fwd + p.bwd for p in prof) + 0.005 + 0.003
    assert ev[-1]["time_us"] == pytest.approx(3 * per_it * 1e6, abs=3)
    acts = [d["action"] for d in plan["directives"]]
    # Per iteration: 3 drops (blocks 2, 3, 4), 2 spills for block 1 (saved and input),
    # 1 input spill (block 3), and their 3 prefetches.
    assert acts.count("drop") == 9 and acts.count("spill") == 9 and acts.count("prefetch") == 9
    costed = [x for x in t["tensors"] if x["recompute_us"]]
    assert len(costed) == 9 and all(x["recompute_us"] == 4000 for x in costed)
    # Only the recomputed blocks' tensors are dropped.
    assert {d["id"] for d in plan["directives"] if d["action"] == "drop"} == {x["id"] for x in costed}
    json.loads(tp.read_text())
    with pytest.raises(ValueError, match="one mode per block"):
        S.build(prof, MODES[:3], {})
    with pytest.raises(ValueError, match="unknown mode"):
        S.build(prof, ["x"] * 6, {})


def test_memcast_reads_the_trace_and_replays_the_plan_as_the_planner_predicts(tmp_path):
    prof, link, trace, plan, tp, pp = docs(tmp_path)
    rc, out, err = cli("trace", "import", tp, "-o", tmp_path / "run.mctrace")
    assert rc == 0, err
    rc, out, err = cli("trace", "stats", tmp_path / "run.mctrace", "--json")
    assert rc == 0, err
    st = json.loads(out)
    assert st["iterations"] == 3 and st["static_bytes"] == 256 * MB, st
    rc, out, err = cli("replay", tmp_path / "run.mctrace", "--budget", "8G", "--plan", pp,
                       "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert r["completed"] and r["plan"]["refused"] == 0, r
    steps = [c + s for c, s in zip(r["compute_per_iteration_us"], r["stall_per_iteration_us"])]
    # The planner's prediction of the same plan, plus the same time outside the blocks:
    # here the link hides every copy, so both are compute + recomputes.
    pred = P.simulate(prof, MODES, link, None, cap=0)
    assert pred["stall_s"] == 0
    want = (pred["step_s"] + 0.008) * 1e6
    for s in steps:
        assert s == pytest.approx(want, rel=0.01), (steps, want)
    assert r["recomputes"] == 9 and r["faults"] == 0


def test_bad_documents_are_errors_naming_the_file(tmp_path):
    prof, link, trace, plan, tp, pp = docs(tmp_path, iterations=1)
    bad = tmp_path / "bad.trace.json"
    bad.write_text(tp.read_text().replace('"Free"', '"Fre"', 1))
    rc, out, err = cli("trace", "stats", bad)
    assert rc != 0 and "bad.trace.json" in err and "byte offset" in err, err
    # A free of a tensor that is not live: the event index.
    t = json.loads(tp.read_text())
    frees = [i for i, e in enumerate(t["trace"]["events"]) if "Free" in str(e["kind"])]
    del t["trace"]["events"][frees[0] - 1:frees[0]]
    t["trace"]["events"].insert(1, {"time_us": 0, "kind": {"Free": {"id": 99999}}})
    bad.write_text(json.dumps(t))
    rc, out, err = cli("trace", "stats", bad)
    assert rc != 0 and "bad.trace.json" in err and "trace event 1" in err, err
    badplan = tmp_path / "bad.plan.json"
    p = json.loads(pp.read_text())
    p["directives"][0]["id"] = 99999
    badplan.write_text(json.dumps(p))
    rc, out, err = cli("replay", tp, "--budget", "8G", "--plan", badplan, "--json")
    assert rc != 0 and "tensor 99999 is not live" in err, err


ENGINE = r'''
import json, sys, torch
PRELUDE
def run_planned(path, plan_path):
    torch.manual_seed(0)
    seq = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh()) for _ in range(6)])
    opt = torch.optim.SGD(seq.parameters(), lr=0.1)
    off = O.Offload(list(seq), 1 << 30, min_bytes=1 << 10, modes=MODES)
    off.torch_device = torch.device("cpu")
    for _ in range(4):
        x = torch.randn(16, 256)
        loss = seq(x).pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad()
    off.flush()
    info = off.write_trace(path, plan_path, iterations=2)
    off.remove()
    return info
print(json.dumps(run_planned(sys.argv[1], sys.argv[2])))
'''


def test_a_cpu_offload_run_writes_a_trace_memcast_replays(tmp_path):
    pytest.importorskip("torch")
    src = open(os.path.join(HERE, "test_offload_cpu.py")).read()
    prelude = src.split("CODE = r'''")[1].split("def run(")[0]
    code = ENGINE.replace("PRELUDE", prelude).replace(
        "MODES", repr(["keep", "offload", "recompute", "offload_input", "recompute", "keep"]))
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.dirname(HERE) + os.pathsep + e.get("PYTHONPATH", "")
    tp, pp = tmp_path / "cpu.trace.json", tmp_path / "cpu.plan.json"
    p = subprocess.run([sys.executable, "-c", code, str(tp), str(pp)], capture_output=True,
                       text=True, timeout=300, env=e)
    assert p.returncode == 0, p.stdout + p.stderr
    info = json.loads(p.stdout.strip().splitlines()[-1])
    assert info["counts"] == {"keep": 2, "offload": 1, "recompute": 2, "offload_input": 1}
    t = json.loads(tp.read_text())["trace"]
    assert t["static_blocks"][0]["bytes"] == 10 << 20   # the faked memory_allocated
    # The time outside the blocks is measured in the iterations that ran the plan
    # (the backward's end marked by the first block's gradients); the faked events all
    # measure 0.01 ms.
    assert info["rest_from"].startswith("measured in the"), info["rest_from"]
    assert info["head_s"] == pytest.approx(1e-5)
    assert info["tail_s"] == pytest.approx(1e-5)
    rc, out, err = cli("trace", "stats", tp, "--json")
    assert rc == 0, err
    assert json.loads(out)["iterations"] == 2
    rc, out, err = cli("replay", tp, "--budget", "1G", "--plan", pp, "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert r["completed"] and r["plan"]["directives"] > 0 and r["plan"]["refused"] == 0, r


REPORT = r'''
import json, sys, torch
PRELUDE
sys.path.insert(0, SCRIPTS)
import oversub_replay as R
torch.manual_seed(0)
seq = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh()) for _ in range(6)])
opt = torch.optim.SGD(seq.parameters(), lr=0.1)
off = O.Offload(list(seq), 1 << 30, min_bytes=1 << 10)
off.torch_device = torch.device("cpu")
ts = []
for _ in range(5):
    x = torch.randn(16, 256)
    loss = seq(x).pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad()
    ts.append(0.01)
row = R.report(off, ts[-2:], 1 << 30, sys.argv[1], "tiny")
off.remove()
print(json.dumps(row))
'''


def test_the_gpu_scripts_report_runs_on_a_cpu_run(tmp_path):
    """scripts/oversub_replay.py's report (write the trace, replay it twice, one JSON
    line) on a planned CPU run with CUDA faked: what the GPU run does after its steps."""
    pytest.importorskip("torch")
    b = memcast_bin()
    if b is None:
        pytest.skip("no memcast binary")
    src = open(os.path.join(HERE, "test_offload_cpu.py")).read()
    prelude = src.split("CODE = r'''")[1].split("def run(")[0]
    # The repository's scripts/, or the folder scripts/stage-gpu.sh staged (the script
    # beside the package).
    scripts = next((d for d in (os.path.join(HERE, "..", "..", "..", "..", "scripts"),
                                os.path.join(HERE, "..", ".."))
                    if os.path.isfile(os.path.join(d, "oversub_replay.py"))), None)
    if scripts is None:
        pytest.fail("oversub_replay.py found neither in scripts/ nor beside the package")
    code = REPORT.replace("PRELUDE", prelude).replace("SCRIPTS", repr(os.path.abspath(scripts)))
    e = dict(os.environ, MEMCAST_BIN=b)
    e["PYTHONPATH"] = os.path.dirname(HERE) + os.pathsep + e.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                       text=True, timeout=300, env=e)
    assert p.returncode == 0, p.stdout + p.stderr
    row = json.loads(p.stdout.strip().splitlines()[-1])
    assert row["planner"]["rest_from"].startswith("measured in the"), row["planner"]
    assert row["measured"]["blocks_s"][-1] == pytest.approx(2e-5), row["measured"]
    assert row["sim_blocks_vs_measured"] is not None
    assert row["sim_plan"]["completed"] and row["sim_plan"]["step_s"] > 0, row["sim_plan"]
    assert row["sim_reactive"]["completed"], row["sim_reactive"]
    assert row["sim_vs_measured"] is not None
