"""GPU tests of memcast_torch.offload: the same losses and gradients as a run without
it, with blocks kept, offloaded through memcast's pinned pool and recomputed; a budget
too small for any plan is an error before the first step; a new input shape is
profiled and planned again. Each test runs in its own interpreter (as
test_memcast_torch.py). Skipped without a GPU."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)

COMMON = """
import json, torch, memcast_torch as mt
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

def convnet():
    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(3, 32, 3, padding=1)]
    for _ in range(6):
        layers += [torch.nn.BatchNorm2d(32), torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 3, padding=1)]
    seq = torch.nn.Sequential(*layers).cuda()
    head = torch.nn.Linear(32, 10).cuda()
    return seq, head

def run_conv(wrap, steps=3, batch=64, size=32, budget=None, modes=None, min_bytes=1 << 16,
             segment_cap=None):
    seq, head = convnet()
    params = list(seq.parameters()) + list(head.parameters())
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    off = mt.offload(list(seq), budget=budget or (64 << 30), modes=modes, host_bytes=1 << 30,
                     min_bytes=min_bytes, segment_cap=segment_cap) if wrap else None
    g = torch.Generator(device="cuda").manual_seed(1)
    losses, grads = [], []
    for s in range(steps):
        b = batch if not isinstance(batch, list) else batch[s]
        x = torch.randn(b, 3, size, size, device="cuda", generator=g)
        y = torch.randint(0, 10, (b,), device="cuda", generator=g)
        h = seq(x)
        loss = torch.nn.functional.cross_entropy(head(h.mean((2, 3))), y)
        loss.backward()
        losses.append(loss.item())
        grads.append([p.grad.detach().clone() for p in params])
        opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    st = None
    if off is not None:
        off.flush()
        st = {"iters": off.iterations(), "stats": off.stats(), "shapes": len(off.shapes)}
        off.remove()
    return losses, grads, st

def compare(a, b):
    la, ga, _ = a
    lb, gb, _ = b
    bitwise = la == lb and all(torch.equal(x, y) for gs, hs in zip(ga, gb) for x, y in zip(gs, hs))
    rel = 0.0
    for gs, hs in zip(ga, gb):
        for x, y in zip(gs, hs):
            rel = max(rel, ((x - y).abs().max() / (y.abs().max() + 1e-30)).item())
    lrel = max(abs(p - q) / max(abs(q), 1e-30) for p, q in zip(la, lb))
    return {"bitwise": bitwise, "grad_rel": rel, "loss_rel": lrel}
"""


def run(code, timeout=300):
    e = dict(os.environ)
    e["PYTHONPATH"] = PKG + os.pathsep + e.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", COMMON + textwrap.dedent(code)],
                       capture_output=True, text=True, timeout=timeout, env=e)
    if p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    print(p.stdout[-4000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_forced_modes_match_the_uncapped_run_bitwise():
    r = run(
        """
        ref = run_conv(False)
        n = len(convnet()[0])
        modes = [("keep", "offload", "recompute")[i % 3] for i in range(n)]
        got = run_conv(True, modes=modes)
        it = got[2]["iters"][-1]
        # Runs of recomputed blocks recomputed as one segment each.
        seg = run_conv(True, modes=["recompute"] * 8 + ["offload"] + ["recompute"] * (n - 9),
                       segment_cap=1 << 40)
        # Recomputed blocks whose input is offloaded: block by block, and as the first
        # blocks of segments (2..9 and 11..18).
        in_modes = [("recompute", "offload_input", "offload_input", "keep", "offload")[i % 5]
                    for i in range(n)]
        ins = run_conv(True, modes=in_modes)
        in_seg_modes = (["keep", "keep", "offload_input"] + ["recompute"] * 7 + ["offload"]
                        + ["offload_input"] + ["recompute"] * (n - 12))
        in_seg = run_conv(True, modes=in_seg_modes, segment_cap=1 << 40)
        # Control: a prefetch that skips its copy (the device buffer left as allocated)
        # must change the gradients, or the comparison could not fail.
        from memcast_torch import offloading
        real = offloading.Offload._fetch
        def broken(self, s):
            dst = torch.full((s.nbytes,), 7, dtype=torch.uint8, device="cuda")
            s.ev_in = torch.cuda.Event(); s.ev_in.record()
            s.prefetched = dst
            return dst
        offloading.Offload._fetch = broken
        bad = run_conv(True, modes=modes)
        # Only inputs offloaded: the same broken prefetch must change them too (the
        # inputs do go through the pool).
        bad_in = run_conv(True, modes=["recompute"] + ["offload_input"] * (n - 1))
        offloading.Offload._fetch = real
        print(json.dumps({"eq": compare(got, ref), "bad": compare(bad, ref), "it": it,
                          "seg": compare(seg, ref), "ins": compare(ins, ref),
                          "in_seg": compare(in_seg, ref), "bad_in": compare(bad_in, ref),
                          "ins_it": ins[2]["iters"][-1], "in_seg_it": in_seg[2]["iters"][-1],
                          "in_pool": in_seg[2]["stats"]["pool"], "n": n,
                          "bad_in_it": bad_in[2]["iters"][-1],
                          "pool": got[2]["stats"]["pool"], "link": got[2]["stats"]["link"]}))
        """
    )
    assert r["eq"]["bitwise"], r["eq"]
    assert r["seg"]["bitwise"], r["seg"]
    assert r["ins"]["bitwise"], r["ins"]
    assert r["in_seg"]["bitwise"], r["in_seg"]
    assert not r["bad"]["bitwise"] and r["bad"]["grad_rel"] > 1e-3, r["bad"]
    assert not r["bad_in"]["bitwise"] and r["bad_in"]["grad_rel"] > 1e-3, r["bad_in"]
    for key in ("ins_it", "in_seg_it"):
        i = r[key]
        assert i["spilled_bytes"] > 0, i
        assert i["prefetched_bytes"] + i["demand_bytes"] == i["spilled_bytes"], i
    # Every block's input but the first's (each 64 x 32 x 32 x 32 fp32, 8 MiB), once.
    assert r["bad_in_it"]["spilled_bytes"] == (r["n"] - 1) << 23, r["bad_in_it"]
    assert r["in_pool"]["ranges"] == 0
    it = r["it"]
    # The step's GPU time in four parts: the blocks' forward, the head, backward through
    # the blocks (to the first block's gradients), the rest. The marks come in that
    # order (a negative span would be a mark recorded out of order: the backward's end
    # before backward reached the blocks, or after the next step began).
    parts = [it[k] for k in ("fwd_s", "head_s", "bwd_s", "tail_s")]
    assert all(p is not None and p >= 0 for p in parts), it
    assert it["bwd_s"] > 0 and it["fwd_s"] > 0, it
    assert it["spilled_bytes"] > 0 and it["prefetched_bytes"] + it["demand_bytes"] == it["spilled_bytes"]
    assert it["recomputed_bytes"] > 0
    assert r["pool"]["ranges"] == 0, "every host range given back"
    assert r["link"]["d2h"] > 5e9 and r["link"]["h2d"] > 5e9


def test_planned_run_under_a_budget_matches_and_replans_on_a_new_shape():
    r = run(
        """
        ref = run_conv(False, steps=6, batch=[64, 64, 64, 96, 96, 96])
        torch.cuda.empty_cache()
        seq, head = convnet()
        base = torch.cuda.memory_allocated()
        del seq, head
        got = run_conv(True, steps=6, batch=[64, 64, 64, 96, 96, 96], budget=base + (1 << 30),
                       min_bytes=1 << 16)
        its = got[2]["iters"]
        print(json.dumps({"eq": compare(got, ref), "shapes": got[2]["shapes"],
                          "modes": [i["modes"] for i in its],
                          "peaks": [i["peak_allocated"] for i in its], "budget": base + (1 << 30)}))
        """
    )
    assert r["eq"]["bitwise"] or (r["eq"]["grad_rel"] < 1e-6 and r["eq"]["loss_rel"] < 1e-6), r["eq"]
    assert r["shapes"] == 2
    modes = r["modes"]
    assert set(modes[0]) == {"recompute"} and set(modes[3]) == {"recompute"}, "calibration steps"
    assert any(m != "recompute" for m in modes[1]), modes[1]


def test_a_budget_only_offloaded_inputs_fit_trains_and_matches():
    r = run(
        """
        from memcast_torch import plan as P
        ref = run_conv(False, steps=6, batch=128)
        torch.cuda.empty_cache()
        # The profile of this net at this batch (a budget large enough for anything).
        seq, head = convnet()
        off = mt.offload(list(seq), budget=64 << 30, host_bytes=1 << 30, min_bytes=1 << 16)
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        x = torch.randn(128, 3, 32, 32, device="cuda")
        seq(x).sum().backward()
        off.flush()
        st = off.stats()
        prof = [P.BlockProfile(p["fwd_s"], p["bwd_s"], p["saved"], p["inp"])
                for p in st["profile"]]
        link = P.Link(d2h=st["link"]["d2h"], h2d=st["link"]["h2d"], pool=1 << 30)
        off.remove()
        del seq, head, off, x
        torch.cuda.empty_cache()
        kept = P.min_peak(base, prof)
        least = P.min_peak(base, prof, link)
        # Below what every block recomputed with its input kept needs (the bound that
        # made this an error before inputs could be offloaded), above the least peak
        # with inputs offloaded.
        budget = int(least + 0.5 * (kept - least))
        got = run_conv(True, steps=6, batch=128, budget=budget, min_bytes=1 << 16)
        its = got[2]["iters"]
        print(json.dumps({"eq": compare(got, ref), "kept": kept, "budget": budget, "least": least,
                          "modes": [i["modes"] for i in its],
                          "spilled": [i["spilled_bytes"] for i in its],
                          "peaks": [i["peak_allocated"] for i in its]}))
        """
    )
    assert r["least"] < r["budget"] < r["kept"], r
    assert r["eq"]["bitwise"] or (r["eq"]["grad_rel"] < 1e-6 and r["eq"]["loss_rel"] < 1e-6), r["eq"]
    cal = r["modes"][0]
    assert "offload_input" in cal and set(cal) <= {"recompute", "offload_input"}, cal
    assert all("offload_input" in m for m in r["modes"]), r["modes"]
    assert all(s > 0 for s in r["spilled"]), r["spilled"]


def test_a_budget_too_small_is_an_error_before_the_first_step():
    r = run(
        """
        seq, head = convnet()
        opt = torch.optim.SGD(seq.parameters(), lr=0.1)
        w0 = seq[0].weight.detach().clone()
        off = mt.offload(list(seq), budget=1 << 20, host_bytes=1 << 30)
        x = torch.randn(64, 3, 32, 32, device="cuda")
        try:
            seq(x).sum().backward()
            err = None
        except mt.PlanError as e:
            err = str(e)
        print(json.dumps({"err": err, "grad": seq[0].weight.grad is not None,
                          "same": torch.equal(w0, seq[0].weight)}))
        """
    )
    assert r["err"] and "too small for any plan" in r["err"], r
    assert not r["grad"] and r["same"]


def test_gpt2_blocks_with_dropout_and_bf16_match():
    pytest.importorskip("transformers")
    r = run(
        """
        import transformers as T
        def run_gpt(wrap, modes=None):
            torch.manual_seed(0)
            cfg = T.GPT2Config(n_layer=4, n_embd=128, n_head=4, n_positions=128, vocab_size=1000, use_cache=False)
            model = T.GPT2LMHeadModel(cfg).cuda().train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            off = mt.offload(model.transformer.h, budget=64 << 30, modes=modes, host_bytes=1 << 30,
                             min_bytes=1 << 14) if wrap else None
            g = torch.Generator(device="cuda").manual_seed(3)
            losses, grads = [], []
            for s in range(3):
                ids = torch.randint(0, 1000, (8, 128), device="cuda", generator=g)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                losses.append(loss.item())
                grads.append([p.grad.detach().clone() for p in model.parameters() if p.grad is not None])
                opt.step(); opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            st = None
            if off is not None:
                off.flush(); st = off.iterations()[-1]; off.remove()
            return losses, grads, st
        ref = run_gpt(False)
        got = run_gpt(True, modes=["offload", "recompute", "keep", "offload"])
        print(json.dumps({"eq": compare(got, ref), "it": got[2]}))
        """
    )
    assert r["eq"]["bitwise"] or (r["eq"]["grad_rel"] < 1e-6 and r["eq"]["loss_rel"] < 1e-6), r["eq"]
    assert r["it"]["spilled_bytes"] > 0
