#!/usr/bin/env python3
"""Checks that the measured tables in docs/ are what the code prints today.

Each table of docs/predictive.md is printed by an example of memcast-alloc, the test
split's table of docs/traces.md by `memcast corpus`, and docs/tiers.md's table of
budgets by the test `tier::replay_tests::replay_table`; docs/allocator.md's tables hold
columns of `replay_table` and `placement_table` among notes of their own, and its
ablation tables one `replay_table` run per configuration; docs/predictor.md's
leave-one-out and seeded synthetic tables come from `predictor/scripts/loo.sh` and
`memcast eval`. This script builds the
examples, runs each one and reports every row (or cell) it prints that the document does
not hold: a row that moved means
either a change of behaviour (which the commit that made it must say and measure) or a
table left stale. Run it before calling a change "same behaviour" and after
regenerating a table. About 6 minutes on 2 cores after a release build (the checks of
allocator.md, predictor.md and the targets of traces.md take about 1.5 of them).

    python3 scripts/check_doc_tables.py [--only NAME ...] [--dump DIR]

Exit status 1 if any row is missing, 0 otherwise. Tables whose cells depend on the host
clock (`predictive_tables presplit`: host time, events per second; allocator.md's replay
speed and fast-path tables) are not checked.
"""

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# `--dump DIR` and the check being run (see `check`).
DUMP = None
NAME = ""
FIGURES = "training-data/traces/pytorch_allocator_figures.jsonl"

# (name, example and arguments, document, how its rows appear there)
CHECKS = [
    ("nobudget", ["predictive_tables", "nobudget"], "docs/predictive.md", "rows"),
    ("budget", ["predictive_tables", "budget"], "docs/predictive.md", "rows"),
    ("ablation", ["predictive_tables", "ablation"], "docs/predictive.md", "lstm/oracle"),
    ("recompute", ["predictive_tables", "recompute"], "docs/predictive.md", "rows"),
    ("budget-validation", ["budget_split", "validation"], "docs/predictive.md", "rows"),
    ("budget-test", ["budget_split", "test"], "docs/predictive.md", "rows"),
    ("timeline-shape", ["timeline_shape"], "docs/tiers.md", "rows"),
    ("budget-spread-test", ["budget_split", "test", "60%", "spread"], "docs/tiers.md", "rows"),
    ("budget-launch-blocking", ["budget_split", "test", "60%",
                                "manifest=training-data/corpus/launch-blocking/manifest.tsv"],
     "docs/tiers.md", "rows"),
    ("budget-solo-test", ["budget_split", "test", "60%",
                          "manifest=training-data/corpus/launch-blocking-h100/manifest.tsv",
                          "solo=training-data/corpus/launch-blocking-h100/iteration-times.jsonl",
                          "costs=h100"],
     "docs/tiers.md", "rows"),
    ("nobudget-test", ["nobudget_split", "test"], "docs/predictive.md", "rows"),
    ("corpus-test", ["memcast", "corpus", "--split", "test"], "docs/traces.md", "corpus"),
    ("tiers", ["cargo", "test", "-q", "-p", "memcast-alloc", "--lib",
               "tier::replay_tests::replay_table", "--", "--nocapture"], "docs/tiers.md", "rows"),
    # docs/allocator.md composes its tables from columns of an example's table, with
    # notes and older figures beside them (see `subsequence_rows`), and its ablation
    # tables from one run per configuration (`variant_rows`).
    ("allocator-results", ["replay_table", FIGURES], "docs/allocator.md",
     ["kind", "memcast overhead", "memcast device allocs", "PyTorch native overhead",
      "PyTorch native device allocs", "PyTorch expandable overhead"]),
    ("allocator-emulation", ["replay_table", FIGURES], "docs/allocator.md",
     ["emulation peak reserved vs PyTorch", "same, no warm-up", "emulation device allocs",
      "PyTorch segments at the end", "PyTorch native device allocs"]),
    ("allocator-variants", ["replay_table", FIGURES], "docs/allocator.md", "variants"),
    ("placement-recorded", ["placement_table", "training-data/recorded/*_from_start_memcast.mctrace",
                            "--prefix", "3"], "docs/allocator.md",
     ["best fit", "planned", "profile, prefix (3 it.)", "profile, whole",
      "prefix profile hits / misses"]),
    ("placement-test", ["placement_table", "test", "--prefix", "3"], "docs/allocator.md",
     ["shapes", "best fit", "profile, prefix (3 it.)", "PyTorch expandable"]),
    # docs/traces.md's table of the targets: the counts `memcast corpus` prints under its
    # table, per split, with the defaults and with `--conf page_release:peak`.
    ("corpus-counts", ["memcast", "corpus", "training-data/corpus/manifest.tsv"],
     "docs/traces.md", "corpus-counts"),
    # Its table of page release at the peak: `memcast corpus --split test --json`, with
    # the defaults and with `--conf page_release:peak`.
    ("corpus-peak", ["memcast", "corpus", "training-data/corpus/manifest.tsv"],
     "docs/traces.md", "corpus-peak"),
    # docs/predictor.md's held-out synthetic workloads: the default model's `memcast eval`
    # on each trace `predictor/scripts/synth-set.sh` draws with seed 1000.
    ("predictor-synthetic", ["memcast", "eval"], "docs/predictor.md", "synthetic-eval"),
    # Its leave-one-out table: `predictor/scripts/loo.sh` with the seed-1 synthetic set
    # (8 trainings, deterministic; ~30 s).
    ("predictor-loo", ["memcast", "train"], "docs/predictor.md", "loo"),
]

# The doc tables of configurations: the first header cell names the table; each row's
# configuration is the last `...` of its first cell (`-` or none: the defaults), or for
# the table of `growth_small_chunk` that key at the row's first word.
VARIANT_TABLES = ("variant (`MEMCAST_ALLOC_CONF`)", "growth", "`growth_small_chunk`")


def table_rows(text):
    """The body rows of every Markdown table in `text` (headers and rules left out)."""
    lines = text.splitlines()
    rows = []
    for i, line in enumerate(lines):
        if not line.startswith("| "):
            continue
        is_header = i + 1 < len(lines) and lines[i + 1].startswith("|---")
        if is_header:
            continue
        rows.append(line.strip())
    return rows


def merged_lstm_oracle(rows):
    """`predictive_tables ablation` prints one row per forecaster; the document joins
    the LSTM's and the oracle's cells of one trace and action set as `a / b`."""
    by_key = {}
    order = []
    for row in rows:
        c = cells(row)
        key = (c[0], c[1])
        if key not in by_key:
            by_key[key] = {}
            order.append(key)
        by_key[key][c[2]] = c[3:]
    out = []
    for key in order:
        f = by_key[key]
        if "lstm" in f and "oracle" in f:
            joined = " | ".join(f"{a} / {b}" for a, b in zip(f["lstm"], f["oracle"]))
            out.append(f"| {key[0]} | {key[1]} | {joined} |")
    return out


def corpus_rows(text):
    """`memcast corpus` prints a fixed-width table; docs/traces.md holds it as
    Markdown, with `static`/`dynamic` spelled out and the WAPE cells as `a / b name`."""
    kinds = {"stat": "static", "dyn": "dynamic"}
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 9 or f[1] not in kinds:
            continue
        wape = " ".join(f[8:])
        if wape != "-":
            wape = " ".join(
                w.replace("/", " / ") if w[:1].isdigit() else w.replace("_", " ")
                for w in wape.split()
            )
        cells = [f[0], kinds[f[1]]] + f[2:8] + [wape]
        out.append("| " + " | ".join(cells) + " |")
    return out


def cells(row):
    return [x.strip() for x in row.strip().strip("|").split("|")]


def printed(text):
    """`replay_table`'s rows as dicts keyed by its header."""
    lines = [l for l in text.splitlines() if l.startswith("| ")]
    head = cells(lines[0])
    return [dict(zip(head, cells(l))) for l in lines[1:] if not l.startswith("|---")]


def first_word(cell):
    """A doc cell's figure: bold and any words after it (notes, older figures) left out."""
    return cell.replace("**", "").split(" ")[0] if cell else ""


def doc_tables(text):
    """Every Markdown table of `text`: (header cells, body rows as cell lists)."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            head = cells(lines[i])
            body = []
            i += 2
            while i < len(lines) and lines[i].startswith("| "):
                body.append(cells(lines[i]))
                i += 1
            out.append((head, body))
        else:
            i += 1
    return out


def subsequence_rows(text, doc, cols):
    """The doc's tables hold an example's figures among other cells (bold, notes, older
    figures in parentheses): each printed row must have a doc row of the same trace
    whose cells, by their first word, hold the printed cells `cols` (by their first
    word) in order. Returns (rows checked, rows missing)."""
    rows = [b for _, body in doc_tables(doc) for b in body]
    checked, missing = 0, []
    for r in printed(text):
        need = [first_word(r[c]) for c in cols]
        checked += 1
        ok = False
        for b in rows:
            if b[0] != r["trace"]:
                continue
            words = iter(first_word(c) for c in b[1:])
            if all(any(w == x for w in words) for x in need):
                ok = True
                break
        if not ok:
            missing.append(f"{r['trace']}: {' | '.join(need)}")
    return checked, missing


def variant_rows(argv, doc):
    """Each row of docs/allocator.md's tables of configurations against `replay_table`
    run with that row's `MEMCAST_ALLOC_CONF` (cells `overhead / device allocs`)."""
    checked, missing, runs = 0, [], {}
    for head, body in doc_tables(doc):
        if head[0] not in VARIANT_TABLES:
            continue
        for b in body:
            if head[0] == "`growth_small_chunk`":
                conf = "growth_small_chunk:" + first_word(b[0])
            else:
                quoted = re.findall(r"`([^`]*)`", b[0])
                conf = quoted[-1] if quoted else "-"
            if conf not in runs:
                env = dict(os.environ)
                env.pop("MEMCAST_ALLOC_CONF", None)
                if conf != "-":
                    env["MEMCAST_ALLOC_CONF"] = conf
                run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env)
                if run.returncode != 0:
                    missing.append(f"`{conf}`: replay_table failed: {run.stderr.strip()}")
                    runs[conf] = None
                    continue
                runs[conf] = printed(run.stdout)
            got = runs[conf]
            if got is None:
                continue
            for h, cell in zip(head[1:], b[1:]):
                name = h.split(" ")[0]
                trace = next((r for r in got if r["trace"].startswith(name)), None) or next(
                    (r for r in got if name in r["trace"]), None)
                checked += 1
                if trace is None:
                    missing.append(f"{head[0]} / {h}: no trace named so")
                    continue
                expect = f"{trace['memcast overhead']} / {trace['memcast device allocs']}"
                if cell != expect:
                    missing.append(f"`{conf}` on {trace['trace']}: doc {cell}, code {expect}")
    return checked, missing


def synthetic_eval_rows(memcast):
    """The rows of docs/predictor.md's table of seeded synthetic workloads: `memcast
    eval` (per-step WAPE) on the set `synth-set.sh` draws with seed 1000."""
    rows = []
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([os.path.join(ROOT, "predictor", "scripts", "synth-set.sh"), memcast, d,
                        "1000"], cwd=ROOT, check=True, capture_output=True)
        for f in sorted(glob.glob(os.path.join(d, "*.mctrace"))):
            out = subprocess.run([memcast, "eval", "--trace", f], cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout
            per_step = out.split("peak rise")[0]
            head = per_step.splitlines()[0]
            wape = {p[0]: p[1] for p in (l.split() for l in per_step.splitlines()) if len(p) == 4}
            ratio = re.search(r"= ([0-9.]+)", per_step).group(1)
            cols = ["lstm", "last_value", "moving_average", "seasonal_naive", "seasonal_rescaled"]
            steps = re.search(r"\((\d+) steps", head).group(1)
            rows.append("| " + " | ".join([head.split()[0], steps] + [wape[c] for c in cols]
                                          + [ratio]) + " |")
    return rows


def loo_rows(memcast, doc):
    """docs/predictor.md's leave-one-out table: each trace's WAPEs and ratio (from
    `loo.sh`'s JSON) among the cells of the doc row of that trace."""
    with tempfile.TemporaryDirectory() as d:
        syn, out = os.path.join(d, "syn"), os.path.join(d, "loo")
        subprocess.run([os.path.join(ROOT, "predictor", "scripts", "synth-set.sh"), memcast, syn,
                        "1"], cwd=ROOT, check=True, capture_output=True)
        subprocess.run([os.path.join(ROOT, "predictor", "scripts", "loo.sh"), memcast, out],
                       cwd=ROOT, check=True, capture_output=True, env=dict(os.environ, EXTRA=syn))
        lines = ["| trace | lstm | last_value | moving_average | seasonal_naive | seasonal_rescaled | ratio |",
                 "|---|---|---|---|---|---|---|"]
        for p in sorted(glob.glob(os.path.join(out, "*.json"))):
            r = json.load(open(p))
            m = r["models"]
            w = [f"{m[k]['wape']:.4f}" for k in ["lstm", "last_value", "moving_average",
                                                  "seasonal_naive", "seasonal_rescaled"]]
            lines.append("| " + " | ".join([r["trace"]] + w + [f"{r['lstm_vs_best_baseline']:.3f}"]) + " |")
    return subsequence_rows("\n".join(lines), doc,
                            ["lstm", "last_value", "moving_average", "seasonal_naive",
                             "seasonal_rescaled", "ratio"])


# docs/traces.md's rows of the targets table: (its first cell, the line of `memcast
# corpus` that gives it, the variant: None for the defaults, "peak" with
# `--conf page_release:peak`, "from-start" on the corpus recorded from the process's
# start); the doc's columns are the splits.
COUNT_ROWS = [
    ("memcast reserved overhead at or below expandable segments",
     "memcast at or below expandable segments", None),
    ("the same with `--conf page_release:peak`", "memcast at or below expandable segments", "peak"),
    ("memcast overhead at most 2% on static traces",
     "static traces with memcast overhead at most 2%", None),
    ("the same with `--conf page_release:peak`",
     "static traces with memcast overhead at most 2%", "peak"),
    ("PyTorch emulation within 5% of native peak reserved",
     "PyTorch emulation within 5% of native peak reserved", None),
    ("LSTM WAPE at most 0.8x the best non-learned forecaster (dynamic)",
     "dynamic traces with LSTM WAPE at most 0.8x the best non-learned forecaster", None),
    ("the same on the horizon's peak rise of live bytes",
     "the same on the horizon's peak rise of live bytes (what predictive mode acts on)", None),
    ("tiered replay at 60% completes", "tiered replays completed", None),
    ("the same on traces recorded from the process's start (below)",
     "PyTorch emulation within 5% of native peak reserved", "from-start"),
]


def corpus_count_cells(argv, doc):
    """Each cell of docs/traces.md's targets table against `memcast corpus --split S`
    (`--conf page_release:peak`, or the from-start manifest, for the rows that say so):
    the cell starts `N of M`."""
    table = next(body for head, body in doc_tables(doc) if head[:2] == ["check", "test"])
    splits = ["test", "train", "validation"]
    counts = {}
    variants = {
        None: argv,
        "peak": argv + ["--conf", "page_release:peak"],
        "from-start": [a.replace("corpus/manifest.tsv", "corpus/from-start/manifest.tsv")
                       for a in argv],
    }
    for peak, args in variants.items():
        for split in splits:
            out = subprocess.run(args + ["--split", split], cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout
            for line in out.splitlines():
                label, _, value = line.rpartition(": ")
                if " of " in value:
                    counts[(label, peak, split)] = value.strip()
    checked, missing, seen = 0, [], {}
    for first, label, peak in COUNT_ROWS:
        k = seen.get(first, 0)
        seen[first] = k + 1
        rows = [b for b in table if b[0] == first]
        if len(rows) <= k:
            missing.append(f"no row `{first}`")
            continue
        for split, cell in zip(splits, rows[k][1:]):
            checked += 1
            want = counts.get((label, peak, split))
            if want is None or not cell.startswith(want):
                missing.append(f"{first} ({split}{', ' + peak if peak else ''}): doc {cell}, code {want}")
    return checked, missing


def corpus_peak_rows(argv):
    """docs/traces.md's rows of page release at the peak, from `memcast corpus --split
    test --json` with the defaults and with `--conf page_release:peak`."""
    def run(extra):
        out = subprocess.run(argv + ["--split", "test", "--json"] + extra, cwd=ROOT,
                             check=True, capture_output=True, text=True).stdout
        rows = (json.loads(line) for line in out.splitlines() if line.strip())
        return [r for r in rows if "workload" in r]
    rows = []
    for d, p in zip(run([]), run(["--conf", "page_release:peak"])):
        m, q = d["memcast"], p["memcast"]
        cells = [
            d["workload"], "dynamic" if d["dynamic"] else "static",
            f"{100 * m['reserved_overhead']:.2f}%", f"{100 * q['reserved_overhead']:.2f}%",
            f"{100 * d['pytorch_expandable']['reserved_overhead']:.2f}%",
            f"{m['device_allocs']} -> {q['device_allocs']}",
            str(q["critical_path_device_calls_after_first_iteration"]),
            f"{m['device_time_us'] / 1000:.0f} -> {q['device_time_us'] / 1000:.0f}",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def dump(rows):
    """With `--dump DIR`, writes `rows` to DIR/NAME.rows (NAME: the check being run)."""
    if DUMP:
        with open(os.path.join(DUMP, NAME + ".rows"), "w") as f:
            f.write("".join(r + "\n" for r in rows))
    return rows


def check(argv, cmd, text, how):
    """Runs one check: (rows or cells checked, those the document does not hold, unit)."""
    if how == "variants":
        return (*variant_rows(argv, text), "cells")
    if how == "corpus-counts":
        return (*corpus_count_cells(argv, text), "cells")
    if how == "corpus-peak":
        rows = dump(corpus_peak_rows(argv))
        return len(rows), [r for r in rows if r not in text], "rows"
    if how == "loo":
        return (*loo_rows(argv[0], text), "rows")
    if how == "synthetic-eval":
        rows = dump(synthetic_eval_rows(argv[0]))
        return len(rows), [r for r in rows if r not in text], "rows"
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        return 1, [f"`{' '.join(cmd)}` failed:\n{run.stderr}"], "runs"
    if isinstance(how, list):
        return (*subsequence_rows(run.stdout, text, how), "rows")
    rows = table_rows(run.stdout)
    if how == "corpus":
        rows = corpus_rows(run.stdout)
    elif how == "lstm/oracle":
        rows = merged_lstm_oracle(rows)
    rows = dump(rows)
    return len(rows), [r for r in rows if r not in text], "rows"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="names of the checks to run")
    ap.add_argument("--dump", metavar="DIR",
                    help="also write the rows each whole-row check prints, as the "
                    "document holds them, to DIR/NAME.rows (one per line; to regenerate a "
                    "table); the checks of cells and of columns write nothing")
    args = ap.parse_args()
    global DUMP, NAME
    DUMP = args.dump
    checks = [c for c in CHECKS if not args.only or c[0] in args.only]
    if DUMP:
        os.makedirs(DUMP, exist_ok=True)
        # A check that fails writes nothing: no file of an earlier dump stays behind.
        for c in checks:
            stale = os.path.join(DUMP, c[0] + ".rows")
            if os.path.exists(stale):
                os.remove(stale)
    unknown = set(args.only or []) - {c[0] for c in CHECKS}
    if unknown:
        sys.exit(f"unknown check(s): {', '.join(sorted(unknown))}; known: "
                 + ", ".join(c[0] for c in CHECKS))
    examples = sorted({c[1][0] for c in checks if c[1][0] not in ("memcast", "cargo")})
    if examples:
        build = ["cargo", "build", "--release", "-p", "memcast-alloc"]
        for e in examples:
            build += ["--example", e]
        subprocess.run(build, cwd=ROOT, check=True)
    if any(c[1][0] == "memcast" for c in checks):
        subprocess.run(["cargo", "build", "--release", "-p", "memcast"], cwd=ROOT, check=True)
    missing_total = 0
    for name, cmd, doc, how in checks:
        NAME = name
        if cmd[0] == "cargo":
            argv = cmd
        elif cmd[0] == "memcast":
            argv = [os.path.join(ROOT, "target", "release", "memcast")] + cmd[1:]
        else:
            argv = [os.path.join(ROOT, "target", "release", "examples", cmd[0])]
            for a in cmd[1:]:
                argv += sorted(glob.glob(os.path.join(ROOT, a))) if "*" in a else [a]
        with open(os.path.join(ROOT, doc)) as f:
            text = f.read()
        n, missing, unit = check(argv, cmd, text, how)
        missing_total += len(missing)
        print(f"{name}: {n} {unit}, " + ("ok" if not missing else f"{len(missing)} not in {doc}"))
        for r in missing:
            print(f"    {r}")
    sys.exit(1 if missing_total else 0)


if __name__ == "__main__":
    main()
