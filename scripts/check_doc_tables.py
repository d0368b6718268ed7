#!/usr/bin/env python3
"""Checks that the measured tables in docs/ are what the code prints today.

Each table of docs/predictive.md is printed by an example of memcast-alloc, the test
split's table of docs/traces.md by `memcast corpus`, and docs/tiers.md's table of
budgets by the test `tier::replay_tests::replay_table`. This script builds the examples, runs each one and reports
every row it prints that the document does not hold verbatim: a row that moved means
either a change of behaviour (which the commit that made it must say and measure) or a
table left stale. Run it before calling a change "same behaviour" and after
regenerating a table. About 5 minutes on 2 cores after a release build.

    python3 scripts/check_doc_tables.py [--only NAME ...]

Exit status 1 if any row is missing, 0 otherwise. Tables whose cells depend on the host
clock (`predictive_tables presplit`: host time, events per second) are not checked.
"""

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, example and arguments, document, how its rows appear there)
CHECKS = [
    ("nobudget", ["predictive_tables", "nobudget"], "docs/predictive.md", "rows"),
    ("budget", ["predictive_tables", "budget"], "docs/predictive.md", "rows"),
    ("ablation", ["predictive_tables", "ablation"], "docs/predictive.md", "lstm/oracle"),
    ("recompute", ["predictive_tables", "recompute"], "docs/predictive.md", "rows"),
    ("budget-validation", ["budget_split", "validation"], "docs/predictive.md", "rows"),
    ("budget-test", ["budget_split", "test"], "docs/predictive.md", "rows"),
    ("nobudget-test", ["nobudget_split", "test"], "docs/predictive.md", "rows"),
    ("corpus-test", ["memcast", "corpus", "--split", "test"], "docs/traces.md", "corpus"),
    ("tiers", ["cargo", "test", "-q", "-p", "memcast-alloc", "--lib",
               "tier::replay_tests::replay_table", "--", "--nocapture"], "docs/tiers.md", "rows"),
]


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
    cells = {}
    order = []
    for row in rows:
        c = [x.strip() for x in row.strip("|").split("|")]
        key = (c[0], c[1])
        if key not in cells:
            cells[key] = {}
            order.append(key)
        cells[key][c[2]] = c[3:]
    out = []
    for key in order:
        f = cells[key]
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="names of the checks to run")
    args = ap.parse_args()
    checks = [c for c in CHECKS if not args.only or c[0] in args.only]
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
        if cmd[0] == "cargo":
            argv = cmd
        elif cmd[0] == "memcast":
            argv = [os.path.join(ROOT, "target", "release", "memcast")] + cmd[1:]
        else:
            argv = [os.path.join(ROOT, "target", "release", "examples", cmd[0])] + cmd[1:]
        run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        if run.returncode != 0:
            print(f"{name}: `{' '.join(cmd)}` failed:\n{run.stderr}")
            missing_total += 1
            continue
        rows = table_rows(run.stdout)
        if how == "corpus":
            rows = corpus_rows(run.stdout)
        elif how == "lstm/oracle":
            rows = merged_lstm_oracle(rows)
        with open(os.path.join(ROOT, doc)) as f:
            text = f.read()
        missing = [r for r in rows if r not in text]
        missing_total += len(missing)
        status = "ok" if not missing else f"{len(missing)} not in {doc}"
        print(f"{name}: {len(rows)} rows, {status}")
        for r in missing:
            print(f"    {r}")
    sys.exit(1 if missing_total else 0)


if __name__ == "__main__":
    main()
