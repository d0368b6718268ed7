#!/usr/bin/env python3
"""Reactive against predictive mode in real jobs: one line per workload.

Reads the JSON figures `record.py --mode memcast` writes (one object per run, any
number of files or JSON-lines files) and pairs the runs of each workload by their
`allocator` tag: `memcast-reactive` against `memcast-predictive` by default, or
`--tags A,B`. Runs of the same tag (rounds: `reactive-1`, `reactive-2`, ... with
`--rounds`) are pooled. Per workload and tag, over the iterations after the first:

- `crit`: device calls a request had to wait for; `ahead`: calls made ahead of need;
- `malloc`: host time inside the allocator's malloc, ms per iteration;
- `device`: time inside device calls (growth, release), ms per iteration;
- `iter`: the median iteration time, ms.

The last line counts the workloads where the second tag's `crit` is at most half of
the first's (both 0 counts).

    python3 scripts/corpus/compare_modes.py FIG.jsonl [...] [--tags A,B] [--split S] [--rounds]
"""
import argparse
import json
import statistics


def load(paths):
    for p in paths:
        with open(p) as f:
            text = f.read().strip()
        if not text:
            continue
        try:
            yield json.loads(text)
        except json.JSONDecodeError:
            for n, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as e:
                        raise SystemExit(f"{p}: line {n}: not JSON: {e}")


def after_first(r, key):
    v = r.get(key)
    return None if v is None else v[1:]


def summary(runs):
    def pooled(key):
        xs = [after_first(r, key) for r in runs]
        xs = [x for x in xs if x is not None]
        return [y for x in xs for y in x] if xs else None

    iters = pooled("iteration_s") or []
    malloc = pooled("malloc_ms_per_iteration")
    device = pooled("device_call_ms_per_iteration")
    return {
        "n": len(runs),
        "crit": sum(sum(after_first(r, "critical_device_calls_per_iteration") or [])
                    for r in runs) / len(runs),
        "ahead": sum(sum(after_first(r, "ahead_device_calls_per_iteration") or [])
                     for r in runs) / len(runs),
        "malloc": statistics.mean(malloc) if malloc else None,
        "device": statistics.mean(device) if device else None,
        "iter": 1e3 * statistics.median(iters) if iters else None,
    }


def fmt(s):
    if s is None:
        return "-"
    f = lambda x, d: "-" if x is None else f"{x:.{d}f}"
    return (f"crit {s['crit']:5.1f} ahead {s['ahead']:5.1f} malloc {f(s['malloc'], 2):>6} "
            f"device {f(s['device'], 2):>6} iter {f(s['iter'], 1):>7}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--tags", default="reactive,predictive")
    ap.add_argument("--split", help="only workloads of this split (train, validation, test)")
    ap.add_argument("--rounds", action="store_true",
                    help="pool tags with a round suffix (reactive-1, reactive-2, ...)")
    a = ap.parse_args()
    tags = a.tags.split(",")
    if len(tags) != 2:
        raise SystemExit("--tags takes two tags, A,B")
    by = {}
    for r in load(a.files):
        if a.split and r.get("split") != a.split:
            continue
        tag = r.get("allocator", "").removeprefix("memcast-")
        if a.rounds:
            tag = tag.rsplit("-", 1)[0]
        by.setdefault(r["name"], {}).setdefault(tag, []).append(r)
    halved = both = 0
    for name in sorted(by):
        s = [summary(by[name][t]) if by[name].get(t) else None for t in tags]
        print(f"{name:36s} | {tags[0]}: {fmt(s[0])} | {tags[1]}: {fmt(s[1])}")
        if s[0] and s[1]:
            both += 1
            halved += s[1]["crit"] <= s[0]["crit"] / 2
    print(f"{tags[1]} at most half of {tags[0]}'s calls in requests after the first "
          f"iteration: {halved} of {both}")


if __name__ == "__main__":
    main()
