#!/usr/bin/env python3
"""Independent count of PyTorch snapshot statistics, to check `memcast trace stats`.

Written separately from the Rust importer (plain `pickle.load`, no shared code) so that
the two can disagree. Usage: independent_stats.py FILE... > stats.json (one JSON object
per line). Marker allocations (7,341,568 B, freed right away) count as iteration
boundaries, not allocations, as memcast's importer does by default.
"""
import json
import lzma
import pickle
import sys

MARKER = 7_341_568


def load(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rb") as f:
        return pickle.load(f)


def stats(path):
    snap = load(path)
    ev = snap["device_traces"][0]
    live = {}  # addr -> size, for trace allocations
    markers = set()
    allocs = frees = boundaries = 0
    static_freed = []
    cur = peak = 0
    static_live = 0
    for i, e in enumerate(ev):
        a = e["action"]
        if a == "alloc":
            nxt = ev[i + 1] if i + 1 < len(ev) else None
            if e["size"] == MARKER and nxt and nxt["action"] == "free_requested" and nxt["addr"] == e["addr"]:
                markers.add(e["addr"])
                boundaries += 1
                continue
            live[e["addr"]] = e["size"]
            allocs += 1
            cur += e["size"]
            peak = max(peak, cur)
        elif a == "free_completed":
            if e["addr"] in markers:
                markers.discard(e["addr"])
                continue
            frees += 1
            if e["addr"] in live:
                cur -= live.pop(e["addr"])
            else:
                static_freed.append(e["size"])
    end_static = [
        b["requested_size"]
        for s in snap["segments"]
        for b in s["blocks"]
        if b["state"].startswith("active") and b["address"] not in live
    ]
    static_bytes = sum(end_static) + sum(static_freed)
    # peak_requested: replay with static blocks live from the start.
    cur_total = static_bytes
    peak_total = cur_total
    live2 = {}
    markers = set()
    for i, e in enumerate(ev):
        a = e["action"]
        if a == "alloc":
            nxt = ev[i + 1] if i + 1 < len(ev) else None
            if e["size"] == MARKER and nxt and nxt["action"] == "free_requested" and nxt["addr"] == e["addr"]:
                markers.add(e["addr"])
                continue
            live2[e["addr"]] = e["size"]
            cur_total += e["size"]
            peak_total = max(peak_total, cur_total)
        elif a == "free_completed":
            if e["addr"] in markers:
                markers.discard(e["addr"])
                continue
            cur_total -= live2.pop(e["addr"], e["size"])
    name = path.split("/")[-1].split(".snapshot")[0]
    return {
        "name": name,
        "allocs": allocs,
        "frees": frees,
        "iterations": boundaries - 1,
        "static_blocks": len(end_static) + len(static_freed),
        "static_bytes": static_bytes,
        "peak_live_bytes": peak,
        "peak_requested_bytes": peak_total,
    }


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(json.dumps(stats(p)))
